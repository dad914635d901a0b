"""Which run of a batch-size / activation-checkpointing sweep is fastest?

The article's first advice is to tune the batch size before anything else.
Every candidate trains briefly; its parsed series (``parse_logs``) carries the
run's settings and headline metrics in the CSV's metadata line. This module
ranks the candidates by steady-state tokens/s per GPU, shows their peak memory,
and names the best one that completed. Emulated runs (CPU) are ranked too but
labelled: their speed is not the precision's speed on a GPU.

Beside each measured figure stand the predictions that exist for it: the plan's
(``memory_estimate``'s ``batch_candidates``: the throughput model for the target
instance's GPU, passed as ``plan``) and, for a run timed on a GPU, the throughput
model's for the GPU the run used (``kfp_sagemaker_blackwell.planning.throughput``), so that every real
run also checks the model. A column no candidate has a value for is left out.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.catalog.spec import ModelSpec
from kfp_sagemaker_blackwell.common import markdown as md
from kfp_sagemaker_blackwell.common import report_page, run_context
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.common.kfp_values import integral
from kfp_sagemaker_blackwell.common.step_series import SeriesFormatError, read_series
from kfp_sagemaker_blackwell.planning import throughput
from kfp_sagemaker_blackwell.planning.training_setup import TrainingSetup


@dataclass(frozen=True)
class Candidate:
    run: str
    precision: str
    batch_size: int | None
    activation_checkpointing: bool | None
    status: str
    tokens_per_s_per_gpu: float | None
    peak_memory_gib: float | None
    emulated: bool
    failure_reason: str = ""
    # The throughput model's prediction on the GPU the run used (None on a CPU or when
    # the series does not say the model).
    predicted_tokens_per_s_per_gpu: float | None = None
    # The plan's prediction for the target instance's GPU (memory_estimate's candidates).
    planned_tokens_per_s_per_gpu: float | None = None
    # That prediction corrected by a probe (prerank_candidates' trials; None without one).
    corrected_tokens_per_s_per_gpu: float | None = None
    meta: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "completed" and self.tokens_per_s_per_gpu is not None

    @property
    def measured_over_predicted(self) -> float | None:
        if self.tokens_per_s_per_gpu is None or not self.predicted_tokens_per_s_per_gpu:
            return None
        return self.tokens_per_s_per_gpu / self.predicted_tokens_per_s_per_gpu


@dataclass(frozen=True)
class Ranking:
    candidates: list[Candidate]  # best first; failed ones last
    best: Candidate | None

    @property
    def emulated(self) -> bool:
        return any(c.emulated for c in self.candidates)


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(float(x)) else None


def _planned(plan: Sequence[Mapping[str, Any]], precision: str, batch: int | None,
             ac: bool | None, key: str = "predicted_tokens_per_s_per_gpu") -> float | None:
    """The plan's ``key`` (predicted, or probe-corrected, tokens/s per GPU) for this
    configuration, or None."""
    for entry in plan:
        if (entry.get("precision"), entry.get("batch_size"),
                entry.get("activation_checkpointing")) == (precision, batch, ac):
            return _num(entry.get(key))
    return None


def load(paths: list[str], plan: Sequence[Mapping[str, Any]] = ()) -> list[Candidate]:
    """The candidates' series (a file that is not a series is a UserError naming it);
    ``plan``: memory_estimate's ``batch_candidates``, whose predictions stand beside."""
    plan = integral(plan)  # memory_estimate's numbers as it wrote them
    if not paths:
        raise UserError("series", "no runs to rank.", "pass the collected parse_logs series.")
    out: list[Candidate] = []
    for path in paths:
        try:
            s = read_series(path)
        except SeriesFormatError as exc:
            raise UserError("series", f"{path} could not be read as a step series: "
                            f"{exc.problem} (at {exc.field})", exc.fix) from None
        except (OSError, UnicodeError, csv.Error) as exc:
            raise UserError("series", f"{path} could not be read as a step series ({exc}).",
                            "pass the parse_logs series outputs of the candidate runs.") from None
        meta, metrics = s.meta, s.meta.get("metrics") or {}
        training = meta.get("training") or {}
        batch = training.get("batch_size")
        ac = training.get("activation_checkpointing")
        batch = int(batch) if isinstance(batch, int) else None
        ac = bool(ac) if isinstance(ac, bool) else None
        out.append(Candidate(
            run=str(meta.get("run") or path),
            precision=s.precision,
            batch_size=batch,
            activation_checkpointing=ac,
            status=str(meta.get("status") or "unknown"),
            tokens_per_s_per_gpu=_robust_tokens_per_s(metrics),
            peak_memory_gib=_num(metrics.get("peak_memory_gib")),
            emulated=bool(meta.get("emulated")),
            failure_reason=str(meta.get("failure_reason") or ""),
            predicted_tokens_per_s_per_gpu=_predict(meta, s.precision),
            planned_tokens_per_s_per_gpu=_planned(plan, s.precision, batch, ac),
            corrected_tokens_per_s_per_gpu=_planned(plan, s.precision, batch, ac,
                                                    "corrected_tokens_per_s_per_gpu"),
            meta=meta,
        ))
    return out


