"""``scout catalog discover`` / ``show``: the command builds, saves and prints a catalog."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from scout_core.cli.catalog import parse_tokens
from scout_core.cli.main import main
from scout_core.moe import CatalogSet


def test_parse_tokens() -> None:
    assert parse_tokens("1:4") == [1, 2, 3, 4]
    assert parse_tokens("16:64:16,1,2") == [1, 2, 16, 32, 48, 64]
    for bad in ("4:1", "a:b", "", "1:9:0", "-3"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_tokens(bad)


def test_discover_writes_a_catalog_and_show_prints_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "catalog.json"
    code = main(
        [
            "catalog", "discover", "--out", str(out), "--projection", "128x128",
            "--projection", "64x256", "--experts-per-kernel", "1,4", "--tokens", "1:512",
            "--device-name", "NVIDIA A100-SXM4-80GB", "--num-sms", "108",
        ]
    )  # fmt: skip
    printed = capsys.readouterr()
    assert code == 0, printed.err
    catalogs = CatalogSet.load(out)
    assert sorted(catalogs.catalogs) == ["128x128/e1", "128x128/e4", "64x256/e1", "64x256/e4"]
    for catalog in catalogs.catalogs.values():
        assert len(catalog.entries) == 512
        assert catalog.size < 512 * 0.03  # more than 97% fewer representatives
        assert catalog.environment.device == "NVIDIA A100-SXM4-80GB"
    assert f"wrote {out} (4 classes, {catalogs.size} representatives" in printed.out
    assert "128x128/e4" in printed.out and "reduction" in printed.out
    assert "512/512" in printed.err or "2048/2048" in printed.err  # the progress bar, at 100%

    assert main(["catalog", "show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "128x128/e1: rotation of" in shown and "rows 15, 16," in shown


def test_discover_fixed_tile_and_a_heterogeneous_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model.json"
    model.write_text(
        json.dumps(
            [
                {"name": "layers.0.moe", "num_experts": 4, "ep_size": 2, "d_model": 16,
                 "d_ff": 32, "max_tokens_per_expert": 64},
                {"name": "layers.1.moe", "num_experts": 2, "ep_size": 2, "d_model": 16,
                 "d_ff": 24, "token_vectors": [[5], [9], [30]]},
            ]
        )
    )  # fmt: skip
    out = tmp_path / "hetero.json"
    code = main(
        ["catalog", "discover", "--out", str(out), "--model", str(model), "--tile", "16x16x16",
         "--quiet"]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    catalogs = CatalogSet.load(out)
    assert sorted(catalogs.catalogs) == ["16x24/e1", "16x32/e2", "24x16/e1", "32x16/e2"]
    assert catalogs["16x24/e1"].workload.admitted == ((5,), (9,), (30,))
    profiler = catalogs["16x32/e2"].environment.profiler
    assert profiler["rules"] == [
        {"max_rows": None, "config": {"block_m": 16, "block_n": 16, "block_k": 16, "split_k": 1,
                                      "num_warps": 4, "num_stages": 3}}
    ]  # fmt: skip
    assert capsys.readouterr().err == ""  # --quiet: no progress output


def test_bad_workloads_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "c.json")
    assert main(["catalog", "discover", "--out", out, "--projection", "12"]) == 2
    assert "bad projection" in capsys.readouterr().err
    assert main(["catalog", "discover", "--out", out, "--tile", "0x16x16"]) == 2
    (tmp_path / "broken.json").write_text("[]")
    assert main(["catalog", "show", str(tmp_path / "broken.json")]) == 2
    assert "not a JSON object" in capsys.readouterr().err
    assert not Path(out).exists()
