"""What the planner shows and hands on: the ranked table (Markdown), every candidate with
its figures' sources (JSON), and the chosen configuration in the training component's
parameter names (JSON).

Every figure of the table carries a key to its source: ``[T1]`` tokens/s (and the time
that follows from it), ``[B1]`` the time's and cost's error band, ``[M1]`` memory, ``[P1]``
price (a spot row's: its expected saving and interruptions), ``[R1]`` the precision's risk,
``[O1]`` a training-plan offering; the legend under the table says for each key whether
it is predicted, probed or measured, and by what. A plan with B200/B300 rows (predicted from
datasheets) adds the Blackwell check: the throughput model against NVIDIA's published
end-to-end figures (``planning/published.py``).
"""

from __future__ import annotations

import json
import math
from typing import Any

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.catalog.precisions import risk
from kfp_sagemaker_blackwell.components.plan_training import offerings, probes, search
from kfp_sagemaker_blackwell.components.plan_training.search import (
    Candidate,
    SearchResult,
    risk_words,
)
from kfp_sagemaker_blackwell.planning import pricing, published
from kfp_sagemaker_blackwell.planning.estimator import GiB

CHOICE_SCHEMA = "kfp-sagemaker/training-choice/v1"
CANDIDATES_SCHEMA = "kfp-sagemaker/training-candidates/v1"
# The model's parameters, as the training component names them.
MODEL_PARAMETERS = ("model_preset", "num_layers", "hidden_size", "num_heads", "num_kv_heads",
                    "ffn_hidden_size", "vocab_size")


class Legend:
    """Source keys (T1, M1, ...) in order of first use."""

    def __init__(self) -> None:
        self.keys: dict[tuple[str, str, str], str] = {}

    def key(self, letter: str, kind: str, source: str) -> str:
        k = (letter, kind, source)
        if k not in self.keys:
            n = sum(1 for x in self.keys if x[0] == letter) + 1
            self.keys[k] = f"{letter}{n}"
        return self.keys[k]

    def lines(self) -> list[str]:
        order = {letter: i for i, letter in enumerate("TBMPSOR")}
        return [f"- [{key}] {kind}: {source}" for (letter, kind, source), key in
                sorted(self.keys.items(), key=lambda kv: (order[kv[0][0]], kv[1]))]


def _price_kind(cand: Candidate) -> str:
    if cand.offering is not None:
        return "quoted"
    source = cand.price.source if cand.price else ""
    if "(yours)" in source:
        return "given"
    return "listed" if source.startswith("AWS Price List API") else "shipped"


def row_cells(cand: Candidate, legend: Legend) -> list[str]:
    c = cand.config
    t = legend.key("T", c.throughput_kind, c.throughput_source)
    m = legend.key("M", c.memory_kind, c.memory_source)
    if cand.offering is not None:
        p = legend.key("O", "quoted", _offering_text(cand))
    else:
        p = legend.key("P", _price_kind(cand), cand.price.source if cand.price else "no price")
    validated = cand.risk_source.startswith("validated")
    r = legend.key("R", "risk order, validated" if validated else "risk order",
                   cand.risk_source.removeprefix("validated: "))

    def money(x: float | None) -> str:
        return pricing.money(x, cand.currency) if x is not None else "n/a"

    band, b = "", ""
    if cand.band is not None:
        band, b = f" {cand.band.text()}", " " + legend.key("B", cand.band.source, cand.band.why)
    spot = " " + legend.key("S", "expected", cand.spot.source) if cand.spot else ""
    headroom = c.headroom_bytes / GiB
    return [
        f"{c.instance_count} x {c.instance_type}", cand.capacity, c.precision,
        str(c.batch_size), "on" if c.activation_checkpointing else "off",
        f"{c.tokens_per_s:,.0f} [{t}]", f"{duration(cand.seconds)}{band} [{t}{b}]",
        f"{'~' if cand.spot else ''}{money(cand.cost)}{band} [{t}{b} {p}{spot}]",
        f"{money(cand.worst_cost)} [{p}]",
        f"{headroom:.1f} GiB ({headroom * GiB / c.gpu_memory_bytes:.0%}) [{m}]",
        f"{cand.risk} {risk_words(cand.risk)} [{r}]",
    ]


def duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:,.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def parameters(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def _offering_text(cand: Candidate) -> str:
    o = offerings.summary(cand.offering or {})
    return (f"SearchTrainingPlanOfferings {o['training_plan_offering_id']}: UpfrontFee "
            f"{pricing.money(o['upfront_fee'], o['currency'])} for {cand.config.instance_count}"
            f" x {cand.config.instance_type} x {o['duration_hours']} h, {o['start']} to "
            f"{o['end']}, paid up front")


HEADER = ("| # | instances | capacity | precision | micro-batch | checkpointing | tokens/s | "
          "time | cost | worst case | memory headroom per GPU | risk |")


def shown(result: SearchResult) -> list[Candidate]:
    """The ranked candidates the table shows (every one: a spot row has its own expected
    cost)."""
    return list(result.ranked)


def table(result: SearchResult, top: int = 10) -> tuple[list[str], Legend]:
    """The ranked table's lines (header, rule, the ``top`` best) and its legend."""
    legend = Legend()
    lines = [HEADER, "|" + "---|" * 12]
    for i, cand in enumerate(shown(result)[:top], 1):
        lines.append(f"| {i} | " + " | ".join(row_cells(cand, legend)) + " |")
    return lines, legend


def markdown(result: SearchResult, top: int = 10) -> str:
    goal = result.goal
    m = goal.model
    out = [f"### Training plan: {parameters(m.total_params())} parameters on "
           f"{goal.training_tokens:,} tokens, "
           f"sequence {goal.seq_length:,}", ""]
    limits = [f"deadline {goal.deadline_hours:g} h" if goal.deadline_hours else "no deadline",
              f"budget {pricing.money(goal.max_cost_usd)}" if goal.max_cost_usd else "no budget"]
    out.append(f"{result.configurations:,} configurations of {len(goal.instance_types)} instance "
               f"types x {len(goal.instance_counts)} instance counts "
               f"({', '.join(map(str, goal.instance_counts))}) x precisions x micro-batches x "
               f"checkpointing, x capacity {', '.join(goal.capacity_modes)}; ranked by "
               f"{goal.rank_by}; {', '.join(limits)}; searched in {result.seconds:.1f} s.")
    out.append("")
    chosen = result.chosen
    if chosen is not None:
        out += [f"**Chosen:** {_sentence(chosen)}", ""]
        out += _ties(result)
    else:
        out += [f"**Nothing can be chosen:** {result.problem()}", ""]
    out += _verdicts(result) + _above_ceiling(result)
    lines, legend = table(result, top)
    rows = shown(result)
    if rows:
        more = len(rows) - min(top, len(rows))
        out += lines + (["", f"({more} more in the candidates JSON)"] if more > 0 else [])
        out += ["", f"Sources (time = {goal.startup_seconds:,} s start-up + tokens / tokens/s, "
                "from the same source; cost = instances x time x price, "
                "planning/pricing.py):", *legend.lines()]
        if any(c.capacity == "spot" for c in rows):
            out.append(f"- spot (~): expected cost; its worst case is max_wait_seconds = "
                       f"{search.SPOT_WAIT_FACTOR:g} x max_runtime_seconds at the on-demand "
                       "rate (what the spend guard checks)")
        if goal.keep_alive_seconds:
            out.append(f"- warm pool: every on-demand cost and worst case includes "
                       f"keep_alive_seconds = {goal.keep_alive_seconds:,} s of retained "
                       "instances (billed after the job)")
        out += _blackwell_section(result)
    out += _not_ranked(result)
    return "\n".join(out) + "\n"


def blackwell_check(result: SearchResult) -> list[published.Comparison]:
    """The published Blackwell figures against the throughput model, for a plan that shows
    B200/B300 rows (compute capability 10.x: predicted from datasheets); else none."""
    if not any(hardware.gpu(c.config.gpu).compute_capability >= (10, 0) for c in shown(result)):
        return []
    return list(published.check())


def _blackwell_section(result: SearchResult) -> list[str]:
    checks = blackwell_check(result)
    if not checks:
        return []
    lines = ["", "Blackwell check: the model against published figures (this project measured "
             "no Blackwell GPU; planning/published.py):"]
    lines += [f"- {c.label}: published {c.published_text()}, model {c.predicted_text()} "
              f"({c.difference_text()}) [{c.source.label}]" for c in checks]
    lines.append(f"- {checks[0].source.title}: {checks[0].source.url}. The model predicts this "
                 f"project's trainer at the nearest shape ({published.TRAINER_DIFFERENCES}); "
                 "each figure's configuration and the shape predicted are in the candidates "
                 "JSON (blackwell_check)")
    return lines


def _ties(result: SearchResult) -> list[str]:
    """The tie the choice broke, if any."""
    band = result.tie_band
    if result.tied < 2 or band is None:
        return []
    figure = "time" if result.goal.rank_by == "time" else "cost"
    return [f"**Tie:** rows 1-{result.tied} are within the {figure} band of the best "
            f"({band.text()} on another GPU, +/-{band.same_gpu:.1%} on its own, where the "
            f"model's miss is shared; {band.source}): ranked by lower risk (a precision the "
            "convergence sweep validated counts as the baseline), then fewer instances.", ""]


def _verdicts(result: SearchResult) -> list[str]:
    """What the convergence verdicts changed above the risk ceiling: which path the plan
    took (a precision they passed is ranked; one they failed is not planned) and why."""
    goal = result.goal
    passed = sorted(p for p in goal.validated if risk(p) > goal.max_risk)
    failed = sorted(p for p in goal.failed if risk(p) > goal.max_risk)
    if not passed and not failed:
        return []
    chosen = result.chosen
    said = [f"{', '.join(passed)} passed the convergence comparison: ranked above max_risk "
            f"{goal.max_risk} {risk_words(goal.max_risk)}"] if passed else []
    said += [f"{', '.join(failed)} failed it: not planned, the plan keeps to the ceiling"] \
        if failed else []
    if chosen is not None:
        said.append(f"chosen: {chosen.config.precision}")
    return [f"**Convergence verdicts:** {'; '.join(said)}.", ""]


def _above_ceiling(result: SearchResult) -> list[str]:
    """The separate line for the best row left out for its risk alone."""
    above, chosen = result.above_ceiling, result.chosen
    if above is None:
        return []
    c = above.config
    goal = result.goal
    what = (f"{c.precision} ({c.instance_count} x {c.instance_type}, {above.capacity}, risk "
            f"{above.risk} {risk_words(above.risk)} > max_risk {goal.max_risk} "
            f"{risk_words(goal.max_risk)})")
    if chosen is None:
        gain = f"would cost {pricing.money(above.cost or 0, above.currency)}"
    elif goal.rank_by == "time":
        gain = f"would take {duration(chosen.seconds - above.seconds)} less"
    else:
        gain = f"would cost {pricing.money((chosen.cost or 0) - (above.cost or 0))} less"
    band = "its band"
    if above.band is not None and chosen is not None:
        same = above.config.gpu == chosen.config.gpu
        width = f"+/-{search.spread(above, chosen):.0%}"
        band = (f"the {width} band between two rows of one GPU ({above.band.source})" if same
                else f"its {width} band ({above.band.source})")
    if result.worth_validating():
        advice = (f"if validated, more than {band}: run the precision sweep first "
                  "(compare_convergence's verdicts as convergence_verdicts; plan_and_train "
                  "compares its convergence with bf16 before training), or raise max_risk.")
    else:
        advice = (f"if validated, but within {band}: not worth its risk; the precision sweep "
                  "(convergence_verdicts) or a higher max_risk would rank it.")
    return [f"**Above the risk ceiling:** {what} {gain} {advice}", ""]


def _sentence(cand: Candidate) -> str:
    c = cand.config
    money = pricing.money(cand.cost or 0, cand.currency)
    how = {"on-demand": "on-demand", "spot": "on spot (expected cost)",
           "training-plan": "on a training plan (paid up front)"}[cand.capacity]
    return (f"{c.instance_count} x {c.instance_type} {how}, {c.precision}, micro-batch "
            f"{c.batch_size}, activation checkpointing {'on' if c.activation_checkpointing else 'off'}"
            f": {cand.steps:,} steps in {duration(cand.seconds)} for {money} "
            f"({c.throughput_kind} tokens/s).")


def _not_ranked(result: SearchResult) -> list[str]:
    out: list[str] = []
    for u in result.unpriced:
        fastest = (f"; its fastest fitting configuration would take {u.fastest_hours:,.1f} h "
                   "(predicted)") if u.fastest_hours is not None else "; nothing fits on it"
        out.append(f"- unpriced, not ranked: {u.instance_type} ({', '.join(u.capacity)}): "
                   f"{u.why}{fastest}")
    by_reason: dict[str, list[Candidate]] = {}
    for cand in result.dropped:
        by_reason.setdefault(cand.dropped.split(":", 1)[0], []).append(cand)
    for reason, cands in by_reason.items():
        best = min(cands, key=lambda x: x.seconds if reason.startswith("misses") else
                   (x.worst_cost or math.inf))
        out.append(f"- {reason}: {len(cands)} (closest: {best.config.instance_count} x "
                   f"{best.config.instance_type} {best.capacity} {best.config.precision}, "
                   f"{best.dropped.split(': ', 1)[1]})")
    fits: dict[str, dict[str, list[int]]] = {}
    for mf in result.misfits:
        fits.setdefault(mf.instance_type, {}).setdefault(mf.precision, []).append(
            mf.instance_count)
    for where, precisions in fits.items():
        what = "; ".join(f"{p} on {', '.join(map(str, counts))} instance(s)"
                         for p, counts in precisions.items())
        out.append(f"- does not fit in GPU memory even at micro-batch 1 with checkpointing, "
                   f"{where}: {what}")
    out += [f"- {note}" for note in result.notes]
    return (["", "Not ranked, and why:", *out]) if out else []


def row(cand: Candidate) -> dict[str, Any]:
    """One candidate, every figure with its kind and source (JSON-ready)."""
    c = cand.config
    return {
        "instance_type": c.instance_type, "instance_count": c.instance_count, "gpu": c.gpu,
        "world_size": c.world_size, "capacity": cand.capacity, "precision": c.precision,
        "batch_size": c.batch_size, "activation_checkpointing": c.activation_checkpointing,
        "steps": cand.steps, "tokens_per_step": c.tokens_per_step,
        "tokens_per_s": round(c.tokens_per_s, 1),
        "tokens_per_s_per_gpu": round(c.tokens_per_s_per_gpu, 1),
        "throughput_kind": c.throughput_kind, "throughput_source": c.throughput_source,
        "hours": round(cand.hours, 3), "max_runtime_seconds": cand.max_runtime_seconds,
        "max_wait_seconds": cand.max_wait_seconds,
        "cost": _round(cand.cost), "worst_case_cost": _round(cand.worst_cost),
        "band": ({"source": cand.band.source, "typical": cand.band.typical,
                  "worst_too_fast": cand.band.worst_too_fast,
                  "runtime_margin": cand.band.runtime_margin, "why": cand.band.why}
                 if cand.band else None),
        "cost_low": _round(cand.cost * (1 - cand.band.typical)) if cand.band and cand.cost
        is not None else None,
        "cost_high": _round(cand.cost * (1 + cand.band.typical)) if cand.band and cand.cost
        is not None else None,
        "spot": ({"expected_cost": _round(cand.spot.cost.amount),
                  "cost_at_on_demand_rate": _round(cand.cost_at_on_demand),
                  "expected_interruptions": round(cand.spot.interruptions, 4),
                  "interruption_overhead_seconds": round(cand.spot.overhead_seconds, 1),
                  "source": cand.spot.source} if cand.spot else None),
        "currency": cand.currency,
        "price_per_instance_hour": _round(cand.price.per_instance_hour if cand.price else None),
        "price_source": cand.price.source if cand.price else "",
        "peak_bytes": c.peak_bytes, "usable_bytes": c.usable_bytes,
        "headroom_bytes": c.headroom_bytes, "memory_kind": c.memory_kind,
        "memory_source": c.memory_source, "risk": cand.risk, "risk_words": risk_words(cand.risk),
        "risk_source": cand.risk_source,
        "training_plan_offering": offerings.summary(cand.offering) if cand.offering else None,
        "dropped": cand.dropped,
    }


def _round(x: float | None) -> float | None:
    return round(x, 2) if x is not None else None


def candidates_json(result: SearchResult) -> str:
    return json.dumps({
        "schema": CANDIDATES_SCHEMA,
        "training_tokens": result.goal.training_tokens, "seq_length": result.goal.seq_length,
        "rank_by": result.goal.rank_by, "deadline_hours": result.goal.deadline_hours,
        "max_cost_usd": result.goal.max_cost_usd,
        "ranked": [row(c) for c in result.ranked],
        "dropped": [row(c) for c in result.dropped],
        "unpriced": [{"instance_type": u.instance_type, "capacity": list(u.capacity),
                      "why": u.why, "fastest_hours": u.fastest_hours} for u in result.unpriced],
        "misfits": [{"instance_type": m.instance_type, "instance_count": m.instance_count,
                     "precision": m.precision, "peak_bytes": m.peak_bytes,
                     "usable_bytes": m.usable_bytes} for m in result.misfits],
        "notes": result.notes, "configurations": result.configurations,
        "blackwell_check": [c.to_dict() for c in blackwell_check(result)],
    }, indent=1, sort_keys=True) + "\n"


def training_parameters(cand: Candidate, model: dict[str, Any], seq_length: int,
                        max_cost_usd: float) -> dict[str, Any]:
    """The chosen candidate as sagemaker_training's parameters. ``max_cost_usd``: the
    user's budget, else the planned worst case (rounded up to the dollar), so the
    training component's spend guard holds the run to what was planned."""
    c = cand.config
    budget = max_cost_usd or (math.ceil(cand.worst_cost) if cand.worst_cost is not None
                              and cand.currency == "USD" else 0.0)
    return {
        **{k: model[k] for k in MODEL_PARAMETERS},
        "instance_type": c.instance_type, "instance_count": c.instance_count,
        "precision": c.precision, "batch_size": c.batch_size, "seq_length": seq_length,
        "activation_checkpointing": c.activation_checkpointing,
        "max_steps": cand.steps, "max_runtime_seconds": cand.max_runtime_seconds,
        "use_spot": cand.capacity == "spot", "max_wait_seconds": cand.max_wait_seconds,
        "max_cost_usd": float(budget),
    }


def choice_json(result: SearchResult, model: dict[str, Any]) -> str:
    """The chosen configuration: the training component's parameters, what was predicted
    (with sources) and what the user still has to supply."""
    cand = result.chosen
    if cand is None:
        return json.dumps({"schema": CHOICE_SCHEMA, "chosen": False,
                           "problem": str(result.problem())}, indent=1) + "\n"
    needs = []
    if cand.capacity == "spot":
        needs.append("checkpoint_s3_uri: spot needs a checkpoint location to resume from")
    if cand.offering:
        needs.append("training_plan_arn: " + offerings.summary(cand.offering)["buy"])
    return json.dumps({
        "schema": CHOICE_SCHEMA, "chosen": True,
        "sagemaker_training": training_parameters(cand, model, result.goal.seq_length,
                                                  result.goal.max_cost_usd),
        "predicted": row(cand), "needs": needs,
    }, indent=1, sort_keys=True) + "\n"


def probe_markdown(result: SearchResult, runs: list[probes.ProbeRun]) -> str:
    """Predicted against probed, for each probed candidate."""
    if not runs:
        return ""
    goal = result.goal
    rank = {(c.config.instance_type, c.config.instance_count, c.config.precision,
             c.config.batch_size, c.config.activation_checkpointing): i
            for i, c in enumerate(shown(result), 1)}
    lines = ["", "#### Predicted against probed", "",
             "| candidate | probe ran on | status | predicted tokens/s per GPU there | probed "
             "| probed / predicted | rank now | used |", "|" + "---|" * 8]
    for r in runs:
        it, _, precision, batch, ac = r.candidate
        predicted = search.predicted_at(goal, it, precision, batch, ac, r.world_size)
        probed = f"{r.tokens_per_s_per_gpu:,.0f}" if r.tokens_per_s_per_gpu else "n/a"
        ratio = (f"{r.tokens_per_s_per_gpu / predicted:.3f}" if r.tokens_per_s_per_gpu
                 and r.used else "n/a")
        where = f"{r.world_size} x {r.gpu or 'CPU'}"
        lines.append(f"| {probes.label(*r.candidate)} | {where} | {r.status} | "
                     f"{predicted:,.0f} (predicted for {hardware_gpu(it)}) | {probed} | {ratio} | "
                     f"{rank.get(r.candidate, '-')} | {'yes' if r.used else 'no: ' + r.why_not} |")
    return "\n".join(lines) + "\n"


def hardware_gpu(instance_type: str) -> str:
    return hardware.INSTANCE_TYPES[instance_type].gpu
