"""What the KFP component does, as a plain function (tested without KFP).

``params`` are the component's parameters by name: its signature
(``components/plan_training/component.py``) is their one declaration, whose defaults
the CLI fills in. Everything is validated before the first AWS call (the Price List
API and SearchTrainingPlanOfferings, only when ``region`` is given).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.catalog.precisions import PRECISIONS, parse_precision
from kfp_sagemaker_blackwell.common.documents import VERDICTS_SCHEMA, read_document
from kfp_sagemaker_blackwell.common.errors import UserError, unknown_name
from kfp_sagemaker_blackwell.components.plan_training import probes, report, search
from kfp_sagemaker_blackwell.planning import planner, pricing
from kfp_sagemaker_blackwell.planning.probe import Probe


@dataclass(frozen=True)
class PlanOutputs:
    result: search.SearchResult
    markdown: str
    candidates: str  # JSON
    choice: str  # JSON
    parameters: dict[str, Any] | None  # sagemaker_training's, None when nothing was chosen
    top_candidates: list[dict[str, Any]]
    validate_precision: str = ""  # above max_risk and worth a convergence comparison
    validation_runs: list[dict[str, Any]] = field(default_factory=list)


def _positive(name: str, value: Any, *, integer: bool = False, zero: bool = False) -> None:
    kinds = (int,) if integer else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value) \
        and (value >= 0 if zero else value > 0)
    if not ok:
        what = "an integer" if integer else "a number"
        raise UserError(name, f"={value!r} must be {what} {'>= 0' if zero else '> 0'}.",
                        "pass e.g. 100000000000 for training_tokens, 72 for deadline_hours "
                        "(0: none)." if not integer or name == "training_tokens" else "")


def _choices(name: str, values: Any, valid: tuple[str, ...],
             parse: Callable[[str], str] | None = None) -> tuple[str, ...]:
    """``values`` ("a,b" or ["a", "b"], lowered), each one of ``valid``; ``parse``: the
    one check of each (precisions: parse_precision, whose Precisions the search trusts)."""
    out = tuple(planner.parse_precisions(values or []))
    parsed, bad = [], []
    for v in out:
        try:
            parsed.append(parse(v) if parse else _member(v, valid))
        except ValueError:
            bad.append(v)
    if bad:
        raise UserError(name, f"{', '.join(map(repr, bad))} not one of {', '.join(valid)}.", "")
    return tuple(parsed)


def _member(value: str, valid: tuple[str, ...]) -> str:
    if value not in valid:
        raise ValueError(value)
    return value


def instance_counts(max_instance_count: int) -> tuple[int, ...]:
    """Powers of two up to ``max_instance_count``, and that count."""
    return tuple(sorted({1 << k for k in range(max_instance_count.bit_length())}
                        | {max_instance_count}))


def _instance_types(given: Any, book: pricing.PriceBook,
                    plans: bool) -> tuple[tuple[str, ...], list[str]]:
    """The candidate types and notes: as given (each known to the catalog), else every
    catalog type with a price (every one, when training plans are searched)."""
    if given:
        types = tuple(str(t).strip() for t in given if str(t).strip())
        for t in types:
            try:
                hardware.instance_type(t)  # a misspelt one gets a "did you mean"
            except ValueError as exc:
                raise unknown_name("instance_types", exc) from None
        return tuple(dict.fromkeys(types)), []
    if plans:
        return tuple(hardware.INSTANCE_TYPES), []
    priced = tuple(t for t in hardware.INSTANCE_TYPES if book.price(t) is not None)
    left = [t for t in hardware.INSTANCE_TYPES if t not in priced]
    notes = [f"not searched (no price; pass instance_hour_prices or list them in "
             f"instance_types to see them): {', '.join(left)}"] if left else []
    return priced, notes


@dataclass(frozen=True)
class Verdicts:
    """The convergence sweep's verdicts: precision -> where its pass comes from, the
    precisions it failed, and a note on each of those."""

    passed: dict[str, str]
    failed: frozenset[str]
    notes: list[str]


def read_verdicts(text_or_path: str) -> Verdicts:
    """The convergence sweep's verdicts (compare_convergence's ``verdicts`` output, a path
    or its JSON). A passed precision is ranked even above max_risk; a failed one is not
    planned; the others keep the risk ceiling. Each entry of ``precisions`` must be an
    object naming a precision the trainer knows (a UserError naming the entry otherwise)."""
    field = "convergence_verdicts"
    fix = "pass the verdicts output of compare_convergence."
    text = text_or_path
    if not text.lstrip().startswith("{"):
        try:
            text = Path(text_or_path).read_text(encoding="utf-8")
        except OSError as exc:
            raise UserError(field, f"cannot be read ({exc}).", fix) from None
    doc = read_document(text, schema=VERDICTS_SCHEMA, field=field, fix=fix)
    entries = doc.get("precisions") or []
    if not isinstance(entries, list):
        raise UserError(f"{field}.precisions", f"is a {type(entries).__name__} "
                        f"({json.dumps(entries)[:80]}), not a list of objects.",
                        'give a list like [{"precision": "fp8", "converges": true}]: ' + fix)
    passed: dict[str, str] = {}
    failed: set[str] = set()
    notes = []
    for i, p in enumerate(entries):
        where = f"{field}.precisions[{i}]"
        if not isinstance(p, dict):
            raise UserError(where, f"={json.dumps(p)[:80]} is not an object.",
                            'give {"precision": ..., "converges": true or false}: ' + fix)
        try:
            name = parse_precision(p.get("precision", ""), f"{where}.precision")
        except ValueError as exc:
            raise unknown_name(f"{where}.precision", exc) from None
        if p.get("converges"):
            passed[name] = (f"validated: the convergence sweep passed it (converges like "
                            f"{doc.get('baseline', 'the baseline')}; compare_convergence verdicts)")
        else:
            failed.add(name)
            why = "; ".join(p.get("reasons") or []) or p.get("verdict", "not compared")
            notes.append(f"{name} excluded: the convergence sweep did not pass it ({why})")
    if not passed:
        raise UserError(field, "pass no precision.", "fix the sweep's runs, "
                        "or leave convergence_verdicts out to plan every precision.")
    return Verdicts(passed, frozenset(failed), notes)


def _fallbacks(value: Any) -> tuple[tuple[str, int], ...]:
    """sagemaker_training's ``fallback_instances`` as (instance type, count; 0: the
    candidate's): the types are checked here; the rest by the training component."""
    if not value:
        return ()
    if not isinstance(value, list):
        raise UserError("fallback_instances", f"{value!r} is not a list.",
                        'give e.g. [{"InstanceType": "ml.p5.48xlarge", "InstanceCount": 2}].')
    out = []
    for i, entry in enumerate(value):
        name = entry.get("InstanceType", "") if isinstance(entry, dict) else entry
        try:
            hardware.instance_type(str(name))
        except ValueError as exc:
            raise unknown_name(f"fallback_instances[{i}].InstanceType", exc) from None
        count = entry.get("InstanceCount", 0) if isinstance(entry, dict) else 0
        if isinstance(count, float) and count.is_integer():
            count = int(count)  # KFP passes numbers inside lists of dicts as floats
        _positive(f"fallback_instances[{i}].InstanceCount", count, integer=True, zero=True)
        out.append((str(name), count))
    return tuple(out)


