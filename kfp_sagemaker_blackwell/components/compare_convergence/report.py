"""The comparison as people look at it: an HTML page with its images embedded (base64 PNG,
so it renders in the KFP UI offline), a Markdown summary, KFP metrics and JSON verdicts."""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Mapping
from typing import Any

from kfp_sagemaker_blackwell.common import markdown as md
from kfp_sagemaker_blackwell.common import report_page, run_context
from kfp_sagemaker_blackwell.common.documents import VERDICTS_SCHEMA
from kfp_sagemaker_blackwell.common.losses import DEFINITION as FINAL_LOSS_DEFINITION
from kfp_sagemaker_blackwell.common.losses import window_size
from kfp_sagemaker_blackwell.components.compare_convergence.compare import (
    NOT_COMPARED,
    Comparison,
    Pair,
    Result,
    verdict_rows,
)

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]


def label(r: Result, sep: str = " ") -> str:
    """A precision's name in tables and legends (what "emulated" means is said once, in
    ``numerics_note``, not next to every name)."""
    del sep
    return r.precision


def numerics_note(cmp: Comparison) -> str:
    """One sentence on emulated numerics for the runs that used them ("" when none did)."""
    emulated = [p for p, r in cmp.results.items() if r.emulated]
    if not emulated:
        return ""
    which = "All runs" if len(emulated) == len(cmp.results) else "Runs " + ", ".join(emulated)
    return (f"{which} used emulated numerics: the PyTorch backend reproduces each precision's "
            "rounding (quantise-dequantise of the GEMM inputs) on hardware that cannot run it "
            "natively (here: a CPU or a GPU without those tensor cores). Their losses are real "
            "measurements of that precision's numerics; their speed is not, so their speed-up "
            f"is predicted for {cmp.settings.target_gpu} by the throughput model "
            "(planning/throughput.py) from each run's model, batch, sequence, "
            "checkpointing and world size: predicted, not measured.")


def runs_on_target(cmp: Comparison, r: Result) -> bool | None:
    """Whether the target GPU can run this precision (None for a name hardware does not know)."""
    try:
        return cmp.settings.gpu.supports(r.precision)
    except ValueError:
        return None


def convergence_reasons(cmp: Comparison, r: Result) -> list[str]:
    """The verdict's reasons that are about convergence (not about the target GPU)."""
    target = runs_on_target(cmp, r)
    if target is not False:
        return list(r.reasons)
    gpu = cmp.settings.gpu.name
    return [why for why in r.reasons if why != f"{r.precision} does not run on {gpu}"]


def converges(cmp: Comparison, r: Result) -> bool | None:
    """Converges like the baseline: paired, and nothing but the target GPU failed it;
    None when it was not compared (no baseline run of the same seed)."""
    if r.passed:
        return True
    if not r.compared:
        return None
    return bool(r.pairs or r.precision == cmp.baseline) and not convergence_reasons(cmp, r)


def _fmt(x: float, spec: str = ".4g") -> str:
    return format(x, spec) if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def _colors(cmp: Comparison) -> dict[str, str]:
    """The baseline is black (drawn on top, dashed), the others take the palette."""
    others = [p for p in cmp.results if p != cmp.baseline]
    out = {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(others)}
    out[cmp.baseline] = "black"
    return out


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _final_window_start(pair: Pair, cmp: Comparison) -> float:
    """Where the final window starts; a one-point window is drawn half a step wide."""
    start = float(pair.x[-window_size(len(pair.x), cmp.settings.final_window)])
    if start == float(pair.x[-1]) and len(pair.x) > 1:
        start = (float(pair.x[-2]) + start) / 2
    return start


def _curve_style(cmp: Comparison, p: str) -> dict[str, Any]:
    """The baseline dashed and on top, so no other curve hides it."""
    if p == cmp.baseline:
        return {"linestyle": "--", "linewidth": 2.2, "zorder": 5}
    return {"linestyle": "-", "linewidth": 1.6, "zorder": 3}


