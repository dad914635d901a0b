"""Writes the per-step series Dataset (schema: ``components.common.step_series``)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from components.common.step_series import COLUMN_NAMES, SERIES_SCHEMA
from components.parse_logs.parser import NUMERIC_STEP_FIELDS, ParsedLog


def _cell(x: Any) -> str:
    if x is None:
        return ""
    if isinstance(x, bool):
        return "1" if x else "0"
    if isinstance(x, float):
        return repr(x) if math.isfinite(x) else ("nan" if math.isnan(x) else
                                                 ("inf" if x > 0 else "-inf"))
    return str(x)


def metadata(report: dict[str, Any]) -> dict[str, Any]:
    """The run-level facts compare_convergence needs (the CSV's first line)."""
    keys = ("run", "status", "failed", "failure_reason", "requested_precision", "precision",
            "precision_confirmed", "recipe", "backend", "emulated", "seed", "entropy_floor",
            "world_size", "gpu", "tokens_per_step", "training", "metrics", "counts", "warnings")
    meta: dict[str, Any] = {"schema": SERIES_SCHEMA}
    meta.update({k: report.get(k) for k in keys})
    return meta


def write_series(path: str | Path, parsed: ParsedLog, report: dict[str, Any]) -> int:
    """Writes the CSV; returns the number of rows."""
    s = parsed.series
    n = len(s["step"])
    meta = metadata(report)
    tps = report.get("tokens_per_step")
    tokens = [float(step) * tps if tps else math.nan for step in s["step"]]
    seed, floor, run = report.get("seed"), report.get("entropy_floor"), report.get("run") or ""
    constant = [_cell(seed), _cell(float(floor) if floor is not None else math.nan),
                run.replace(",", "_").replace("\n", " ")]
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(f"# {SERIES_SCHEMA} {json.dumps(meta, sort_keys=True, default=str)}\n")
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(COLUMN_NAMES)
        numeric = [s[name] for name in NUMERIC_STEP_FIELDS]
        for i in range(n):
            row = [str(s["step"][i]), _cell(tokens[i])]
            row += [_cell(col[i]) for col in numeric]
            row += [s["precision"][i], "1" if s["emulated"][i] else "0"]
            row += constant
            writer.writerow(row)
    return n