def goal_and_book(params: Mapping[str, Any], verdicts: str = ""
                  ) -> tuple[search.Goal, pricing.PriceBook, list[str]]:
    """The validated search goal, the price book and notes (no AWS call but the Price
    List API's, when a region is given)."""
    _positive("training_tokens", params["training_tokens"], integer=True)
    _positive("seq_length", params["seq_length"], integer=True)
    _positive("max_instance_count", params["max_instance_count"], integer=True)
    _positive("deadline_hours", params["deadline_hours"], zero=True)
    budget = pricing.Budget.parse(params["max_cost_usd"])
    _positive("runtime_margin", params["runtime_margin"], zero=True)
    for name in ("show_top", "probe_count", "startup_seconds", "max_batch_size"):
        _positive(name, params[name], integer=True, zero=True)
    if not 0 <= params["headroom"] < 1:
        raise UserError("headroom", f"={params['headroom']!r} must be in [0, 1).", "e.g. 0.05.")
    if params["rank_by"] not in search.RANK_BY:
        raise UserError("rank_by", f"={params['rank_by']!r}.", "use cost or time.")
    modes = _choices("capacity_modes", params["capacity_modes"], search.CAPACITY_MODES)
    if not modes:
        raise UserError("capacity_modes", "is empty.", f"list some of {search.CAPACITY_MODES}.")
    precisions = _choices("precisions", params["precisions"], PRECISIONS, parse_precision)
    probes = tuple(Probe.from_dict(p, field="probes") for p in params["probes"] or [])
    model = planner.model_from_parameters(params)
    max_risk = search.risk_level(params["max_risk"])
    _positive("keep_alive_seconds", params["keep_alive_seconds"], integer=True, zero=True)
    fallbacks = _fallbacks(params["fallback_instances"])
    sweep = read_verdicts(verdicts) if verdicts else Verdicts({}, frozenset(), [])
    notes = list(sweep.notes)
    book = pricing.PriceBook(params["region"], params["instance_hour_prices"])
    plans = "training-plan" in modes and bool(params["region"])
    types, more = _instance_types(params["instance_types"], book, plans)
    goal = search.Goal(
        model=model, training_tokens=params["training_tokens"], seq_length=params["seq_length"],
        instance_types=types, instance_counts=instance_counts(params["max_instance_count"]),
        capacity_modes=modes, precisions=precisions, deadline_hours=float(params["deadline_hours"]),
        max_cost_usd=budget.limit_usd, headroom=params["headroom"],
        runtime_margin=float(params["runtime_margin"]), rank_by=params["rank_by"],
        startup_seconds=params["startup_seconds"], max_batch_size=params["max_batch_size"],
        validated=sweep.passed, failed=sweep.failed, max_risk=max_risk,
        keep_alive_seconds=params["keep_alive_seconds"], fallback_instances=fallbacks,
        probes=probes)
    return goal, book, notes + more + search.probe_notes(goal, probes, "probes")