def _robust_tokens_per_s(metrics: dict[str, Any]) -> float | None:
    """The median step's tokens/s per GPU (one slow step of a short trial cannot reorder the
    ranking); the mean for series written before parse_logs carried the median."""
    median = _num(metrics.get("median_tokens_per_s_per_gpu"))
    return median if median is not None else _num(metrics.get("mean_tokens_per_s_per_gpu"))


def _predict(meta: dict[str, Any], precision: str) -> float | None:
    """The model's tokens/s per GPU for the run's configuration on its GPU, or None."""
    training = meta.get("training") or {}
    model, batch, seq = training.get("model"), training.get("batch_size"), training.get("seq_length")
    world = meta.get("world_size")
    if meta.get("emulated") or not meta.get("gpu") or not isinstance(model, dict) or \
            not isinstance(batch, int) or not isinstance(seq, int):
        return None
    try:
        gpu = hardware.gpu(str(meta["gpu"]))
        spec = ModelSpec(**{k: v for k, v in model.items() if k in ModelSpec.__dataclass_fields__})
        setup = TrainingSetup(spec, batch, seq, precision,
                              bool(training.get("activation_checkpointing")),
                              world if isinstance(world, int) and world > 0 else 1)
        return throughput.predict(setup, gpu).tokens_per_s_per_gpu
    except (TypeError, ValueError, UserError):
        return None


def rank(candidates: list[Candidate]) -> Ranking:
    ok = sorted((c for c in candidates if c.ok), key=lambda c: -(c.tokens_per_s_per_gpu or 0))
    bad = [c for c in candidates if not c.ok]
    return Ranking(ok + bad, ok[0] if ok else None)


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _setting(c: Candidate) -> str:
    ac = {True: "on", False: "off", None: "?"}[c.activation_checkpointing]
    return f"batch {c.batch_size if c.batch_size is not None else '?'}, checkpointing {ac}"


def candidate_label(c: Candidate) -> str:
    """A candidate in a chart's tick: short, and one per candidate (precision, batch, AC)."""
    ac = {True: "AC on", False: "AC off", None: "AC ?"}[c.activation_checkpointing]
    return f"{c.precision} b{c.batch_size if c.batch_size is not None else '?'} {ac}"


EMULATED_CAVEAT = ("Some runs used EMULATED numerics (PyTorch backend on a CPU): their "
                   "tokens/s rank this machine, not the target GPU.")


def _target(context: Mapping[str, Any] | None) -> str:
    return str((context or {}).get("instance_type") or "the target instance")


def columns(r: Ranking, context: Mapping[str, Any] | None = None) -> list[tuple[str, str]]:
    """(key, header) of the table's columns; a prediction column only where a prediction
    exists (never a column of n/a)."""
    out = [("rank", "rank"), ("run", "run"), ("precision", "precision"),
           ("setting", "setting"), ("status", "status"),
           ("measured", "tokens/s/GPU (measured)")]
    if any(c.planned_tokens_per_s_per_gpu for c in r.candidates):
        out.append(("planned", f"tokens/s/GPU (predicted for {_target(context)} by the plan)"))
    if any(c.corrected_tokens_per_s_per_gpu for c in r.candidates):
        out.append(("corrected", f"tokens/s/GPU (predicted for {_target(context)}, "
                    "probe-corrected)"))
    if any(c.predicted_tokens_per_s_per_gpu for c in r.candidates):
        out += [("predicted", "tokens/s/GPU (predicted on the run's GPU)"),
                ("ratio", "measured / predicted")]
    if any(c.peak_memory_gib for c in r.candidates):
        out.append(("memory", "peak GiB (measured)"))
    return out