def _loss_axes(ax: Any, cmp: Comparison, colors: dict[str, str], *, zoom: bool) -> list[float]:
    """Draws every run on ``ax`` (smoothed; faint raw); returns the final windows' losses."""
    tail: list[float] = []
    for p, res in cmp.results.items():
        for run in res.runs:
            if not len(run.step):
                continue
            pair = next((q for q in res.pairs if q.seed == run.seed), None)
            name = f"{p} seed {run.seed}" if len(res.runs) > 1 else p
            ax.plot(run.step, run.loss, color=colors[p], alpha=0.12, linewidth=0.8)
            if pair is None:
                ax.plot(run.step, run.loss, color=colors[p], linewidth=1.2, linestyle=":",
                        label=f"{name} (not paired)")
                continue
            y = pair.base_smooth if p == cmp.baseline else pair.cand_smooth
            ax.plot(pair.x, y, color=colors[p], label=name, **_curve_style(cmp, p))
            start = _final_window_start(pair, cmp)
            tail += [float(v) for v, x in zip(y, pair.x, strict=True)
                     if x >= start and math.isfinite(v)]
            if zoom:
                ax.axvspan(start, float(pair.x[-1]), color="#888", alpha=0.06, zorder=0)
    return tail


def _floors(cmp: Comparison) -> list[float]:
    return sorted({round(r.entropy_floor, 6) for res in cmp.results.values() for r in res.runs
                   if r.entropy_floor is not None})


def _x_name(cmp: Comparison) -> str:
    return next((q.x_name for r in cmp.results.values() for q in r.pairs), "step")


def loss_curves_figure(cmp: Comparison, colors: dict[str, str]) -> str:
    """Loss curves (left) and the final window zoomed in (right), both with a legend."""
    plt = _pyplot()
    fig, (ax, zoom) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    _loss_axes(ax, cmp, colors, zoom=False)
    tail = _loss_axes(zoom, cmp, colors, zoom=True)
    for floor in _floors(cmp):
        ax.axhline(floor, color="grey", linestyle=":", linewidth=1,
                   label=f"data entropy floor {floor:.4g}")
    x_name = _x_name(cmp)
    ax.set(xlabel=x_name, ylabel="training loss",
           title=f"Loss curves (smoothed; faint: raw); baseline {cmp.baseline} dashed")
    zoom.set(xlabel=x_name, title="Final window (shaded), where the final loss is measured")
    for axis in (ax, zoom):
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7, ncol=2)
    starts = [_final_window_start(q, cmp) for r in cmp.results.values() for q in r.pairs]
    ends = [float(q.x[-1]) for r in cmp.results.values() for q in r.pairs]
    if tail and starts:
        lo, hi = min(tail), max(tail)
        pad = (hi - lo) * 0.15 or abs(hi) * 0.01 or 0.01
        span = (max(ends) - min(starts)) or max(1.0, abs(max(ends)) * 0.1)
        zoom.set_xlim(min(starts) - 0.5 * span, max(ends) + 0.02 * span)
        zoom.set_ylim(lo - pad, hi + pad)
    return _png(fig)


def _difference_scale(ax: Any, diffs: list[float], tols: list[float]) -> None:
    """Linear when the differences are near the tolerance; symlog, labelled, when not."""
    from matplotlib import ticker

    big = max((abs(d) for d in diffs), default=0.0)
    tol = min(tols, default=0.0)
    if not tol or big <= 20 * tol:
        return
    ax.set_yscale("symlog", linthresh=tol)
    ax.yaxis.set_major_locator(ticker.SymmetricalLogLocator(base=10, linthresh=tol,
                                                            subs=[1.0, 2.0, 5.0]))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.3g}"))


def _tolerance_lines(ax: Any, windows: dict[str, tuple[float, float, float]],
                     colors: dict[str, str]) -> None:
    """Each tolerance over its final window; one black line when they are all the same."""
    same = len({round(t, 12) for _, _, t in windows.values()}) == 1
    for i, (p, (start, end, tol)) in enumerate(windows.items()):
        if same and i:
            continue
        ax.hlines(tol, start, end, color="black" if same else colors[p], linestyle=":",
                  linewidth=1.5, label=f"tolerance {tol:.3g}" + ("" if same else f" ({p})"))