def top_candidates(result: search.SearchResult, count: int) -> list[dict[str, Any]]:
    """The ``count`` best distinct configurations (a capacity mode does not change what a
    probe measures), as training parameters plus the predicted tokens/s per GPU."""
    out: list[dict[str, Any]] = []
    seen = set()
    for cand in result.ranked:
        c = cand.config
        key = (c.instance_type, c.instance_count, c.precision, c.batch_size,
               c.activation_checkpointing)
        if key in seen:
            continue
        seen.add(key)
        out.append({"label": probes.label(*key),
                    "instance_type": c.instance_type, "instance_count": c.instance_count,
                    "precision": c.precision, "batch_size": c.batch_size,
                    "activation_checkpointing": c.activation_checkpointing,
                    "capacity": cand.capacity, "rank": len(out) + 1,
                    "predicted_tokens_per_s_per_gpu": round(c.tokens_per_s_per_gpu, 1),
                    "throughput_kind": c.throughput_kind})
        if len(out) == count:
            break
    return out


# The precision a convergence comparison measures the others against.
VALIDATION_BASELINE = "bf16"


def validation_runs(result: search.SearchResult) -> tuple[str, list[dict[str, Any]]]:
    """When the best row above the risk ceiling beats the choice by more than its band: its
    precision and the two short jobs that compare its convergence with the baseline's, on
    its instances, at one micro-batch both fit with activation checkpointing (the same
    tokens per step: comparable loss curves). ("", []) otherwise."""
    above = result.worth_validating()
    if above is None:
        return "", []
    c = above.config
    hw = planner.Hardware.of(hardware.INSTANCE_TYPES[c.instance_type], c.instance_count)
    request = planner.Request(result.goal.model, result.goal.seq_length, hw,
                              headroom=result.goal.headroom)
    batch = min(c.batch_size, planner.largest_batch(request, VALIDATION_BASELINE, True))
    if batch < 1 or not hw.gpu.supports(VALIDATION_BASELINE):
        result.notes.append(f"{c.precision} not validated first: {VALIDATION_BASELINE} does not "
                            f"fit on {c.instance_count} x {c.instance_type} to compare with")
        return "", []
    runs = [{"label": probes.label(c.instance_type, c.instance_count, p, batch, True),
             "precision": p, "instance_type": c.instance_type, "instance_count": c.instance_count,
             "batch_size": batch, "activation_checkpointing": True}
            for p in (VALIDATION_BASELINE, str(c.precision))]
    return str(c.precision), runs


def with_probes(goal: search.Goal, paths: list[str]
                ) -> tuple[search.Goal, list[probes.ProbeRun], list[str]]:
    """The goal re-ranking the probed candidates: only those whose probe completed, each
    corrected by its probe when it ran on the candidate's GPU."""
    runs = probes.read(paths)
    done = frozenset(r.candidate for r in runs if r.status == "completed")
    if not done:
        raise UserError("probe_series", "no probe completed: " + "; ".join(
            f"{probes.label(*r.candidate)}: {r.why_not}" for r in runs) + ".",
            "fix the probe jobs (their logs say why), or plan without probes.")
    used = [p for r in runs if (p := r.probe()) is not None]
    notes = [f"probe {probes.label(*r.candidate)} not chosen: {r.why_not}"
             for r in runs if r.candidate not in done]
    if not used:
        notes.append("no probe ran on a candidate's GPU: the probed candidates are ranked on "
                     "their predictions")
    notes += search.probe_notes(goal, used, "probe_series")
    return replace(goal, only=done, probes=goal.probes + tuple(used)), runs, notes


def run_component(verdicts: str = "", probe_series: Sequence[str] = (),
                  **params: Any) -> PlanOutputs:
    """The component's outputs for its parameters (``verdicts``: the convergence sweep's
    verdicts, a path or JSON text, "" when not given; ``probe_series``: the probes' series
    files, to re-rank the probed candidates on their measured speed)."""
    goal, book, notes = goal_and_book(params, verdicts)
    runs: list[probes.ProbeRun] = []
    if probe_series:
        goal, runs, more = with_probes(goal, list(probe_series))
        notes += more
    offer = None
    if "training-plan" in goal.capacity_modes and params["region"]:
        from kfp_sagemaker_blackwell.components.plan_training import offerings

        offer = offerings.searcher(params["region"])
    result = search.search(goal, book, offer)
    result.notes[:0] = notes + book.notes
    model = {k: params[k] for k in report.MODEL_PARAMETERS}
    chosen = result.chosen
    validate, checks = validation_runs(result) if not probe_series else ("", [])
    return PlanOutputs(
        result=result,
        markdown=report.markdown(result, params["show_top"]) + report.probe_markdown(result, runs),
        candidates=report.candidates_json(result), choice=report.choice_json(result, model),
        parameters=(report.training_parameters(chosen, model, goal.seq_length,
                                               goal.max_cost_usd) if chosen else None),
        top_candidates=top_candidates(result, params["probe_count"]),
        validate_precision=validate, validation_runs=checks)
