"""The multi-rank harness: results, failures, timeouts, and no stray processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from scout_core.testing.harness import RankFailedError, RankProcess, RanksTimeoutError, run_ranks
from scout_core.testing.zygotes import ForkedRank

FORKED = {"OMP_NUM_THREADS": "1"}
PRELOADED = "scout_core.plugin.torch_plugin"
FRESH = {"SCOUT_TEST_FRESH_RANKS": "1"}


def rank_sum(offset: int) -> int:
    import torch
    import torch.distributed as dist

    t = torch.tensor([dist.get_rank() + offset])
    dist.all_reduce(t)
    return int(t.item())


def rank_pid() -> int:
    return os.getpid()


def rank_fails_on_one() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise RuntimeError("injected failure on rank 1")
    dist.barrier()  # peers block here until the harness kills them


def rank_sleeps_forever() -> None:
    time.sleep(3600)


def rank_facts() -> dict[str, object]:
    import numpy

    return {
        "ppid": os.getppid(),
        "rank": os.environ["RANK"],
        "call": os.environ.get("SCOUT_HARNESS_CALL"),
        "cwd": os.getcwd(),
        "draw": int(numpy.random.randint(2**31)),
        # Already imported when the rank starts: preloaded by its zygote (or None).
        "torch_plugin": getattr(sys.modules.get(PRELOADED), "__file__", None),
    }


def rank_exits(code: int) -> None:
    import torch.distributed as dist

    dist.barrier()
    os._exit(code)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); read its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.distributed
@pytest.mark.timeout(90)
def test_results_come_back_per_rank() -> None:
    assert run_ranks(rank_sum, 3, args=(10,), timeout_s=60) == [33, 33, 33]


@pytest.mark.distributed
@pytest.mark.timeout(90)
@pytest.mark.parametrize("env", [FRESH, FORKED], ids=["fresh", "forked"])
def test_a_failing_rank_raises_with_its_traceback_and_peers_are_killed(
    env: dict[str, str],
) -> None:
    pids: list[int] = []
    with pytest.raises(RankFailedError, match="injected failure on rank 1"):
        run_ranks(
            rank_fails_on_one,
            3,
            timeout_s=60,
            env=env,
            on_start=lambda ranks: pids.extend(r.proc.pid for r in ranks),
        )
    assert len(pids) == 3 and not any(_alive(p) for p in pids)


@pytest.mark.distributed
@pytest.mark.timeout(90)
@pytest.mark.parametrize("env", [FRESH, FORKED], ids=["fresh", "forked"])
def test_timeout_kills_every_rank(env: dict[str, str]) -> None:
    pids: list[int] = []
    start = time.monotonic()
    with pytest.raises(RanksTimeoutError, match=r"ranks \[0, 1, 2\] still running"):
        run_ranks(
            rank_sleeps_forever,
            3,
            timeout_s=8,
            env=env,
            on_start=lambda ranks: pids.extend(r.proc.pid for r in ranks),
        )
    assert time.monotonic() - start < 30
    assert len(pids) == 3 and not any(_alive(p) for p in pids)


def test_local_functions_are_refused() -> None:
    def local() -> None:
        return None

    with pytest.raises(ValueError, match="module-level"):
        run_ranks(local, 2)


def test_a_scripts_own_function_runs_on_every_rank(tmp_path: Path) -> None:
    # `python script.py` with the body beside the call: ranks load the script by path
    # (its `if __name__ == "__main__":` block runs once, in the harness), and a module
    # next to the script imports on every rank.
    (tmp_path / "helper_mod.py").write_text("OFFSET = 1\n")
    script = tmp_path / "script.py"
    script.write_text(
        "from helper_mod import OFFSET\n"
        "from scout_core.testing import run_ranks\n\n"
        "def body(x: int) -> int:\n"
        "    import torch, torch.distributed as dist\n"
        "    t = torch.tensor([dist.get_rank() + x + OFFSET]); dist.all_reduce(t)\n"
        "    return int(t.item())\n\n"
        'if __name__ == "__main__":\n'
        "    print(run_ranks(body, 3, args=(1,), timeout_s=60))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    res = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[9, 9, 9]"  # (0+1+2) + 3 * (1 + 1)


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_ranks_fork_from_one_zygote_with_their_own_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    first = run_ranks(rank_facts, 3, env={**FORKED, "SCOUT_HARNESS_CALL": "a"}, timeout_s=60)
    again = run_ranks(rank_facts, 3, env={**FORKED, "SCOUT_HARNESS_CALL": "b"}, timeout_s=60)
    parents = {r["ppid"] for r in first + again}
    # One zygote forked all six: not this process, and the same for both calls
    # (SCOUT_HARNESS_CALL is not read at import, so it is set per rank, not per zygote).
    assert len(parents) == 1 and os.getpid() not in parents
    assert [r["rank"] for r in first] == ["0", "1", "2"]
    assert {r["call"] for r in first} == {"a"} and {r["call"] for r in again} == {"b"}
    assert {r["cwd"] for r in first + again} == {str(tmp_path)}
    # A fresh interpreter seeds numpy's global generator from the OS; so does a fork.
    assert len({r["draw"] for r in first + again}) == 6
    # The zygote preloaded SCOUT's modules, from this harness's own scout_core.
    from scout_core.plugin import torch_plugin

    assert {r["torch_plugin"] for r in first + again} == {torch_plugin.__file__}


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_an_import_variable_gets_its_own_zygote_and_fresh_ranks_opt_out() -> None:
    one = run_ranks(rank_facts, 2, env=FORKED, timeout_s=60)
    two = run_ranks(rank_facts, 2, env={**FORKED, "TORCH_SHOW_CPP_STACKTRACES": "1"}, timeout_s=60)
    later = {**FORKED, "TORCHELASTIC_ERROR_FILE": "/nonexistent/error.json"}  # read on error
    three = run_ranks(rank_facts, 2, env=later, timeout_s=60)
    fresh = run_ranks(rank_facts, 2, env={**FORKED, **FRESH}, timeout_s=60)
    default = run_ranks(rank_facts, 2, timeout_s=60)  # no OMP_NUM_THREADS: forked as well
    assert len({r["ppid"] for r in one}) == len({r["ppid"] for r in two}) == 1
    assert one[0]["ppid"] != two[0]["ppid"]
    assert {r["ppid"] for r in three} == {one[0]["ppid"]}
    assert {r["ppid"] for r in fresh} == {os.getpid()}
    parents = {r["ppid"] for r in default}
    assert len(parents) == 1 and not parents & {os.getpid(), one[0]["ppid"], two[0]["ppid"]}


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_a_zygote_with_a_thread_is_not_forked_from(tmp_path: Path) -> None:
    # Forking a process that holds a second thread can leave a lock held forever in
    # the child; a preload that starts one sends the ranks back to fresh interpreters.
    (tmp_path / "starts_a_thread.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    )
    env = {
        **FORKED,
        "SCOUT_TEST_PRELOAD": "starts_a_thread",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), *(p for p in sys.path if p)]),
    }
    results = run_ranks(rank_facts, 2, env=env, timeout_s=60)
    assert {r["ppid"] for r in results} == {os.getpid()}


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_a_zygote_that_preloads_pyarrow_is_forked_from() -> None:
    # pyarrow's bundled jemalloc starts a background thread when it loads (TorchTitan's
    # data loader imports it); a zygote turns that thread off, so it still forks.
    pytest.importorskip("pyarrow")
    results = run_ranks(
        rank_facts, 2, env={**FORKED, "SCOUT_TEST_PRELOAD": "pyarrow"}, timeout_s=60
    )
    parents = {r["ppid"] for r in results}
    assert len(parents) == 1 and os.getpid() not in parents


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_a_forked_ranks_exit_code_comes_back_as_popens_would() -> None:
    procs: list[RankProcess] = []
    with pytest.raises(RankFailedError, match="exit 87"):
        run_ranks(rank_exits, 3, args=(87,), env=FORKED, timeout_s=60, on_start=procs.extend)
    assert all(isinstance(p.proc, ForkedRank) for p in procs)
    assert [p.proc.returncode for p in procs] == [87, 87, 87]


def rank_reports_then_sleeps(folder: str) -> None:
    Path(folder, f"rank-{os.environ['RANK']}").write_text(f"{os.getpid()} {os.getppid()}")
    time.sleep(3600)


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_zygote_and_forked_ranks_die_with_a_killed_harness(tmp_path: Path) -> None:
    # The zygote outlives one run_ranks call (it serves the next), never the harness.
    script = tmp_path / "harness.py"
    script.write_text(
        "import sys\n"
        "from scout_core.testing import run_ranks\n"
        "from test_harness import rank_reports_then_sleeps\n"
        "run_ranks(rank_reports_then_sleeps, 2, args=(sys.argv[1],), timeout_s=600,\n"
        "          env={'OMP_NUM_THREADS': '1'})\n"
    )
    here = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, *(p for p in sys.path if p)])}
    harness = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env)
    try:
        deadline = time.monotonic() + 90
        while len(list(tmp_path.glob("rank-*"))) < 2:
            assert harness.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        pids = {int(p) for f in tmp_path.glob("rank-*") for p in f.read_text().split()}
        assert harness.pid not in pids and len(pids) == 3  # two ranks, one zygote
        harness.kill()
        harness.wait()
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids)
    finally:
        harness.kill()
        harness.wait()


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_a_preload_that_prints_leaves_the_zygote_protocol_intact(tmp_path: Path) -> None:
    (tmp_path / "chatty.py").write_text("print('hello from an import', flush=True)\n")
    env = {
        **FORKED,
        "SCOUT_TEST_PRELOAD": "chatty",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), *(p for p in sys.path if p)]),
    }
    results = run_ranks(rank_facts, 2, env=env, timeout_s=60)
    parents = {r["ppid"] for r in results}
    assert len(parents) == 1 and os.getpid() not in parents


def test_a_port_clash_is_retried_and_anything_else_raised_at_once() -> None:
    from scout_core.testing.harness import RankFailedError, port_clash, retry_on_port_clash

    calls: list[int] = []

    def clashing_twice() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise RankFailedError("rank 0: bind: Address already in use (EADDRINUSE)")
        return "ran"

    assert retry_on_port_clash(clashing_twice) == "ran" and len(calls) == 3
    calls.clear()
    with pytest.raises(RankFailedError, match="EADDRINUSE"):
        retry_on_port_clash(clashing_twice, attempts=2)  # still taken: the clash is raised
    calls.clear()

    def broken() -> None:
        calls.append(1)
        raise RankFailedError("rank 1: ValueError: a real failure")

    with pytest.raises(RankFailedError, match="a real failure"):
        retry_on_port_clash(broken)
    assert len(calls) == 1
    assert port_clash("OSError: [Errno 98] Address already in use")
    assert not port_clash("ConnectionRefusedError")


def rank_starts_helpers(folder: str) -> dict[str, object]:
    """Start two helpers the way SCOUT starts its observer, and report what they saw."""
    from scout_core.observer import spawn

    rank = os.environ["RANK"]
    here = str(Path(__file__).parent)
    # Set after the rank started: a helper gets the environment and directory of its start.
    os.environ["PYTHONPATH"] = os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])
    os.environ["SCOUT_PROBE_VALUE"] = f"rank {rank}"
    os.chdir(folder)
    out = Path(folder, f"probe-{rank}.json")
    r, w = os.pipe()
    helper = spawn.spawn(["-m", "helper_probe", str(out), str(w), "7"], (w,))
    os.close(w)
    code = helper.wait(timeout=60)
    said = os.read(r, 64).decode()
    sleeper = spawn.spawn(["-m", "helper_probe", "sleep"], ())
    running = sleeper.poll()
    sleeper.kill()
    return {
        "kind": type(helper).__name__,
        "pid": helper.pid,
        "code": code,
        "returncode": helper.returncode,
        "said": said,
        "w": w,
        "seen": json.loads(out.read_text()),
        "sleeper_running": running,
        "killed": sleeper.wait(timeout=30),
    }


@pytest.mark.distributed
@pytest.mark.timeout(180)
@pytest.mark.parametrize("fresh", [False, True], ids=["forked", "fresh"])
def test_a_ranks_helpers_start_as_popen_would(tmp_path: Path, fresh: bool) -> None:
    # Forked helpers (scout_core/testing/_helpers.py) against the real Popen start.
    env = {**FORKED, "SCOUT_TEST_FRESH_HELPERS": "1"} if fresh else FORKED
    results = run_ranks(rank_starts_helpers, 2, args=(str(tmp_path),), env=env, timeout_s=120)
    for rank, got in enumerate(results):
        assert got["kind"] == ("Popen" if fresh else "ForkedHelper")
        seen = got["seen"]
        assert seen["pid"] == got["pid"] and seen["sid"] == got["pid"]  # its own session
        assert seen["value"] == f"rank {rank}" and seen["cwd"] == str(tmp_path)
        assert seen["fds"] == [0, 1, 2, got["w"]] and seen["stdin"] == os.devnull
        assert got["said"] == "hello"
        assert got["code"] == got["returncode"] == 7
        assert got["sleeper_running"] is None and got["killed"] == -9


def rank_helper_then_sleeps(folder: str) -> None:
    from scout_core.observer import spawn

    here = str(Path(__file__).parent)
    os.environ["PYTHONPATH"] = os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])
    helper = spawn.spawn(["-m", "helper_probe", "sleep"], ())
    Path(folder, f"helper-{os.environ['RANK']}").write_text(f"{os.getpid()} {helper.pid}")
    time.sleep(3600)


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_a_forked_helper_dies_with_its_rank(tmp_path: Path) -> None:
    found: dict[int, int] = {}

    def kill_rank_zero(ranks: list[RankProcess]) -> None:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("helper-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        for f in tmp_path.glob("helper-*"):
            rank_pid, helper_pid = map(int, f.read_text().split())
            found[rank_pid] = helper_pid
        os.kill(ranks[0].proc.pid, signal.SIGKILL)

    def start() -> None:
        with pytest.raises(RankFailedError):
            run_ranks(
                rank_helper_then_sleeps,
                2,
                args=(str(tmp_path),),
                env=FORKED,
                timeout_s=90,
                on_start=lambda ranks: threading.Thread(
                    target=kill_rank_zero, args=(ranks,), daemon=True
                ).start(),
            )

    start()
    assert len(found) == 2
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in found.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in found.values())