def difference_figure(cmp: Comparison, colors: dict[str, str]) -> str:
    """Paired difference to the baseline; each tolerance drawn over the final window only,
    with the final-window mean difference it is compared with."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.4))
    diffs: list[float] = []
    tols: list[float] = []
    windows: dict[str, tuple[float, float, float]] = {}
    for p, res in cmp.results.items():
        if p == cmp.baseline:
            continue
        for i, pair in enumerate(res.pairs):
            d = pair.cand_smooth - pair.base_smooth
            diffs += [float(v) for v in d if math.isfinite(v)]
            ax.plot(pair.x, d, color=colors[p], linewidth=1.4,
                    linestyle=["-", "--", ":", "-."][i % 4],
                    label=p if i == 0 else None)
        if not res.pairs:
            continue
        start = min(_final_window_start(q, cmp) for q in res.pairs)
        end = max(float(q.x[-1]) for q in res.pairs)
        ax.axvspan(start, end, color="#888", alpha=0.06, zorder=0)
        if math.isfinite(res.tolerance):
            tols.append(res.tolerance)
            windows[p] = (start, end, res.tolerance)
        if math.isfinite(res.final_loss_diff):
            ax.plot([start, end], [res.final_loss_diff] * 2, color=colors[p], linewidth=5,
                    alpha=0.45, solid_capstyle="butt",
                    label=f"{p}: final-window mean {res.final_loss_diff:+.3g} "
                          f"({'converges' if converges(cmp, res) else 'FAIL'})")
    _tolerance_lines(ax, windows, colors)
    ax.axhline(0, color="black", linewidth=0.8)
    _difference_scale(ax, diffs, tols)
    ax.set(xlabel=_x_name(cmp), ylabel=f"loss - {cmp.baseline} loss (same seed)",
           title="Difference to the baseline; the tolerance applies to the mean over the "
                 "shaded final window")
    ax.grid(alpha=0.3)
    if diffs:
        ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    else:
        ax.text(0.5, 0.5, "nothing to compare (see the problems above)", ha="center",
                va="center", transform=ax.transAxes)
    return _png(fig)


def _bar_labels(cmp: Comparison) -> list[str]:
    return [p + ("\n(baseline)" if p == cmp.baseline else "") for p in cmp.results]


def speedup_figure(cmp: Comparison, colors: dict[str, str]) -> str:
    """Speed-up over the baseline: measured on the target GPU, or predicted for it (hatched)."""
    plt = _pyplot()
    names = list(cmp.results)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    speed = [cmp.results[p].speedup for p in names]
    bars = ax.bar(_bar_labels(cmp), [s if math.isfinite(s) else 0 for s in speed],
                  color=[colors[p] for p in names])
    for bar, p, s in zip(bars, names, speed, strict=True):
        res = cmp.results[p]
        predicted = res.speedup_predicted
        if predicted:
            bar.set_hatch("//")
            bar.set_alpha(0.6)
        runs = runs_on_target(cmp, res)
        ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(),
                (f"{s:.2f}x" if math.isfinite(s) else "n/a") + ("\n(predicted)" if predicted else "")
                + (f"\nnot on {cmp.settings.target_gpu}" if runs is False else ""),
                ha="center", va="bottom", fontsize=8)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel(f"throughput vs {cmp.baseline}")
    gpu = cmp.settings.target_gpu
    ax.set_title(f"Speed-up (hatched: predicted on {gpu} by the throughput model)"
                 if any(cmp.results[p].speedup_predicted for p in names)
                 else "Speed-up (measured tokens/s, after warm-up)")
    ax.margins(y=0.25)
    return _png(fig)


def memory_figure(cmp: Comparison, colors: dict[str, str]) -> str | None:
    """Measured peak memory per GPU; None (no figure) when nothing was measured."""
    names = list(cmp.results)
    mem = [cmp.results[p].peak_memory_gib for p in names]
    if not any(math.isfinite(m) for m in mem):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    bars = ax.bar(_bar_labels(cmp), [m if math.isfinite(m) else 0 for m in mem],
                  color=[colors[p] for p in names])
    for bar, m in zip(bars, mem, strict=True):
        ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(),
                f"{m:.1f} GiB" if math.isfinite(m) else "not measured", ha="center",
                va="bottom", fontsize=8)
    ax.set_ylabel("peak memory per GPU (GiB)")
    ax.set_title("Peak memory allocated per GPU (measured by the trainer)")
    ax.margins(y=0.2)
    return _png(fig)


FIGURES = {"loss_curves": loss_curves_figure, "difference": difference_figure,
           "speedup": speedup_figure, "memory": memory_figure}


def figures(cmp: Comparison) -> dict[str, str]:
    """name -> base64 PNG: loss curves, difference to baseline, speed-up, memory (when
    measured)."""
    colors = _colors(cmp)
    out: dict[str, str] = {}
    for name, draw in FIGURES.items():
        png = draw(cmp, colors)
        if png is not None:
            out[name] = png
    return out


def _reason_text(cmp: Comparison, r: Result) -> str:
    reasons = convergence_reasons(cmp, r)
    if reasons:
        return "; ".join(reasons)
    if not r.compared:
        return "; ".join(n for n in r.notes if n.startswith(NOT_COMPARED)) or NOT_COMPARED
    return "within tolerance"


def _diff_text(r: Result) -> str:
    if not math.isfinite(r.final_loss_diff):
        return "n/a"
    return f"{_fmt(r.final_loss_diff, '+.4g')} ({_fmt(r.final_loss_diff_rel * 100, '+.2f')}%)"


def _speed_text(r: Result) -> str:
    speed = _fmt(r.speedup, ".2f") + "x" if math.isfinite(r.speedup) else "n/a"
    return speed + (" (predicted)" if r.speedup_predicted else "")


def _seed_text(r: Result) -> str:
    seeds = [str(s) for s in r.seeds]
    if not seeds:
        return "n/a"
    return ", ".join(seeds) + (f" ({len(seeds)} seeds)" if len(seeds) > 1 else "")


def _yes_no(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def row_cells(cmp: Comparison, p: str, r: Result) -> dict[str, str]:
    """The verdict table's cells for one precision (the HTML and the Markdown share them)."""
    return {
        "precision": p + (" (baseline)" if p == cmp.baseline else "")
        + (" (recommended)" if p == cmp.recommended else ""),
        "converges": {True: "PASS", False: "FAIL", None: NOT_COMPARED.upper()}[
            converges(cmp, r)],
        "runs": _yes_no(runs_on_target(cmp, r)),
        "final loss": _fmt(r.final_loss),
        "diff vs baseline": _diff_text(r),
        "tolerance": _fmt(r.tolerance, ".3g"),
        "seed": _seed_text(r),
        "seed spread": _fmt(r.seed_spread),
        "worst divergence": _fmt(r.worst_divergence_rel * 100, "+.2f") + "%"
        if math.isfinite(r.worst_divergence_rel) else "n/a",
        "speed-up": _speed_text(r),
        "memory ratio": _fmt(r.memory_ratio, ".2f"),
        "gap to entropy floor": _fmt(r.gap_to_floor),
        "reason": _reason_text(cmp, r),
    }


