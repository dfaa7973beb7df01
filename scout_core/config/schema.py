"""SCOUT's configuration schema: one flat, validated, frozen dataclass.

Contract: every knob is a field of :class:`Config` with a docstring under it, built from
Python, a file (:meth:`Config.from_file`), a framework's section
(:meth:`Config.from_mapping`) or ``SCOUT_<FIELD>`` variables (:meth:`Config.from_env`),
every value through one per-field check (:mod:`.checks`). It is flat on purpose: it maps
one-to-one onto environment variables, flags and a framework's section.
docs/configuration.md is generated from the field docstrings (:func:`fields_doc`), and a
test keeps it in step.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scout_core.config.checks import RECIPES, check, field_names
from scout_core.config.sources import env_overrides, read_file, values_from_mapping
from scout_core.errors import ConfigError

__all__ = ["Config", "fields_doc"]


@dataclass(kw_only=True, slots=True, frozen=True)
class Config:
    """Everything SCOUT can be told. Build with keywords; change with ``dataclasses.replace``."""

    enabled: bool = True
    """Master switch. A disabled config attaches nothing: no hooks, no observer, no records."""

    run_id: str | None = None
    """Run identity written into every evidence record; the run's records go to
    ``<report_dir>/<run_id>/``. ``None``: ``TORCHELASTIC_RUN_ID`` when torchrun was
    given one (plain torchrun's ``"none"`` is ignored), else a fresh id unique per
    launch (``scout-<UTC date>-<time>-<12 hex>``), agreed by every rank at ``enable``.
    1..128 letters, digits, ``.``, ``_`` or ``-``; the same on every rank."""

    report_dir: str = "scout-report"
    """Directory for evidence records; each rank appends to
    ``<run_id>/rank-<global rank>.jsonl`` in it (one directory per run)."""

    layers: str | None = None
    """Dotted module path (from the model root) of the ``ModuleList`` of repeated layers,
    e.g. ``"model.layers"``. ``None`` auto-detects the largest ``ModuleList`` of
    same-class blocks."""

    embedding: str | None = None
    """Dotted module path of the token embedding. ``None`` auto-detects it."""

    lm_head: str | None = None
    """Dotted module path of the LM head (output projection). ``None`` auto-detects it."""

    replay_interval: int = 20
    """Replay one hidden layer every this many optimizer steps, rotating through the
    layers (1..1,000,000)."""

    embedding_interval: int = 20
    """Replay the embedding every this many optimizer steps (1..1,000,000). Switch the
    recipe off through ``recipes``, not with 0."""

    lm_head_interval: int = 20
    """Replay the LM head every this many optimizer steps (1..1,000,000). Switch the
    recipe off through ``recipes``, not with 0."""

    optimizer_interval: int = 20
    """Replay the optimizer update on one slice every this many optimizer steps
    (1..1,000,000). Switch the recipe off through ``recipes``, not with 0."""

    router_interval: int = 20
    """Replay one MoE router every this many optimizer steps, rotating through the MoE
    layers (1..1,000,000). Only models with MoE layers have routers to replay."""

    expert_interval: int = 20
    """Replay the local experts of one MoE layer at one catalog representative every
    this many optimizer steps, rotating through the catalog (1..1,000,000)."""

    all_to_all_interval: int = 20
    """Replay one MoE layer's dispatch and combine all-to-all on SCOUT's expert-parallel
    groups every this many optimizer steps, rotating through the MoE layers
    (1..1,000,000). Only models with MoE layers under expert parallelism (a layout with
    an expert axis) have all-to-alls to replay."""

    moe_catalog: str | None = None
    """Path of the MoE shape catalog (``scout catalog discover``) whose representatives
    expert replay rotates through. ``None``: expert replay is off (with a warning when
    the model has MoE layers)."""

    spread_recipes: bool = True
    """Give each recipe its own phase within its interval, so that no step runs more
    than one recipe unless the intervals leave no free step (with the default
    intervals of 20: the optimizer at steps 4, 24 ..., the LM head at 9, the
    embedding at 14, a hidden layer at 19). ``false`` runs recipes of equal interval
    on the same step."""

    recipes: tuple[str, ...] = RECIPES
    """Replay recipes to run, any of ``hidden``, ``embedding``, ``lm_head``,
    ``optimizer``, ``router``, ``experts``, ``all_to_all`` (no repeats; the last three
    act only on MoE models). An empty list turns numerical replay off and leaves
    the hang observer."""

    variants: tuple[float, ...] = (0.1, 1.0, 10.0)
    """Input scale variants each replay runs, to widen value coverage (1 to 8 scales,
    each in 0.0001..10,000, no repeats)."""

    optimizer_slice: int = 65536
    """Elements in one optimizer-replay slice; the slice rotates over the parameters
    (1..67,108,864)."""

    custody_slices: int = 512
    """Parameter custody's rotation length (0..1,000,000; 0 is off): a rank signs its
    local parameters and their optimizer slots right after the optimizer step writes them
    and checks them before the next step, 1/``custody_slices`` of them per step on
    average, so every local element is checked once in this many steps. 1 checks every
    element every step, at two reads of them per step."""

    custody_every: int = 16
    """Parameter custody works at every this many optimizer steps (1..1,000,000; at most
    ``custody_slices``, a larger value acts as ``custody_slices``): it signs
    ``custody_every / custody_slices`` of the local elements then, and nothing in
    between. The rotation and the chance of seeing a one-time change stay those of
    ``custody_slices``; the per-step fixed part of custody's cost is paid once in this
    many steps."""

    referee_timeout_s: float = 60.0
    """How long a rank waits for its part of a referee exchange (1..3,600 s): where two
    copies disagree on a computed surface, a third rank recomputes the round; a referee
    that does not answer in time leaves the pair a group-scope verdict with the reason."""

    kappa: float = 5.0
    """Sensitivity of statistical C3: a peer is an outlier when its timing is more than
    ``kappa`` robust scales from the median (> 0 and <= 100)."""

    straggler_rounds: int = 2
    """Consecutive timing rounds in which the same rank must be the outlier before a
    straggler verdict (1..1,000)."""

    straggler_min_excess_s: float = 0.05
    """Minimum absolute excess over the peers' median, in seconds, for a timing outlier
    to count towards a straggler (0..3,600)."""

    straggler_min_ratio: float = 1.5
    """Minimum ratio of the outlier's time to the peers' median for a timing outlier to
    count towards a straggler (1..1,000)."""

    deterministic: bool = True
    """Run replay under deterministic algorithms (scoped to the replay), so equal inputs
    give bitwise-equal outputs on healthy peers."""

    replay_threads: int | None = None
    """Intra-op CPU threads during replay (1..1,024). ``None``: the peers agree on the
    minimum of their current thread counts, since BLAS may change path with the
    thread count."""

    observer: bool = True
    """Start the out-of-band hang observer (one CPU process per rank)."""

    hang_timeout_s: float = 60.0
    """Seconds of silent progress before the observer starts a hang diagnosis
    (1..86,400: a healthy step must never look like a hang)."""

    stage_timeout_s: float | None = None
    """Seconds a rank may stay inside one stage (dataloader, checkpoint I/O) before it
    counts as stalled (1..86,400). ``None`` uses ``hang_timeout_s``."""

    observer_addr: str | None = None
    """Host of the observers' own c10d store. ``None`` derives it under torchrun."""

    observer_port: int | None = None
    """Port of the observers' own c10d store (1..65535). ``None`` derives it under
    torchrun."""

    observer_join_timeout_s: float = 30.0
    """Seconds the observers wait for each other to join their group (1..3,600)."""

    on_hang: str = "report"
    """What to do after a hang verdict: ``report`` (write evidence only),
    ``dump_stacks`` (also dump every thread's stack) or ``terminate`` (also end the
    process with ``hang_exit_code`` so the launcher restarts the job)."""

    hang_exit_code: int = 86
    """Exit code used by ``on_hang = "terminate"`` (1..255; not 16 or 17, which
    Megatron-Core uses, nor 93, which nvidia-resiliency-ext uses)."""

    on_sdc: str = "recover"
    """What to do when replay's SDC verdict makes the checkpoint gate select the
    verified generation: ``recover`` (hold the selection until ``gate.recover``
    restores it in place) or ``terminate`` (every rank exits with ``sdc_exit_code``
    at that boundary, after torchelastic's error file, so the launcher restarts the
    job and ``session.resume()`` restores verified; needs ``checkpoint_dir``)."""

    sdc_exit_code: int = 87
    """Exit code used by ``on_sdc = "terminate"`` (1..255; not 16, 17 or 93)."""

    gate: bool = True
    """Run the checkpoint gate at replay boundaries: keep latest / candidate / verified
    in-memory checkpoints, certify them by clean replay cycles, and let
    ``session.recover`` restore the one recovery can trust."""

    checkpoint_dir: str | None = None
    """Directory for durable gate checkpoints (torch.distributed.checkpoint). ``None``
    keeps gate checkpoints in memory only."""

    catalog_size: int | None = None
    """K, the number of recipe checks in one catalog cycle (1..1,000,000). ``None`` derives it
    from the recipe catalog (rotated layers plus embedding, LM head, optimizer)."""

    peer_replication: bool = False
    """Also replicate each in-memory gate checkpoint to a peer, so a lost machine's
    state can be recovered."""

    gate_memory: str = "full"
    """Host memory the in-memory gate may hold per rank: ``full`` (latest, candidate and
    verified: up to 3x the model + optimizer state; a ``latest`` retrieval restores
    the last boundary) or ``lean`` (at most 2x: once a verified generation exists,
    routine captures are skipped and ``latest`` is the candidate, so a straggler or a
    clean-sweep recovery rolls back to the last cycle close)."""

    gate_capture_interval: int | None = None
    """Take a routine ``latest`` capture at most once every this many optimizer steps
    (1..1,000,000): an accepted boundary closer than that to the last capture copies
    nothing (its recipes still count toward the cycle; cycle closes always capture).
    ``None`` uses ``replay_interval``: one host copy per interval however the recipes
    are spread over it, so a ``latest`` retrieval restores at most that many steps back;
    1 captures at every accepted boundary."""

    def __post_init__(self) -> None:
        # Frozen: normalised values (list -> tuple, int -> float) go in through
        # object.__setattr__, which is how a frozen dataclass sets its own fields.
        for f in dataclasses.fields(self):
            value = check(type(self), f.name, getattr(self, f.name))
            object.__setattr__(self, f.name, value)
        if self.on_sdc == "terminate" and self.checkpoint_dir is None:
            raise ConfigError(
                "key 'on_sdc' is 'terminate' but 'checkpoint_dir' is not set: the restarted "
                "job could only resume from a durable verified generation"
            )

    # -- resolved views ---------------------------------------------------------------

    def named_run_id(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The run's name when one was given: ``run_id``, else ``TORCHELASTIC_RUN_ID``
        unless it is unset, empty or plain torchrun's ``"none"``; else ``None`` (then
        ``enable`` agrees on a fresh id, :func:`scout_core.records.runs.agree_run_id`)."""
        if self.run_id is not None:
            return self.run_id
        env = os.environ if environ is None else environ
        value = env.get("TORCHELASTIC_RUN_ID", "")
        return None if value.strip().lower() in {"", "none"} else value

    def resolved_run_id(self, environ: Mapping[str, str] | None = None) -> str:
        """The run id records carry, without talking to other ranks: :meth:`named_run_id`,
        else ``"scout"``. Inside a session it is always the agreed id: ``enable`` sets
        ``run_id`` on the session's config."""
        return self.named_run_id(environ) or "scout"

    def resolved_stage_timeout_s(self) -> float:
        """``stage_timeout_s`` when set, else ``hang_timeout_s``."""
        return self.hang_timeout_s if self.stage_timeout_s is None else self.stage_timeout_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict of every field (tuples become lists); ``from_mapping`` reads it back."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    # -- constructors -----------------------------------------------------------------

    @classmethod
    def from_mapping(
        cls,
        mapping: Mapping[str, Any],
        *,
        source: str = "config mapping",
        base: Config | None = None,
    ) -> Config:
        """Build a config from a mapping of field names to values (a file's table, a
        framework's ``"scout"`` section), on top of ``base`` (default: the defaults).

        Unknown keys and wrong types raise :class:`ConfigError` naming ``source`` and
        the key. Values must have the field's type: a list stands for a tuple and an
        int for a float, but strings are not parsed (that is what env overrides do).
        """
        values = values_from_mapping(cls, mapping, source=source)
        start = cls() if base is None else base
        return dataclasses.replace(start, **values)

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
    ) -> Config:
        """Read a ``.toml`` or ``.json`` file, then apply ``SCOUT_*`` env overrides.

        The file holds the config keys either at the top level or inside one
        ``[scout]`` table (TOML) / ``"scout"`` object (JSON). The ``scout`` table is
        used when the file has a top-level ``scout`` key, and then any other top-level
        keys are left alone, so the section can live inside a larger file.
        """
        mapping = read_file(Path(path))
        base = cls.from_mapping(mapping, source=str(path))
        return cls.from_env(base, environ=os.environ if environ is None else environ)

    @classmethod
    def from_env(
        cls, base: Config | None = None, environ: Mapping[str, str] | None = None
    ) -> Config:
        """Apply ``SCOUT_<FIELD>`` overrides from ``environ`` to ``base``.

        With no ``base``, ``SCOUT_CONFIG=<path>`` names a file to start from (its
        values, then these overrides); without it the defaults are the start.
        Values are parsed from text: bools ``1/0/true/false/yes/no/on/off``, ints,
        floats, comma-separated lists, and ``none`` or an empty value for ``None``
        (an empty value is an empty list for a list field). An unknown ``SCOUT_*``
        variable is logged as a warning with a "did you mean" hint and otherwise
        ignored: other tools (Scout APM) use the prefix too, and a job must not fail
        over their variables. A known key with a bad value is a :class:`ConfigError`.
        """
        env = os.environ if environ is None else environ
        if base is None:
            file = env.get("SCOUT_CONFIG")
            base = cls.from_mapping(read_file(Path(file)), source=file) if file else cls()
        overrides = env_overrides(cls, env)
        return dataclasses.replace(base, **overrides) if overrides else base


@functools.cache
def fields_doc() -> dict[str, str]:
    """Field name -> the docstring written under it in :class:`Config` (whitespace folded).

    Read from the source with :mod:`ast`, because a string under an assignment is not
    kept at runtime. ``docs/configuration.md`` is written from this.
    """
    tree = ast.parse(inspect.getsource(Config))
    cls = tree.body[0]
    assert isinstance(cls, ast.ClassDef)
    docs: dict[str, str] = {}
    body = cls.body
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return {name: docs.get(name, "") for name in field_names(Config)}
