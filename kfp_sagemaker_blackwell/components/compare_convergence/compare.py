"""Convergence comparison of a precision sweep against its baseline (numbers, no pictures).

Precision effects at small scale are smaller than seed-to-seed noise, so the
comparison is paired: each run is compared with the baseline run of the same
seed (same data order and initialisation, see the trainer), on the baseline's
steps (or tokens), after the same smoothing. Where several seeds exist, the
difference is also set against the baseline's seed-to-seed spread.

Per precision (mean over its paired seeds):

- ``final_loss_diff``: mean loss over the final window (last ``final_window`` of
  the aligned points) minus the baseline's, absolute and relative;
- ``worst_divergence_rel``: the largest smoothed (precision - baseline) / baseline
  after warm-up, and its step;
- ``diverged``: worst divergence above ``divergence_tolerance_rel``, or a loss that
  ends well above its own minimum while the baseline's does not;
- ``nan``: a non-finite loss anywhere;
- ``speedup``: steady-state tokens/s over the baseline's, measured when both runs
  were timed on the target GPU; otherwise (emulated numerics, a CPU, another GPU) the
  throughput model's prediction for the target GPU and each run's configuration
  (``kfp_sagemaker_blackwell.planning.throughput``), labelled "predicted";
- ``memory_ratio``: peak memory over the baseline's; ``gap_to_floor``: final loss
  minus the data's entropy floor when the trainer logged one.

Verdict: pass when the run completed, has no NaN, did not diverge and its final
loss is at most ``max(loss_tolerance_abs, loss_tolerance_rel * baseline)`` above the
baseline (with seeds: or within ``seed_spread_factor`` x the baseline's seed spread).
A run with no baseline run of the same seed is "not compared" (never a fail): the
comparison must be paired.

Recommended: walking up the risk order (``RISK``: bf16 < fp8 < fp8-current /
fp8-block < mxfp8 < nvfp4), a riskier passing precision replaces the safer one only
when it is at least ``min_speedup_gain`` (5%) faster; ``Comparison.recommendation``
says why in one sentence ("nvfp4 is predicted 3% faster than fp8 for this model: not
worth the risk").
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.catalog.precisions import (
    PRECISIONS,
    RISK,  # the risk order, shared with plan_training
    Precision,
)
from kfp_sagemaker_blackwell.catalog.spec import ModelSpec
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.common.losses import final_loss
from kfp_sagemaker_blackwell.common.step_series import Series
from kfp_sagemaker_blackwell.components.compare_convergence.records import (
    NOT_COMPARED,
    Comparison,
    LeftOut,
    Pair,
    Result,
    Run,
    Settings,
    run_from_series,
)
from kfp_sagemaker_blackwell.planning import throughput
from kfp_sagemaker_blackwell.planning.training_setup import TrainingSetup


def smooth(y: np.ndarray, window: int) -> np.ndarray:
    """Centred moving average; the window shrinks at the ends (no phase shift)."""
    if window <= 1 or len(y) < 3:
        return y.astype(float).copy()
    c = np.concatenate([[0.0], np.cumsum(y, dtype=float)])
    idx = np.arange(len(y))
    half = window // 2
    lo = np.clip(idx - half, 0, len(y))
    hi = np.clip(idx + half + 1, 0, len(y))
    return (c[hi] - c[lo]) / (hi - lo)


def _precision_order(p: str) -> tuple[int, str]:
    return (PRECISIONS.index(p) if isinstance(p, Precision) else 99, p)


def _pair(base: Run, cand: Run, st: Settings) -> tuple[Pair | None, str]:
    x_name = "step"
    bx, cx = base.step.astype(float), cand.step.astype(float)
    if st.align_by == "tokens":
        if np.isfinite(base.tokens).all() and np.isfinite(cand.tokens).all() and len(
                base.tokens) and len(cand.tokens):
            bx, cx, x_name = base.tokens, cand.tokens, "tokens"
    if len(bx) == 0 or len(cx) == 0:
        return None, "no step lines to compare"
    lo, hi = max(bx.min(), cx.min()), min(bx.max(), cx.max())
    grid_mask = (bx >= lo) & (bx <= hi)
    x = bx[grid_mask]
    if len(x) < 3:
        return None, (f"its {x_name}s ({cx.min():g}-{cx.max():g}) and the baseline's "
                      f"({bx.min():g}-{bx.max():g}) overlap on fewer than 3 logged points")
    span_b = bx.max() - bx.min()
    coverage = (min(cx.max(), bx.max()) - bx.min()) / span_b if span_b > 0 else 1.0
    base_y = base.loss[grid_mask]
    cand_y = np.interp(x, cx, cand.loss)
    n = len(x)
    window = st.smoothing_window or max(1, round(0.05 * n))
    window = window if window % 2 else window + 1
    bs, cs = smooth(base_y, window), smooth(cand_y, window)
    final_b, final_c = final_loss(base_y, st.final_window), final_loss(cand_y, st.final_window)
    start = min(int(st.warmup * n), n - 1)
    rel = (cs[start:] - bs[start:]) / np.where(np.abs(bs[start:]) > 0, np.abs(bs[start:]), 1.0)
    i = int(np.argmax(rel))
    return Pair(cand.seed, x, x_name, base_y, cand_y, bs, cs, final_b, final_c, float(rel[i]),
                float(x[start + i]), float(coverage)), ""


def _group_runs(series: list[Series], problems: list[str]) -> dict[str, list[Run]]:
    """Runs by precision, each group sorted by seed; a duplicate (precision, seed) is an error."""
    runs: dict[str, list[Run]] = {}
    seen: dict[tuple[str, int | None], str] = {}
    for s in series:
        run = run_from_series(s)
        if not run.precision:
            problems.append(f"{s.source}: the series says no precision; left out.")
            continue
        key = (run.precision, run.seed)
        if key in seen:
            raise UserError(
                "series", f"two series for precision {run.precision} and seed {run.seed}: "
                f"{seen[key]} and {s.source}.",
                "pass one series per precision and seed (a retried run: keep the last).")
        seen[key] = s.source
        runs.setdefault(run.precision, []).append(run)
    for group in runs.values():
        group.sort(key=lambda r: (r.seed is None, r.seed or 0))
    return runs


def _healthy_baseline(runs: dict[str, list[Run]], baseline: str, problems: list[str]) -> list[Run]:
    base_runs = runs.get(baseline, [])
    healthy = [r for r in base_runs if not r.failed and r.nan_step is None]
    if not base_runs:
        problems.append(f"the baseline precision {baseline} is not among the series "
                        f"({', '.join(sorted(runs, key=_precision_order)) or 'none'}): "
                        "nothing can be compared.")
    elif not healthy:
        r = base_runs[0]
        why = f"NaN loss at step {r.nan_step}" if r.nan_step is not None else (
            f"status {r.status}" + (f": {r.failure_reason}" if r.failure_reason else ""))
        problems.append(f"the baseline {baseline} run failed ({why}): nothing can be compared.")
    return healthy


def compare(series: list[Series], settings: Settings, *,
            input_problems: list[str] | None = None,
            left_out: list[LeftOut] | None = None) -> Comparison:
    """Compares the series with checked settings (:meth:`Settings.from_parameters`);
    ``input_problems`` (e.g. unreadable files) make it partial; ``left_out``: the files
    they concern, named by the reports."""
    st = settings
    if not series:
        raise UserError("series", "no series were given: nothing to compare"
                        + (f" ({'; '.join(input_problems)})." if input_problems else "."),
                        "pass the parse_logs series of each precision (dsl.Collected).")
    problems: list[str] = list(input_problems or [])
    runs = _group_runs(series, problems)
    baseline = st.baseline
    healthy_base = _healthy_baseline(runs, baseline, problems)
    base_by_seed = {r.seed: r for r in healthy_base}
    target = st.gpu
    results: dict[str, Result] = {}
    base_mem = _nanmean([r.peak_memory_gib for r in healthy_base])
    for precision in sorted(runs, key=_precision_order):
        group = runs[precision]
        res = Result(precision, emulated=any(r.emulated for r in group), runs=group,
                     seeds=[r.seed for r in group], status=_group_status(group))
        results[precision] = res
        res.tokens_per_s = _nanmean([r.tokens_per_s for r in group])
        res.peak_memory_gib = _nanmean([r.peak_memory_gib for r in group])
        floors = [r.entropy_floor for r in group if r.entropy_floor is not None]
        _judge(res, group, base_by_seed, st, precision == baseline)
        if floors and math.isfinite(res.final_loss):
            res.gap_to_floor = res.final_loss - float(np.mean(floors))
        _speed(res, baseline, target, healthy_base)
        if math.isfinite(res.peak_memory_gib) and math.isfinite(base_mem) and base_mem > 0:
            res.memory_ratio = res.peak_memory_gib / base_mem
    spread = _spread(healthy_base)
    for res in results.values():
        res.seed_spread = spread
        _verdict(res, st, baseline, bool(healthy_base))
    problems += _coverage_problems(runs, healthy_base, st)
    problems += _nothing_compared(results, baseline, bool(healthy_base))
    recommended, why = ("", "")
    if not problems:
        recommended, why = recommend(results, st, baseline)
    elif any(r.compared and r.precision != baseline for r in results.values()):
        why = "No recommendation: the comparison is partial (see the problems above)."
    else:
        why = "No recommendation: nothing was compared (see the problems above)."
    return Comparison(st, baseline, results, recommended, bool(problems), problems,
                      _notes(runs, results, target), runs, recommendation=why,
                      left_out=list(left_out or []))


def _coverage_problems(runs: dict[str, list[Run]], healthy_base: list[Run],
                       st: Settings) -> list[str]:
    longest = max((r.step.max() for g in runs.values() for r in g if len(r.step)), default=0)
    if not healthy_base:
        return []
    base_end = max(r.step.max() for r in healthy_base)
    if base_end < st.min_step_coverage * longest:
        return [f"the baseline ran to step {base_end} but other runs to step {longest}: runs "
                "are compared on the baseline's steps only."]
    return []


def _nothing_compared(results: dict[str, Result], baseline: str, have_baseline: bool) -> list[str]:
    """A sweep where no run could be paired with the baseline compared nothing."""
    others = [r for p, r in results.items() if p != baseline]
    if not have_baseline or not others or any(r.compared for r in others):
        return []
    return ["nothing was compared: no run of " + ", ".join(r.precision for r in others)
            + " shares a seed with a healthy baseline run (each is 'not compared'; see its "
            "notes)."]


def _notes(runs: dict[str, list[Run]], results: dict[str, Result],
           target: hardware.GPU) -> list[str]:
    notes: list[str] = []  # what emulated numerics mean is said once, by report.numerics_note
    if len({len(g) for g in runs.values()}) > 1:
        notes.append("precisions have different numbers of seeds; each is compared on the "
                     "seeds it shares with the baseline.")
    return notes


def _speed_of(r: Result, baseline: str) -> float:
    if r.precision == baseline:
        return 1.0
    return r.speedup if math.isfinite(r.speedup) else math.nan


def _best(group: list[Result], baseline: str) -> Result:
    return max(group, key=lambda r: (math.isfinite(_speed_of(r, baseline)),
                                     _speed_of(r, baseline) if math.isfinite(
                                         _speed_of(r, baseline)) else 0.0,
                                     -(r.final_loss_diff if math.isfinite(r.final_loss_diff)
                                       else 0.0)))


def recommend(results: dict[str, Result], st: Settings, baseline: str) -> tuple[str, str]:
    """(precision, one sentence why): the safest passing precision, replaced by a riskier
    passing one (``RISK``) only when that one is at least ``min_speedup_gain`` faster."""
    passing = [r for r in results.values() if r.passed]
    if not passing:
        return "", "No precision passed: nothing to recommend."
    ranks: dict[int, list[Result]] = {}
    for r in passing:
        ranks.setdefault(RISK.get(r.precision, 5), []).append(r)
    order = sorted(ranks)
    current = _best(ranks[order[0]], baseline)
    rejected: tuple[Result, float] | None = None
    step_up: tuple[Result, float] | None = None
    for rank in order[1:]:
        cand = _best(ranks[rank], baseline)
        gain = _speed_of(cand, baseline) / _speed_of(current, baseline) - 1.0
        if math.isfinite(gain) and gain >= st.min_speedup_gain:
            step_up, current, rejected = (current, gain), cand, None
        elif rejected is None or not math.isfinite(rejected[1]) or (
                math.isfinite(gain) and gain > rejected[1]):
            rejected = (cand, gain)
    return current.precision, _why(current, step_up, rejected, st, baseline)


def _how(*rs: Result) -> str:
    return "predicted" if any(r.speedup_predicted for r in rs) else "measured"


def _why(chosen: Result, step_up: tuple[Result, float] | None,
         rejected: tuple[Result, float] | None, st: Settings, baseline: str) -> str:
    thr = f"threshold {st.min_speedup_gain:.0%}"
    if rejected is not None:
        r, gain = rejected
        if not math.isfinite(gain):
            return (f"{chosen.precision} recommended: {r.precision} also passed but its "
                    f"speed-up is unknown ({r.speedup_source}), so it is not worth the risk.")
        return (f"{r.precision} is {_how(r, chosen)} {gain:+.0%} vs {chosen.precision} for this "
                f"model: not worth the risk ({thr}); {chosen.precision} recommended.")
    if step_up is not None:
        safer, gain = step_up
        return (f"{chosen.precision} is {_how(chosen, safer)} {gain:.0%} faster than "
                f"{safer.precision}, the next safer precision that passed ({thr}): "
                f"{chosen.precision} recommended.")
    if chosen.precision == baseline:
        return f"{baseline} is the only precision that passed."
    return f"{chosen.precision} is the safest precision that passed."


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def _spread(group: list[Run]) -> float:
    finals = []
    for r in group:
        n = len(r.loss)
        if n:
            w = max(1, math.ceil(0.1 * n))
            finals.append(float(np.mean(r.loss[-w:])))
    return float(np.std(finals, ddof=1)) if len(finals) >= 2 else math.nan


def _group_status(group: list[Run]) -> str:
    statuses = sorted({r.status for r in group})
    return statuses[0] if len(statuses) == 1 else ",".join(statuses)


def _judge(res: Result, group: list[Run], base_by_seed: dict[int | None, Run], st: Settings,
           is_baseline: bool) -> None:
    for r in group:
        step = r.nan_step
        if step is not None or r.status == "nan":
            res.nan = True
            res.reasons.append(f"NaN/inf loss from step {step} (run {r.label})"
                               if step is not None else f"NaN/inf loss (run {r.label}): "
                               f"{r.failure_reason}")
        elif r.failed:
            why = f"{r.status}" + (f": {r.failure_reason}" if r.failure_reason else "")
            res.reasons.append(f"run {r.label} did not train ({why})")
    if not base_by_seed:
        if not is_baseline:
            res.notes.append(f"{NOT_COMPARED}: no healthy baseline run to compare against")
        return
    pairs: list[Pair] = []
    unpaired: list[Run] = []
    for r in group:
        if r.failed or r.nan_step is not None:
            continue
        base = base_by_seed.get(r.seed)
        if base is None and len(base_by_seed) == 1 and len(group) == 1 and (
                r.seed is None or None in base_by_seed):
            base = next(iter(base_by_seed.values()))  # seeds unknown: one run each
            res.notes.append("seed unknown: paired with the only baseline run")
        if base is None:
            unpaired.append(r)
            continue
        pair, why = _pair(base, r, st)
        if pair is None:
            res.reasons.append(f"run {r.label}: {why}")
            continue
        if pair.coverage < st.min_step_coverage:
            res.reasons.append(
                f"run {r.label} is incomplete: it reached {pair.x[-1]:g} of the baseline's "
                f"{base.step.max() if pair.x_name == 'step' else base.tokens.max():g} "
                f"{pair.x_name}s ({pair.coverage:.0%})")
        pairs.append(pair)
    for r in unpaired:
        res.notes.append(
            f"{NOT_COMPARED}: run {r.label} (seed {r.seed}) has no baseline run with the same "
            f"seed (baseline seeds: {', '.join(sorted(map(str, base_by_seed)))}); the "
            "comparison must be paired")
    res.pairs = pairs
    if not pairs:
        return
    diffs = np.array([p.final_cand - p.final_base for p in pairs])
    res.final_loss = float(np.mean([p.final_cand for p in pairs]))
    res.baseline_final_loss = float(np.mean([p.final_base for p in pairs]))
    res.final_loss_diff = float(diffs.mean())
    if res.baseline_final_loss:
        res.final_loss_diff_rel = res.final_loss_diff / abs(res.baseline_final_loss)
    res.diff_seed_std = float(diffs.std(ddof=1)) if len(diffs) >= 2 else math.nan
    worst = max(pairs, key=lambda p: p.worst_rel)
    res.worst_divergence_rel, res.worst_divergence_at = worst.worst_rel, worst.worst_x
    res.diverged = worst.worst_rel > st.divergence_tolerance_rel
    rising_seeds = []
    for p in pairs:
        tail = p.cand_smooth[-max(1, math.ceil(st.final_window * len(p.x))):]
        base_tail = p.base_smooth[-len(tail):]
        rising = float(np.mean(tail)) > float(np.min(p.cand_smooth)) * (
            1 + st.divergence_tolerance_rel)
        base_rising = float(np.mean(base_tail)) > float(np.min(p.base_smooth)) * (
            1 + st.divergence_tolerance_rel)
        if rising and not base_rising:
            rising_seeds.append(p.seed)
    if rising_seeds:
        res.diverged = True
        res.reasons.append(f"loss rises at the end (seed {', '.join(map(str, rising_seeds))}) "
                           "while the baseline's does not")
    if res.diverged and worst.worst_rel > st.divergence_tolerance_rel:
        res.reasons.append(
            f"diverged: smoothed loss {worst.worst_rel:+.1%} off the baseline at "
            f"{worst.x_name} {worst.worst_x:g} (tolerance {st.divergence_tolerance_rel:.0%})")


def _setup(run: Run, precision: str) -> TrainingSetup | None:
    """The run's configuration as the throughput model needs it (None when the series
    does not carry the model and the batch)."""
    t = run.training
    model, batch, seq = t.get("model"), t.get("batch_size"), t.get("seq_length")
    if not isinstance(model, dict) or not isinstance(batch, int) or not isinstance(seq, int):
        return None
    try:
        spec = ModelSpec(**{k: v for k, v in model.items() if k in ModelSpec.__dataclass_fields__})
        accum = t.get("grad_accum_steps")
        return TrainingSetup(spec, batch, seq, precision, bool(t.get("activation_checkpointing")),
                             run.world_size, gradient_accumulation_steps=accum
                             if isinstance(accum, int) and accum > 0 else 1).validate()
    except (TypeError, ValueError, UserError):
        return None


def _timed_on(runs: list[Run]) -> str:
    """The GPU all these runs were timed on with real numerics ("" if not all one GPU)."""
    names = set()
    for r in runs:
        if r.emulated or not r.gpu:
            return ""
        try:
            names.add(hardware.gpu(r.gpu).name)
        except ValueError:
            return ""
    return names.pop() if len(names) == 1 else ""


def _speed(res: Result, baseline: str, target: hardware.GPU, healthy_base: list[Run]) -> None:
    precision = res.precision
    if precision == baseline:
        res.speedup, res.speedup_source = 1.0, "baseline"
        return
    base_tps = _nanmean([r.tokens_per_s for r in healthy_base])
    timed = _timed_on(res.runs + healthy_base)
    if timed and math.isfinite(res.tokens_per_s) and math.isfinite(base_tps) and base_tps > 0:
        res.measured_speedup, res.measured_on = res.tokens_per_s / base_tps, timed
        if timed == target.name:
            res.speedup, res.speedup_source = res.measured_speedup, f"measured on {timed}"
            return
    known = isinstance(precision, Precision)  # the series' name, converted once (run_from_series)
    if known and not target.supports(precision):
        res.speedup_source = f"{precision} is not supported on {target.name}"
        res.reasons.append(f"{precision} does not run on {target.name}")
        return
    run = next((r for r in res.runs if _setup(r, precision)), None) if known else None
    base = next((r for r in healthy_base if _setup(r, baseline)), None)
    if run is None or base is None or not known:
        res.speedup_source = ("unknown: the series do not say the model and batch the "
                              "throughput model needs" if known
                              else f"unknown: {precision} is not a known precision")
        return
    p = throughput.predict(_setup(run, precision), target)  # type: ignore[arg-type]
    b = throughput.predict(_setup(base, baseline), target)  # type: ignore[arg-type]
    res.speedup = p.tokens_per_s_per_gpu / b.tokens_per_s_per_gpu
    res.speedup_source = (f"predicted on {target.name} by the throughput model for the run's "
                          f"configuration ({p.bound}-bound)")
    if res.measured_on:
        res.notes.append(f"measured {res.measured_speedup:.2f}x on {res.measured_on}")


def _verdict(res: Result, st: Settings, baseline: str, have_baseline: bool) -> None:
    if res.pairs and math.isfinite(res.final_loss_diff):
        tol = max(st.loss_tolerance_abs, st.loss_tolerance_rel * abs(res.baseline_final_loss))
        how = (f"{st.loss_tolerance_rel:.1%} of the baseline's final loss"
               if tol > st.loss_tolerance_abs else f"{st.loss_tolerance_abs:g} absolute")
        if math.isfinite(res.seed_spread) and st.seed_spread_factor > 0:
            noise = st.seed_spread_factor * res.seed_spread
            if noise > tol:
                tol, how = noise, (f"{st.seed_spread_factor:g} x the baseline's seed spread "
                                   f"{res.seed_spread:.4g}")
        res.tolerance = tol
        if res.final_loss_diff > tol:
            res.reasons.append(
                f"final loss {res.final_loss_diff:+.4g} ({res.final_loss_diff_rel:+.2%}) above "
                f"{baseline}; tolerance {tol:.4g} ({how})")
    if res.precision == baseline and have_baseline and not res.reasons:
        res.verdict = "pass"
        return
    if not res.pairs and not res.reasons and res.precision != baseline:
        res.verdict = NOT_COMPARED  # nothing failed, nothing was paired: see res.notes
        return
    res.verdict = "pass" if (res.pairs and not res.reasons) else "fail"


def verdict_rows(cmp: Comparison) -> list[dict[str, Any]]:
    """One plain dict per precision (the JSON verdicts, the tables)."""
    rows = []
    for p, r in cmp.results.items():
        rows.append({
            "precision": p, "baseline": p == cmp.baseline, "emulated": r.emulated,
            "verdict": r.verdict, "reasons": r.reasons, "notes": r.notes,
            "seeds": [s for s in r.seeds], "status": r.status,
            "final_loss": _j(r.final_loss), "baseline_final_loss": _j(r.baseline_final_loss),
            "final_loss_diff": _j(r.final_loss_diff),
            "final_loss_diff_rel": _j(r.final_loss_diff_rel),
            "diff_seed_std": _j(r.diff_seed_std), "seed_spread": _j(r.seed_spread),
            "tolerance": _j(r.tolerance), "worst_divergence_rel": _j(r.worst_divergence_rel),
            "worst_divergence_at": _j(r.worst_divergence_at), "diverged": r.diverged,
            "nan": r.nan, "speedup": _j(r.speedup), "speedup_source": r.speedup_source,
            "speedup_predicted": r.speedup_predicted,
            "measured_speedup": _j(r.measured_speedup), "measured_on": r.measured_on,
            "memory_ratio": _j(r.memory_ratio), "tokens_per_s": _j(r.tokens_per_s),
            "peak_memory_gib": _j(r.peak_memory_gib), "gap_to_floor": _j(r.gap_to_floor),
            "recommended": p == cmp.recommended,
        })
    return rows


def _j(x: float) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None
