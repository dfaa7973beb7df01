"""The checkpoint gate's wire format: one rank's flags as int64 words, combined job-wide.

Before any change of gate state every rank's :class:`~scout_core.decision.gate.LocalFlags`
are combined with one ``MAX`` reduction (:func:`scout_core.decision.agreement.reduce_max`)
on a diagnostic group. Each flag is one word (any rank's flag wins); the step, the
digest of the recipes checked and the digest of the gate state travel twice, once
negated, so the fold sees both their maximum and their minimum and can tell that the
ranks disagree (:func:`merge_flags` is the same fold as a pure function, for tests
and for reasoning). Disagreement raises :class:`~scout_core.errors.ProtocolError` on
every rank: a gate never guesses which rank is right.
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
"""The number of words :func:`words` returns."""


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
    """Turn the MAX-reduced words back into :class:`JobFlags`, checking agreement
    (the words may come from :func:`combine` or from a seat of a boundary vote,
    :mod:`scout_core.decision.vote`)."""
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
    """Combine ``local`` with every other rank's flags: one MAX reduction on ``group``.

    ``group`` must be a SCOUT diagnostic group spanning the whole job, never ``WORLD``
    or a training group. Raises :class:`ProtocolError` on every rank when the ranks
    disagree.
    """
    return fold_words(reduce_max(words(local), group))


def combine_outcome(outcome: Outcome, *, group: dist.ProcessGroup) -> Outcome:
    """The job-wide outcome of a check every rank ran (the full-catalog sweep).

    SDC anywhere wins, then any hang, inconclusive or missing result (not clean);
    clean only when every rank was clean. One MAX reduction on ``group``.
    """
    outcome = Outcome(outcome)
    sdc, unclean = reduce_max(
        [int(outcome is Outcome.SDC), int(outcome is not Outcome.CLEAN)], group
    )
    if sdc:
        return Outcome.SDC
    return Outcome.INCONCLUSIVE if unclean else Outcome.CLEAN
