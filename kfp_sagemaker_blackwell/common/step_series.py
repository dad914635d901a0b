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

This module is the contract's one declaration: ``META_FIELDS`` (each metadata key's
type), ``COLUMNS`` and ``validate``, which the writer (``write_series``, called by
parse_logs) and the reader (``read_series``) both run, so parse_logs cannot write what
compare_convergence and rank_throughput refuse. ``validate`` refuses, as a
``SeriesFormatError`` (a ``UserError`` naming ``file:line`` and the fix): a metadata
value of another type (``"emulated": "no"``, ``"metrics": [1]``), a precision outside
``kfp_sagemaker_blackwell.catalog.precisions.PRECISIONS``, a cell that is not its column's type, a step outside
0..``MAX_STEP``, the same step twice with different values, and rows that contradict
the metadata (precision, emulated, seed, entropy floor, run, tokens per step, the
metrics' step count). Rows out of order are sorted; an identical repeat is kept once.

Plain typed Python rather than JSON Schema: jsonschema is only a dev extra (the
components image has it through sagemaker-core, by accident), the rows are CSV cells,
not a JSON document, and a whole-column check reads 100k rows in well under a second.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kfp_sagemaker_blackwell.catalog.precisions import PRECISIONS
from kfp_sagemaker_blackwell.common.errors import UserError

SERIES_SCHEMA = "kfp-sagemaker/step-series/v1"

# (column, type, meaning): the documented schema (docs/components.md and the component docstring).
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("step", "int", "optimizer step the line reports (1-based, at most MAX_STEP); one row "
                    "per step, ascending"),
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
STATUSES = ("completed", "stopped", "incomplete") + FAILED_STATUSES

# The largest step a series may hold. No run gets near it (a billion optimizer steps is
# three years at ten steps a second); a larger number is damage, and past 2**63 it no
# longer fits the int64 arrays the readers align curves on.
MAX_STEP = 10**9
# The largest world size, batch, sequence length or accumulation count: far above any
# real run, low enough that the throughput model's arithmetic stays finite.
MAX_COUNT = 10**9
# The largest magnitude of a model-spec number (hidden size, rope theta...).
MAX_SPEC_NUMBER = 1e15

READ_FIX = (f"pass the series file parse_logs wrote for the run, unedited ({SERIES_SCHEMA}, "
            "documented in common/step_series.py); if it is damaged, run "
            "parse_logs on the job's log again")


class SeriesFormatError(UserError):
    """A file that breaks the series contract. ``where`` is the file, or ``file:line`` for
    a row; the message says what is wrong and the fix."""

    def __init__(self, where: str, problem: str, fix: str = READ_FIX) -> None:
        super().__init__(where, problem, fix)


# ---- the metadata line: one declaration per key ---------------------------------------
# Every key may be absent or null (unknown); when it is there, it has the type below.
# Keys the schema does not declare are kept and ignored (a newer writer may add some).

Check = Callable[[Any], bool]


def _is_bool(x: Any) -> bool:
    return isinstance(x, bool)


def _is_str(x: Any) -> bool:
    return isinstance(x, str)


def _int_in(lo: int, hi: int) -> Check:
    return lambda x: isinstance(x, int) and not isinstance(x, bool) and lo <= x <= hi


def _number_in(lo: float, hi: float) -> Check:
    return lambda x: (isinstance(x, (int, float)) and not isinstance(x, bool)
                      and math.isfinite(x) and lo <= x <= hi)


def _spec_value(x: Any) -> bool:
    return x is None or isinstance(x, (bool, str)) or _number_in(-MAX_SPEC_NUMBER,
                                                                 MAX_SPEC_NUMBER)(x)


def _mapping_of(check: Check) -> Check:
    return lambda x: isinstance(x, dict) and all(check(v) for v in x.values())


def _list_of(check: Check) -> Check:
    return lambda x: isinstance(x, list) and all(check(v) for v in x)


_PRECISION_TEXT = "one of " + ", ".join(PRECISIONS)

# key -> (what it must be, in words; the check)
TRAINING_FIELDS: dict[str, tuple[str, Check]] = {
    "batch_size": (f"an integer from 1 to {MAX_COUNT:.0e}", _int_in(1, MAX_COUNT)),
    "seq_length": (f"an integer from 1 to {MAX_COUNT:.0e}", _int_in(1, MAX_COUNT)),
    "grad_accum_steps": (f"an integer from 1 to {MAX_COUNT:.0e}", _int_in(1, MAX_COUNT)),
    "max_steps": (f"an integer from 0 to {MAX_STEP:.0e}", _int_in(0, MAX_STEP)),
    "activation_checkpointing": ("true or false", _is_bool),
    "model": ("an object of numbers, strings and booleans (the model spec)",
              _mapping_of(_spec_value)),
}


def _training(x: Any) -> bool:
    return isinstance(x, dict) and all(
        x.get(k) is None or check(x[k]) for k, (_, check) in TRAINING_FIELDS.items())


META_FIELDS: dict[str, tuple[str, Check]] = {
    "schema": (f"the string {SERIES_SCHEMA!r}", lambda x: x == SERIES_SCHEMA),
    "run": ("a string (the run's label)", _is_str),
    "status": ("one of " + ", ".join(STATUSES), lambda x: _is_str(x) and x in STATUSES),
    "failed": ("true or false", _is_bool),
    "failure_reason": ("a string", _is_str),
    "requested_precision": ("a string", _is_str),
    "precision": (_PRECISION_TEXT + ", or \"\" when unknown",
                  lambda x: _is_str(x) and (x == "" or x in PRECISIONS)),
    "precision_confirmed": ("true or false", _is_bool),
    "recipe": ("a string", _is_str),
    "backend": ("a string", _is_str),
    "emulated": ("true or false (a JSON boolean)", _is_bool),
    "seed": ("an integer", _int_in(-(2**63), 2**64 - 1)),
    "entropy_floor": ("a finite number >= 0 (nats per token)", _number_in(0.0, 1e6)),
    "world_size": (f"an integer from 1 to {MAX_COUNT:.0e}", _int_in(1, MAX_COUNT)),
    "gpu": ("a string", _is_str),
    "tokens_per_step": ("a finite number > 0", _number_in(1e-300, 1e300)),
    "training": ("an object whose " + "; ".join(f"{k} is {w}" for k, (w, _) in
                                                TRAINING_FIELDS.items()), _training),
    "metrics": ("an object of finite numbers or nulls (e.g. {\"mean_tokens_per_s\": 1234.5})",
                _mapping_of(lambda v: v is None or _number_in(-1e300, 1e300)(v))),
    "counts": ("an object of integers >= 0", _mapping_of(_int_in(0, 2**63))),
    "warnings": ("a list of strings", _list_of(_is_str)),
}


def check_meta(meta: dict[str, Any], source: str) -> dict[str, Any]:
    """``meta`` if it keeps the contract, else SeriesFormatError naming the first bad key."""
    for key, (want, check) in META_FIELDS.items():
        value = meta.get(key)
        if value is not None and not check(value):
            shown = json.dumps(value, default=str)
            raise SeriesFormatError(source, f"the metadata's {key!r} is {_cut(shown)}; it must "
                                    f"be {want} (or null when unknown).")
    status, failed = meta.get("status"), meta.get("failed")
    if status is not None and failed is not None and failed != (status in FAILED_STATUSES):
        raise SeriesFormatError(source, f"the metadata says status {status!r} but failed "
                                f"{json.dumps(failed)}: they contradict each other.")
    return meta


def _cut(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


# ---- the rows ----------------------------------------------------------------------------

FLOAT_COLUMNS = tuple(c[0] for c in COLUMNS if c[1] == "float")


@dataclass
class Series:
    """A series read back: run metadata and columns, sorted by step, one row per step
    (numbers as floats, nan when unknown; ``emulated`` as bools; ``seed`` None when
    unknown)."""

    meta: dict[str, Any]
    columns: dict[str, list[Any]] = field(default_factory=dict)
    source: str = ""

    @property
    def precision(self) -> str:
        column = self.columns.get("precision") or []
        return str(self.meta.get("precision") or (column[-1] if column else "") or "")

    def __len__(self) -> int:
        return len(self.columns.get("step", []))


def run_cell(run: str) -> str:
    """The ``run`` column's text for a label (no comma, no line break: one cell that
    numpy.genfromtxt reads too)."""
    return run.replace(",", "_").replace("\r", " ").replace("\n", " ")


def _is_float(x: Any) -> bool:
    return isinstance(x, float)  # nan and inf included: a NaN loss is data


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


_CELL_KINDS: dict[str, tuple[str, Check]] = {
    "step": (f"an integer from 0 to {MAX_STEP:.0e}", _int_in(0, MAX_STEP)),
    "precision": (_PRECISION_TEXT, lambda x: _is_str(x) and x in PRECISIONS),
    "emulated": ("0 or 1", _is_bool),
    "seed": ("an integer, or empty when unknown",
             lambda x: x is None or _int_in(-(2**63), 2**64 - 1)(x)),
    "run": ("a string", _is_str),
}
_NUMBER_CELL: tuple[str, Check] = ("a number, or nan when unknown", _is_float)


def _column_ok(name: str, values: list[Any]) -> bool:
    """The fast check of a whole column (C-level set and min/max: 100k rows in ms); the
    slow one per value runs only to name the row that fails."""
    types = set(map(type, values))
    if name == "step":
        return types <= {int} and (not values or 0 <= min(values) <= max(values) <= MAX_STEP)
    if name == "precision":
        return types <= {str} and set(values) <= set(PRECISIONS)
    if name == "emulated":
        return types <= {bool}
    if name == "seed":
        ints = [v for v in set(values) if v is not None]
        return types <= {int, type(None)} and all(_CELL_KINDS["seed"][1](v) for v in ints)
    if name == "run":
        return types <= {str}
    return types <= {float}


def _check_cells(columns: dict[str, list[Any]], lines: list[int], source: str) -> None:
    """Each value has its column's type and range (the writer's data and the reader's)."""
    for name in COLUMN_NAMES:
        if _column_ok(name, columns[name]):
            continue
        want, check = _CELL_KINDS.get(name, _NUMBER_CELL)
        for i, value in enumerate(columns[name]):
            if not check(value):
                raise SeriesFormatError(f"{source}:{lines[i]}", f"column {name}: "
                                        f"{_cut(repr(value))} is not {want}.")


def _sort_and_merge(columns: dict[str, list[Any]], lines: list[int],
                    source: str) -> tuple[dict[str, list[Any]], list[int]]:
    """Rows sorted by step; a repeated step with the same values is kept once, with other
    values it is refused (which one would be the run's?)."""
    steps = columns["step"]
    if all(map(operator.lt, steps, itertools.islice(steps, 1, None))):
        return columns, lines  # what parse_logs writes: ascending, one row per step
    order = sorted(range(len(steps)), key=steps.__getitem__)
    keep: list[int] = []
    for i in order:
        if keep and steps[keep[-1]] == steps[i]:
            j = keep[-1]
            differ = [n for n in COLUMN_NAMES if not _same(columns[n][j], columns[n][i])]
            if differ:
                a, b = sorted((lines[i], lines[j]))
                raise SeriesFormatError(
                    f"{source}:{b}", f"step {steps[i]} appears twice (lines {a} and {b}) with "
                    f"different {', '.join(differ[:4])}: the series cannot say which is the "
                    "run's.", "keep one row per step (after a restart parse_logs keeps the "
                    "re-run step); " + READ_FIX)
            continue
        keep.append(i)
    if keep == list(range(len(steps))):
        return columns, lines
    return ({n: [col[i] for i in keep] for n, col in columns.items()},
            [lines[i] for i in keep])


def _constant(columns: dict[str, list[Any]], lines: list[int], name: str, meta_value: Any,
              source: str, *, what: str) -> None:
    """Every row's ``name`` equals the metadata's value (or, without one, the first row's)."""
    values = columns[name]
    if not values:
        return
    expect = values[0] if meta_value is None else meta_value
    if isinstance(expect, float) and math.isnan(expect):
        if all(isinstance(v, float) and math.isnan(v) for v in values):
            return
    elif values.count(expect) == len(values) and set(map(type, values)) == {type(expect)}:
        return
    for i, v in enumerate(values):
        if not _same(v, expect):
            said = "the metadata" if meta_value is not None else f"line {lines[0]}"
            raise SeriesFormatError(
                f"{source}:{lines[i]}", f"step {columns['step'][i]} says {name} {v!r} but "
                f"{said} says {expect!r}: {what}.")


def _check_tokens(columns: dict[str, list[Any]], lines: list[int], meta: dict[str, Any],
                  source: str) -> None:
    tps = meta.get("tokens_per_step")
    last = -math.inf
    for i, (step, tokens) in enumerate(zip(columns["step"], columns["tokens"], strict=True)):
        if not math.isfinite(tokens):
            continue
        expect = step * tps if tps is not None else None
        if tokens <= last or tokens < 0 or (
                expect is not None and not math.isclose(tokens, expect, rel_tol=1e-9)):
            why = (f"tokens_per_step {tps:g} x step" if expect is not None
                   else "a count that grows with the step")
            raise SeriesFormatError(f"{source}:{lines[i]}", f"step {step} says tokens "
                                    f"{tokens!r}, which is not {why}.")
        last = tokens


def _check_against_meta(columns: dict[str, list[Any]], lines: list[int], meta: dict[str, Any],
                        source: str) -> None:
    """The rows say what the metadata says (precision, numerics, seed, floor, run, counts)."""
    floor = meta.get("entropy_floor")
    run = meta.get("run")
    _constant(columns, lines, "precision", meta.get("precision") or None, source,
              what="one series holds one run, in one precision")
    _constant(columns, lines, "emulated", meta.get("emulated"), source,
              what="a run's numerics are emulated for all its steps or none")
    _constant(columns, lines, "seed", meta.get("seed"), source, what="one run has one seed")
    _constant(columns, lines, "entropy_floor", None if floor is None else float(floor),
              source, what="one run trains on one data set")
    _constant(columns, lines, "run", None if run is None else run_cell(run), source,
              what="one series holds one run")
    _check_tokens(columns, lines, meta, source)
    metrics = meta.get("metrics") or {}
    steps = columns["step"]
    counted = {"steps": (len(steps), f"{len(steps)} rows"),
               "last_step": (steps[-1] if steps else None, f"last step {steps[-1] if steps else ''}")}
    for key, (value, has) in counted.items():
        if metrics.get(key) is not None and value is not None and metrics[key] != value:
            raise SeriesFormatError(source, f"the metadata's metrics say {key} "
                                    f"{metrics[key]:g} but the file has {has}: the metadata "
                                    "is not the rows'.")


def validate(meta: dict[str, Any], columns: dict[str, list[Any]], *, source: str,
             lines: list[int] | None = None) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """The contract, for the writer's data and the reader's alike: typed metadata, typed
    cells, rows sorted by step with no conflicting repeat, rows that agree with the
    metadata. Returns (meta, columns sorted by step); SeriesFormatError names the file,
    the line and the fix. ``lines`` are the rows' line numbers in the file (default:
    where the writer puts them, after the metadata line and the header)."""
    check_meta(meta, source)
    n = len(columns.get("step", []))
    if set(columns) != set(COLUMN_NAMES) or any(len(c) != n for c in columns.values()):
        raise SeriesFormatError(source, "the columns are not the schema's ("
                                + ", ".join(COLUMN_NAMES) + ") with one value per row.")
    lines = list(range(3, 3 + n)) if lines is None else lines
    _check_cells(columns, lines, source)
    columns, lines = _sort_and_merge(columns, lines, source)
    _check_against_meta(columns, lines, meta, source)
    return meta, columns


# ---- text ---------------------------------------------------------------------------------

def _format(x: Any) -> str:
    if x is None:
        return ""
    if isinstance(x, bool):
        return "1" if x else "0"
    if isinstance(x, float):
        return repr(x) if math.isfinite(x) else ("nan" if math.isnan(x) else
                                                 ("inf" if x > 0 else "-inf"))
    return str(x)


def write_series(path: str | Path, meta: dict[str, Any], columns: dict[str, list[Any]]) -> int:
    """Validates (``validate``) and writes the series; returns the number of rows."""
    meta = {"schema": SERIES_SCHEMA, **meta}
    meta, columns = validate(meta, columns, source=str(path))
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(f"# {SERIES_SCHEMA} {json.dumps(meta, sort_keys=True, allow_nan=False)}\n")
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(COLUMN_NAMES)
        cols = [columns[name] for name in COLUMN_NAMES]
        writer.writerows([_format(col[i]) for col in cols] for i in range(len(columns["step"])))
    return len(columns["step"])


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
                    f"{path}:{lineno}", f"a line longer than {MAX_LINE_BYTES // 2**20} MiB, "
                    f"so not a step series ({SERIES_SCHEMA}); the file was not read.")


def read_series(path: str | Path) -> Series:
    check_line_lengths(path)
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    return parse_series(text, source=str(path))


def _parse_meta(first: str, source: str) -> dict[str, Any]:
    payload = first[1:].strip()
    if not payload.startswith(SERIES_SCHEMA):
        raise SeriesFormatError(source + ":1", f"the first line is a comment but not the "
                                f"{SERIES_SCHEMA} metadata line ({_cut(payload, 60)!r}).")
    payload = payload[len(SERIES_SCHEMA):].strip()
    try:
        loaded = json.loads(payload) if payload else {}
    except ValueError as exc:
        raise SeriesFormatError(source + ":1", f"the metadata line is not JSON ({exc}).") from None
    if not isinstance(loaded, dict):
        raise SeriesFormatError(source + ":1", "the metadata line is not a JSON object.")
    return check_meta(loaded, source)


def _int_cell(cell: str) -> int | str:
    """An integer cell as int (digits, an optional minus), else the text (refused later)."""
    digits = cell[1:] if cell.startswith("-") else cell
    return int(cell) if digits.isascii() and digits.isdigit() and len(digits) <= 20 else cell


def _float_cell(cell: str) -> float | str:
    try:
        return float(cell)  # also "nan", "inf", "-inf", surrounding blanks
    except ValueError:
        return math.nan if not cell.strip() else cell


def _seed_cell(cell: str) -> int | str | None:
    return None if not cell.strip() else _int_cell(cell.strip())


def _emulated_cell(cell: str) -> bool | str:
    return {"0": False, "1": True}.get(cell.strip(), cell)


# One cell's text as the type its column declares; text that is not stays text, so the
# check names the row.
_CONVERTERS: dict[str, Callable[[str], Any]] = {
    **{name: _float_cell for name in FLOAT_COLUMNS},
    "step": lambda cell: _int_cell(cell.strip()), "seed": _seed_cell,
    "emulated": _emulated_cell, "precision": str.strip, "run": str.strip,
}


def _convert(name: str, cells: Sequence[str]) -> list[Any]:
    """A column's cells as its type: ``float`` (or ``int``) over the whole column in C
    first, cell by cell only when some cell is not a number (it stays text, to be named)."""
    fast = float if name in FLOAT_COLUMNS else int if name == "step" else None
    if fast is not None:
        try:
            return list(map(fast, cells))
        except ValueError:
            pass
    convert = _CONVERTERS[name]
    table = {cell: convert(cell) for cell in set(cells)}  # seed, run...: one value each
    return list(map(table.__getitem__, cells))


def _header(header: list[str], source: str, line: int) -> list[str]:
    header = [h.strip() for h in header]
    missing = [c for c in COLUMN_NAMES if c not in header]
    if missing:
        raise SeriesFormatError(
            f"{source}:{line}", f"not a step series: missing column(s) {', '.join(missing)} "
            f"(columns: {_cut(', '.join(header[:20]), 200)}); expected the CSV parse_logs "
            "writes.")
    extra = sorted({h for h in header if header.count(h) > 1 or h not in COLUMN_NAMES})
    if extra:
        raise SeriesFormatError(f"{source}:{line}", "the header has column(s) the schema "
                                f"does not declare, or twice: {_cut(', '.join(extra), 200)}.")
    return header


def parse_series(text: str, *, source: str = "") -> Series:
    meta: dict[str, Any] = {}
    body = text
    if text.startswith("#"):
        first, _, body = text.partition("\n")
        meta = _parse_meta(first, source)
    first_line = 2 if text.startswith("#") else 1
    reader = csv.reader(io.StringIO(body))
    header = next(reader, None)
    if header is None and not meta:
        raise SeriesFormatError(source, f"empty file, not a step series ({SERIES_SCHEMA}).")
    header = _header(header, source, first_line) if header is not None else list(COLUMN_NAMES)
    rows: list[list[str]] = []
    lines: list[int] = []
    for row in reader:
        if not row:
            continue
        lineno = first_line + reader.line_num - 1
        if len(row) != len(header):
            raise SeriesFormatError(f"{source}:{lineno}", f"{len(row)} cells, the header has "
                                    f"{len(header)}.")
        rows.append(row)
        lines.append(lineno)
    cells = zip(*rows, strict=True) if rows else ((),) * len(header)
    columns = {name: _convert(name, col) for name, col in zip(header, cells, strict=True)}
    meta, columns = validate(meta, columns, source=source, lines=lines)
    for key in ("seed", "entropy_floor", "run"):
        if meta.get(key) is None and columns[key]:
            meta[key] = columns[key][0]
    if meta.get("emulated") is None and columns["emulated"]:
        meta["emulated"] = columns["emulated"][-1]
    return Series(meta=meta, columns=columns, source=source)