def _headers(cmp: Comparison) -> dict[str, str]:
    return {"converges": "converges (vs baseline)",
            "runs": f"runs on {cmp.settings.target_gpu}"}


CSS = report_page.CSS

TITLES = {"loss_curves": "Loss curves", "difference": "Difference to the baseline",
          "speedup": "Throughput", "memory": "Memory"}


def figure_source(cmp: Comparison, name: str) -> str:
    """What a figure shows: measured (by what) or predicted (by what)."""
    if name == "speedup":
        predicted = [p for p, r in cmp.results.items() if r.speedup_predicted]
        if predicted:
            measured = [p for p in cmp.results if p not in predicted]
            return (f"Predicted for {cmp.settings.target_gpu} by the throughput model "
                    "(planning/throughput.py) for " + ", ".join(predicted)
                    + " (hatched bars)" + ("; measured steady-state tokens/s for "
                                           + ", ".join(measured) if measured else "") + ".")
        return ("Measured: steady-state tokens/s per GPU after warm-up, from the trainer's "
                "step lines.")
    return {
        "loss_curves": "Measured: the training loss each job's trainer logged (parse_logs "
                       "series), smoothed as in the settings below.",
        "difference": "Measured: each run's smoothed loss minus the baseline run's of the "
                      "same seed, from the logged losses.",
        "memory": "Measured: peak memory allocated per GPU, reported by the trainer.",
    }.get(name, "")


def context_rows(cmp: Comparison, given: Mapping[str, Any] | None,
                 now: Any = None) -> list[tuple[str, str]]:
    """The report's run context: what the pipeline passed and what the runs say."""
    metas = [{"run": r.label, "gpu": r.gpu, "world_size": r.world_size, "training": r.training}
             for group in cmp.runs.values() for r in group]
    return run_context.rows(given, metas, now=now)


def left_out_heading(cmp: Comparison) -> str:
    """"2 of 5 series files were left out (...)", or "" when none was."""
    n = len(cmp.left_out)
    if not n:
        return ""
    given = n + sum(len(g) for g in cmp.runs.values())
    contract = sum(lo.contract for lo in cmp.left_out)
    why = (f"{contract} broke the step-series contract" if contract == n else
           f"{contract} broke the step-series contract, {n - contract} could not be read"
           if contract else "could not be read")
    return (f"{n} of {given} series file{'s' if given > 1 else ''} "
            f"{'was' if n == 1 else 'were'} left out ({why}): not compared, not in the "
            "tables below")


