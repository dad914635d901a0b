"""A bring-your-own-image job's metrics: its MetricDefinitions applied to its log lines.

SageMaker searches a job's log with each definition's ``Regex`` and publishes the
value as the metric ``Name`` (AlgorithmSpecification.MetricDefinitions, as
DescribeTrainingJob returns them); this module does the same search on the lines
parse_logs reads, so a custom image's loss and throughput reach the step series
(``kfp_sagemaker_blackwell.common.step_series``) without the in-repo trainer's log format.

The value is the regex's first group (the whole match without a group), read as a
float; a match that is not a number is counted, not fatal. Names map to the
series' columns by ``SERIES_COLUMN`` after lower-casing and dropping a ``train:``,
``train/``, ``train_`` or ``train.`` prefix (``loss``, ``train:loss`` and
``train/loss`` are all ``loss``). ``step``, ``iteration``, ``iter`` and ``epoch``
number the rows: a line with that metric starts the row of that number and the
other metrics (on that line or after it) fill it; without one, each line that
matches a series metric is the next row. A name the series has no column for
(``accuracy``, ``validation:loss``...) is left out: a warning names it (SageMaker's
console and CloudWatch still have it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# Metric name (normalised) -> the step series' column (kfp_sagemaker_blackwell.common.step_series).
SERIES_COLUMN = {
    "loss": "loss", "lr": "lr", "learning_rate": "lr", "learning-rate": "lr",
    "grad_norm": "grad_norm", "grad-norm": "grad_norm", "gradient_norm": "grad_norm",
    "tokens_per_s": "tokens_per_s", "tokens/s": "tokens_per_s", "throughput": "tokens_per_s",
    "tokens_per_s_per_gpu": "tokens_per_s_per_gpu", "tflops_per_gpu": "tflops_per_gpu",
    "mfu": "mfu", "mem_alloc_gib": "mem_alloc_gib", "mem_reserved_gib": "mem_reserved_gib",
}
STEP_NAMES = frozenset({"step", "iteration", "iter", "epoch"})
_PREFIX = re.compile(r"^train[:/_.]")


def normalised(name: str) -> str:
    return _PREFIX.sub("", name.strip().lower())


def column_of(name: str) -> str | None:
    """The series column a metric name fills: "step", a numeric column, or None."""
    key = normalised(name)
    return "step" if key in STEP_NAMES else SERIES_COLUMN.get(key)


def _value(match: re.Match[str]) -> float | None:
    text = match.group(1) if match.re.groups else match.group(0)
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


class MetricScanner:
    """Applies MetricDefinitions to log lines; ``rows`` are the series' rows."""

    def __init__(self, definitions: Sequence[Mapping[str, Any]]) -> None:
        self.definitions = [(str(d["Name"]), re.compile(str(d["Regex"])),
                             column_of(str(d["Name"]))) for d in definitions]
        self.has_step = any(col == "step" for _, _, col in self.definitions)
        self.rows: dict[int, dict[str, float]] = {}
        self.unreadable = 0
        self.lines = 0
        self._current: int | None = None

    def feed(self, lines: Iterable[str]) -> None:
        for line in lines:
            self._line(line)

    def _line(self, line: str) -> None:
        found: list[tuple[str | None, float]] = []
        for _name, regex, col in self.definitions:
            m = regex.search(line)
            if m is None:
                continue
            value = _value(m)
            if value is None:
                self.unreadable += 1
                continue
            found.append((col, value))
        if not found:
            return
        self.lines += 1
        for col, value in found:
            if col == "step" and value.is_integer() and value >= 0:
                self._current = int(value)
        if not self.has_step and any(col not in (None, "step") for col, _ in found):
            self._current = len(self.rows) + 1
        for col, value in found:
            if col not in (None, "step") and self._current is not None:
                self.rows.setdefault(self._current, {})[col] = value

    def series(self, precision: str, numeric_fields: Sequence[str]) -> dict[str, list[Any]]:
        """The series' columns (the parser's ``ParsedLog.series`` shape), by step."""
        steps = sorted(self.rows)
        out: dict[str, list[Any]] = {"step": steps}
        for name in numeric_fields:
            out[name] = [self.rows[s].get(name, math.nan) for s in steps]
        out["precision"] = [precision] * len(steps)
        out["emulated"] = [False] * len(steps)
        return out

    def warnings(self) -> list[str]:
        out = []
        unknown = sorted({n for n, _, col in self.definitions if col is None})
        if unknown:
            out.append(f"metric definition(s) {', '.join(unknown)} have no step-series "
                       "column: left out of the series (SageMaker's console has them)")
        if self.unreadable:
            out.append(f"{self.unreadable} metric match(es) were not numbers")
        return out


def apply(parsed: Any, scanner: MetricScanner, job: Mapping[str, Any], precision: str,
          numeric_fields: Sequence[str]) -> Any:
    """``parsed`` (a ParsedLog) with the metric series when the in-repo trainer's step lines
    are absent, and the job's TrainingJobStatus standing for the trainer's summary line
    (a custom image prints none). Unchanged when the log has the trainer's own lines."""
    import dataclasses

    if parsed.steps or "summary" in parsed.records:
        return parsed
    warnings = list(parsed.warnings) + scanner.warnings()
    records = dict(parsed.records)
    status = str(job.get("TrainingJobStatus") or "")
    if status in ("Completed", "Failed", "Stopped"):
        records["summary"] = {"status": status.lower(),
                              **({"failure_reason": job["FailureReason"]}
                                 if job.get("FailureReason") else {})}
    series = parsed.series
    if scanner.rows and precision:
        series = scanner.series(precision, numeric_fields)
    elif scanner.rows:
        warnings.append("the metric definitions matched, but no precision is known for the "
                        "series: pass requested_precision")
    return dataclasses.replace(parsed, series=series, records=records, warnings=warnings,
                               stats={**parsed.stats, "metric_lines": scanner.lines})