def _cells(i: int, c: Candidate) -> dict[str, str]:
    status = c.status + (f": {c.failure_reason[:80]}" if c.failure_reason else "")
    return {"rank": str(i) if c.ok else "-", "run": c.run,
            "precision": c.precision + (" (emulated)" if c.emulated else ""),
            "setting": _setting(c), "status": status,
            "measured": _fmt(c.tokens_per_s_per_gpu, ",.0f"),
            "planned": _fmt(c.planned_tokens_per_s_per_gpu, ",.0f"),
            "corrected": _fmt(c.corrected_tokens_per_s_per_gpu, ",.0f"),
            "predicted": _fmt(c.predicted_tokens_per_s_per_gpu, ",.0f"),
            "ratio": _fmt(c.measured_over_predicted, ".2f"),
            "memory": _fmt(c.peak_memory_gib, ".2f")}


def _notes(r: Ranking, context: Mapping[str, Any] | None) -> list[str]:
    notes = []
    if any(c.planned_tokens_per_s_per_gpu for c in r.candidates):
        notes.append(f"Predicted by the plan: memory_estimate's throughput model "
                     f"(planning/throughput.py) for each configuration on "
                     f"{_target(context)}, before anything ran.")
    if any(c.corrected_tokens_per_s_per_gpu for c in r.candidates):
        notes.append("Probe-corrected: the plan's prediction x a probe's measured / predicted "
                     "ratio (prerank_candidates, planning/probe.py); the pre-ranking timed "
                     "only these candidates.")
    if any(c.predicted_tokens_per_s_per_gpu for c in r.candidates):
        notes.append("Predicted on the run's GPU: the throughput model "
                     "(planning/throughput.py) for each run's configuration on the "
                     "GPU it ran on.")
    return notes


def _best_text(r: Ranking) -> str:
    b = r.best
    if b is None:
        return ""
    peak = "" if b.peak_memory_gib is None else f", peak {b.peak_memory_gib:.2f} GiB"
    return (f"{_setting(b)} ({b.precision}, {_fmt(b.tokens_per_s_per_gpu, ',.0f')} tokens/s "
            f"per GPU measured{peak})")


def markdown(r: Ranking, context: Mapping[str, Any] | None = None) -> str:
    """The summary the KFP UI renders; every value from a series is escaped
    (``kfp_sagemaker_blackwell.common.markdown``): it shows as text and stays in its cell."""
    lines = ["# Batch-size tuning", ""]
    lines += run_context.to_markdown(run_context.rows(context, [c.meta for c in r.candidates]))
    if r.best:
        best = _best_text(r).split(" (", 1)
        lines.append(f"**Best: {md.inline(best[0])}** ({md.inline(best[1])}.")
    else:
        lines.append("**No candidate completed**: nothing to recommend.")
    if r.emulated:
        lines += ["", EMULATED_CAVEAT]
    cols = columns(r, context)
    lines += ["", "| " + " | ".join(md.inline(h) for _, h in cols) + " |",
              "|" + "|".join("---:" if k in ("rank", "measured", "planned", "corrected",
                                             "predicted", "ratio", "memory") else "---" for k, _ in cols)
              + "|"]
    for i, c in enumerate(r.candidates, 1):
        cells = _cells(i, c)
        lines.append("| " + " | ".join(md.inline(cells[k]) for k, _ in cols) + " |")
    for note in _notes(r, context):
        lines += ["", md.line(note)]
    return "\n".join(lines) + "\n"


