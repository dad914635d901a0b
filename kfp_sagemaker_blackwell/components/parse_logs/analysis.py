"""From what the parser found to what people ask: did it train, in which precision, how fast.

``analyse(parsed, requested_precision=...)`` returns a plain dict (the JSON
events document, see ``EVENTS_SCHEMA``) with the run's status, the confirmed
precision and recipe, warnings, the headline metrics and the events.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.catalog.precisions import LOW_PRECISIONS, PRECISIONS
from kfp_sagemaker_blackwell.common.losses import final_loss
from kfp_sagemaker_blackwell.common.step_series import FAILED_STATUSES
from kfp_sagemaker_blackwell.components.parse_logs.parser import ParsedLog

EVENTS_SCHEMA = "kfp-sagemaker/log-events/v1"
GIB = 2**30
_DTYPE_PRECISION = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}


def _finite(values: list[float]) -> list[float]:
    return [v for v in values if isinstance(v, float) and math.isfinite(v)]


def steady_state(values: list[float]) -> list[float]:
    """The logged values after warm-up: the first 10% of points (at least one, when there
    are three or more) hold compilation and allocator warm-up."""
    if len(values) >= 3:
        values = values[max(1, len(values) // 10):]
    return _finite(values)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _bf16_mfu(tflops: float | None, parsed: ParsedLog) -> float | None:
    """MFU against the GPU's dense bf16 peak, for logs older than the trainer's own figure."""
    gpu = parsed.records.get("world", {}).get("gpu") or parsed.summary.get("gpu")
    if tflops is None or not gpu or parsed.summary.get("emulated"):
        return None
    try:
        peak = hardware.gpu(str(gpu)).peak_for("bf16")
    except (KeyError, ValueError):
        return None
    return tflops / peak if peak else None


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def confirmed_precision(parsed: ParsedLog) -> tuple[str, bool, dict[str, Any]]:
    """(precision, confirmed by a recipe line?, recipe record)."""
    recipe = dict(parsed.recipe or {})
    if recipe.get("precision") and recipe.get("source") != "summary":
        return str(recipe["precision"]), True, recipe
    te = parsed.te
    if "fp8" in te and not te["fp8"] and te.get("dtype") in _DTYPE_PRECISION:
        precision = _DTYPE_PRECISION[te["dtype"]]
        return precision, True, {"precision": precision, "recipe": "none", "backend": "te",
                                 "emulated": False, "source": "te"}
    if recipe.get("precision"):  # from the summary: said, but not by a start-up line
        return str(recipe["precision"]), False, recipe
    column = parsed.series.get("precision") or []
    if column:
        return column[-1], False, {"precision": column[-1], "source": "steps"}
    if te.get("precision_preset"):
        return str(te["precision_preset"]), False, {"precision": te["precision_preset"],
                                                    "source": "te"}
    return "", False, {}


# Settings of the run worth carrying next to its numbers (batch tuning ranks by them; the
# model, batch and sequence let compare_convergence and rank_throughput predict its speed).
TRAINING_KEYS = ("batch_size", "seq_length", "activation_checkpointing", "grad_accum_steps",
                 "max_steps", "model")


def run_status(parsed: ParsedLog) -> str:
    counts = parsed.event_counts
    summary_status = str(parsed.summary.get("status") or "") if parsed.summary else ""
    nan = bool(counts.get("nan_loss"))
    if parsed.stats.get("lines", 0) == 0:
        return "no_logs"
    if summary_status and summary_status != "failed":
        return "nan" if nan else summary_status
    for kind, status in (("oom", "oom"), ("nan_loss", "nan"), ("nccl_error", "nccl_error")):
        if counts.get(kind):
            return status
    if summary_status:
        return summary_status
    if counts.get("error") or counts.get("config_error"):
        return "error"
    if parsed.steps:
        return "incomplete"
    if "avg_iter_time_s" in parsed.te:  # TE's fsdp.py prints no summary: its last line is this
        return "completed"
    return "no_steps"


def failure_reason(parsed: ParsedLog, status: str) -> str:
    reason = str(parsed.summary.get("failure_reason") or "") if parsed.summary else ""
    if reason:
        return reason
    first = {e["kind"]: e for e in reversed(parsed.events)}
    if status == "oom" and "oom" in first:
        e = first["oom"]
        size = e.get("bytes_requested")
        where = f" at step {e['step']}" if e.get("step") is not None else ""
        return (f"CUDA out of memory{where}"
                + (f": tried to allocate {size / GIB:.2f} GiB" if size else "")
                + ". Fix: lower the batch size or sequence length, or turn on activation "
                  "checkpointing.")
    if status == "nan" and "nan_loss" in first:
        return f"non-finite loss from step {first['nan_loss'].get('step')}"
    for kind in ("nccl_error", "error", "config_error"):
        if kind in first:
            return str(first[kind].get("message", ""))[:500]
    if status == "incomplete":
        return "the log ends without the trainer's summary line (still running, killed, or cut)"
    if status == "no_steps":
        return "no step lines in the log"
    if status == "no_logs":
        return "the log is empty"
    return ""


def tokens_per_step(parsed: ParsedLog) -> float | None:
    summary = parsed.summary
    tokens, steps = _num(summary.get("tokens")), _num(summary.get("steps"))
    resumed = _num(summary.get("resumed_from_step")) or 0.0
    if tokens and steps and steps > resumed:
        return tokens / steps
    config = parsed.records.get("config", {})
    world = parsed.records.get("world", {})
    parts = [_num(config.get("batch_size")), _num(config.get("seq_length")),
             _num(config.get("grad_accum_steps", 1)),
             _num(world.get("world_size", summary.get("world_size", 1)))]
    if all(p for p in parts):
        return math.prod(p for p in parts if p)
    return None


def metrics(parsed: ParsedLog) -> dict[str, float]:
    """The headline numbers (finite values only: KFP Metrics cannot hold NaN)."""
    s = parsed.series
    summary = parsed.summary
    out: dict[str, float | None] = {}
    losses = _finite(s["loss"])
    # One definition of "final loss" (common/losses.py): the final-window mean.
    out["final_loss"] = final_loss(losses) if losses else _num(summary.get("final_loss"))
    out["last_loss"] = losses[-1] if losses else _num(summary.get("final_loss"))
    for name in ("tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu"):
        mean = _mean(steady_state(s[name]))
        out[f"mean_{name}" if name != "mfu" else "mfu"] = (
            mean if mean is not None else _num(summary.get(name)))
    # The robust figures (one slow step cannot move them): the trainer's median steady-state
    # step when its summary says it, else the median of the logged values after warm-up.
    for name in ("tokens_per_s", "tokens_per_s_per_gpu"):
        out[f"median_{name}"] = _first(_num(summary.get(f"{name}_median")),
                                       _median(steady_state(s[name])))
    out["mfu_bf16_peak"] = _first(_num(summary.get("mfu_bf16_peak_median")),
                                  _num(summary.get("mfu_bf16_peak")),
                                  _bf16_mfu(_median(steady_state(s["tflops_per_gpu"])), parsed))
    peaks = _finite(s["mem_alloc_gib"])
    candidates = [max(peaks)] if peaks else []
    if _num(summary.get("peak_allocated_bytes")):
        candidates.append(float(summary["peak_allocated_bytes"]) / GIB)
    if _num(parsed.te.get("peak_memory_mb")):
        candidates.append(parsed.te["peak_memory_mb"] * 1e6 / GIB)
    out["peak_memory_gib"] = max(candidates) if candidates else None
    reserved = _finite(s["mem_reserved_gib"])
    rcands = [max(reserved)] if reserved else []
    if _num(summary.get("peak_reserved_bytes")):
        rcands.append(float(summary["peak_reserved_bytes"]) / GIB)
    out["peak_reserved_gib"] = max(rcands) if rcands else None
    out["avg_iter_time_s"] = _num(parsed.te.get("avg_iter_time_s"))
    out["steps"] = float(len(s["step"]))
    out["last_step"] = float(s["step"][-1]) if s["step"] else None
    counts = parsed.event_counts
    for kind in ("oom", "nan_loss", "loss_spike", "restart", "nccl_error", "error", "sigterm"):
        out[f"{kind}_events"] = float(counts.get(kind, 0))
    out["log_lines"] = float(parsed.stats.get("lines", 0))
    out["unparsed_trainer_lines"] = float(parsed.stats.get("unparsed_trainer_records", 0))
    return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(v)}


def analyse(parsed: ParsedLog, *, requested_precision: str = "", run: str = "") -> dict[str, Any]:
    """The run report (the JSON events document)."""
    precision, confirmed, recipe = confirmed_precision(parsed)
    requested = requested_precision.strip().lower()
    warnings = list(parsed.warnings)
    if requested and requested not in PRECISIONS:
        warnings.append(f"requested precision {requested!r} is not one the trainer knows "
                        f"({', '.join(PRECISIONS)})")
    if requested and precision and precision != requested:
        warnings.append(
            f"precision mismatch: {requested} was requested but the log "
            f"{'confirms' if confirmed else 'reports'} {precision}"
            + (f" (recipe {recipe.get('recipe')})" if recipe.get("recipe") else "")
            + ": check the job's precision hyperparameter and the trainer's start-up lines.")
    elif requested in LOW_PRECISIONS and not confirmed and parsed.stats.get("lines", 0):
        warnings.append(f"{requested} was requested but no start-up line confirms its recipe "
                        "(expected e.g. 'Using FP8 recipe: ...' or the trainer's recipe line).")
    if not precision:
        precision = requested
    emulated = recipe.get("emulated")
    if emulated is None and parsed.series["emulated"]:
        emulated = bool(parsed.series["emulated"][-1])
    if emulated is None and "emulated" in parsed.summary:
        emulated = bool(parsed.summary.get("emulated"))
    if emulated:
        warnings.append("numerics were EMULATED on the PyTorch backend: throughput, TFLOP/s and "
                        "MFU are not a speed measurement of the precision.")
    unparsed = parsed.stats.get("unparsed_trainer_records", 0)
    if unparsed:
        warnings.append(f"{unparsed} trainer-tagged line(s) matched no known record (cut, "
                        "interleaved or from another trainer version); they were skipped.")
    status = run_status(parsed)
    data = parsed.records.get("data", {})
    entropy_floor = _num(data.get("entropy_floor"))
    if entropy_floor is None:
        entropy_floor = _num(parsed.summary.get("entropy_floor"))
    seed = parsed.records.get("config", {}).get("seed")
    world = parsed.records.get("world", {})
    world_size = world.get("world_size", parsed.summary.get("world_size", parsed.te.get(
        "world_size")))
    return {
        "schema": EVENTS_SCHEMA,
        "run": run,
        "status": status,
        "failed": status in FAILED_STATUSES,
        "failure_reason": failure_reason(parsed, status),
        "requested_precision": requested,
        "precision": precision,
        "precision_confirmed": confirmed,
        "recipe": recipe.get("recipe") or parsed.summary.get("recipe") or "",
        "backend": recipe.get("backend") or parsed.summary.get("backend") or "",
        "emulated": bool(emulated),
        "seed": seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
        "entropy_floor": entropy_floor,
        "world_size": world_size if isinstance(world_size, int) else None,
        "gpu": world.get("gpu") or parsed.summary.get("gpu") or "",
        "tokens_per_step": tokens_per_step(parsed),
        "training": {k: parsed.records.get("config", {}).get(k) for k in TRAINING_KEYS},
        "metrics": metrics(parsed),
        "warnings": warnings,
        "counts": dict(sorted(parsed.event_counts.items())),
        "events": parsed.events,
        "summary": parsed.summary,
        "te": parsed.te,
        "stats": parsed.stats,
        "streams": parsed.streams,
    }
