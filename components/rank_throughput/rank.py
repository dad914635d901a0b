"""Which run of a batch-size / activation-checkpointing sweep is fastest?

The article's first advice is to tune the batch size before anything else.
Every candidate trains briefly; its parsed series (``parse_logs``) carries the
run's settings and headline metrics in the CSV's metadata line. This module
ranks the candidates by steady-state tokens/s per GPU, shows their peak memory,
and names the best one that completed. Emulated runs (CPU) are ranked too but
labelled: their speed is not the precision's speed on a GPU.

Beside each measured figure stands the throughput model's prediction for the same
configuration on the GPU the run used (``components.common.throughput``),
so that every real run also checks the model; runs on a CPU get no prediction.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from components.common import markdown as md
from components.common import throughput
from components.common.errors import UserError
from components.common.step_series import SeriesFormatError, read_series
from components.common.training_setup import TrainingSetup
from trainer import hardware
from trainer.spec import ModelSpec


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


def load(paths: list[str]) -> list[Candidate]:
    """The candidates' series (a file that is not a series is a UserError naming it)."""
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
        out.append(Candidate(
            run=str(meta.get("run") or path),
            precision=s.precision,
            batch_size=int(batch) if isinstance(batch, int) else None,
            activation_checkpointing=bool(ac) if isinstance(ac, bool) else None,
            status=str(meta.get("status") or "unknown"),
            tokens_per_s_per_gpu=_robust_tokens_per_s(metrics),
            peak_memory_gib=_num(metrics.get("peak_memory_gib")),
            emulated=bool(meta.get("emulated")),
            failure_reason=str(meta.get("failure_reason") or ""),
            predicted_tokens_per_s_per_gpu=_predict(meta, s.precision),
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


def markdown(r: Ranking) -> str:
    """The summary the KFP UI renders; every value from a series is escaped
    (``components.common.markdown``): it shows as text and stays in its cell."""
    lines = ["# Batch-size tuning", ""]
    if r.best:
        lines.append(f"**Best: {md.inline(_setting(r.best))}** ({md.inline(r.best.precision)}, "
                     f"{_fmt(r.best.tokens_per_s_per_gpu, ',.0f')} tokens/s per GPU, peak "
                     f"{_fmt(r.best.peak_memory_gib, '.2f')} GiB).")
    else:
        lines.append("**No candidate completed**: nothing to recommend.")
    if r.emulated:
        lines += ["", "Some runs used EMULATED numerics (PyTorch backend on a CPU): their "
                  "tokens/s rank this machine, not the target GPU."]
    lines += ["", "| rank | run | precision | setting | status | tokens/s/GPU (measured) | "
              "tokens/s/GPU (predicted) | measured / predicted | peak GiB |",
              "|---:|---|---|---|---|---:|---:|---:|---:|"]
    for i, c in enumerate(r.candidates, 1):
        status = c.status + (f": {c.failure_reason[:80]}" if c.failure_reason else "")
        lines.append(f"| {i if c.ok else '-'} | {md.inline(c.run)} | {md.inline(c.precision)}"
                     f"{' (emulated)' if c.emulated else ''} | {md.inline(_setting(c))} | "
                     f"{md.inline(status)} | "
                     f"{_fmt(c.tokens_per_s_per_gpu, ',.0f')} | "
                     f"{_fmt(c.predicted_tokens_per_s_per_gpu, ',.0f')} | "
                     f"{_fmt(c.measured_over_predicted, '.2f')} | "
                     f"{_fmt(c.peak_memory_gib, '.2f')} |")
    if any(c.predicted_tokens_per_s_per_gpu for c in r.candidates):
        lines += ["", "Predicted: the throughput model (components/common/throughput.py) "
                  "for each run's configuration on the GPU it ran on."]
    return "\n".join(lines) + "\n"


def html_report(r: Ranking) -> str:
    """Markdown table plus a bar chart of tokens/s and memory, the image embedded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [c for c in r.candidates if c.ok]
    img = ""
    if ok:
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
        labels = [_setting(c).replace(", ", "\n") for c in ok]
        a.bar(labels, [c.tokens_per_s_per_gpu or 0 for c in ok], color="#4477aa")
        a.set_title("tokens/s per GPU" + (" (emulated)" if r.emulated else ""))
        b.bar(labels, [c.peak_memory_gib or 0 for c in ok], color="#cc6677")
        b.set_title("peak memory (GiB)")
        for ax in (a, b):
            ax.tick_params(axis="x", labelsize=8)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        plt.close(fig)
        data = base64.b64encode(buf.getvalue()).decode("ascii")
        img = f'<img alt="throughput and memory per candidate" src="data:image/png;base64,{data}">'
    rows = "".join(
        f"<tr><td>{html.escape(c.run)}</td><td>{html.escape(_setting(c))}</td>"
        f"<td>{html.escape(c.status)}</td><td>{_fmt(c.tokens_per_s_per_gpu, ',.0f')}</td>"
        f"<td>{_fmt(c.predicted_tokens_per_s_per_gpu, ',.0f')}</td>"
        f"<td>{_fmt(c.peak_memory_gib, '.2f')}</td></tr>"
        for c in r.candidates
    )
    best = html.escape(_setting(r.best)) if r.best else "none (no candidate completed)"
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Batch-size tuning</title>"
        "</head><body><h1>Batch-size tuning</h1>"
        f"<p><b>Best:</b> {best}</p>{img}<table border='1'><tr><th>run</th><th>setting</th>"
        f"<th>status</th><th>tokens/s/GPU (measured)</th><th>tokens/s/GPU (predicted by the "
        f"throughput model)</th><th>peak GiB</th></tr>{rows}</table>"
        "</body></html>"
    )


def to_json(r: Ranking) -> str:
    return json.dumps({"best": asdict(r.best) if r.best else None,
                       "candidates": [asdict(c) for c in r.candidates]}, sort_keys=True)
