"""The outputs of parse_logs: Markdown summary, JSON events, KFP metrics, series CSV."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp_sagemaker_blackwell.common import markdown as md
from kfp_sagemaker_blackwell.components.parse_logs.analysis import analyse
from kfp_sagemaker_blackwell.components.parse_logs.parser import ParsedLog
from kfp_sagemaker_blackwell.components.parse_logs.series import write_series

# The KFP Metrics parse_logs logs (a subset of analysis.metrics; finite values only).
KFP_METRICS = ("final_loss", "last_loss", "mean_tokens_per_s", "mean_tokens_per_s_per_gpu",
               "median_tokens_per_s", "median_tokens_per_s_per_gpu",
               "mean_tflops_per_gpu", "mfu", "mfu_bf16_peak", "peak_memory_gib", "peak_reserved_gib",
               "avg_iter_time_s", "steps", "oom_events", "nan_loss_events", "loss_spike_events",
               "restart_events", "nccl_error_events", "log_lines", "unparsed_trainer_lines")


def _fmt(x: Any, spec: str = ",.4g", unit: str = "") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{format(x, spec)}{unit}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else _fmt(x * 100, ".1f", "%")


def _md(text: Any) -> str:
    """A value from the log or the user, as text in the Markdown the KFP UI renders."""
    return md.inline(text, 300)


def markdown(report: dict[str, Any]) -> str:
    m = report["metrics"]
    run = report.get("run") or "training log"
    status = _md(report["status"])
    precision = _md(report.get("precision") or "unknown")
    confirm = ("confirmed by the log" if report.get("precision_confirmed")
               else "NOT confirmed by a start-up line")
    recipe = f", recipe {_md(report['recipe'])}" if report.get("recipe") else ""
    emulated = " — **emulated numerics** (not a speed measurement)" if report.get(
        "emulated") else ""
    lines = [f"## {_md(run)}: {status}", ""]
    if report.get("failure_reason"):
        lines += [f"**Why:** {_md(report['failure_reason'])}", ""]
    lines += ["| | |", "|---|---|",
              f"| status | {status} |",
              f"| precision | {precision} ({confirm}{recipe}){emulated} |"]
    if report.get("requested_precision"):
        lines.append(f"| requested precision | {_md(report['requested_precision'])} |")
    lines.append(f"| steps logged | {_fmt(m.get('steps'), ',.0f')} (last step "
                 f"{_fmt(m.get('last_step'), '.0f')}) |")
    lines.append(f"| final loss (mean of the last 10% of steps) | {_fmt(m.get('final_loss'), '.5g')} "
                 f"(last step: {_fmt(m.get('last_loss'), '.5g')}) |")
    floor = report.get("entropy_floor")
    if floor is not None:
        gap = (m["final_loss"] - floor) if "final_loss" in m else None
        lines.append(f"| data entropy floor | {floor:.5g} nats (gap {_fmt(gap, '.4g')}) |")
    lines.append(f"| mean tokens/s (after warm-up) | {_fmt(m.get('mean_tokens_per_s'), ',.1f')} |")
    lines.append(f"| tokens/s per GPU | {_fmt(m.get('mean_tokens_per_s_per_gpu'), ',.1f')} |")
    lines.append(f"| median tokens/s per GPU (the median step after warm-up: one slow step "
                 f"does not move it) | {_fmt(m.get('median_tokens_per_s_per_gpu'), ',.1f')} |")
    lines.append(f"| TFLOP/s per GPU | {_fmt(m.get('mean_tflops_per_gpu'), ',.1f')} |")
    lines.append(f"| MFU (against the GPU's dense bf16 peak, for every precision) | "
                 f"{_pct(m.get('mfu_bf16_peak'))} |")
    lines.append(f"| MFU (against the precision's own dense peak) | {_pct(m.get('mfu'))} |")
    lines.append(f"| peak memory | {_fmt(m.get('peak_memory_gib'), '.2f', ' GiB')} allocated, "
                 f"{_fmt(m.get('peak_reserved_gib'), '.2f', ' GiB')} reserved |")
    if "avg_iter_time_s" in m:
        lines.append(f"| avg. iteration time (TE fsdp.py) | {m['avg_iter_time_s']:.4g} s |")
    if report.get("world_size"):
        lines.append(f"| world size | {report['world_size']} {_md(report.get('gpu') or '')} |")
    stats = report.get("stats", {})
    lines.append(f"| log | {stats.get('lines', 0):,} lines in {len(report.get('streams', []))} "
                 f"stream(s), {stats.get('unparsed_trainer_records', 0):,} unparsed trainer "
                 "lines |")
    if report.get("warnings"):
        lines += ["", "**Warnings**", ""]
        lines += [f"- {_md(w)}" for w in report["warnings"]]
    counts = report.get("counts", {})
    shown = [k for k in counts if k != "recipe"]
    if shown:
        lines += ["", "**Events**", "", "| event | count | first |", "|---|---|---|"]
        firsts: dict[str, dict[str, Any]] = {}
        for e in report.get("events", []):
            firsts.setdefault(e["kind"], e)
        for kind in shown:
            e = firsts.get(kind, {})
            where = f"step {e['step']}: " if e.get("step") is not None else ""
            detail = e.get("message") or e.get("reason") or e.get("path") or ""
            if kind == "oom" and e.get("bytes_requested"):
                detail = f"tried to allocate {e['bytes_requested'] / 2**30:.2f} GiB. {detail}"
            lines.append(f"| {_md(kind)} | {_md(counts[kind])} | {_md(where + str(detail))} |")
    return "\n".join(lines) + "\n"


def events_document(report: dict[str, Any]) -> str:
    return json.dumps(_json_safe(report), indent=1, default=str, allow_nan=False) + "\n"


@dataclass
class Outputs:
    report: dict[str, Any]
    rows: int


def write_outputs(parsed: ParsedLog, *, requested_precision: str = "", run: str = "",
                  series_path: str | Path | None = None, markdown_path: str | Path | None = None,
                  events_path: str | Path | None = None) -> Outputs:
    report = analyse(parsed, requested_precision=requested_precision, run=run)
    report = _json_safe(report)
    rows = 0
    if series_path:
        rows = write_series(series_path, parsed, report)
    if markdown_path:
        Path(markdown_path).write_text(markdown(report), encoding="utf-8")
    if events_path:
        Path(events_path).write_text(events_document(report), encoding="utf-8")
    return Outputs(report, rows)


def kfp_metrics(report: dict[str, Any]) -> dict[str, float]:
    m = report["metrics"]
    return {k: m[k] for k in KFP_METRICS if k in m}


def _json_safe(x: Any) -> Any:
    """NaN/inf become strings: JSON has no NaN and KFP's UI chokes on it."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x
