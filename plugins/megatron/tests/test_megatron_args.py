"""Megatron-LM flags for SCOUT: --scout-config and one --scout-<key> per Config field."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest
from scout_megatron.args import add_args, config_from_args, flag_of, section_from_args

from scout_core import Config, ConfigError


def _parser() -> argparse.ArgumentParser:
    # Built as Megatron-LM builds its own (megatron/training/arguments.py).
    return add_args(
        argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False)
    )


def _parse(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(list(argv))


def test_every_config_field_has_a_flag() -> None:
    flags = {a.option_strings[0] for a in _parser()._actions if a.option_strings}
    expected = {flag_of(f.name) for f in dataclasses.fields(Config)} | {"--scout-config"}
    assert expected <= flags
    assert {f for f in flags if f.startswith("--scout-")} == expected


def test_no_flags_no_section_and_nothing_in_the_namespace() -> None:
    args = _parse()
    assert section_from_args(args) is None
    assert not [k for k in vars(args) if k.startswith("scout")]
    assert config_from_args(args, environ={}) is None  # the environment decides


def test_flags_parse_like_environment_variables() -> None:
    args = _parse(
        "--scout-replay-interval", "5",
        "--scout-recipes", "hidden,lm_head",
        "--scout-observer", "false",
        "--scout-deterministic",
        "--scout-kappa", "3.5",
        "--scout-stage-timeout-s", "none",
        "--scout-variants", "1,2",
        "--scout-report-dir", "runs/scout",
    )  # fmt: skip
    section = section_from_args(args)
    assert section == {
        "replay_interval": 5,
        "recipes": ("hidden", "lm_head"),
        "observer": False,
        "deterministic": True,
        "kappa": 3.5,
        "stage_timeout_s": None,
        "variants": (1.0, 2.0),
        "report_dir": "runs/scout",
    }
    config = Config.from_mapping(section)
    assert config.replay_interval == 5 and config.recipes == ("hidden", "lm_head")


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--scout-kappa", "abc"], ["--scout-kappa", "'kappa'", "float"]),
        (["--scout-hang-exit-code", "16"], ["--scout-hang-exit-code", "must not be 16"]),
        (["--scout-recipes", "hidden,nope"], ["--scout-recipes", "nope"]),
        (["--scout-observer", "maybe"], ["--scout-observer", "bool"]),
    ],
)
def test_bad_values_raise_config_error_naming_flag_and_key(
    argv: list[str], needles: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        section_from_args(_parse(*argv))
    for needle in needles:
        assert needle in str(info.value)


def test_unknown_flag_is_refused_by_argparse() -> None:
    with pytest.raises(SystemExit):
        _parse("--scout-replay-intervall", "3")


def test_config_file_then_flags_then_environment(tmp_path: Path) -> None:
    path = tmp_path / "scout.json"
    path.write_text(json.dumps({"scout": {"replay_interval": 7, "kappa": 4.0}}))
    args = _parse("--scout-config", str(path), "--scout-kappa", "6")
    section = section_from_args(args)
    assert section is not None
    assert section["replay_interval"] == 7 and section["kappa"] == 6.0
    config = config_from_args(args, environ={"SCOUT_REPLAY_INTERVAL": "9"})
    assert config is not None and config.enabled
    assert (config.replay_interval, config.kappa) == (9, 6.0)


def test_unknown_key_in_the_file_names_it(tmp_path: Path) -> None:
    path = tmp_path / "scout.toml"
    path.write_text("replay_intervall = 3\n")
    with pytest.raises(ConfigError, match="replay_intervall"):
        section_from_args(_parse("--scout-config", str(path)))
