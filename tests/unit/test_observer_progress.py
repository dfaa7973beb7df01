"""The shared-memory progress record: seqlock publishes, reads from a second mapping,
torn reads, the armed progress event, and the pure hang decision."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from scout_core.observer.progress import (
    ARMED,
    OP_ID,
    SEQ,
    STATE,
    ObserverState,
    ProgressRecord,
    Publisher,
    Stage,
)
from scout_core.observer.verdict import RankEvidence, decide_round
from scout_core.vocabulary import Failure, Scope, Status


@pytest.fixture
def pair() -> Iterator[tuple[ProgressRecord, ProgressRecord]]:
    """The trainer's record and an observer-side view through duplicated descriptors."""
    mine = ProgressRecord.create()
    theirs = ProgressRecord.attach(os.dup(mine.mem_fd), os.dup(mine.event_r), os.dup(mine.event_w))
    yield mine, theirs
    theirs.close()
    mine.close()


def test_publish_is_seen_by_the_other_mapping(pair: tuple[ProgressRecord, ProgressRecord]) -> None:
    mine, theirs = pair
    pub = Publisher(mine)
    assert theirs.read().op_id == 0
    pub.enter_collective((1 << 48, 7, 9))
    snap = theirs.read()
    assert (snap.op_id, snap.stage, snap.fingerprint, snap.torn) == (
        1,
        Stage.COLLECTIVE,
        (1 << 48, 7, 9),
        False,
    )
    pub.exit_collective()
    pub.advance_step()
    snap = theirs.read()
    assert (snap.op_id, snap.step, snap.stage, snap.fingerprint) == (3, 1, Stage.IDLE, (0, 0, 0))
    assert theirs.words[SEQ] % 2 == 0
    pub.mark_closing()
    assert theirs.read().closing


def test_attach_refuses_foreign_memory() -> None:
    fd = os.memfd_create("not-scout")
    os.ftruncate(fd, 128)
    with pytest.raises(ValueError, match="not a SCOUT progress record"):
        ProgressRecord.attach(fd, fd, fd)
    os.close(fd)


def test_writer_frozen_mid_publish_gives_a_torn_read_not_a_spin(
    pair: tuple[ProgressRecord, ProgressRecord],
) -> None:
    mine, theirs = pair
    Publisher(mine).publish(Stage.LAYER)
    mine.words[SEQ] += 1  # what a trainer stopped inside publish() leaves behind
    mine.words[OP_ID] = 2
    start = time.monotonic()
    snap = theirs.read()
    assert snap.torn and snap.op_id == 2
    assert time.monotonic() - start < 2.0


def test_concurrent_publishes_never_give_inconsistent_snapshots(
    pair: tuple[ProgressRecord, ProgressRecord],
) -> None:
    mine, theirs = pair
    pub = Publisher(mine)
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            pub.enter_collective((i, i, i))  # the three words always equal in one publish

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(2000):
            snap = theirs.read()
            if not snap.torn and snap.stage == Stage.COLLECTIVE:
                assert len(set(snap.fingerprint)) == 1, snap
    finally:
        stop.set()
        t.join()


def test_event_fires_only_when_armed(pair: tuple[ProgressRecord, ProgressRecord]) -> None:
    mine, theirs = pair
    pub = Publisher(mine)
    pub.publish(Stage.LAYER)  # not armed: no system call, nothing pending
    assert theirs.wait_for_progress(0.0) is False
    assert theirs.words[ARMED] == 1  # wait_for_progress armed it
    pub.publish(Stage.LAYER)
    assert theirs.words[ARMED] == 0
    assert theirs.wait_for_progress(1.0) is True
    start = time.monotonic()
    assert theirs.wait_for_progress(0.1) is False
    assert time.monotonic() - start >= 0.09


def test_observer_words_round_trip(pair: tuple[ProgressRecord, ProgressRecord]) -> None:
    mine, theirs = pair
    theirs.set_observer_word(STATE, ObserverState.JOINED)
    assert mine.observer_word(STATE) == ObserverState.JOINED