def _summary_html(cmp: Comparison) -> list[str]:
    e = html.escape
    parts: list[str] = []
    if cmp.partial:
        parts.append("<div class='partial'><b>PARTIAL REPORT</b>: no recommendation. "
                     + "<br>".join(e(p) for p in cmp.problems) + "</div>")
    if cmp.left_out:
        parts.append(f"<div class='partial' id='left-out'><b>{e(left_out_heading(cmp))}</b>"
                     "<ul>" + "".join(f"<li><code>{e(lo.source)}</code>: {e(lo.problem)}</li>"
                                      for lo in cmp.left_out) + "</ul></div>")
    if cmp.recommended:
        r = cmp.results[cmp.recommended]
        how = (f"{_fmt(r.speedup, '.2f')}x {e(r.speedup_source)}"
               if r.speedup_source != "baseline" else "the baseline itself")
        parts.append(f"<p class='recommendation'><b>Recommended precision: {e(label(r))}</b>"
                     f" ({how}).</p>")
    elif not cmp.partial:
        parts.append("<p class='recommendation'><b>No precision passed.</b></p>")
    if cmp.recommendation:
        parts.append(f"<p>{e(cmp.recommendation)}</p>")
    for note in [numerics_note(cmp), *cmp.notes]:
        if note:
            parts.append(f"<p class='note'>{e(note)}</p>")
    return parts


def _settings_html(cmp: Comparison) -> str:
    st, e = cmp.settings, html.escape
    return ("<h2>Settings</h2><p class='note'>"
            f"{e(FINAL_LOSS_DEFINITION)} (here {st.final_window:.0%} of the points a run shares "
            "with the baseline run of the same seed). "
            f"Loss tolerance {st.loss_tolerance_rel:.2%} relative / {st.loss_tolerance_abs:g} "
            f"absolute (or {st.seed_spread_factor:g} x the seed spread where seeds exist), "
            "applied to the difference of the final losses; "
            f"divergence tolerance {st.divergence_tolerance_rel:.0%} (any point after warm-up); "
            f"warm-up {st.warmup:.0%}; smoothing "
            f"{st.smoothing_window or 'automatic (~5% of points)'}; aligned by {e(st.align_by)}; "
            f"target GPU {e(st.target_gpu)}. Comparisons are paired: each run against the "
            "baseline run with the same seed.</p>")


def html_report(cmp: Comparison, figs: dict[str, str] | None = None,
                context: Mapping[str, Any] | None = None, now: Any = None) -> str:
    """The page: run context on top, the verdicts, then each figure with its source."""
    figs = figures(cmp) if figs is None else figs
    e = html.escape
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
             "<title>Convergence comparison</title>", f"<style>{CSS}</style></head><body>",
             f"<h1>Convergence comparison: baseline {e(cmp.baseline)}</h1>",
             run_context.to_html(context_rows(cmp, context, now))]
    parts += _summary_html(cmp)
    parts += ["<h2>Verdicts</h2>", verdict_table_html(cmp)]
    for name, data in figs.items():
        title = TITLES.get(name, name)
        parts.append(f"<figure id='figure-{e(name)}'><h2>{e(title)}</h2>"
                     f"<img alt='{e(title)}' src='data:image/png;base64,{data}'>"
                     f"<figcaption class='source'>{e(figure_source(cmp, name))}</figcaption>"
                     "</figure>")
    if "memory" not in figs:
        parts.append("<p class='note'>No memory figure: no run measured GPU memory (CPU or "
                     "emulated runs).</p>")
    parts += [_settings_html(cmp), "</body></html>"]
    return "\n".join(parts)


def verdict_table_html(cmp: Comparison) -> str:
    e = html.escape
    rows = [{p: row_cells(cmp, p, r)} for p, r in cmp.results.items()]
    if not rows:
        return "<p>No precision to show.</p>"
    headers = _headers(cmp)
    keys = list(next(iter(rows[0].values())))
    out = ["<table><tr>" + "".join(f"<th>{e(headers.get(k, k))}</th>" for k in keys) + "</tr>"]
    for row in rows:
        cells = next(iter(row.values()))
        tds = []
        for k in keys:
            cls = {"PASS": "pass", "FAIL": "fail"}.get(cells[k], "note") if k == "converges" else (
                "no" if k == "runs" and cells[k] == "no" else "")
            tds.append(f"<td class='{cls}'>{e(cells[k])}</td>" if cls else
                       f"<td>{e(cells[k])}</td>")
        out.append("<tr>" + "".join(tds) + "</tr>")
    out.append("</table>")
    return "".join(out)