def _bars(ok: list[Candidate], values: list[float], *, color: str, ylabel: str, title: str,
          text: str) -> str:
    """One bar per candidate, tick labels rotated so that they never overlap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(ok) + 2), 4.2))
    bars = ax.bar([candidate_label(c) for c in ok], values, color=color)
    for bar, v in zip(bars, values, strict=True):
        ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), format(v, text),
                ha="center", va="bottom", fontsize=8)
    ax.set(ylabel=ylabel, title=title)
    ax.margins(y=0.15)
    ax.grid(axis="y", alpha=0.3)
    plt.setp(ax.get_xticklabels(), rotation=35, ha="right", rotation_mode="anchor", fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def figures(r: Ranking) -> dict[str, tuple[str, str]]:
    """name -> (base64 PNG, source caption); memory only when some run measured it."""
    ok = [c for c in r.candidates if c.ok]
    if not ok:
        return {}
    where = ("this machine (EMULATED numerics: ranks this machine, not the target GPU)"
             if r.emulated else "the GPUs the runs used")
    out = {"throughput": (_bars(
        ok, [c.tokens_per_s_per_gpu or 0.0 for c in ok], color="#4477aa",
        ylabel="tokens/s per GPU", title="Throughput per candidate (measured)", text=",.0f"),
        f"Measured: steady-state tokens/s per GPU after warm-up, from each run's trainer "
        f"log, on {where}.")}
    mem = [c.peak_memory_gib for c in ok]
    if any(m for m in mem):
        out["memory"] = (_bars(ok, [m or 0.0 for m in mem], color="#cc6677",
                               ylabel="GiB per GPU", title="Peak memory per candidate (measured)",
                               text=".1f"),
                         "Measured: peak memory allocated per GPU, reported by the trainer.")
    return out


TITLES = {"throughput": "Throughput", "memory": "Memory"}


def html_report(r: Ranking, context: Mapping[str, Any] | None = None,
                figs: dict[str, tuple[str, str]] | None = None) -> str:
    """The page: run context on top, the best candidate, the caveat, the figures (each
    labelled measured), the table; styled like the precision sweep's report."""
    e = html.escape
    figs = figures(r) if figs is None else figs
    parts = [report_page.head("Batch-size tuning"), "<h1>Batch-size tuning</h1>",
             run_context.to_html(run_context.rows(context, [c.meta for c in r.candidates]))]
    parts.append(f"<p class='recommendation'><b>Best: {e(_best_text(r))}</b></p>" if r.best
                 else "<p class='recommendation'><b>No candidate completed</b>: nothing to "
                 "recommend.</p>")
    if r.emulated:
        parts.append(f"<p class='caveat'>{e(EMULATED_CAVEAT)}</p>")
    for name, (data, source) in figs.items():
        title = TITLES.get(name, name)
        parts.append(f"<figure id='figure-{e(name)}'><h2>{e(title)}</h2>"
                     f"<img alt='{e(title)} per candidate' src='data:image/png;base64,{data}'>"
                     f"<figcaption class='source'>{e(source)}</figcaption></figure>")
    if r.candidates and "memory" not in figs:
        parts.append("<p class='note'>No memory chart: no run measured GPU memory (CPU or "
                     "emulated runs).</p>")
    cols = columns(r, context)
    numeric = {"rank", "measured", "planned", "corrected", "predicted", "ratio", "memory"}
    rows = "".join(
        "<tr>" + "".join(f"<td class='num'>{e(cells[k])}</td>" if k in numeric
                         else f"<td>{e(cells[k])}</td>" for k, _ in cols) + "</tr>"
        for cells in (_cells(i, c) for i, c in enumerate(r.candidates, 1)))
    parts += ["<h2>Candidates</h2>", "<table class='candidates'><tr>"
              + "".join(f"<th>{e(h)}</th>" for _, h in cols) + f"</tr>{rows}</table>"]
    parts += [f"<p class='note'>{e(n)}</p>" for n in _notes(r, context)]
    return "\n".join(parts + ["</body></html>"])


def to_json(r: Ranking) -> str:
    def plain(c: Candidate) -> dict[str, Any]:
        d = asdict(c)
        d.pop("meta")
        return d

    return json.dumps({"best": plain(r.best) if r.best else None,
                       "candidates": [plain(c) for c in r.candidates]}, sort_keys=True)
