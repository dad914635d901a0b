"""The search: which instances, precision, micro-batch, checkpointing and capacity train
this model on this many tokens cheapest (or fastest), within a deadline and a budget.

Every configuration (instance type x count x precision x micro-batch x activation
checkpointing) is asked of the project's two models, nothing new is modelled here:

- **fits?** ``kfp_sagemaker_blackwell.planning.planner`` (the memory estimate's largest batch
  per precision and checkpointing mode, and its per-GPU peak) at the given headroom;
- **how fast?** ``kfp_sagemaker_blackwell.planning.throughput.predict`` (tokens/s per GPU), corrected
  by a probe of the same precision, micro-batch and checkpointing on the same GPU when
  one is given (``kfp_sagemaker_blackwell.planning.probe``: the measured / predicted ratio
  at the probe's world size, applied to the prediction for the full run: "probe, then
  extrapolate");
- **what does it cost?** ``kfp_sagemaker_blackwell.planning.pricing``: a ``PriceBook`` price (yours,
  the AWS Price List API, or the shipped table, each with its source) through the one
  cost function ``pricing.cost``; a training plan's cost is the offering's
  ``UpfrontFee`` (``offerings``).

Capacity modes: ``on-demand`` (plus the warm pool's retained time,
``keep_alive_seconds``, billed after the job); ``spot`` (billed at a discount SageMaker
reports only after the job: its cost here is the expected one, ``pricing.spot_expected``:
the typical saving and the interruptions' overhead, each with its source; its worst case is
``max_wait_seconds`` at the on-demand rate, as the spend guard checks it);
``training-plan`` (paid up front: the cheapest offering SearchTrainingPlanOfferings has for
the run's hours).

**Risk ceiling.** A precision above ``max_risk`` (catalog/precisions.py's order; default
``DEFAULT_MAX_RISK``, the lowest level holding the formats validated in practice) is not
ranked unless the convergence sweep passed it: it is dropped with that reason, and the
report shows what the cheapest such row would save. A precision the sweep failed is not
planned at all.

**Uncertainty.** Every row carries its source's error band (``planning/uncertainty.py``):
its ``max_runtime_seconds`` (and so its worst case) uses the band's margin unless
``runtime_margin`` is given, and rows within the band of the best one are a tie, broken by
lower risk, then fewer instances.

A candidate is dropped, with its reason, when it misses the deadline, runs past what
one SageMaker job may run (28 days), or when its worst case (the training component's
spend guard: instances x ``max_runtime_seconds``, spot ``max_wait_seconds``, x the
price; a plan's fee) exceeds ``max_cost_usd``. An instance type without a price is
listed as unpriced, never ranked. Of the candidates that share instance type, count,
capacity and precision, only the best (by the ranking) is kept: the other micro-batch
and checkpointing choices of the same hardware are worse on every ranked figure.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.catalog.flags import TrainConfig, flag_default
from kfp_sagemaker_blackwell.catalog.precisions import RISK, RISK_WORDS, risk
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.common.training_job import MAX_RUNTIME_LIMIT_S
from kfp_sagemaker_blackwell.components.plan_training.candidates import (
    ABOVE_CEILING,
    CAPACITY_MODES,  # noqa: F401 (read from here)
    RANK_BY,  # noqa: F401 (read from here)
    Candidate,
    Config,
    Goal,
    Misfit,
    OfferingSearch,
    SearchResult,
    Unpriced,
    _best_per_group,
    break_ties,
    c_precision,
    risk_words,
    spread,  # noqa: F401 (read from here)
)
from kfp_sagemaker_blackwell.planning import estimator, planner, pricing, throughput
from kfp_sagemaker_blackwell.planning.probe import Probe, correct, fit_at_probe
from kfp_sagemaker_blackwell.planning.uncertainty import Band, band_for

# A spot job may wait for capacity and be interrupted: max_wait_seconds leaves as much
# time again as the run's max_runtime_seconds (SageMaker requires max_wait >= max_runtime).
SPOT_WAIT_FACTOR = 2.0
MEMORY_SOURCE = ("predicted by the memory estimate (components/memory_estimate: "
                 "calibrated on H200 runs, median 0.1% on held-out runs)")
# The formats validated in practice (bf16; FP8 with delayed or current scaling: the article's
# "start with FP8"); the default ceiling is the lowest risk level that holds them all.
VALIDATED_FORMATS = ("bf16", "fp8", "fp8-current")
DEFAULT_MAX_RISK = max(RISK[p] for p in VALIDATED_FORMATS)
# Steps between the trainer's checkpoints (its default): what a spot interruption loses.
CHECKPOINT_EVERY: int = flag_default(TrainConfig.__dataclass_fields__["checkpoint_every"])


def search(goal: Goal, book: pricing.PriceBook,
           offerings: OfferingSearch | None = None) -> SearchResult:
    """Every configuration of ``goal``, ranked (see the module docstring). ``offerings``:
    how training plans are searched (None: they are not; a note says so)."""
    start = time.perf_counter()
    result = SearchResult(goal, [], [], [], [], [])
    plan_configs: list[Config] = []
    for it in goal.instance_types:
        configs = _configurations(goal, it, result)
        result.configurations += len(configs)
        hourly = [c for c in goal.capacity_modes if c != "training-plan"]
        price = book.price(it)
        if hourly and price is None:
            fastest = min((_seconds(goal, c) for c in configs), default=None)
            result.unpriced.append(Unpriced(it, tuple(hourly), book.missing(it),
                                            fastest / 3600 if fastest is not None else None))
        elif hourly:
            for c in configs:
                for mode in hourly:
                    _keep(result, _hourly(goal, c, mode, price, book))  # type: ignore[arg-type]
        plan_configs += configs
    if "training-plan" in goal.capacity_modes:
        if offerings is None:
            result.notes.append("training-plan: not searched (no region: give region to search "
                                "SearchTrainingPlanOfferings)")
        else:
            for cand in _plan_candidates(goal, plan_configs, offerings, result.notes):
                _keep(result, cand)
    best = _best_per_group(result.ranked, goal.rank_by)
    result.tie_band = best[0].band if best else None
    result.ranked, result.tied = break_ties(best, goal.rank_by)
    result.dropped = _best_per_group(result.dropped, goal.rank_by)
    result.seconds = time.perf_counter() - start
    return result


def _precisions(goal: Goal, gpu: hardware.GPU) -> list[str]:
    wanted = goal.precisions or tuple(gpu.supported_precisions())
    return [p for p in wanted if gpu.supports(p) and p not in goal.failed]


def _batches(top: int, cap: int) -> list[int]:
    """Powers of two up to the largest batch that fits at full speed (capped), and that batch."""
    top = min(top, cap)
    return sorted({1 << k for k in range(top.bit_length())} | {top}) if top else []


def _configurations(goal: Goal, instance_type: str, result: SearchResult) -> list[Config]:
    """Every fitting configuration of ``instance_type``; misfits recorded in ``result``."""
    it = hardware.INSTANCE_TYPES[instance_type]  # a catalog name (plan_training.launcher checked it)
    gpu = it.gpu_spec
    skipped = [p for p in goal.precisions if not gpu.supports(p)]
    if skipped:
        result.notes.append(f"{instance_type} ({gpu.name}) does not run {', '.join(skipped)}")
    out: list[Config] = []
    for count in goal.instance_counts:
        hw = planner.Hardware.of(it, count)
        for p in _precisions(goal, gpu):
            # The goal was checked where it was made (plan_training.launcher.goal_and_book):
            # its model, sequence, precisions and headroom need no second check here.
            request = planner.Request(goal.model, goal.seq_length, hw, precisions=(p,),
                                      headroom=goal.headroom)
            cap, _ = planner.batch_cap(request)
            cap = min(cap, goal.max_batch_size or cap)
            found = []
            for ac in (False, True):
                for b in _batches(planner.full_speed_batch(request, p, ac), cap):
                    if not goal.only or (instance_type, count, p, b, ac) in goal.only:
                        found.append(_config(goal, request, p, b, ac))
            if not found and not goal.only:
                e = estimator.estimate_checked(request.setup(p, 1, True), gpu)
                result.misfits.append(Misfit(instance_type, count, p, e.peak_bytes,
                                             request.usable_bytes))
            out += found
    return out


def _config(goal: Goal, request: planner.Request, precision: str, batch: int,
            checkpointing: bool) -> Config:
    hw = request.hardware
    setup = request.setup(precision, batch, checkpointing)
    estimate = estimator.estimate_checked(setup, hw.gpu)
    peak = estimate.peak_bytes
    tps = throughput.predict_checked(setup, hw.gpu, instance_type=hw.instance_type).tokens_per_s_per_gpu
    kind, source = "predicted", throughput.source_for(hw.gpu)
    memory_kind, memory_source = "predicted", MEMORY_SOURCE
    if precision in ("mxfp8", "nvfp4"):
        memory_source += f"; {precision}: {planner.UNMEASURED_NOTE}"
    probe = _probe_for(goal, hw, precision, batch, checkpointing)
    if probe is not None:
        corrected = correct(probe, setup, hw.gpu, instance_type=hw.instance_type,
                            predicted=tps)
        tps, kind, source = corrected.corrected, probe.kind, corrected.source
        if probe.peak_memory_bytes and probe.world_size == hw.world_size:
            # the probe's figure is the allocator's (no CUDA context): the context added
            # back, as predicted, to compare with the GPU's memory like for like
            peak = probe.peak_memory_bytes + estimate.breakdown["cuda_context"]
            memory_kind = probe.kind
            memory_source = (f"{probe.kind}: peak reserved of {probe.source or 'a probe'} "
                             "+ the predicted CUDA context")
    return Config(hw.instance_type, max(1, hw.world_size // hw.gpus_per_node), hw.gpu.name,
                  hw.world_size, precision, batch, checkpointing, peak, request.usable_bytes,
                  memory_kind, memory_source, tps, kind, source,
                  batch * goal.seq_length * hw.world_size)


def _probe_for(goal: Goal, hw: planner.Hardware, precision: str, batch: int,
               checkpointing: bool) -> Probe | None:
    """The probe of this precision, micro-batch and checkpointing on this GPU (of this
    instance type and world size first, else the largest below it, when there are several)."""
    match = [p for p in goal.probes if p.matches(precision, batch, checkpointing, hw.gpu.name)]
    return max(match, key=lambda p: (p.instance_type == hw.instance_type,
                                     p.world_size == hw.world_size,
                                     p.world_size <= hw.world_size, p.world_size),
               default=None)


def probe_notes(goal: Goal, probes: Iterable[Probe], parameter: str) -> list[str]:
    """A note for each of ``probes`` (given in ``parameter``) whose own configuration the
    memory estimate says cannot fit where it ran (``planning.probe.fit_at_probe``: it
    contradicts the memory model; its speed still corrects its candidates)."""
    notes = []
    for p in probes:
        gpu = hardware.gpu(p.gpu_name())
        if not gpu.supports(p.precision):
            continue  # it matches no candidate (_probe_for), and has no estimate
        # the most GPUs of this type the goal plans on: how far fit_at_probe looks for
        # a world size on which the probe's configuration fits
        most = max((it.gpus_per_node * max(goal.instance_counts) for it in
                    (hardware.INSTANCE_TYPES[t] for t in goal.instance_types)
                    if it.gpu == gpu.name), default=p.world_size)
        hw = planner.Hardware(gpu, "", most, max(most, p.world_size))
        setup = planner.Request(goal.model, goal.seq_length, hw).setup(
            p.precision, p.batch_size, p.activation_checkpointing)
        fit = fit_at_probe(p, setup, gpu)
        if not fit.fits:
            notes.append(fit.warning(parameter))
    return notes


def predicted_at(goal: Goal, instance_type: str, precision: str, batch: int,
                 checkpointing: bool, world_size: int) -> float:
    """The throughput model's tokens/s per GPU for a configuration on ``world_size`` GPUs
    of ``instance_type`` (what a probe there is compared with)."""
    hw = planner.resolve_hardware(instance_type=instance_type)
    setup = planner.Request(goal.model, goal.seq_length, hw).setup(precision, batch,
                                                                    checkpointing)
    return throughput.predict(replace(setup, world_size=world_size), hw.gpu,
                              instance_type=instance_type).tokens_per_s_per_gpu


def _seconds(goal: Goal, c: Config) -> float:
    """The job's predicted billable time: start-up, then every step."""
    return goal.startup_seconds + _steps(goal, c) * c.tokens_per_step / c.tokens_per_s


