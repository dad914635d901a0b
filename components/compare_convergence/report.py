"""The comparison as people look at it: an HTML page with its images embedded (base64 PNG,
so it renders in the KFP UI offline), a Markdown summary, KFP metrics and JSON verdicts."""

from __future__ import annotations

import base64
import html
import io
import json
import math
from typing import Any

from components.compare_convergence.compare import NOT_COMPARED, Comparison, Result, verdict_rows

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]


def label(r: Result, sep: str = " ") -> str:
    return f"{r.precision}{sep}(emulated)" if r.emulated else r.precision


def _fmt(x: float, spec: str = ".4g") -> str:
    return format(x, spec) if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def _colors(cmp: Comparison) -> dict[str, str]:
    return {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(cmp.results)}


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def figures(cmp: Comparison) -> dict[str, str]:
    """name -> base64 PNG: loss curves, difference to baseline, speed-up, memory."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = _colors(cmp)
    out: dict[str, str] = {}

    # 1. Loss curves, every precision and seed on one plot (smoothed; raw faint), and
    #    the second half zoomed in, where precision effects show.
    fig, (ax, zoom) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    floors = set()
    x_name = "step"
    x_max = 0.0
    tail_y: list[float] = []
    for p, res in cmp.results.items():
        for i, run in enumerate(res.runs):
            if not len(run.step):
                continue
            x_max = max(x_max, float(run.step.max()))
            style = ["-", "--", ":", "-."][i % 4]
            pair = next((q for q in res.pairs if q.seed == run.seed), None)
            for axis in (ax, zoom):
                axis.plot(run.step, run.loss, color=colors[p], alpha=0.15, linewidth=0.8)
                if pair is not None:
                    axis.plot(pair.x, pair.cand_smooth, color=colors[p], linewidth=1.8,
                              linestyle=style, label=(f"{label(res)} seed {run.seed}"
                                                      if len(res.runs) > 1 else label(res))
                              if axis is ax else None)
                else:
                    axis.plot(run.step, run.loss, color=colors[p], linewidth=1.2,
                              label=f"{label(res)} (unpaired)" if axis is ax else None)
            if pair is not None:
                x_name = pair.x_name
                half = pair.cand_smooth[len(pair.cand_smooth) // 2:]
                tail_y += [float(v) for v in half if math.isfinite(v)]
            if run.entropy_floor is not None:
                floors.add(round(run.entropy_floor, 6))
    for floor in sorted(floors):
        ax.axhline(floor, color="black", linestyle=":", linewidth=1,
                   label=f"data entropy floor {floor:.4g}")
    ax.set_xlabel(x_name)
    ax.set_ylabel("training loss")
    ax.set_title(f"Loss curves (smoothed; faint: raw) - baseline {cmp.baseline}")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, ncol=2)
    zoom.set_title("second half, zoomed")
    zoom.set_xlabel(x_name)
    zoom.grid(alpha=0.3)
    if tail_y and x_max > 0:
        lo, hi = min(tail_y), max(tail_y)
        pad = (hi - lo) * 0.1 or abs(hi) * 0.01 or 0.01
        zoom.set_xlim(x_max / 2, x_max * 1.01)
        zoom.set_ylim(lo - pad, hi + pad)
    out["loss_curves"] = _png(fig)

    # 2. Difference to the baseline (paired, smoothed), with each precision's tolerance.
    fig, ax = plt.subplots(figsize=(9, 4.2))
    drew = False
    drawn_tols: dict[float, list[str]] = {}
    for p, res in cmp.results.items():
        if p == cmp.baseline:
            continue
        for i, pair in enumerate(res.pairs):
            ax.plot(pair.x, pair.cand_smooth - pair.base_smooth, color=colors[p], linewidth=1.6,
                    linestyle=["-", "--", ":", "-."][i % 4],
                    label=label(res) if i == 0 else None)
            drew = True
        if math.isfinite(res.tolerance) and res.pairs:
            drawn_tols.setdefault(round(res.tolerance, 12), []).append(res.precision)
    for tol, which in drawn_tols.items():
        ax.axhline(tol, color="black" if len(drawn_tols) == 1 else colors[which[0]],
                   linestyle=":", linewidth=1,
                   label=f"tolerance {tol:.3g}" + ("" if len(drawn_tols) == 1
                                                   else f" ({', '.join(which)})"))
    ax.axhline(0, color="black", linewidth=0.8)
    tols = [r.tolerance for r in cmp.results.values() if math.isfinite(r.tolerance)]
    if drew and tols:
        # linear within the tolerance, logarithmic beyond: small and large gaps both show
        ax.set_yscale("symlog", linthresh=max(min(tols), 1e-6))
    ax.set_xlabel(x_name)
    ax.set_ylabel(f"loss - {cmp.baseline} loss (same seed)")
    ax.set_title("Difference to the baseline (paired by seed, smoothed)")
    ax.grid(alpha=0.3)
    if drew:
        ax.legend(fontsize=8, ncol=2)
    else:
        ax.text(0.5, 0.5, "nothing to compare (see the problems above)", ha="center",
                va="center", transform=ax.transAxes)
    out["difference"] = _png(fig)

    # 3. Speed-up and 4. memory, as bars.
    names = list(cmp.results)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    speed = [cmp.results[p].speedup for p in names]
    bars = ax.bar([label(cmp.results[p], "\n") for p in names],
                  [s if math.isfinite(s) else 0 for s in speed],
                  color=[colors[p] for p in names])
    for bar, p, s in zip(bars, names, speed, strict=True):
        res = cmp.results[p]
        if res.speedup_predicted:
            bar.set_hatch("//")
            bar.set_alpha(0.6)
        ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(),
                (f"{s:.2f}x" if math.isfinite(s) else "n/a")
                + ("\n(predicted)" if res.speedup_predicted else "")
                + ("" if res.passed else "\n" + res.verdict.upper()),
                ha="center", va="bottom", fontsize=8)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel(f"throughput vs {cmp.baseline}")
    gpu = cmp.settings.target_gpu
    ax.set_title("Speed-up (hatched: predicted on " + gpu + " by the throughput model)"
                 if any(cmp.results[p].speedup_predicted for p in names)
                 else "Speed-up (measured tokens/s, after warm-up)")
    ax.margins(y=0.25)
    out["speedup"] = _png(fig)

    fig, ax = plt.subplots(figsize=(8, 3.8))
    mem = [cmp.results[p].peak_memory_gib for p in names]
    if any(math.isfinite(m) for m in mem):
        bars = ax.bar([label(cmp.results[p], "\n") for p in names],
                      [m if math.isfinite(m) else 0 for m in mem],
                      color=[colors[p] for p in names])
        for bar, m in zip(bars, mem, strict=True):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(),
                    f"{m:.1f} GiB" if math.isfinite(m) else "n/a", ha="center", va="bottom",
                    fontsize=8)
        ax.set_ylabel("peak memory per GPU (GiB)")
        ax.margins(y=0.2)
    else:
        ax.text(0.5, 0.5, "no GPU memory was measured (CPU or emulated runs)", ha="center",
                va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
    ax.set_title("Peak memory allocated per GPU")
    out["memory"] = _png(fig)
    return out


def _reason_text(r: Result) -> str:
    if r.reasons:
        return "; ".join(r.reasons)
    if not r.compared:
        return "; ".join(n for n in r.notes if n.startswith(NOT_COMPARED)) or NOT_COMPARED
    return "within tolerance"


CSS = """body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;
color:#222;max-width:1100px}table{border-collapse:collapse;margin:12px 0;font-size:14px}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}.pass{background:#e6f4ea;color:#137333;font-weight:600}
.fail{background:#fce8e6;color:#a50e0e;font-weight:600}.note{color:#555;font-size:13px}
.partial{background:#fff4e5;border:1px solid #f0a020;padding:8px 12px;margin:12px 0}
img{max-width:100%;display:block;margin:8px 0 20px}"""


def html_report(cmp: Comparison, figs: dict[str, str] | None = None) -> str:
    figs = figures(cmp) if figs is None else figs
    e = html.escape
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
             "<title>Convergence comparison</title>", f"<style>{CSS}</style></head><body>",
             f"<h1>Convergence comparison: baseline {e(cmp.baseline)}</h1>"]
    if cmp.partial:
        parts.append("<div class='partial'><b>PARTIAL REPORT</b>: no recommendation. "
                     + "<br>".join(e(p) for p in cmp.problems) + "</div>")
    if cmp.recommended:
        r = cmp.results[cmp.recommended]
        how = (f"{_fmt(r.speedup, '.2f')}x {e(r.speedup_source)}"
               if r.speedup_source != "baseline" else "the baseline itself")
        parts.append(f"<p><b>Recommended precision: {e(label(r))}</b> ({how}).</p>")
    elif not cmp.partial:
        parts.append("<p><b>No precision passed.</b></p>")
    if cmp.recommendation:
        parts.append(f"<p>{e(cmp.recommendation)}</p>")
    for note in cmp.notes:
        parts.append(f"<p class='note'>{e(note)}</p>")
    parts.append("<h2>Verdicts</h2>")
    parts.append(verdict_table_html(cmp))
    titles = {"loss_curves": "Loss curves", "difference": "Difference to the baseline",
              "speedup": "Throughput", "memory": "Memory"}
    for name, data in figs.items():
        parts.append(f"<h2>{titles.get(name, name)}</h2>")
        parts.append(f"<img alt='{e(titles.get(name, name))}' "
                     f"src='data:image/png;base64,{data}'>")
    st = cmp.settings
    parts.append(
        "<h2>Settings</h2><p class='note'>"
        f"loss tolerance {st.loss_tolerance_rel:.2%} relative / {st.loss_tolerance_abs:g} "
        f"absolute (or {st.seed_spread_factor:g} x the seed spread where seeds exist); "
        f"divergence tolerance {st.divergence_tolerance_rel:.0%}; final window "
        f"{st.final_window:.0%} of the aligned points; warm-up {st.warmup:.0%}; smoothing "
        f"{st.smoothing_window or 'automatic (~5% of points)'}; aligned by {e(st.align_by)}; "
        f"target GPU {e(st.target_gpu)}. Comparisons are paired: each run against the "
        "baseline run with the same seed.</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def verdict_table_html(cmp: Comparison) -> str:
    e = html.escape
    head = ("<table><tr><th>precision</th><th>verdict</th><th>final loss</th>"
            "<th>diff vs baseline</th><th>seeds</th><th>seed spread</th><th>worst divergence</th>"
            "<th>speed-up</th><th>memory ratio</th><th>gap to entropy floor</th>"
            "<th>reason</th></tr>")
    rows = [head]
    for p, r in cmp.results.items():
        cls = "pass" if r.passed else ("fail" if r.compared else "note")
        star = " (recommended)" if p == cmp.recommended else ""
        diff = (f"{_fmt(r.final_loss_diff, '+.4g')} ({_fmt(r.final_loss_diff_rel * 100, '+.2f')}%)"
                if math.isfinite(r.final_loss_diff) else "n/a")
        speed = _fmt(r.speedup, ".2f") + "x" if math.isfinite(r.speedup) else "n/a"
        if r.speedup_predicted:
            speed += " (predicted)"
        rows.append(
            f"<tr><td>{e(label(r))}{e(star)}</td><td class='{cls}'>{r.verdict.upper()}</td>"
            f"<td>{_fmt(r.final_loss)}</td><td>{diff}</td>"
            f"<td>{e(', '.join(str(s) for s in r.seeds))}</td><td>{_fmt(r.seed_spread)}</td>"
            f"<td>{_fmt(r.worst_divergence_rel * 100, '+.2f')}%</td><td>{e(speed)}</td>"
            f"<td>{_fmt(r.memory_ratio, '.2f')}</td><td>{_fmt(r.gap_to_floor)}</td>"
            f"<td>{e(_reason_text(r))}</td></tr>")
    rows.append("</table>")
    return "".join(rows)


def markdown(cmp: Comparison) -> str:
    lines = [f"## Convergence comparison (baseline {cmp.baseline})", ""]
    if cmp.partial:
        lines += ["**PARTIAL REPORT - no recommendation:**", ""]
        lines += [f"- {p}" for p in cmp.problems] + [""]
    if cmp.recommended:
        r = cmp.results[cmp.recommended]
        lines.append(f"**Recommended precision: {label(r)}** ({_fmt(r.speedup, '.2f')}x, "
                     f"{r.speedup_source})")
    elif not cmp.partial:
        lines.append("**No precision passed.**")
    if cmp.recommendation:
        lines += ["", cmp.recommendation]
    lines += ["", "| precision | verdict | final loss | diff vs baseline | speed-up | memory "
              "ratio | reason |", "|---|---|---|---|---|---|---|"]
    for p, r in cmp.results.items():
        diff = (f"{_fmt(r.final_loss_diff, '+.4g')} ({_fmt(r.final_loss_diff_rel * 100, '+.2f')}%)"
                if math.isfinite(r.final_loss_diff) else "n/a")
        speed = (_fmt(r.speedup, ".2f") + "x") if math.isfinite(r.speedup) else "n/a"
        if r.speedup_predicted:
            speed += " (predicted)"
        reason = _reason_text(r).replace("|", "\\|")
        lines.append(f"| {label(r)}{' **(recommended)**' if p == cmp.recommended else ''} | "
                     f"{r.verdict.upper()} | {_fmt(r.final_loss)} | {diff} | {speed} | "
                     f"{_fmt(r.memory_ratio, '.2f')} | {reason} |")
    if cmp.notes:
        lines += [""] + [f"_{n}_" for n in cmp.notes]
    return "\n".join(lines) + "\n"


def metrics(cmp: Comparison) -> dict[str, float]:
    out: dict[str, float] = {
        "precisions": float(len(cmp.results)),
        "passed": float(sum(r.passed for r in cmp.results.values())),
        "failed": float(sum(r.verdict == "fail" for r in cmp.results.values())),
        "not_compared": float(sum(not r.compared for r in cmp.results.values())),
        "partial": float(cmp.partial),
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
        "schema": "kfp-sagemaker/convergence-verdicts/v1", "baseline": cmp.baseline,
        "recommended_precision": cmp.recommended, "recommendation": cmp.recommendation,
        "passed": cmp.passed, "partial": cmp.partial,
        "problems": cmp.problems, "notes": cmp.notes, "precisions": verdict_rows(cmp),
    }, indent=1, allow_nan=False) + "\n"
