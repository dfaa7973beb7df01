"""The certification ledger of framework checkpoint tags and its JSON sidecar (no process group).

Moved from the DeepSpeed plugin with the ledger itself (it never depended on
DeepSpeed); entries no longer carry DeepSpeed's ``global_steps``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scout_core import CheckpointError
from scout_core.checkpoint.certification import (
    SIDECAR,
    Ledger,
    TagEntry,
    read_sidecar,
    write_sidecar,
)


def _tag(entry: TagEntry | None) -> str:
    assert entry is not None
    return entry.tag


def _ledger(tmp_path: Path) -> Ledger:
    led = Ledger()
    led.add(tmp_path, "a", step=3, role="verified", reason="r")
    led.add(tmp_path, "b", step=7, role="candidate", reason="r")
    led.add(tmp_path, "c", step=8, role="suspect", reason="r")
    return led


def test_newest_by_role_and_resave_replaces(tmp_path: Path) -> None:
    led = _ledger(tmp_path)
    assert _tag(led.newest(("verified",))) == "a"
    assert _tag(led.newest(("latest", "candidate", "verified"))) == "b"
    assert led.newest(("latest",)) is None
    assert led.newest(("verified",), directory=tmp_path / "other") is None
    led.add(tmp_path, "b", step=2, role="latest", reason="again")
    assert [(e.tag, e.step, e.role) for e in led.in_dir(tmp_path)] == [
        ("b", 2, "latest"),
        ("a", 3, "verified"),
        ("c", 8, "suspect"),
    ]


def test_sidecar_round_trip_and_merge(tmp_path: Path) -> None:
    led = _ledger(tmp_path)
    path = write_sidecar(tmp_path, led.in_dir(tmp_path), run_id="x", catalog_size=4)
    assert path == tmp_path / SIDECAR
    assert not list(tmp_path.glob("*.tmp"))  # the temp file was renamed into place
    found = read_sidecar(tmp_path)
    assert found is not None
    assert [(e.tag, e.step, e.role) for e in found] == [
        ("a", 3, "verified"),
        ("b", 7, "candidate"),
        ("c", 8, "suspect"),
    ]
    fresh = Ledger()
    fresh.merge(tmp_path, found)
    assert _tag(fresh.newest(("verified",))) == "a"
    assert read_sidecar(tmp_path / "nowhere") is None


@pytest.mark.parametrize(
    "text",
    ['{"schema": "scout.deepspeed.certification/1", "tags": [{"tag": "a"}]}', '{"tags": []}', "{"],
)
def test_a_bad_sidecar_is_refused(tmp_path: Path, text: str) -> None:
    (tmp_path / SIDECAR).write_text(text, encoding="utf-8")
    with pytest.raises(CheckpointError):
        read_sidecar(tmp_path)


def test_unknown_role_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="unknown certification role"):
        Ledger().add(tmp_path, "a", step=1, role="trusted", reason="r")


def test_a_sidecar_the_deepspeed_plugin_wrote_is_still_read(tmp_path: Path) -> None:
    legacy = {
        "schema": "scout.deepspeed.certification/1",
        "run_id": "x",
        "K": 4,
        "tags": [
            {
                "tag": "t3",
                "step": 3,
                "global_steps": 4,
                "role": "verified",
                "reason": "r",
                "seq": 1,
                "time": 0.0,
            }
        ],
    }
    import json

    (tmp_path / SIDECAR).write_text(json.dumps(legacy), encoding="utf-8")
    found = read_sidecar(tmp_path)
    assert found is not None and [(e.tag, e.step, e.role) for e in found] == [("t3", 3, "verified")]


def _entry(**over: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "tag": "t3",
        "step": 3,
        "role": "verified",
        "reason": "r",
        "seq": 1,
        "time": 0.0,
    }
    entry.update(over)
    return entry


@pytest.mark.parametrize(
    ("tags", "needle"),
    [
        ([_entry(tag="../../../etc")], "not a plain file name"),
        ([_entry(tag="/etc/passwd")], "not a plain file name"),
        ([_entry(tag="a/b")], "not a plain file name"),
        ([_entry(step="3")], "step must be an integer"),
        ([_entry(step=True)], "step must be an integer"),
        ([_entry(step=10**400)], "step must be an integer"),
        ([_entry(seq=None)], "seq must be an integer"),
        ([_entry(time="now")], "malformed"),
        ([_entry(role=["verified"])], "malformed"),
        (["t3"], "not an object"),
        ("t3", "'tags' must be a list"),
        ([_entry()] * 5000, "'tags' must be a list of at most"),
    ],
)
def test_a_tampered_sidecar_is_refused(tmp_path: Path, tags: object, needle: str) -> None:
    import json

    data = {"schema": "scout.certification/1", "run_id": "x", "K": 4, "tags": tags}
    (tmp_path / SIDECAR).write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(CheckpointError, match=needle):
        read_sidecar(tmp_path)


@pytest.mark.parametrize(
    "text",
    [
        '{"schema": "scout.certification/1", "tags": [{"time": Infinity}]}',
        '{"schema": "scout.certification/1", "tags": [{"time": NaN}]}',
        '{"schema": "scout.certification/1", "tags": ' + "[" * 100_000 + "]" * 100_000 + "}",
    ],
)
def test_hostile_sidecar_json_is_refused(tmp_path: Path, text: str) -> None:
    (tmp_path / SIDECAR).write_text(text, encoding="utf-8")
    with pytest.raises(CheckpointError):
        read_sidecar(tmp_path)


def test_the_ledger_is_bounded_and_keeps_the_newest_verified(tmp_path: Path) -> None:
    from scout_core.checkpoint.certification import MAX_ENTRIES

    led = Ledger()
    led.add(tmp_path, "v0", step=0, role="verified", reason="r")
    for step in range(1, 3 * MAX_ENTRIES):
        led.add(tmp_path, f"t{step}", step=step, role="uncertified", reason="r")
    held = led.in_dir(tmp_path)
    assert len(held) == MAX_ENTRIES
    assert _tag(led.newest(("verified",))) == "v0"  # never dropped
    assert held[-1].tag == f"t{3 * MAX_ENTRIES - 1}"  # the newest stay