def _runtime(goal: Goal, seconds: float, band: Band) -> int:
    """max_runtime_seconds: the steps' predicted time x (1 + the margin: ``runtime_margin``
    when given, else the row's band's), and start-up."""
    margin = goal.runtime_margin or band.runtime_margin
    return math.ceil(goal.startup_seconds + (seconds - goal.startup_seconds) * (1 + margin))


def _steps(goal: Goal, c: Config) -> int:
    return math.ceil(goal.training_tokens / c.tokens_per_step)


def _risk(goal: Goal, precision: str) -> tuple[int, str]:
    level = risk(precision)
    if precision in goal.validated:
        return level, goal.validated[precision]
    if goal.validated or goal.failed:
        return level, ("not validated: the convergence sweep did not compare it (risk order of "
                       "catalog/precisions.py)")
    return level, "not validated: no convergence sweep given (risk order of catalog/precisions.py)"


def risk_level(value: Any, field: str = "max_risk") -> int:
    """A risk level from its number (0-4) or its word (baseline, low, medium, higher, high);
    anything else is a UserError naming ``field`` with the accepted values."""
    text = str(value).strip().lower()
    for level, word in RISK_WORDS.items():
        if text in (word, str(level)):
            return level
    from kfp_sagemaker_blackwell.catalog.bounds import UnknownName

    exc = UnknownName(field, text, RISK_WORDS.values())
    raise UserError(field, exc.problem, exc.fix.rstrip(".") + f" (or its level, 0-{max(RISK_WORDS)}; "
                    "catalog/precisions.py's risk order).")