MARKDOWN_COLUMNS = ("precision", "converges", "runs", "final loss", "diff vs baseline",
                    "tolerance", "seed", "speed-up", "memory ratio", "reason")


def markdown(cmp: Comparison, context: Mapping[str, Any] | None = None) -> str:
    """The summary the KFP UI renders: every value from a run, a file or a parameter is
    escaped (``kfp_sagemaker_blackwell.common.markdown``), so it shows as text and stays in its cell."""
    lines = [f"## Convergence comparison (baseline {md.inline(cmp.baseline)})", ""]
    lines += run_context.to_markdown(context_rows(cmp, context))
    if cmp.partial:
        lines += ["**PARTIAL REPORT - no recommendation:**", ""]
        lines += [f"- {md.line(p)}" for p in cmp.problems] + [""]
    if cmp.left_out:
        lines += [f"**{md.line(left_out_heading(cmp))}:**", ""]
        lines += [f"- {md.inline(lo.source)}" for lo in cmp.left_out] + [""]
    if cmp.recommended:
        r = cmp.results[cmp.recommended]
        lines.append(f"**Recommended precision: {md.inline(label(r))}** "
                     f"({_fmt(r.speedup, '.2f')}x, {md.inline(r.speedup_source)})")
    elif not cmp.partial:
        lines.append("**No precision passed.**")
    if cmp.recommendation:
        lines += ["", md.line(cmp.recommendation)]
    headers = _headers(cmp)
    lines += ["", "| " + " | ".join(md.inline(headers.get(c, c)) for c in MARKDOWN_COLUMNS)
              + " |", "|" + "---|" * len(MARKDOWN_COLUMNS)]
    for p, r in cmp.results.items():
        cells = row_cells(cmp, p, r)
        lines.append("| " + " | ".join(md.inline(cells[c]) for c in MARKDOWN_COLUMNS) + " |")
    lines += ["", f"_{md.inline(FINAL_LOSS_DEFINITION)}; the tolerance applies to the "
              "difference of the final losses._"]
    for note in [numerics_note(cmp), *cmp.notes]:
        if note:
            lines += ["", f"_{md.inline(note)}_"]
    return "\n".join(lines) + "\n"


def metrics(cmp: Comparison) -> dict[str, float]:
    out: dict[str, float] = {
        "precisions": float(len(cmp.results)),
        "passed": float(sum(r.passed for r in cmp.results.values())),
        "failed": float(sum(r.verdict == "fail" for r in cmp.results.values())),
        "not_compared": float(sum(not r.compared for r in cmp.results.values())),
        "partial": float(cmp.partial),
        "left_out": float(len(cmp.left_out)),
    }
    if cmp.recommended:
        r = cmp.results[cmp.recommended]
        if math.isfinite(r.speedup):
            out["recommended_speedup"] = r.speedup
    for p, r in cmp.results.items():
        out[f"{p}_pass"] = float(r.passed)
        for key in ("final_loss", "final_loss_diff", "final_loss_diff_rel",
                    "worst_divergence_rel", "speedup", "memory_ratio", "gap_to_floor"):
            v = getattr(r, key)
            if math.isfinite(v):
                out[f"{p}_{key}"] = float(v)
    return out


def verdicts_json(cmp: Comparison) -> str:
    return json.dumps({
        "schema": VERDICTS_SCHEMA, "baseline": cmp.baseline,
        "recommended_precision": cmp.recommended, "recommendation": cmp.recommendation,
        "passed": cmp.passed, "partial": cmp.partial,
        "problems": cmp.problems, "notes": cmp.notes, "numerics": numerics_note(cmp),
        "left_out": [{"source": lo.source, "problem": lo.problem, "contract": lo.contract}
                     for lo in cmp.left_out],
        "final_loss_definition": FINAL_LOSS_DEFINITION,
        "precisions": [{**row, "converges": converges(cmp, cmp.results[row["precision"]]),
                        "runs_on_target_gpu": runs_on_target(cmp, cmp.results[row["precision"]])}
                       for row in verdict_rows(cmp)],
    }, indent=1, allow_nan=False) + "\n"
