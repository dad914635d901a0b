"""Batch tuning's pre-ranking: which candidates are worth a trial, after a probe.

``memory_estimate`` lists the batch-tuning candidates (``batch_candidates``: per allowed
checkpointing mode, powers of two up to the largest batch predicted to fit, each with
the throughput model's tokens/s per GPU, fastest first). Without a probe every candidate
is timed by a trial, exactly as listed. With probes (short measured runs of the plan's
precision on the target GPU type, ``kfp_sagemaker_blackwell.planning.probe.Probe``, in
the JSON memory_estimate's ``probe`` takes; several as a list):

- each candidate's predicted tokens/s per GPU and peak memory are corrected by the
  nearest probe (its own configuration first, then the same checkpointing mode and the
  nearest micro-batch) with ``probe.correct`` / ``probe.correct_peak``: the measured /
  predicted ratio at the probe's configuration, applied to the candidate's prediction for
  the full run. A probe that measured no peak leaves the peaks predicted;
- a candidate whose corrected peak exceeds the plan's usable memory is dropped (a probe
  that used less memory than predicted adds no batch above the plan's largest);
- the rest are ranked by corrected tokens/s per GPU (on one instance type the cost per
  token ranks them the same way), and only the best ``trial_count`` are timed.

One probe scales every candidate's speed by one factor: it changes what they are
expected to reach and which of them fit, not their order; probes of two or more
micro-batches correct each candidate by its nearest, and can reorder them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from kfp_sagemaker_blackwell.catalog.spec import ModelSpec
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.common.kfp_values import integral
from kfp_sagemaker_blackwell.planning import estimator, planner
from kfp_sagemaker_blackwell.planning.memory_plan import MemoryPlan
from kfp_sagemaker_blackwell.planning.probe import Probe, correct, correct_peak
from kfp_sagemaker_blackwell.planning.training_setup import TrainingSetup

PREDICTED, CORRECTED = "predicted", "probe-corrected"
THROUGHPUT_SOURCE = "predicted by the throughput model (memory_estimate's plan)"
MEMORY_SOURCE = "predicted by the memory estimate (memory_estimate's plan)"


@dataclass(frozen=True)
class Ranked:
    """One candidate: its figures, each with its kind (predicted or probe-corrected)."""

    candidate: dict[str, Any]  # as memory_estimate listed it
    predicted_tokens_per_s_per_gpu: float
    tokens_per_s_per_gpu: float  # corrected when a probe corrected it, else predicted
    throughput_kind: str
    throughput_source: str
    predicted_peak_bytes: int
    peak_bytes: int
    memory_kind: str
    memory_source: str
    fits: bool
    throughput_probe: Probe | None = None  # what corrected the speed (None: predicted)
    throughput_factor: float | None = None  # its measured / predicted at its configuration
    memory_probe: Probe | None = None  # what corrected the peak (None: predicted)
    memory_factor: float | None = None
    rank: int = 0  # 1 = best of the fitting ones; 0: dropped for memory
    timed: bool = True  # a trial times it
    why_not: str = ""  # why no trial times it

    def item(self) -> dict[str, Any]:
        """The loop item a trial gets: the candidate as listed, and what corrected it."""
        if self.throughput_kind == PREDICTED and self.memory_kind == PREDICTED:
            return dict(self.candidate)
        return {**self.candidate,
                "corrected_tokens_per_s_per_gpu": round(self.tokens_per_s_per_gpu, 1),
                "throughput_kind": self.throughput_kind,
                "throughput_source": self.throughput_source,
                "predicted_peak_bytes": self.predicted_peak_bytes,
                "corrected_peak_bytes": self.peak_bytes, "memory_kind": self.memory_kind}


@dataclass(frozen=True)
class PreRank:
    plan: MemoryPlan
    probes: tuple[Probe, ...]
    usable_bytes: int
    trial_count: int
    ranked: list[Ranked] = field(default_factory=list)  # timed first, then the rest

    @property
    def trials(self) -> list[dict[str, Any]]:
        return [r.item() for r in self.ranked if r.timed]

    @property
    def dropped(self) -> list[Ranked]:
        return [r for r in self.ranked if not r.timed]


def request_of(plan: MemoryPlan) -> planner.Request:
    """The planner's request the plan was made for (its model, sequence, hardware,
    headroom and training settings), to ask the models about each candidate again."""
    training = {k: v for k, v in plan.training.items()
                if k in TrainingSetup.__dataclass_fields__}
    hw = planner.resolve_hardware(instance_type=plan.instance_type or None,
                                  gpu=None if plan.instance_type else plan.gpu,
                                  world_size=plan.world_size)
    return planner.Request(ModelSpec(**plan.model), plan.seq_length, hw,
                           precisions=tuple(plan.precisions), headroom=plan.headroom_fraction,
                           training=training)


def check_probes(plan: MemoryPlan, probes: tuple[Probe, ...]) -> None:
    """Every probe ran a runnable precision of the plan on the plan's GPU type: a
    UserError naming ``probe`` otherwise (a probe of another precision or GPU says
    nothing about these candidates)."""
    runnable = plan.runnable_precisions()
    for p in probes:
        if p.precision not in runnable or p.gpu_name() != plan.gpu:
            raise UserError(
                "probe", f"ran {p.precision} on {p.gpu_name()}; the candidates are "
                f"{', '.join(runnable) or 'none'} on {plan.gpu}.",
                f"probe {' or '.join(runnable) or 'a runnable precision'} on a {plan.gpu} "
                "instance (a probe of another precision or GPU type says nothing about "
                "these candidates), or leave probe empty.")


def nearest(probes: tuple[Probe, ...], precision: str, batch: int, ac: bool) -> Probe | None:
    """The probe of this configuration, else of the same checkpointing mode and the nearest
    micro-batch (then the larger world size: closer to the full run)."""
    same = [p for p in probes if p.precision == precision]
    return min(same, key=lambda p: ((p.batch_size, p.activation_checkpointing) != (batch, ac),
                                    p.activation_checkpointing != ac,
                                    abs(math.log2(p.batch_size / batch)), -p.world_size),
               default=None)


def _ranked(request: planner.Request, candidate: dict[str, Any],
            probes: tuple[Probe, ...]) -> Ranked:
    hw = request.hardware
    p, b, ac = (candidate["precision"], int(candidate["batch_size"]),
                bool(candidate["activation_checkpointing"]))
    setup = request.setup(p, b, ac)
    predicted = float(candidate["predicted_tokens_per_s_per_gpu"])
    peak = estimator.estimate_checked(setup, hw.gpu).peak_bytes
    speed = nearest(probes, p, b, ac)
    tps, kind, source, speed_factor = predicted, PREDICTED, THROUGHPUT_SOURCE, None
    if speed is not None:
        c = correct(speed, setup, hw.gpu, instance_type=hw.instance_type, predicted=predicted,
                    same_configuration=False)
        tps, kind, source, speed_factor = c.corrected, CORRECTED, c.source, c.factor
    memory = nearest(tuple(q for q in probes if q.peak_memory_bytes), p, b, ac)
    corrected_peak, memory_kind, memory_source, peak_factor = peak, PREDICTED, MEMORY_SOURCE, None
    if memory is not None:
        m = correct_peak(memory, setup, hw.gpu, same_configuration=False)
        corrected_peak, memory_kind, memory_source, peak_factor = (m.corrected, CORRECTED,
                                                                   m.source, m.factor)
    return Ranked(dict(candidate), predicted, tps, kind, source, peak, corrected_peak,
                  memory_kind, memory_source, corrected_peak <= request.usable_bytes,
                  speed, speed_factor, memory, peak_factor)


def prerank(plan: MemoryPlan, candidates: list[dict[str, Any]], probes: tuple[Probe, ...],
            trial_count: int) -> PreRank:
    """The candidates a trial times (see the module docstring): every one, as listed,
    without probes; with probes, the best ``trial_count`` (0: all) of those that fit."""
    candidates = integral(candidates)  # the trials go on as listed: batch 4, not 4.0
    if isinstance(trial_count, bool) or not isinstance(trial_count, int) or trial_count < 0:
        raise UserError("trial_count", f"{trial_count!r} is not a count.",
                        "give how many of the pre-ranked candidates to time (0: all).")
    request = request_of(plan)
    out = PreRank(plan, probes, request.usable_bytes, trial_count)
    if not probes:  # as listed: every candidate timed, in memory_estimate's order
        out.ranked.extend(replace(_ranked(request, c, ()), rank=i)
                          for i, c in enumerate(candidates, 1))
        return out
    check_probes(plan, probes)
    rows = [_ranked(request, c, probes) for c in candidates]
    fitting = sorted((r for r in rows if r.fits), key=lambda r: -r.tokens_per_s_per_gpu)
    if not fitting and rows:
        smallest = min(rows, key=lambda r: r.peak_bytes)
        raise UserError("probe", f"corrects every candidate's peak above the usable "
                        f"{request.usable_bytes / estimator.GiB:.1f} GiB per GPU (the smallest: "
                        f"{smallest.peak_bytes / estimator.GiB:.1f} GiB; {smallest.memory_source}).",
                        "train with activation checkpointing, a shorter sequence or more GPUs; "
                        "or check the probe's peak_memory_bytes (its peak per GPU, in bytes).")
    keep = len(fitting) if trial_count == 0 else trial_count
    for i, r in enumerate(fitting, 1):
        why = "" if i <= keep else f"ranked {i} of {len(fitting)}: trial_count={trial_count}"
        out.ranked.append(replace(r, rank=i, timed=not why, why_not=why))
    for r in rows:
        if not r.fits:
            out.ranked.append(replace(r, timed=False, why_not=(
                f"predicted not to fit after the probe's correction: "
                f"{r.peak_bytes / estimator.GiB:.1f} GiB > "
                f"{request.usable_bytes / estimator.GiB:.1f} GiB usable")))
    return out

