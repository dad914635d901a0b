"""Writes the per-step series Dataset: the run's metadata and columns, handed to
``kfp_sagemaker_blackwell.common.step_series.write_series``, which checks them against the same
contract its readers check (so parse_logs cannot write a series they refuse)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from kfp_sagemaker_blackwell.common.step_series import run_cell
from kfp_sagemaker_blackwell.common.step_series import write_series as write_checked
from kfp_sagemaker_blackwell.components.parse_logs.parser import NUMERIC_STEP_FIELDS, ParsedLog

# The report's keys the series carries on its first line (kfp_sagemaker_blackwell.common.step_series
# declares each one's type).
META_KEYS = ("run", "status", "failed", "failure_reason", "requested_precision", "precision",
             "precision_confirmed", "recipe", "backend", "emulated", "seed", "entropy_floor",
             "world_size", "gpu", "tokens_per_step", "training", "metrics", "counts",
             "warnings")


def metadata(report: dict[str, Any]) -> dict[str, Any]:
    """The run-level facts compare_convergence needs (the CSV's first line)."""
    return {k: report.get(k) for k in META_KEYS}


def columns(parsed: ParsedLog, report: dict[str, Any]) -> dict[str, list[Any]]:
    """The series' columns, typed as the schema declares them."""
    s = parsed.series
    n = len(s["step"])
    tps = report.get("tokens_per_step")
    floor = report.get("entropy_floor")
    out: dict[str, list[Any]] = {
        "step": list(s["step"]),
        "tokens": [float(step) * tps if tps else math.nan for step in s["step"]],
    }
    out.update({name: [float(v) for v in s[name]] for name in NUMERIC_STEP_FIELDS})
    out["precision"] = list(s["precision"])
    out["emulated"] = [bool(e) for e in s["emulated"]]
    out["seed"] = [report.get("seed")] * n
    out["entropy_floor"] = [float(floor) if floor is not None else math.nan] * n
    out["run"] = [run_cell(report.get("run") or "")] * n
    return out


def write_series(path: str | Path, parsed: ParsedLog, report: dict[str, Any]) -> int:
    """Writes the CSV; returns the number of rows."""
    return write_checked(path, metadata(report), columns(parsed, report))
