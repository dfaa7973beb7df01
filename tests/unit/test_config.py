"""Unit tests for scout_core.config: defaults, validation, files, env overrides, docs.

Run ``python tests/unit/test_config.py`` to print the reference table that
docs/configuration.md must contain.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from scout_core.config import Config, fields_doc
from scout_core.errors import ConfigError
from scout_core.testing import BUSY_HOST

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"

EXPECTED_DEFAULTS = {
    "enabled": True,
    "run_id": None,
    "report_dir": "scout-report",
    "layers": None,
    "embedding": None,
    "lm_head": None,
    "replay_interval": 20,
    "embedding_interval": 20,
    "lm_head_interval": 20,
    "optimizer_interval": 20,
    "router_interval": 20,
    "expert_interval": 20,
    "all_to_all_interval": 20,
    "moe_catalog": None,
    "spread_recipes": True,
    "recipes": (
        "hidden",
        "embedding",
        "lm_head",
        "optimizer",
        "router",
        "experts",
        "all_to_all",
    ),
    "variants": (0.1, 1.0, 10.0),
    "optimizer_slice": 65536,
    "custody_slices": 512,
    "custody_every": 16,
    "referee_timeout_s": 60.0,
    "kappa": 5.0,
    "straggler_rounds": 2,
    "straggler_min_excess_s": 0.05,
    "straggler_min_ratio": 1.5,
    "deterministic": True,
    "replay_threads": None,
    "observer": True,
    "hang_timeout_s": 60.0,
    "stage_timeout_s": None,
    "observer_addr": None,
    "observer_port": None,
    "observer_join_timeout_s": 30.0,
    "on_hang": "report",
    "hang_exit_code": 86,
    "on_sdc": "recover",
    "sdc_exit_code": 87,
    "gate": True,
    "checkpoint_dir": None,
    "catalog_size": None,
    "peer_replication": False,
    "gate_memory": "full",
    "gate_capture_interval": None,
}


def _table() -> str:
    """The reference table of docs/configuration.md, generated from the code."""
    cfg = Config().to_dict()
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(Config):
        default = json.dumps(cfg[f.name])
        kind = str(f.type).replace("|", "\\|")  # a bare | would split the table cell
        rows.append(f"| `{f.name}` | `{kind}` | `{default}` | {fields_doc()[f.name]} |")
    return "\n".join(rows)


# -- defaults and shape -----------------------------------------------------------------


def test_defaults_are_the_documented_contract() -> None:
    cfg = Config()
    assert {f.name for f in dataclasses.fields(Config)} == set(EXPECTED_DEFAULTS)
    for name, value in EXPECTED_DEFAULTS.items():
        assert getattr(cfg, name) == value, name


def test_frozen_kw_only_and_replace_validates() -> None:
    cfg = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.kappa = 3.0  # type: ignore[misc]  # the point: assignment must be refused
    with pytest.raises(TypeError):
        Config(True)  # type: ignore[misc]  # the point: positional arguments are refused
    changed = dataclasses.replace(cfg, kappa=3, recipes=["hidden"])
    assert changed.kappa == 3.0 and isinstance(changed.kappa, float)
    assert changed.recipes == ("hidden",)
    with pytest.raises(ConfigError, match="replay_interval"):
        dataclasses.replace(cfg, replay_interval=0)


# -- validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("replay_interval", 0, "in 1..1,000,000"),
        ("gate_memory", "half", "must be one of full, lean"),
        ("gate_memory", "", "must be one of full, lean"),
        ("replay_interval", 10**400, "in 1..1,000,000"),
        ("embedding_interval", 0, "in 1..1,000,000"),
        ("lm_head_interval", -1, "in 1..1,000,000"),
        ("optimizer_interval", 2_000_000, "in 1..1,000,000"),
        ("optimizer_slice", 0, "in 1..67,108,864"),
        ("custody_slices", -1, "in 0..1,000,000"),
        ("custody_slices", 1_000_001, "in 0..1,000,000"),
        ("custody_every", 0, "in 1..1,000,000"),
        ("referee_timeout_s", 0.5, "in 1..3,600"),
        ("kappa", 0.0, "> 0 and <= 100"),
        ("kappa", float("nan"), "> 0 and <= 100"),
        ("kappa", 1e300, "> 0 and <= 100"),
        ("straggler_rounds", 0, "in 1..1,000"),
        ("straggler_min_excess_s", -0.01, "in 0..3,600"),
        ("straggler_min_ratio", 0.9, "in 1..1,000"),
        ("replay_threads", 0, "in 1..1,024"),
        ("replay_threads", 10**9, "in 1..1,024"),
        ("hang_timeout_s", 0.0, "in 1..86,400"),
        ("hang_timeout_s", 0.01, "in 1..86,400"),
        ("hang_timeout_s", float("inf"), "in 1..86,400"),
        ("stage_timeout_s", -1.0, "in 1..86,400"),
        ("observer_port", 0, "1..65535"),
        ("observer_port", 65536, "1..65535"),
        ("observer_port", 10**400, "1..65535"),
        ("observer_join_timeout_s", 0.0, "in 1..3,600"),
        ("catalog_size", 0, "in 1..1,000,000"),
        ("all_to_all_interval", 0, "in 1..1,000,000"),
        ("all_to_all_interval", 1_000_001, "in 1..1,000,000"),
        ("hang_exit_code", 10**400, "1..255"),
        ("variants", [1.0] * 3 + [2.0, 3.0, 4.0, 5.0, 6.0, 7.0], "at most 8"),
        ("variants", [1.0, 1e9], "0.0001..10000"),
        ("run_id", "a/b", "names the run's report directory"),
        ("run_id", "..", "names the run's report directory"),
        ("report_dir", "a\x00b", "NUL"),
        ("variants", [], "at least one"),
        ("variants", [1.0, -0.1], "> 0"),
        ("variants", [1.0, float("inf")], "> 0"),
        ("variants", [1.0, 1.0], "repeats"),
        ("recipes", ["hidden", "hidden"], "twice"),
        ("layers", "model..layers", "dotted module path"),
        ("lm_head", "output head", "dotted module path"),
        ("report_dir", " ", "empty"),
        ("run_id", "", "empty"),
        ("hang_exit_code", 0, "1..255"),
        ("hang_exit_code", 256, "1..255"),
    ],
)
def test_bad_values_name_the_key(key: str, value: object, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config(**{key: value})  # type: ignore[arg-type]  # deliberately wrong values
    assert repr(key) in str(info.value)
    assert fragment in str(info.value)


def test_unknown_recipe_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as info:
        Config(recipes=("hidden", "routers"))
    message = str(info.value)
    assert "'routers'" in message
    assert "hidden, embedding, lm_head, optimizer, router, experts, all_to_all" in message


def test_on_hang_lists_the_valid_actions() -> None:
    with pytest.raises(ConfigError, match="report, dump_stacks, terminate; got 'abort'"):
        Config(on_hang="abort")
    assert Config(on_hang="terminate").on_hang == "terminate"


@pytest.mark.parametrize(("code", "owner"), [(16, "Megatron"), (17, "Megatron"), (93, "nvidia")])
def test_reserved_exit_codes_are_refused_with_the_reason(code: int, owner: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config(hang_exit_code=code)
    message = str(info.value)
    assert f"must not be {code}" in message
    assert owner in message
    assert "16, 17, 93" in message


@pytest.mark.parametrize("code", [1, 15, 18, 86, 92, 94, 255])
def test_other_exit_codes_are_accepted(code: int) -> None:
    assert Config(hang_exit_code=code).hang_exit_code == code


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("kappa", "5", "expects float, got str '5'"),
        ("enabled", 1, "expects bool, got int 1"),
        ("replay_interval", True, "expects int, got bool True"),
        ("replay_interval", 2.5, "expects int, got float 2.5"),
        ("recipes", "hidden", "expects list of str, got str 'hidden'"),
        ("variants", [1.0, "x"], "expects list of float"),
        ("report_dir", None, "expects str, got None"),
        ("observer_port", "29500", "expects int or null, got str '29500'"),
    ],
)
def test_wrong_types_name_key_type_and_value(key: str, value: object, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config(**{key: value})  # type: ignore[arg-type]  # deliberately wrong types
    assert f"key {key!r} {expected}" in str(info.value)


def test_optional_fields_accept_none_and_values() -> None:
    cfg = Config(
        replay_threads=4,
        stage_timeout_s=5,
        observer_addr="node0",
        observer_port=29600,
        checkpoint_dir="/tmp/ckpt",
        catalog_size=7,
        layers="model.layers",
        embedding="model.embed_tokens",
        lm_head="lm_head",
    )
    assert cfg.stage_timeout_s == 5.0
    assert cfg.resolved_stage_timeout_s() == 5.0
    assert Config(hang_timeout_s=12.0).resolved_stage_timeout_s() == 12.0


def test_empty_recipes_switch_replay_off() -> None:
    assert Config(recipes=()).recipes == ()


# -- run id -------------------------------------------------------------------------------


def test_resolved_run_id_prefers_explicit_then_torchelastic_then_default() -> None:
    assert Config(run_id="mine").resolved_run_id({"TORCHELASTIC_RUN_ID": "te"}) == "mine"
    assert Config().resolved_run_id({"TORCHELASTIC_RUN_ID": "te-42"}) == "te-42"
    assert Config().resolved_run_id({}) == "scout"
    assert Config().resolved_run_id({"TORCHELASTIC_RUN_ID": ""}) == "scout"
    # plain torchrun sets "none" for every job: no identity, so enable makes a fresh id
    assert Config().resolved_run_id({"TORCHELASTIC_RUN_ID": "none"}) == "scout"
    assert Config().named_run_id({"TORCHELASTIC_RUN_ID": "none"}) is None
    assert Config().named_run_id({"TORCHELASTIC_RUN_ID": "job-7"}) == "job-7"


# -- mappings -----------------------------------------------------------------------------


def test_from_mapping_normalises_lists_and_ints() -> None:
    cfg = Config.from_mapping({"recipes": ["hidden", "optimizer"], "variants": [1, 2], "kappa": 4})
    assert cfg.recipes == ("hidden", "optimizer")
    assert cfg.variants == (1.0, 2.0)
    assert cfg.kappa == 4.0


def test_from_mapping_unknown_key_suggests_and_lists() -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_mapping({"replay_intervall": 5}, source="ds_config.json[scout]")
    message = str(info.value)
    assert message.startswith("ds_config.json[scout]: unknown key 'replay_intervall'")
    assert "did you mean 'replay_interval'?" in message
    for name in EXPECTED_DEFAULTS:
        assert name in message


def test_from_mapping_wrong_type_names_source_key_type_value() -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_mapping({"kappa": "high"}, source="scout.toml")
    assert str(info.value) == "scout.toml: key 'kappa' expects float, got str 'high'"


def test_from_mapping_applies_on_top_of_base() -> None:
    base = Config(kappa=3.0)
    cfg = Config.from_mapping({"replay_interval": 7}, base=base)
    assert (cfg.kappa, cfg.replay_interval) == (3.0, 7)


def test_to_dict_is_json_safe_and_round_trips() -> None:
    cfg = Config(run_id="r1", recipes=("optimizer",), variants=(1.0,), observer_port=1234)
    data = json.loads(json.dumps(cfg.to_dict(), allow_nan=False))
    assert data["recipes"] == ["optimizer"]
    assert Config.from_mapping(data) == cfg


# -- files ----------------------------------------------------------------------------------


def test_from_file_toml_top_level(tmp_path: Path) -> None:
    path = tmp_path / "scout.toml"
    path.write_text('report_dir = "runs/scout"\nreplay_interval = 10\nrecipes = ["hidden"]\n')
    cfg = Config.from_file(path, environ={})
    assert (cfg.report_dir, cfg.replay_interval, cfg.recipes) == ("runs/scout", 10, ("hidden",))


def test_from_file_toml_scout_table_ignores_other_tables(tmp_path: Path) -> None:
    path = tmp_path / "train.toml"
    path.write_text('[training]\nsteps = 100\n\n[scout]\nkappa = 6\non_hang = "terminate"\n')
    cfg = Config.from_file(path, environ={})
    assert (cfg.kappa, cfg.on_hang) == (6.0, "terminate")


def test_from_file_json_top_level_and_scout_object(tmp_path: Path) -> None:
    top = tmp_path / "scout.json"
    top.write_text(json.dumps({"observer": False, "variants": [1.0]}))
    assert Config.from_file(top, environ={}).observer is False
    nested = tmp_path / "ds_config.json"
    nested.write_text(json.dumps({"train_batch_size": 8, "scout": {"lm_head_interval": 3}}))
    assert Config.from_file(nested, environ={}).lm_head_interval == 3


def test_from_file_then_env_overrides(tmp_path: Path) -> None:
    path = tmp_path / "scout.toml"
    path.write_text("replay_interval = 10\nkappa = 6.0\n")
    cfg = Config.from_file(path, environ={"SCOUT_REPLAY_INTERVAL": "3"})
    assert (cfg.replay_interval, cfg.kappa) == (3, 6.0)


def test_from_file_errors_name_the_file(tmp_path: Path) -> None:
    yaml = tmp_path / "scout.yaml"
    yaml.write_text("kappa: 1\n")
    with pytest.raises(
        ConfigError, match=r"unsupported config file type '\.yaml'; use \.toml or \.json"
    ):
        Config.from_file(yaml, environ={})
    broken = tmp_path / "broken.toml"
    broken.write_text("kappa = = 1\n")
    with pytest.raises(ConfigError, match=r"broken\.toml: not valid TOML"):
        Config.from_file(broken, environ={})
    bad_key = tmp_path / "bad.json"
    bad_key.write_text(json.dumps({"scout": {"kapa": 1}}))
    with pytest.raises(
        ConfigError, match=r"bad.json: unknown key 'kapa' \(did you mean 'kappa'\?\)"
    ):
        Config.from_file(bad_key, environ={})
    with pytest.raises(ConfigError, match="cannot read config file"):
        Config.from_file(tmp_path / "missing.toml", environ={})
    not_table = tmp_path / "list.json"
    not_table.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="expected a table"):
        Config.from_file(not_table, environ={})


# -- environment ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        ("on", True),
        ("0", False),
        ("False", False),
        ("no", False),
        ("off", False),
    ],
)
def test_env_bools(text: str, expected: bool) -> None:
    assert Config.from_env(environ={"SCOUT_DETERMINISTIC": text}).deterministic is expected


def test_env_parses_every_kind() -> None:
    cfg = Config.from_env(
        environ={
            "SCOUT_ENABLED": "off",
            "SCOUT_RUN_ID": "job-7",
            "SCOUT_REPLAY_INTERVAL": "5",
            "SCOUT_KAPPA": "2.5",
            "SCOUT_RECIPES": "hidden, optimizer",
            "SCOUT_VARIANTS": "1,4",
            "SCOUT_REPLAY_THREADS": "2",
            "SCOUT_STAGE_TIMEOUT_S": "none",
            "SCOUT_OBSERVER_PORT": "",
            "SCOUT_TEST_RANK_DIR": "/tmp/x",
            "SCOUT_CONFIG": "",
            "PATH": "/usr/bin",
        }
    )
    assert cfg.enabled is False
    assert cfg.run_id == "job-7"
    assert cfg.replay_interval == 5
    assert cfg.kappa == 2.5
    assert cfg.recipes == ("hidden", "optimizer")
    assert cfg.variants == (1.0, 4.0)
    assert cfg.replay_threads == 2
    assert cfg.stage_timeout_s is None
    assert cfg.observer_port is None


def test_env_overrides_base_and_empty_list_clears_recipes() -> None:
    base = Config(kappa=9.0, replay_threads=3)
    cfg = Config.from_env(base, environ={"SCOUT_RECIPES": "", "SCOUT_REPLAY_THREADS": "None"})
    assert (cfg.kappa, cfg.recipes, cfg.replay_threads) == (9.0, (), None)
    assert Config.from_env(base, environ={}) is base


@pytest.mark.parametrize(
    ("var", "value", "fragment"),
    [
        ("SCOUT_DETERMINISTIC", "maybe", "expects a bool"),
        ("SCOUT_REPLAY_INTERVAL", "ten", "expects int, got 'ten'"),
        ("SCOUT_REPLAY_INTERVAL", "0", "in 1..1,000,000"),
        ("SCOUT_REPLAY_INTERVAL", "none", "expects int, got 'none'"),
        ("SCOUT_RECIPES", "hidden,moe", "valid recipes: hidden, embedding, lm_head, optimizer"),
        ("SCOUT_HANG_EXIT_CODE", "93", "must not be 93"),
        ("SCOUT_REPLAY_THREADS", "1000000000", "in 1..1,024"),
        ("SCOUT_REPLAY_INTERVAL", "9" * 5000, "expects int"),
        ("SCOUT_HANG_TIMEOUT_S", "0.01", "in 1..86,400"),
        ("SCOUT_KAPPA", "nan", "> 0 and <= 100"),
        ("SCOUT_KAPPA", "1e999", "> 0 and <= 100"),
    ],
)
def test_env_errors_name_the_variable(var: str, value: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_env(environ={var: value})
    message = str(info.value)
    assert message.startswith(f"environment variable {var}")
    assert fragment in message


@pytest.mark.parametrize(
    ("var", "hint"),
    [
        ("SCOUT_KEY", ""),  # Scout APM's variables, common on servers
        ("SCOUT_MONITOR", ""),
        ("SCOUT_NAME", ""),
        ("SCOUT_KAPA", "(did you mean 'SCOUT_KAPPA'?)"),
        ("SCOUT_ENABLE", "(did you mean 'SCOUT_ENABLED'?)"),
    ],
)
def test_unknown_env_variables_warn_and_never_fail(
    var: str, hint: str, caplog: pytest.LogCaptureFixture
) -> None:
    from scout_core.config import sources

    sources._warned.discard(var)
    with caplog.at_level("WARNING", logger="scout_core"):
        cfg = Config.from_env(environ={var: "x", "SCOUT_KAPPA": "7"})
        again = Config.from_env(environ={var: "x"})
    assert cfg.kappa == 7.0 and again == Config()
    warned = [r.getMessage() for r in caplog.records if var in r.getMessage()]
    assert len(warned) == 1, warned  # once per variable, not at every from_env
    assert f"ignoring environment variable {var}: unknown SCOUT_* variable" in warned[0]
    assert hint in warned[0]


def test_hostile_files_give_config_errors(tmp_path: Path) -> None:
    cases = {
        "deep.json": "[" * 100_000 + "]" * 100_000,
        "deepobj.json": '{"scout": ' * 50_000 + "1" + "}" * 50_000,
        "digits.json": '{"replay_interval": ' + "9" * 10_000 + "}",
        "inf.json": '{"kappa": Infinity}',
        "nan.json": '{"kappa": NaN}',
        "big.json": '{"kappa": 1e999}',
        "utf.json": b'{"run_id": "\xff"}'.decode("latin-1"),
        "deep.toml": "a = " + "[" * 100_000 + "]" * 100_000,
        "hugeint.toml": "replay_interval = " + "9" * 10_000,
        "nested.json": '{"recipes": ' + "[" * 500 + "]" * 500 + "}",
    }
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text, encoding="latin-1")
        with pytest.raises(ConfigError, match=name.replace(".", r"\.")):
            Config.from_file(path, environ={})


def test_every_numeric_key_documents_its_sane_range() -> None:
    from scout_core.config.checks import RANGES, range_text

    docs = fields_doc()
    numeric = {
        f.name
        for f in dataclasses.fields(Config)
        if str(f.type).split(" |")[0] in {"int", "float"}
        and f.name not in {"hang_exit_code", "sdc_exit_code"}
    }
    assert numeric - {"observer_port"} == set(RANGES)
    for name in RANGES:
        assert f"({range_text(name)}" in docs[name], name


def test_env_scout_config_names_a_file(tmp_path: Path) -> None:
    path = tmp_path / "scout.toml"
    path.write_text("[scout]\nreplay_interval = 11\nkappa = 7\n")
    cfg = Config.from_env(environ={"SCOUT_CONFIG": str(path), "SCOUT_KAPPA": "8"})
    assert (cfg.replay_interval, cfg.kappa) == (11, 8.0)


# -- docs ------------------------------------------------------------------------------------


def test_every_field_has_a_docstring() -> None:
    docs = fields_doc()
    assert list(docs) == [f.name for f in dataclasses.fields(Config)]
    for name, text in docs.items():
        assert len(text) > 20, f"field {name!r} needs a docstring under it"
    assert docs["kappa"].startswith("Sensitivity of statistical C3")


def test_configuration_doc_matches_the_code() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for name in EXPECTED_DEFAULTS:
        assert f"`{name}`" in text, name
    assert _table() in text, (
        "docs/configuration.md is out of date; regenerate its table with "
        "`python tests/unit/test_config.py`"
    )


def test_configuration_doc_examples_load(tmp_path: Path) -> None:
    text = DOCS.read_text(encoding="utf-8")
    blocks = re.findall(r"```(toml|json)\n(.*?)```", text, flags=re.DOTALL)
    assert [kind for kind, _ in blocks] == ["toml", "toml", "json", "json"]
    loaded = []
    for i, (kind, body) in enumerate(blocks):
        path = tmp_path / f"example{i}.{kind}"
        path.write_text(body)
        loaded.append(Config.from_file(path, environ={}))
    busy, section, deepspeed, flat = loaded
    # The busy-host example is the setting SCOUT's own tests run with.
    assert {k: getattr(busy, k) for k in BUSY_HOST} == BUSY_HOST
    assert section.recipes == ("hidden", "optimizer")
    assert section.on_hang == "terminate"
    assert deepspeed.observer_port == 29650
    assert flat.observer is False


if __name__ == "__main__":
    print(_table())


def test_on_sdc_terminate_needs_a_checkpoint_dir_and_a_free_exit_code() -> None:
    assert Config(on_sdc="terminate", checkpoint_dir="ckpt").sdc_exit_code == 87
    with pytest.raises(ConfigError, match="'checkpoint_dir' is not set"):
        Config(on_sdc="terminate")
    with pytest.raises(ConfigError, match="on_sdc"):
        Config(on_sdc="restart")
    with pytest.raises(ConfigError, match=r"must not be 93.*SCOUT SDC exit"):
        Config(sdc_exit_code=93)