def _hourly(goal: Goal, c: Config, mode: str, price: pricing.Price,
            book: pricing.PriceBook | None = None) -> Candidate:
    seconds = _seconds(goal, c)
    band = band_for(c.gpu, c.throughput_kind)
    runtime = _runtime(goal, seconds, band)
    spot = mode == "spot"
    wait = math.ceil(runtime * SPOT_WAIT_FACTOR) if spot else 0
    retained = 0 if spot else goal.keep_alive_seconds  # billed after the job, per instance
    at_rate = pricing.cost(price, c.instance_count, seconds + retained).amount
    worst = max([pricing.cost(price, c.instance_count, (wait or runtime) + retained).amount]
                + _fallback_worst(goal, c, runtime + retained, book))
    level, why = _risk(goal, c.precision)
    estimate = None
    if spot:
        step_seconds = c.tokens_per_step / c.tokens_per_s
        estimate = pricing.spot_expected(
            price, c.instance_count, seconds, restart_seconds=goal.startup_seconds,
            checkpoint_interval_seconds=CHECKPOINT_EVERY * step_seconds)
    cand = Candidate(c, mode, _steps(goal, c), seconds, runtime, wait, price,
                     estimate.cost.amount if estimate else at_rate, worst, level, why,
                     band=band, spot=estimate, cost_at_on_demand=at_rate if spot else None)
    return replace(cand, dropped=_limits(goal, cand))


