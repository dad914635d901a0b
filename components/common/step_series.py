"""The per-step series Dataset: a CSV with a documented schema, the contract between
parse_logs (which writes it) and compare_convergence / rank_throughput (which read it).

The first line is a comment holding the run's metadata as JSON (so a run that
logged no step at all, e.g. an OOM at start-up, still says which precision it
was and why it failed); then a header and one row per logged step, sorted by
step, one row per step (after a restart the re-run steps replace the old ones)::

    # kfp-sagemaker/step-series/v1 {"run": "...", "precision": "fp8", "status": "completed", ...}
    step,tokens,loss,lr,grad_norm,tokens_per_s,...,precision,emulated,seed,entropy_floor,run
    10,40960.0,3.2101,0.0003,0.91,...,fp8,1,1234,1.149,job-fp8

Read it with ``read_series`` here, ``pandas.read_csv(path, comment="#")`` or
``numpy.genfromtxt(path, delimiter=",", names=True, skip_header=1, dtype=None)``.
Unknown numbers are ``nan``; empty ``seed``/``run`` cells mean unknown.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERIES_SCHEMA = "kfp-sagemaker/step-series/v1"

# (column, type, meaning): the documented schema (README and component docstring).
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("step", "int", "optimizer step the line reports (1-based); one row per step, ascending"),
    ("tokens", "float", "tokens trained on up to and including this step, all ranks "
                        "(step x tokens per step; nan when the log does not say)"),
    ("loss", "float", "training loss of the step (cross-entropy in nats for a language model)"),
    ("lr", "float", "learning rate used for the step"),
    ("grad_norm", "float", "global gradient norm before clipping"),
    ("tokens_per_s", "float", "throughput, all ranks, since the previous step line"),
    ("tokens_per_s_per_gpu", "float", "throughput per GPU (per process on CPU)"),
    ("tflops_per_gpu", "float", "achieved TFLOP/s per GPU (model FLOPs, torchtitan convention)"),
    ("mfu", "float", "model FLOPs utilisation: fraction of the GPU's dense peak for the "
                     "precision (nan on CPU or when emulated)"),
    ("mem_alloc_gib", "float", "peak memory allocated by PyTorch since the previous step line, "
                               "GiB (nan on CPU)"),
    ("mem_reserved_gib", "float", "peak memory reserved by PyTorch's allocator, GiB"),
    ("precision", "str", "precision the step ran in (fp32, bf16, fp16, fp8, fp8-current, "
                         "fp8-block, mxfp8, nvfp4)"),
    ("emulated", "int", "1 when the low-precision numerics were emulated on the PyTorch "
                        "backend (throughput is then not a speed measurement), else 0"),
    ("seed", "int", "the trainer's random seed (same seed = same data order and init); "
                    "empty when unknown"),
    ("entropy_floor", "float", "entropy of the training data in nats/token when known (the "
                               "lowest loss reachable on synthetic data), else nan"),
    ("run", "str", "the run's label (the training job name by default)"),
)
COLUMN_NAMES = tuple(c[0] for c in COLUMNS)


# The metadata's ``status`` values that mean the run failed. The others: completed and
# stopped (from the trainer's summary) and incomplete (the log just ends).
FAILED_STATUSES = ("failed", "oom", "nan", "nccl_error", "error", "no_steps", "no_logs")


@dataclass
class Series:
    """A series read back: run metadata and columns (numbers as floats, nan when unknown)."""

    meta: dict[str, Any]
    columns: dict[str, list[Any]] = field(default_factory=dict)
    source: str = ""

    @property
    def precision(self) -> str:
        column = self.columns.get("precision") or []
        return str(self.meta.get("precision") or (column[-1] if column else "") or "")

    def __len__(self) -> int:
        return len(self.columns.get("step", []))


_INT_COLUMNS = ("step",)
_STR_COLUMNS = ("precision", "run")


def _float(text: str) -> float:
    try:
        return float(text) if text != "" else math.nan
    except ValueError:
        return math.nan


class SeriesFormatError(ValueError):
    """A file that is not a step series (names the file and what is wrong)."""


# The longest line a series may have: a step row is ~200 bytes and the metadata line a
# few KiB; a longer line is not a series, and is refused before the file is read.
MAX_LINE_BYTES = 1 << 20


def check_line_lengths(path: str | Path) -> None:
    """SeriesFormatError for a line over MAX_LINE_BYTES, reading at most that much at once
    (a 200 MB one-line file must not cost gigabytes)."""
    with open(path, "rb") as f:
        for lineno, line in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(line) > MAX_LINE_BYTES:
                raise SeriesFormatError(
                    f"{path}:{lineno}: a line longer than {MAX_LINE_BYTES // 2**20} MiB, so not "
                    f"a step series ({SERIES_SCHEMA}); the file was not read")


def read_series(path: str | Path) -> Series:
    check_line_lengths(path)
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    return parse_series(text, source=str(path))


def parse_series(text: str, *, source: str = "") -> Series:
    meta: dict[str, Any] = {}
    body = text
    if text.startswith("#"):
        first, _, body = text.partition("\n")
        payload = first[1:].strip()
        if payload.startswith(SERIES_SCHEMA):
            payload = payload[len(SERIES_SCHEMA):].strip()
        try:
            loaded = json.loads(payload) if payload else {}
        except ValueError as exc:
            raise SeriesFormatError(f"{source}: the metadata line is not JSON ({exc})") from None
        if not isinstance(loaded, dict):
            raise SeriesFormatError(f"{source}: the metadata line is not a JSON object")
        meta = loaded
    reader = csv.reader(io.StringIO(body))
    header = next(reader, None)
    if header is None:
        if meta:
            header = list(COLUMN_NAMES)
        else:
            raise SeriesFormatError(f"{source}: empty file, not a step series ({SERIES_SCHEMA})")
    header = [h.strip() for h in header]
    missing = [c for c in ("step", "loss") if c not in header]
    if missing:
        raise SeriesFormatError(
            f"{source}: not a step series: missing column(s) {', '.join(missing)} "
            f"(columns: {', '.join(header[:20])}); expected the CSV parse_logs writes")
    columns: dict[str, list[Any]] = {h: [] for h in header}
    for lineno, row in enumerate(reader, start=3 if meta else 2):
        if not row:
            continue
        if len(row) != len(header):
            raise SeriesFormatError(f"{source}:{lineno}: {len(row)} cells, header has "
                                    f"{len(header)}")
        for name, cell in zip(header, row, strict=True):
            if name in _INT_COLUMNS:
                try:
                    columns[name].append(int(cell))
                except ValueError:
                    raise SeriesFormatError(f"{source}:{lineno}: step {cell!r} is not an "
                                            "integer") from None
            elif name in _STR_COLUMNS:
                columns[name].append(cell)
            elif name == "seed":
                columns[name].append(int(cell) if cell.lstrip("-").isdigit() else None)
            elif name == "emulated":
                columns[name].append(cell.strip() in ("1", "true", "True"))
            else:
                columns[name].append(_float(cell))
    series = Series(meta=meta, columns=columns, source=source)
    for key, column in (("seed", "seed"), ("entropy_floor", "entropy_floor"),
                        ("run", "run")):
        if meta.get(key) is None and columns.get(column):
            meta[key] = columns[column][0]
    if "emulated" not in meta and columns.get("emulated"):
        meta["emulated"] = bool(columns["emulated"][-1])
    return series