# -- the decision -------------------------------------------------------------------------

FP = (1 << 48, 11, 22)


def _ev(
    rank: int,
    op: int,
    stage: Stage = Stage.COLLECTIVE,
    fp: tuple[int, int, int] = FP,
    quiet: float = 3.0,
) -> RankEvidence:
    return RankEvidence(
        rank, 5, op, int(stage), fp if stage == Stage.COLLECTIVE else (0, 0, 0), quiet
    )


def test_lagging_rank_is_a_hang() -> None:
    ev = [_ev(0, 10), _ev(1, 10), _ev(2, 9, Stage.IDLE), _ev(3, 10)]
    (v,) = decide_round(ev, min_quiet_s=1.0, world_size=4)
    assert (v.failure, v.status, v.outliers, v.scope) == (
        Failure.HANG,
        Status.ATTRIBUTED,
        (2,),
        Scope.RANK,
    )
    assert v.detail["position"] == {"2": "behind"}
    assert v.localized


@pytest.mark.parametrize(
    ("stage", "failure"),
    [
        (Stage.DATALOADER, Failure.INPUT_STALL),
        (Stage.CHECKPOINT_WRITE, Failure.CHECKPOINT_STALL),
        (Stage.CHECKPOINT_READ, Failure.CHECKPOINT_STALL),
    ],
)
def test_lagging_rank_inside_a_stage(stage: Stage, failure: Failure) -> None:
    ev = [_ev(0, 10), _ev(1, 7, stage), _ev(2, 10)]
    (v,) = decide_round(ev, min_quiet_s=1.0, world_size=3)
    assert (v.failure, v.outliers) == (failure, (1,))


def test_fingerprint_outlier_is_a_protocol_mismatch() -> None:
    other = (FP[0], FP[1], 99)
    ev = [_ev(0, 10), _ev(1, 10), _ev(2, 10, fp=other), _ev(3, 10)]
    (v,) = decide_round(ev, min_quiet_s=1.0, world_size=4)
    assert (v.failure, v.status, v.outliers) == (
        Failure.PROTOCOL_MISMATCH,
        Status.ATTRIBUTED,
        (2,),
    )


def test_all_equal_is_a_group_stall_without_culprit() -> None:
    ev = [_ev(0, 10), _ev(1, 10), _ev(2, 10)]
    (v,) = decide_round(ev, min_quiet_s=1.0, world_size=8)
    assert (v.failure, v.status, v.outliers, v.scope) == (
        Failure.GROUP_STALL,
        Status.AGREE,
        (),
        Scope.GROUP,
    )
    assert not v.localized
    (v,) = decide_round(ev, min_quiet_s=1.0, world_size=3)
    assert v.scope is Scope.JOB


def test_everyone_in_the_dataloader_is_a_job_wide_input_stall() -> None:
    ev = [_ev(r, 4, Stage.DATALOADER) for r in range(3)]
    (v,) = decide_round(ev, min_quiet_s=1.0, world_size=3)
    assert (v.failure, v.outliers, v.scope) == (Failure.INPUT_STALL, (), Scope.JOB)


def test_split_progress_is_inconclusive_and_progressing_rank_means_no_verdict() -> None:
    ev = [_ev(0, 10), _ev(1, 10), _ev(2, 9, Stage.IDLE), _ev(3, 9, Stage.IDLE)]
    (v,) = decide_round(ev, min_quiet_s=1.0, world_size=4)
    assert (v.failure, v.status, v.outliers) == (Failure.HANG, Status.INCONCLUSIVE, ())
    ev[0] = _ev(0, 10, quiet=0.2)
    assert decide_round(ev, min_quiet_s=1.0, world_size=4) == []
    with pytest.raises(ValueError):
        decide_round([], min_quiet_s=1.0, world_size=4)