def _fallback_worst(goal: Goal, c: Config, seconds: float,
                    book: pricing.PriceBook | None) -> list[float]:
    """The worst cases of the fallback instances SageMaker may select instead (each for the
    same max_runtime_seconds, as sagemaker_training's spend guard checks them)."""
    out = []
    for itype, count in goal.fallback_instances:
        price = book.price(itype) if book is not None else None
        if price is not None:
            out.append(pricing.cost(price, count or c.instance_count, seconds).amount)
    return out


def _limits(goal: Goal, cand: Candidate) -> str:
    """Why the candidate cannot be chosen ("" when it can)."""
    if goal.deadline_hours and cand.hours > goal.deadline_hours:
        return f"misses the deadline: {cand.hours:,.1f} h > {goal.deadline_hours:g} h"
    if cand.max_runtime_seconds > MAX_RUNTIME_LIMIT_S:
        return (f"longer than one SageMaker job may run: max_runtime_seconds "
                f"{cand.max_runtime_seconds:,} > {MAX_RUNTIME_LIMIT_S:,} (28 days)")
    if cand.worst_cost is not None and cand.currency != "USD" and goal.max_cost_usd:
        return f"priced in {cand.currency}: max_cost_usd cannot be checked"
    if cand.worst_cost is not None and pricing.Budget(goal.max_cost_usd).over(cand.worst_cost):
        return (f"over the budget: worst case {pricing.money(cand.worst_cost)} (predicted "
                f"{pricing.money(cand.cost or 0)}) > max_cost_usd "
                f"{pricing.money(goal.max_cost_usd)}")
    if cand.capacity == "spot" and (goal.keep_alive_seconds or goal.fallback_instances):
        what = "keep_alive_seconds" if goal.keep_alive_seconds else "fallback_instances"
        return f"spot cannot run with {what}: SageMaker allows it on-demand only"
    if cand.risk > goal.max_risk and not cand.validated:
        return (f"{ABOVE_CEILING}: {c_precision(cand)} is risk {cand.risk} "
                f"{risk_words(cand.risk)} > max_risk {goal.max_risk} "
                f"{risk_words(goal.max_risk)}, and no convergence sweep passed it")
    return ""


