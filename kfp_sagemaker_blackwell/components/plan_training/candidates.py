"""The search's records: the goal, a configuration, a candidate, the result, and how
candidates rank.

``Goal`` (what to train, by when, for how much), ``Config`` and ``Candidate`` (a
configuration and its time, cost and risk), ``Misfit`` / ``Unpriced`` (why one is left
out), ``SearchResult``, and the ranking (``rank_key``, ``spread``, ``break_ties``);
``search.py`` fills them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.catalog.precisions import RISK_WORDS
from kfp_sagemaker_blackwell.catalog.spec import ModelSpec
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.planning import estimator, pricing
from kfp_sagemaker_blackwell.planning.probe import Probe
from kfp_sagemaker_blackwell.planning.uncertainty import Band

CAPACITY_MODES = ("on-demand", "spot", "training-plan")
RANK_BY = ("cost", "time")
KINDS = ("predicted", "probed", "measured")
ABOVE_CEILING = "above max_risk"


@dataclass(frozen=True)
class Goal:
    """What the user asks (validated by ``kfp_sagemaker_blackwell.components.plan_training.launcher``)."""

    model: ModelSpec
    training_tokens: int
    seq_length: int
    instance_types: tuple[str, ...]
    instance_counts: tuple[int, ...]
    # The component's parameters of these names, checked (no defaults here: the
    # signature's are the one declaration, filled in by its CLI and cli.declared).
    capacity_modes: tuple[str, ...]
    precisions: tuple[str, ...]  # (): every precision each GPU runs
    deadline_hours: float  # 0: none
    max_cost_usd: float  # 0: none
    headroom: float
    runtime_margin: float
    startup_seconds: int  # billed before the first step (download, initialisation)
    max_batch_size: int  # the largest micro-batch to consider (0: the largest that fits)
    rank_by: str
    max_risk: int  # above it: ranked only when validated
    keep_alive_seconds: int  # the warm pool's retained time, billed after the job
    # precision -> where its risk verdict comes from (the convergence sweep's verdicts)
    validated: dict[str, str] = field(default_factory=dict)
    # precisions the convergence sweep failed: never planned
    failed: frozenset[str] = frozenset()
    # ResourceConfig.InstancePreferences after the first: (instance type, count; 0: the
    # candidate's); the worst case is the costliest
    fallback_instances: tuple[tuple[str, int], ...] = ()
    probes: tuple[Probe, ...] = ()
    # Only these configurations (instance type, count, precision, micro-batch,
    # checkpointing) are ranked: the probed candidates, when re-ranking (empty: all).
    only: frozenset[tuple[str, int, str, int, bool]] = frozenset()


@dataclass(frozen=True)
class Config:
    """One configuration on one instance type and count, before capacity and price."""

    instance_type: str
    instance_count: int
    gpu: str
    world_size: int
    precision: str
    batch_size: int
    activation_checkpointing: bool
    peak_bytes: int
    usable_bytes: int
    memory_kind: str
    memory_source: str
    tokens_per_s_per_gpu: float
    throughput_kind: str
    throughput_source: str
    tokens_per_step: int  # over all GPUs

    @property
    def gpu_memory_bytes(self) -> int:
        return hardware.GPUS[self.gpu].memory_bytes

    @property
    def headroom_bytes(self) -> int:
        """GPU memory the peak leaves free (at least ``Goal.headroom`` of it)."""
        return self.gpu_memory_bytes - self.peak_bytes

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_s_per_gpu * self.world_size


@dataclass(frozen=True)
class Candidate:
    """A configuration with a capacity mode: its time, cost, worst case and risk."""

    config: Config
    capacity: str
    steps: int
    seconds: float
    max_runtime_seconds: int
    max_wait_seconds: int
    price: pricing.Price | None
    cost: float | None  # what the run is predicted to cost (spot: at most)
    worst_cost: float | None  # what the spend guard checks
    risk: int
    risk_source: str  # starts with "validated" when the convergence sweep passed it
    offering: dict[str, Any] | None = None
    dropped: str = ""  # why it is not ranked ("" when it is)
    band: Band | None = None  # the time's (and cost's) error band
    spot: pricing.SpotEstimate | None = None  # spot: the expected cost and its overhead
    cost_at_on_demand: float | None = None  # spot: the run at the on-demand rate

    @property
    def validated(self) -> bool:
        return self.risk_source.startswith("validated")

    @property
    def hours(self) -> float:
        return self.seconds / 3600.0

    @property
    def currency(self) -> str:
        return self.price.currency if self.price else "USD"


@dataclass(frozen=True)
class Misfit:
    """A precision that does not fit on an instance type and count, even at batch 1."""

    instance_type: str
    instance_count: int
    precision: str
    peak_bytes: int
    usable_bytes: int


@dataclass(frozen=True)
class Unpriced:
    instance_type: str
    capacity: tuple[str, ...]
    why: str
    fastest_hours: float | None  # the fastest fitting configuration's predicted time


@dataclass
class SearchResult:
    goal: Goal
    ranked: list[Candidate]
    dropped: list[Candidate]
    misfits: list[Misfit]
    unpriced: list[Unpriced]
    notes: list[str]
    configurations: int = 0  # how many were asked of the models
    seconds: float = 0.0  # how long the search took
    tied: int = 0  # the first ``tied`` ranked rows are within the band of the best
    tie_band: Band | None = None  # the band of the best row before the tie was broken

    @property
    def chosen(self) -> Candidate | None:
        return self.ranked[0] if self.ranked else None

    @property
    def above_ceiling(self) -> Candidate | None:
        """The best row left out only for its risk (above max_risk, not validated), when it
        beats the chosen one (cheaper; faster when ranked by time)."""
        best = min((c for c in self.dropped if c.dropped.startswith(ABOVE_CEILING)),
                   key=lambda c: rank_key(c, self.goal.rank_by), default=None)
        chosen = self.chosen
        if best is None or (chosen is not None and
                            _metric(best, self.goal.rank_by) >= _metric(chosen, self.goal.rank_by)):
            return None
        return best

    def worth_validating(self) -> Candidate | None:
        """The above-ceiling row when it beats the chosen one by more than its own band (a
        convergence comparison is then worth its cost), else None."""
        best, chosen = self.above_ceiling, self.chosen
        if best is None or chosen is None or best.band is None:
            return None
        margin = 1 + spread(best, chosen)
        return best if _metric(best, self.goal.rank_by) * margin < \
            _metric(chosen, self.goal.rank_by) else None

    def problem(self) -> UserError | None:
        """Why nothing can be chosen (None when something is): the field and the fix."""
        return None if self.ranked else why_nothing(self)


# Offerings: (instance type, count, hours, deadline hours) -> SearchTrainingPlanOfferings'
# offerings (see kfp_sagemaker_blackwell.components.plan_training.offerings).
OfferingSearch = Callable[[str, int, int, float], list[dict[str, Any]]]


def c_precision(cand: Candidate) -> str:
    return str(cand.config.precision)


def rank_key(cand: Candidate, by: str = "cost") -> tuple[float, ...]:
    cost = cand.cost if cand.cost is not None else math.inf
    mode = CAPACITY_MODES.index(cand.capacity)
    if by == "time":
        return (cand.seconds, cost, cand.risk, mode)
    return (cost, cand.seconds, cand.risk, mode)


def _metric(cand: Candidate, by: str) -> float:
    if by == "time":
        return cand.seconds
    return cand.cost if cand.cost is not None else math.inf


def spread(best: Candidate, other: Candidate) -> float:
    """How far ``other`` may be from ``best`` and still be as good, by ``best``'s band: on the
    same GPU their shared miss cancels (``Band.same_gpu``), on another the whole band applies."""
    if best.band is None:
        return 0.0
    return best.band.same_gpu if best.config.gpu == other.config.gpu else best.band.typical


def break_ties(ranked: list[Candidate], by: str) -> tuple[list[Candidate], int]:
    """Rows within the band of the best one are a tie: they go first, ordered by lower risk (a
    precision the convergence sweep validated for this model counts as the baseline's), then
    fewer instances, then as ranked. A row on another GPU is a tie within the best row's band
    (its figure x (1 + the band's typical error)); a row on the same GPU only within the band
    between two rows of one GPU (``Band.same_gpu``: their shared miss cancels in the ratio).
    Returns the rows and how many tied."""
    if not ranked or ranked[0].band is None or not math.isfinite(_metric(ranked[0], by)):
        return ranked, min(len(ranked), 1)
    best = ranked[0]

    def limit(c: Candidate) -> float:
        return _metric(best, by) * (1 + spread(best, c))

    tied = [c for c in ranked if _metric(c, by) <= limit(c)]
    rest = [c for c in ranked if _metric(c, by) > limit(c)]
    tied.sort(key=lambda c: (0 if c.validated else c.risk, c.config.instance_count,
                             rank_key(c, by)))
    return tied + rest, len(tied)


def _best_per_group(cands: list[Candidate], by: str) -> list[Candidate]:
    best: dict[tuple[str, int, str, str], Candidate] = {}
    for cand in sorted(cands, key=lambda c: rank_key(c, by)):
        c = cand.config
        best.setdefault((c.instance_type, c.instance_count, cand.capacity, c.precision), cand)
    return list(best.values())


def risk_words(level: int) -> str:
    return RISK_WORDS.get(level, "unknown")


def why_nothing(result: SearchResult) -> UserError:
    """The UserError for a search that ranked nothing: what stopped it, and the fix."""
    goal = result.goal
    if not result.dropped and not result.unpriced:
        closest = min(result.misfits, key=lambda m: m.peak_bytes / m.usable_bytes, default=None)
        detail = (f" (closest: {closest.precision} on {closest.instance_count} x "
                  f"{closest.instance_type}, batch 1 with checkpointing needs "
                  f"{closest.peak_bytes / estimator.GiB:.1f} GiB of "
                  f"{closest.usable_bytes / estimator.GiB:.1f} usable)") if closest else ""
        return UserError("instance_types", f"no configuration fits in GPU memory{detail}.",
                         "add instance types with more GPU memory, raise max_instance_count, "
                         "shorten seq_length or choose a smaller model.")
    if not result.dropped:
        names = ", ".join(u.instance_type for u in result.unpriced)
        return UserError("instance_hour_prices", f"only unpriced instance types fit ({names}).",
                         "pass instance_hour_prices for them, or add priced instance types.")
    reasons = [c.dropped for c in result.dropped]
    fastest = min(result.dropped, key=lambda c: c.seconds)
    if all(r.startswith("misses the deadline") for r in reasons):
        return UserError("deadline_hours", f"no configuration finishes within "
                         f"{goal.deadline_hours:g} h: the fastest, {_short(fastest)}, takes "
                         f"{fastest.hours:,.1f} h.", "raise deadline_hours or "
                         "max_instance_count, or add faster instance types.")
    cheapest = min((c for c in result.dropped if c.dropped.startswith("over the budget")),
                   key=lambda c: c.worst_cost or math.inf, default=None)
    if cheapest is not None:
        return UserError("max_cost_usd", f"no configuration's worst case fits "
                         f"{pricing.money(goal.max_cost_usd)}: the cheapest, {_short(cheapest)}, "
                         f"{cheapest.dropped.split(': ', 1)[1]}.", "raise max_cost_usd or "
                         "deadline_hours, or lower runtime_margin.")
    return UserError("deadline_hours", "no configuration can run: " + reasons[0] + ".",
                     "raise max_instance_count or deadline_hours.")


def _short(cand: Candidate) -> str:
    c = cand.config
    return (f"{c.precision} on {c.instance_count} x {c.instance_type} ({cand.capacity}, "
            f"batch {c.batch_size}{', checkpointing' if c.activation_checkpointing else ''})")
