"""Files in, files out: what the component and the CLI both do."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kfp_sagemaker_blackwell.common.step_series import Series, SeriesFormatError, read_series
from kfp_sagemaker_blackwell.components.compare_convergence.compare import (
    Comparison,
    LeftOut,
    Settings,
    compare,
)
from kfp_sagemaker_blackwell.components.compare_convergence.report import (
    html_report,
    markdown,
    verdicts_json,
)


def load(paths: Iterable[str | Path]) -> tuple[list[Series], list[str], list[LeftOut]]:
    """Reads the series; a file that cannot be read, or breaks the series contract, is left
    out: a problem (the report is partial) and a ``LeftOut`` naming it, not a crash."""
    series, problems, left_out = [], [], []
    for path in paths:
        try:
            series.append(read_series(path))
        except (OSError, SeriesFormatError, UnicodeError, csv.Error) as exc:
            problems.append(f"{path}: could not be read as a step series ({exc}); left out.")
            left_out.append(LeftOut(str(path), str(exc),
                                    contract=isinstance(exc, SeriesFormatError)))
    return series, problems, left_out


def compare_files(paths: Iterable[str | Path], settings: Settings) -> Comparison:
    series, problems, left_out = load(paths)
    return compare(series, settings, input_problems=problems, left_out=left_out)


def write_outputs(cmp: Comparison, *, html_path: str | Path | None = None,
                  markdown_path: str | Path | None = None,
                  verdicts_path: str | Path | None = None,
                  context: Mapping[str, Any] | None = None) -> None:
    """Writes the reports; ``context`` is what the pipeline knows about the run (pipeline,
    run id, instance type...: ``kfp_sagemaker_blackwell.common.run_context``), shown on top."""
    if html_path:
        Path(html_path).write_text(html_report(cmp, context=context), encoding="utf-8")
    if markdown_path:
        Path(markdown_path).write_text(markdown(cmp, context), encoding="utf-8")
    if verdicts_path:
        Path(verdicts_path).write_text(verdicts_json(cmp), encoding="utf-8")