def _keep(result: SearchResult, cand: Candidate) -> None:
    (result.dropped if cand.dropped else result.ranked).append(cand)


def _plan_candidates(goal: Goal, configs: Sequence[Config], offerings: OfferingSearch,
                     notes: list[str]) -> Iterable[Candidate]:
    """Per instance type and count, the fastest configuration on the cheapest offering
    for its hours (a plan's fee grows with its hours: a slower configuration of the same
    instances needs a longer, dearer plan)."""
    fastest: dict[tuple[str, int], Config] = {}
    for c in configs:
        key = (c.instance_type, c.instance_count)
        best = fastest.get(key)
        if best is None or (_seconds(goal, c), risk(c.precision)) < \
                (_seconds(goal, best), risk(best.precision)):
            fastest[key] = c
    for (it, count), c in sorted(fastest.items()):
        seconds = _seconds(goal, c)
        band = band_for(c.gpu, c.throughput_kind)
        runtime = _runtime(goal, seconds, band)
        if goal.deadline_hours and seconds / 3600 > goal.deadline_hours:
            continue  # the fastest misses the deadline: no plan to search for
        hours = math.ceil(runtime / 3600)
        found = offerings(it, count, hours, goal.deadline_hours)
        level, why = _risk(goal, c.precision)
        base = Candidate(c, "training-plan", _steps(goal, c), seconds, runtime, 0, None, None,
                         None, level, why, band=band)
        if not found:
            notes.append(f"training-plan: no offering of {count} x {it} for {hours} h"
                         + (f" ending within {goal.deadline_hours:g} h" if goal.deadline_hours
                            else ""))
            continue
        offer = min(found, key=lambda o: float(o.get("UpfrontFee") or 0))
        fee = float(offer.get("UpfrontFee") or 0)
        price = pricing.plan_price({**offer, "TotalInstanceCount": count,
                                    "TrainingPlanName": offer.get("TrainingPlanOfferingId")})
        cand = replace(base, price=price, cost=fee, worst_cost=fee, offering=offer)
        yield replace(cand, dropped=_limits(goal, cand))
