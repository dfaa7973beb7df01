"""The checkpoint gate's wire format: one rank's flags as int64 words, combined job-wide.

Contract: one ``MAX`` reduction combines every rank's flags before any gate state changes.
Any rank's flag wins; the step and both digests also travel negated, so a disagreement shows
and raises :class:`~scout_core.errors.ProtocolError` on every rank (docs/checkpoint_gate.md,
"Job-wide agreement"). :func:`merge_flags` is the same fold, pure.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.distributed as dist

from scout_core.decision.agreement import digest, reduce_max
from scout_core.decision.gate import JobFlags, LocalFlags, Outcome
from scout_core.errors import ProtocolError

__all__ = ["WIDTH", "combine", "combine_outcome", "fold_words", "merge_flags", "words"]

_NONE = -1  # wire value of "no recipes" (the rank has no result)
_FAR = 1 << 62  # neutral element for a max over negated values of absent entries
WIDTH = 12


def words(flags: LocalFlags) -> list[int]:
    """The int64 words :func:`combine` reduces with MAX (minimums ride negated)."""
    present = not flags.missing
    return [
        int(flags.missing),
        int(flags.sdc),
        int(flags.hang),
        int(flags.unclean),
        int(present and flags.closes),
        int(present and not flags.closes),
        flags.step,
        -flags.step,
        digest(flags.recipes) if present else _NONE,
        -digest(flags.recipes) if present else -_FAR,
        flags.state,
        -flags.state,
    ]


def fold_words(maxima: Sequence[int]) -> JobFlags:
    """MAX-reduced words (from :func:`combine` or a vote seat) as checked :class:`JobFlags`."""
    (missing, sdc, hang, unclean, closes, not_closes, s_hi, s_lo, r_hi, r_lo, g_hi, g_lo) = (
        int(w) for w in maxima
    )
    if s_hi != -s_lo:
        raise ProtocolError(
            f"gate boundary at different steps across the job ({-s_lo}..{s_hi}); "
            "every rank must reach the same replay boundary"
        )
    if g_hi != -g_lo:
        raise ProtocolError(
            f"gate state differs across the job at step {s_hi} "
            "(counter, accepted recipes or generations); refusing to change it"
        )
    present = r_hi != _NONE
    if present and r_hi != -r_lo:
        raise ProtocolError(
            f"ranks checked different recipes at step {s_hi}; every rank must run the same schedule"
        )
    if closes and not_closes:
        raise ProtocolError(
            f"ranks disagree about the recipe-cycle boundary at step {s_hi}; "
            "a cycle boundary is never guessed"
        )
    return JobFlags(
        step=s_hi,
        recipes=r_hi,
        missing=bool(missing),
        sdc=bool(sdc),
        hang=bool(hang),
        unclean=bool(unclean),
        closes=bool(closes),
    )


def merge_flags(flags: Sequence[LocalFlags]) -> JobFlags:
    """What :func:`combine` computes, as a pure function of every rank's flags."""
    if not flags:
        raise ValueError("merge_flags needs the flags of at least one rank")
    columns = zip(*(words(f) for f in flags), strict=True)
    return fold_words([max(c) for c in columns])


def combine(local: LocalFlags, *, group: dist.ProcessGroup) -> JobFlags:
    """Combine ``local`` with every rank's flags: one MAX reduction on ``group``, a SCOUT
    group over the whole job. :class:`ProtocolError` on every rank when they disagree."""
    return fold_words(reduce_max(words(local), group))


def combine_outcome(outcome: Outcome, *, group: dist.ProcessGroup) -> Outcome:
    """The job-wide outcome of the full-catalog sweep (one MAX reduction on ``group``): SDC
    anywhere wins; clean only when every rank was clean."""
    outcome = Outcome(outcome)
    sdc, unclean = reduce_max(
        [int(outcome is Outcome.SDC), int(outcome is not Outcome.CLEAN)], group
    )
    if sdc:
        return Outcome.SDC
    return Outcome.INCONCLUSIVE if unclean else Outcome.CLEAN
