"""The log parser: trainer lines, TE's fsdp.py lines and the noise around them.

Speed matters (a long multi-host job logs millions of lines), so the parser
never loops over lines in Python. It works on whole byte buffers:

- one ``re.split`` over the buffer finds every ``[trainer] `` record: step lines
  come back as their field values (sliced into columns, converted with ``map``),
  other records as their kind word, and what lies between them is the noise;
- the fast pattern takes any non-space number and the numbers are then checked
  in bulk against the contract's number syntax; a buffer with a value the
  contract refuses is split again with the exact pattern (same result as
  ``catalog.logformat.parse_step`` line by line, proven by the tests);
- rare lines (errors, OOM, NCCL, SIGTERM, TE's fsdp.py prints, recipe phrases)
  are looked for in the noise only when a cheap ``needle in noise`` test says
  the buffer holds one, and only the lines holding the needle are examined.

Bytes, not text: noise is never decoded, so non-UTF-8 output costs nothing and
cannot raise; the few interesting lines are decoded with replacement.

The line format itself belongs to :mod:`catalog.logformat`; the patterns here
are built from that module's field list and recipe pattern.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from catalog import logformat
from catalog.precisions import TE_RECIPES

# The number syntax of catalog.logformat (same language), written so that a
# hostile run of digits cannot make the regex engine backtrack quadratically.
_NUM = rb"(?:[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf))"
TAG = logformat.TAG.encode()
NUMERIC_STEP_FIELDS = logformat.STEP_FIELDS[1:-2]  # loss ... mem_reserved_gib


def _scan_pattern(step: bytes, number: bytes, precision: bytes) -> bytes:
    """``[trainer] `` followed either by a whole step line (its 12 values captured) or
    by any other record's kind word (captured in the 13th group)."""
    fields = logformat.STEP_FIELDS
    assert fields[0] == "step" and fields[-2:] == ("precision", "emulated"), fields
    parts = [rb"step step=(" + step + b")"]
    parts += [b" " + name.encode() + b"=(" + number + b")" for name in fields[1:-2]]
    parts += [rb" precision=(" + precision + rb") emulated=([01])"]
    return re.escape(TAG) + rb" (?:" + b"".join(parts) + rb"|([a-z_]*))"


# Fast: any non-space number (checked afterwards; the contract's own number pattern, or a
# narrower byte class, costs the regex engine more than the checks). Exact: the contract's
# syntax. Steps and precision names are read exactly by both.
# A step has at most 18 digits (an int64; Python refuses to convert > 4300 digits at all).
SCAN_RE = re.compile(_scan_pattern(rb"\d{1,18}", rb"[^ ]+", rb"[\w-]+"))
EXACT_SCAN_RE = re.compile(_scan_pattern(rb"\d{1,18}", _NUM, rb"[\w-]+"))
STRIDE = SCAN_RE.groups + 1  # split() pieces per record: the noise before it + its groups
KIND_GROUP = SCAN_RE.groups  # 1-based index of the kind word
RECIPE_BULK_RE = re.compile(logformat.RECIPE_RE.pattern.encode())
JSON_KINDS = frozenset(("config", "summary", "data", "model", "world", "checkpoint", "event"))
_STEP_TAG = TAG + b" step step="


def _marks(table: dict[bytes, bytes]) -> bytes:
    """A bytes.translate table: each byte of a key becomes its value, any other byte "x"."""
    out = bytearray(b"x" * 256)
    for keys, mark in table.items():
        for k in keys:
            out[k] = mark[0]
    return bytes(out)


# The bytes of the contract's numbers become "0", signs and the separating spaces ",", a
# dot stays and anything else becomes "x" (see _numbers_ok).
_NUMBER_MARKS = _marks({b"0123456789eEnaif": b"0", b".": b".", b"+- ": b","})

# --- rare lines -----------------------------------------------------------------------------
_UNITS = {"B": 1, "bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_SIZE = r"([\d.]+) ?(B|bytes|[KMGT]i?B)"
_OOM_ALLOC_RE = re.compile(r"[Tt]ried to allocate " + _SIZE)
_OOM_GPU_RE = re.compile(r"GPU (\d+) has a total capacity of " + _SIZE + r"(?: of which " + _SIZE
                         + r" is free)?")
_OOM_GPU_OLD_RE = re.compile(r"\(GPU (\d+); " + _SIZE + r" total capacity")
_OOM_TOTAL_RE = re.compile(r"total(?: capacity of)? " + _SIZE)
_EXCEPTION_RE = re.compile(r"(?<![\w.])((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)): ?(.*)")
_NCCL_ERROR_RE = re.compile(
    r"NCCL error|nccl\w*Error|DistBackendError|Watchdog caught collective operation timeout"
    r"|NCCL communicator was aborted|ProcessGroupNCCL.*(?:timed out|Timeout)"
)
_SIGTERM_RE = re.compile(r"SIGTERM|Signals\.SIGTERM")
_TE_RES = {
    "world_size": re.compile(r"WORLD_SIZE = (\d+)"),
    "precision_preset": re.compile(r"Using precision preset: ([\w-]+)"),
    "training_configuration": re.compile(r"Training configuration: dtype=(\S+), FP8=(\w+)"),
    "pre_fsdp_memory_mib": re.compile(r"Pre-FSDP memory use = ([\d.eE+-]+)MiB"),
    "post_fsdp_memory_mib": re.compile(r"Post-FSDP memory use = ([\d.eE+-]+)MiB"),
    "training_time_s": re.compile(r"Training Time: ([\d.eE+-]+)s"),
    "avg_iter_time_s": re.compile(r"Avg\. Iter\. Time: ([\d.eE+-]+)s"),
    "peak_memory_mb": re.compile(r"Peak Memory Use: ([\d.eE+-]+)MBs"),
}
# Phrases that confirm a recipe in TE's users' words (catalog.logformat.recipe_phrase
# writes them; TE's fsdp.py prints the first one).
_PHRASE_RE = re.compile(r"Using FP8 recipe: (\w+)|(MXFP8|NVFP4) enabled(?:: (\w+))?")
_STREAM_RE = re.compile(r"(algo-\d+)-(\d+)$")
RECIPE_TO_PRECISION = {recipe: precision for precision, recipe in TE_RECIPES.items()}

# A needle is a substring every line of interest holds (LogParser._needles pairs each
# with its handler).
_ERROR_NEEDLE = b"rror"  # Error/error: OOM, NCCL, exceptions
_TRACEBACK = b"Traceback (most recent call last)"
MAX_EVENTS_PER_KIND = 50  # events beyond this are counted, not kept
MAX_LINES_PER_NEEDLE = 2000  # per buffer: hostile input cannot make the slow path unbounded
MAX_LINE_CHARS = 4000  # longer interesting lines are cut in events


def _size_bytes(value: str, unit: str) -> int | None:
    try:
        return int(float(value) * _UNITS[unit])
    except (ValueError, KeyError, OverflowError):
        return None


def _decode(line: bytes) -> str:
    return line.decode("utf-8", "replace")


def _step_columns(parts: list[Any], records: list[int], matches: int) -> list[list[Any]]:
    """The step lines' 12 columns of a split buffer whose matches ``records`` (ascending)
    are other records: sliced between them (one copy), or filtered when they are many."""
    if len(records) > 64:
        keep = [True] * matches
        for r in records:
            keep[r] = False
        return [list(itertools.compress(parts[k::STRIDE], keep)) for k in range(1, KIND_GROUP)]
    bounds = list(zip([0] + [r + 1 for r in records], records + [matches], strict=True))
    cols: list[list[Any]] = []
    for k in range(1, KIND_GROUP):
        column: list[Any] = []
        for a, b in bounds:
            column += parts[a * STRIDE + k:b * STRIDE:STRIDE]
        cols.append(column)
    return cols


def _decoded(column: list[bytes]) -> list[str]:
    """The precision names as text (a buffer's steps almost always share one)."""
    n = len(column)
    if column.count(column[0]) == n:
        return [column[0].decode("ascii", "replace")] * n
    names = {b: b.decode("ascii", "replace") for b in set(column)}
    return list(map(names.__getitem__, column))


def _flags(column: list[bytes]) -> list[bool]:
    """``emulated=1`` per step line (a buffer's steps almost always agree)."""
    n, ones = len(column), column.count(b"1")
    if ones in (0, n):
        return [ones == n] * n
    return list(map(b"1".__eq__, column))


def _numbers_ok(columns: list[list[bytes]]) -> bool:
    """Can ``float()`` of these values differ from the contract's reading? (bulk checks)

    Within the bytes of _NUMBER_MARKS, ``float()`` accepts exactly the contract's numbers
    except a leading dot (".5", "-.5"): the ",." search finds it (and sends the odd
    "1e-.5", which both refuse, to the exact pattern). Whitespace, underscores, capitals
    and "infinity", which float() would take, hold other bytes.
    """
    for column in columns:
        marked = b" ".join(column).translate(_NUMBER_MARKS)
        if b"x" in marked or b",." in marked or marked.startswith(b"."):
            return False
    return True


class _Scan:
    """One buffer split around its ``[trainer] `` records (see SCAN_RE)."""

    def __init__(self, parts: list[Any], last_step_before: int | None) -> None:
        self.parts = parts
        self.matches = (len(parts) - 1) // STRIDE
        self.before = last_step_before
        self.steps: list[int] = []
        self.numbers: list[list[float]] = []
        self.precision: list[str] = []
        self.emulated: list[bool] = []
        self.record_index: list[int] = []  # matches that are not step lines
        self._offsets: list[int] | None = None

    def take_steps(self, *, exact: bool) -> bool:
        """Converts the step lines' values; False when a value breaks the contract."""
        if not self.matches:
            return True
        parts = self.parts
        first = parts[1::STRIDE]
        if None in first:  # other records: few, so the columns are read around them
            records, i = [], -1
            try:
                while True:
                    i = first.index(None, i + 1)
                    records.append(i)
            except ValueError:
                pass
            self.record_index = records
            cols = _step_columns(parts, records, len(first))
            first = cols[0]
        else:
            cols = [first] + [parts[k::STRIDE] for k in range(2, KIND_GROUP)]
        if not first:
            return True
        if not exact and not _numbers_ok(cols[1:10]):
            return False
        try:
            steps = list(map(int, first))
            numbers = [list(map(float, c)) for c in cols[1:10]]
        except ValueError:
            if exact:  # pragma: no cover - the exact pattern admits numbers only
                raise
            return False
        self.steps, self.numbers = steps, numbers
        self.precision = _decoded(cols[10])
        self.emulated = _flags(cols[11])
        return True

    def noise(self, chunk: bytes) -> bytes:
        """The buffer without its step lines' ``[trainer] step ...`` part."""
        return chunk if not self.matches else b"".join(self.parts[0::STRIDE])

    def records(self) -> Iterable[tuple[int, bytes, bytes]]:
        """(match index, kind word, rest of its line) of each non-step record."""
        for r in self.record_index:
            rest = self.parts[(r + 1) * STRIDE]
            end = rest.find(b"\n")
            yield r, self.parts[r * STRIDE + KIND_GROUP] or b"", rest if end < 0 else rest[:end]

    def step_at_match(self, r: int) -> int | None:
        """The step of the last step line at or before match ``r``."""
        steps_so_far = r + 1 - bisect.bisect_right(self.record_index, r)
        return self.steps[steps_so_far - 1] if steps_so_far > 0 else self.before

    def step_at_noise(self, pos: int) -> int | None:
        """The step of the last step line before offset ``pos`` of ``noise()``."""
        if not self.matches:
            return self.before
        if self._offsets is None:
            self._offsets = list(itertools.accumulate(map(len, self.parts[0::STRIDE])))
        piece = bisect.bisect_right(self._offsets, pos)
        return self.step_at_match(piece - 1) if piece > 0 else self.before


@dataclass
class Stream:
    """What was read from one source (a CloudWatch stream, a file)."""

    name: str
    lines: int = 0
    first_timestamp: int | None = None


@dataclass
class ParsedLog:
    """Everything the parser found. ``series`` holds one list per column of SERIES_COLUMNS."""

    series: dict[str, list[Any]]
    recipe: dict[str, Any] | None
    records: dict[str, dict[str, Any]]  # last config/model/world/data/summary payload
    te: dict[str, Any]  # values from TE's examples/pytorch/fsdp/fsdp.py
    events: list[dict[str, Any]]
    event_counts: dict[str, int]
    warnings: list[str]
    stats: dict[str, int]
    streams: list[str]

    @property
    def summary(self) -> dict[str, Any]:
        return self.records.get("summary", {})

    @property
    def steps(self) -> int:
        return len(self.series["step"])


class LogParser:
    """Incremental parser. ``feed`` complete lines (bytes), then ``result()``.

    Args:
        spike_threshold: a finite loss more than this fraction above the running
            average (EMA, alpha 0.1) of the losses before it is a loss spike.
    """

    def __init__(self, *, spike_threshold: float = 0.5) -> None:
        self.spike_threshold = spike_threshold
        self._steps: list[int] = []
        self._cols: dict[str, list[float]] = {name: [] for name in NUMERIC_STEP_FIELDS}
        self._precision: list[str] = []
        self._emulated: list[bool] = []
        self._step_stream: list[int] = []  # index into self._streams per step row
        self.recipe: dict[str, Any] | None = None
        self.records: dict[str, dict[str, Any]] = {}
        self.te: dict[str, Any] = {}
        self.events: list[dict[str, Any]] = []
        self.event_counts: dict[str, int] = {}
        self.warnings: list[str] = []
        self.stats = {"lines": 0, "bytes": 0, "trainer_records": 0, "step_lines": 0,
                      "unparsed_trainer_records": 0, "tracebacks": 0}
        self._streams: list[Stream] = []
        self._stream_index: dict[str, int] = {}
        self._last_step: int | None = None
        self._oom_by_step: dict[int | None, dict[str, Any]] = {}
        self._seen: set[tuple[Any, ...]] = set()
        self._finished: ParsedLog | None = None

    # ---- events -------------------------------------------------------------------------
    def add_event(self, kind: str, **payload: Any) -> None:
        self.event_counts[kind] = self.event_counts.get(kind, 0) + 1
        if self.event_counts[kind] <= MAX_EVENTS_PER_KIND:
            event = {"kind": kind}
            event.update(payload)
            self.events.append(event)

    # ---- input --------------------------------------------------------------------------
    def stream(self, name: str, first_timestamp: int | None = None) -> int:
        if name not in self._stream_index:
            self._stream_index[name] = len(self._streams)
            self._streams.append(Stream(name, first_timestamp=first_timestamp))
        return self._stream_index[name]

    def feed_text(self, messages: Iterable[str], stream: str = "", *,
                  first_timestamp: int | None = None, batch: int = 20_000) -> None:
        """Feeds log messages (one line each, e.g. CloudWatch events) as text."""
        buf: list[str] = []
        for message in messages:
            buf.append(message)
            if len(buf) >= batch:
                self.feed("\n".join(buf).encode("utf-8", "surrogatepass"), stream,
                          first_timestamp=first_timestamp)
                buf = []
        if buf:
            self.feed("\n".join(buf).encode("utf-8", "surrogatepass"), stream,
                      first_timestamp=first_timestamp)

    def feed(self, chunk: bytes, stream: str = "", *, first_timestamp: int | None = None) -> None:
        """Parses a buffer of whole lines (a final line without newline is fine)."""
        if not chunk:
            return
        sidx = self.stream(stream, first_timestamp)
        last_step_before = self._last_step
        scan = _Scan(SCAN_RE.split(chunk), last_step_before)
        if not scan.take_steps(exact=False):  # a value the contract refuses: read it exactly
            scan = _Scan(EXACT_SCAN_RE.split(chunk), last_step_before)
            scan.take_steps(exact=True)
        self._add_steps(scan, sidx)
        noise = scan.noise(chunk)
        lines = noise.count(b"\n") + (0 if chunk.endswith(b"\n") else 1)
        self._streams[sidx].lines += lines
        self.stats["lines"] += lines
        self.stats["bytes"] += len(chunk)
        self.stats["trainer_records"] += scan.matches
        unparsed = scan.matches - len(scan.steps)
        if unparsed:
            unparsed -= self._other_records(scan)
        self.stats["unparsed_trainer_records"] += unparsed

        has_error = _ERROR_NEEDLE in noise
        if has_error and _TRACEBACK in noise:
            self.stats["tracebacks"] += noise.count(_TRACEBACK)
        seen: set[int] = set()
        for needle, handler in self._needles(has_error):
            if not (has_error if needle is _ERROR_NEEDLE else needle in noise):
                continue
            for start, line in _lines_holding(noise, needle):
                if start in seen:  # one line, two needles (e.g. TE's recipe line)
                    continue
                seen.add(start)
                handler(_decode(line[:MAX_LINE_CHARS]), scan.step_at_noise(start))

    def _needles(self, has_error: bool) -> list[tuple[bytes, Callable[[str, int | None], None]]]:
        """(needle, handler) for the rare lines worth a look in a buffer."""
        needles: list[tuple[bytes, Callable[[str, int | None], None]]] = [
            (_ERROR_NEEDLE, self._on_error_line),
            (b"SIGTERM", self._on_sigterm_line),
        ]
        # Looked for only until the trainer's own recipe line is seen (it is authoritative).
        if not (self.recipe and self.recipe.get("source") == "trainer"):
            needles += [
                (b"[GPU-", self._on_te_line),  # TE's fsdp.py dist_print prefix
                (b"FP8 recipe", self._on_phrase_line),
                (b" enabled", self._on_phrase_line),  # MXFP8 enabled / NVFP4 enabled
            ]
        if has_error:  # NCCL timeouts say it without "error"
            needles.append((b"Watchdog caught", self._on_error_line))
        return needles

    def _add_steps(self, scan: _Scan, sidx: int) -> None:
        if not scan.steps:
            return
        self._steps.extend(scan.steps)
        for name, values in zip(NUMERIC_STEP_FIELDS, scan.numbers, strict=True):
            self._cols[name].extend(values)
        self._precision.extend(scan.precision)
        self._emulated.extend(scan.emulated)
        self._step_stream.extend(itertools.repeat(sidx, len(scan.steps)))
        self.stats["step_lines"] += len(scan.steps)
        self._last_step = scan.steps[-1]

    # ---- trainer records other than steps ---------------------------------------------------
    def _other_records(self, scan: _Scan) -> int:
        """Handles the non-step records of a buffer; returns how many were understood."""
        matched = 0
        for index, kind_bytes, rest in scan.records():
            kind = kind_bytes.decode()
            if kind == "recipe":
                line = TAG + b" recipe" + rest
                r = RECIPE_BULK_RE.match(line)
                if r is None:
                    continue
                matched += 1
                self._on_recipe(r.group(1).decode(), r.group(2).decode(), r.group(3).decode(),
                                r.group(4) == b"1", "trainer", _decode(line[:MAX_LINE_CHARS]))
            elif kind in JSON_KINDS and rest.startswith(b" {"):
                payload = _json_payload(rest[1:])
                if payload is None:
                    continue
                matched += 1
                self._on_record(kind, payload, scan.step_at_match(index))
        return matched

    def _on_record(self, kind: str, payload: dict[str, Any], step: int | None) -> None:
        if kind == "checkpoint":
            action = str(payload.get("action", ""))
            ck_step = payload.get("step", step)
            self.add_event(f"checkpoint_{action}" if action in ("saved", "resumed")
                           else "checkpoint", step=ck_step, path=payload.get("path"),
                           source="trainer")
            if action == "resumed":
                self.add_event("restart", step=ck_step,
                               reason=f"resumed from checkpoint {payload.get('path', '')} "
                               f"at step {ck_step}")
        elif kind == "event":
            ev_kind = str(payload.get("kind", "")) or "event"
            extra = {k: v for k, v in payload.items() if k != "kind"}
            extra.setdefault("step", step)
            extra["source"] = "trainer"
            if ev_kind == "oom":
                self._on_oom(str(payload.get("message", "")), extra.pop("step"), extra)
            elif ev_kind in ("error", "nan_loss", "sigterm") and self._seen_once(
                    (ev_kind, extra.get("step"), str(extra.get("message", "")))):
                return  # every rank reports the same failure
            else:
                self.add_event(ev_kind, **extra)
        else:
            self.records[kind] = payload
            if kind == "summary" and self.recipe is None and payload.get("precision"):
                # no recipe line (e.g. the start of the log was lost): the summary still says
                self._on_recipe(str(payload.get("precision")), str(payload.get("recipe", "")),
                                str(payload.get("backend", "")), bool(payload.get("emulated")),
                                "summary", "")

    def _seen_once(self, key: tuple[Any, ...]) -> bool:
        """True when ``key`` was seen before (and remembers it)."""
        if key in self._seen:
            return True
        if len(self._seen) < 100_000:
            self._seen.add(key)
        return False

    def _on_recipe(self, precision: str, recipe: str, backend: str, emulated: bool | None,
                   source: str, message: str) -> None:
        found = {"precision": precision, "recipe": recipe, "backend": backend,
                 "emulated": emulated, "source": source}
        if self.recipe is None or (self.recipe["source"] != "trainer" and source == "trainer"):
            self.recipe = found
        self.add_event("recipe", message=message.strip(), **found)

    # ---- rare-line handlers ---------------------------------------------------------------
    def _on_error_line(self, line: str, step: int | None) -> None:
        if "out of memory" in line:
            self._on_oom(line, step)
            return
        if _NCCL_ERROR_RE.search(line):
            self.add_event("nccl_error", step=step, message=line.strip())
            return
        m = _EXCEPTION_RE.search(line)
        if m and TAG.decode() not in line:
            self.add_event("error", step=step, exception=m.group(1), message=line.strip())

    def _on_oom(self, line: str, step: int | None, extra: dict[str, Any] | None = None) -> None:
        """One OOM event per step: every rank, the traceback and the trainer's event all
        report it; the first message with an allocation size fills in the details."""
        info: dict[str, Any] = {}
        alloc = _OOM_ALLOC_RE.search(line)
        if alloc:
            info["bytes_requested"] = _size_bytes(alloc.group(1), alloc.group(2))
        gpu = _OOM_GPU_RE.search(line) or _OOM_GPU_OLD_RE.search(line)
        if gpu:
            info["gpu"] = int(gpu.group(1))
            info["gpu_total_bytes"] = _size_bytes(gpu.group(2), gpu.group(3))
            if gpu.re is _OOM_GPU_RE and gpu.group(4):
                info["gpu_free_bytes"] = _size_bytes(gpu.group(4), gpu.group(5))
        else:
            total = _OOM_TOTAL_RE.search(line)
            if total:
                info["gpu_total_bytes"] = _size_bytes(total.group(1), total.group(2))
        event = self._oom_by_step.get(step)
        if event is None:
            if len(self._oom_by_step) >= MAX_EVENTS_PER_KIND:
                self.event_counts["oom"] = self.event_counts.get("oom", 0) + 1
                return
            event = {"kind": "oom", "step": step, "bytes_requested": None, "message": line.strip(),
                     "reports": 0}
            event.update(extra or {})
            self._oom_by_step[step] = event
            self.events.append(event)
            self.event_counts["oom"] = self.event_counts.get("oom", 0) + 1
        event["reports"] += 1
        if event.get("bytes_requested") is None and info.get("bytes_requested") is not None:
            event["message"] = line.strip()
        for key, value in info.items():
            if event.get(key) is None:
                event[key] = value

    def _on_sigterm_line(self, line: str, step: int | None) -> None:
        if TAG.decode() in line:  # the trainer's own event line is read as a record
            return
        if _SIGTERM_RE.search(line):
            self.add_event("sigterm", step=step, message=line.strip(), source="log")

    def _on_te_line(self, line: str, step: int | None) -> None:
        for key, rx in _TE_RES.items():
            m = rx.search(line)
            if not m:
                continue
            if key == "precision_preset":
                self.te[key] = m.group(1).lower()
            elif key == "training_configuration":
                self.te["dtype"] = m.group(1)
                self.te["fp8"] = m.group(2) == "enabled"
            elif key == "world_size":
                self.te[key] = int(m.group(1))
            else:
                try:
                    self.te[key] = float(m.group(1))
                except ValueError:
                    continue
        if "Using FP8 recipe" in line:
            self._on_phrase_line(line, step, source="te")

    def _on_phrase_line(self, line: str, step: int | None, source: str = "log") -> None:
        if TAG.decode() in line:  # the trainer's recipe line also carries the phrase
            return
        m = _PHRASE_RE.search(line)
        if not m:
            return
        if m.group(1):
            recipe = m.group(1)
            precision = RECIPE_TO_PRECISION.get(recipe, "fp8")
        else:
            precision = m.group(2).lower()
            recipe = m.group(3) or TE_RECIPES[precision]
        if source == "log" and "[GPU-" in line:
            source = "te"
        if source == "te" and self.te.get("precision_preset") in ("mxfp8", "nvfp4", "fp8"):
            precision = self.te["precision_preset"]
        self._on_recipe(precision, recipe, "te" if source == "te" else "", None, source,
                        line)

    # ---- result -------------------------------------------------------------------------
    def result(self) -> ParsedLog:
        """What was parsed; call once all input is fed (later calls return the same)."""
        if self._finished is None:
            series = self._series()
            self._stream_restarts()
            self._finished = ParsedLog(
                series=series,
                recipe=self.recipe,
                records=dict(self.records),
                te=dict(self.te),
                events=self.events,
                event_counts=self.event_counts,
                warnings=self.warnings,
                stats=dict(self.stats),
                streams=[s.name for s in self._streams],
            )
        return self._finished

    def _stream_restarts(self) -> None:
        """SageMaker starts new streams ({job}/algo-N-{epoch}) when a host starts again."""
        by_host: dict[str, list[tuple[int, str]]] = {}
        for s in self._streams:
            m = _STREAM_RE.search(s.name)
            if m:
                by_host.setdefault(m.group(1), []).append((int(m.group(2)), s.name))
        for host, streams in sorted(by_host.items()):
            for _, name in sorted(streams)[1:]:
                self.add_event("restart", host=host, stream=name,
                               reason=f"{host} started again (new log stream {name}): "
                               "a spot interruption or a restart")

    def _series(self) -> dict[str, list[Any]]:
        steps = self._steps
        cols = {name: self._cols[name] for name in NUMERIC_STEP_FIELDS}
        precision = self._precision
        emulated = self._emulated
        if not all(map(operator.lt, steps, itertools.islice(steps, 1, None))):
            # A restart re-runs the steps after its checkpoint: the later lines win.
            last: dict[int, int] = {}
            went_back: list[tuple[int, int]] = []
            for i, s in enumerate(steps):
                if i and s <= steps[i - 1]:
                    went_back.append((steps[i - 1], s))
                last[s] = i
            order = [last[s] for s in sorted(last)]
            if not self.event_counts.get("restart"):
                for before, after in went_back[:MAX_EVENTS_PER_KIND]:
                    self.add_event("restart", step=after,
                                   reason=f"step went back from {before} to {after}")
            steps = list(map(steps.__getitem__, order))
            cols = {name: list(map(col.__getitem__, order)) for name, col in cols.items()}
            precision = list(map(precision.__getitem__, order))
            emulated = list(map(emulated.__getitem__, order))
        out: dict[str, list[Any]] = {"step": steps, **cols, "precision": precision,
                                     "emulated": emulated}
        self._loss_events(out)
        return out

    def _loss_events(self, series: dict[str, list[Any]]) -> None:
        """NaN/inf losses and loss spikes (a loss above (1 + spike_threshold) x the running
        average, EMA with alpha 0.1, of the finite losses before it, after 10 of them)."""
        losses = series["loss"]
        threshold = 1.0 + self.spike_threshold
        if len(losses) > 10 and all(map(math.isfinite, losses)):
            # The common case, at C speed: no NaN and, almost always, no spike.
            if _below_running_min(losses, threshold):
                return
            ema = list(itertools.accumulate(losses, lambda e, x: e + 0.1 * (x - e)))
            if not any(map(operator.gt, losses[10:], map(threshold.__mul__, ema[9:-1]))):
                return
        elif len(losses) <= 10 and all(map(math.isfinite, losses)):
            return
        ema_now: float | None = None
        seen = 0
        in_spike = False
        first_bad: tuple[int, float] | None = None
        bad = 0
        for step, loss in zip(series["step"], losses, strict=True):
            if not math.isfinite(loss):
                bad += 1
                if first_bad is None:
                    first_bad = (step, loss)
                continue
            if (ema_now is not None and seen >= 10 and loss > ema_now * threshold
                    and loss - ema_now > 1e-6):
                if not in_spike:
                    self.add_event("loss_spike", step=step, loss=loss, running_average=ema_now,
                                   ratio=loss / ema_now if ema_now else None,
                                   message=f"loss {loss:.5g} is {loss / ema_now:.2f}x its "
                                   f"running average {ema_now:.5g}")
                in_spike = True
            else:
                in_spike = False
            ema_now = loss if ema_now is None else ema_now + 0.1 * (loss - ema_now)
            seen += 1
        if first_bad is not None and not self.event_counts.get("nan_loss"):
            self.add_event("nan_loss", step=first_bad[0], loss=str(first_bad[1]),
                           non_finite_steps=bad, source="steps",
                           message=f"loss {first_bad[1]} at step {first_bad[0]} "
                           f"({bad} non-finite step(s))")


def _below_running_min(losses: list[float], threshold: float) -> bool:
    """Is every loss from the 11th on at most ``threshold`` x the smallest loss before it?

    Then no loss is a spike: the running average (``e + 0.1 * (x - e)``, rounded) always
    lies between its previous value and the new loss, so it never falls below the running
    minimum, and ``threshold`` x it (threshold >= 0) never below ``threshold`` x that
    minimum. Finite losses of magnitude below 1e300 (no overflow), vectorised with numpy
    (about 20 times faster than the exact running average; False without numpy).
    """
    if not 0.0 <= threshold < math.inf:
        return False
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with the report extra
        return False
    x = np.array(losses, dtype=np.float64)
    if not bool(np.all(np.abs(x) < 1e300)):
        return False
    running_min = np.minimum.accumulate(x[:-1])
    return not bool(np.any(x[10:] > threshold * running_min[9:]))


def _lines_holding(chunk: bytes, needle: bytes) -> Iterable[tuple[int, bytes]]:
    """(start, line) of each line holding ``needle``, at most MAX_LINES_PER_NEEDLE."""
    pos = chunk.find(needle)
    seen = 0
    while pos >= 0 and seen < MAX_LINES_PER_NEEDLE:
        start = chunk.rfind(b"\n", 0, pos) + 1
        end = chunk.find(b"\n", pos)
        if end < 0:
            end = len(chunk)
        yield start, chunk[start:end]
        seen += 1
        pos = chunk.find(needle, end)


def _json_payload(rest: bytes) -> dict[str, Any] | None:
    """The JSON object that ends the line, as catalog.logformat.parse_json reads it."""
    text = _decode(rest).rstrip()
    if not (text.startswith("{") and text.endswith("}")):
        return None
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return payload if isinstance(payload, dict) else None


def parse_bytes(data: bytes, *, stream: str = "", spike_threshold: float = 0.5,
                block: int = 8 << 20) -> ParsedLog:
    """Parses a whole log held in memory."""
    parser = LogParser(spike_threshold=spike_threshold)
    feed_blocks(parser, [data], stream=stream, block=block)
    return parser.result()


def feed_blocks(parser: LogParser, blocks: Iterable[bytes], *, stream: str = "",
                block: int = 8 << 20) -> None:
    """Feeds arbitrary byte blocks (file reads), cut at line ends into buffers of at most
    ``block`` bytes (a longer line is cut: parsing stays bounded, whatever the input)."""
    carry = b""
    for data in blocks:
        if carry:
            data = carry + data
            carry = b""
        start, n = 0, len(data)
        while n - start > block:
            cut = data.rfind(b"\n", start, start + block)
            if cut < 0:  # one enormous line: cut it at the block size
                cut = start + block - 1
            parser.feed(data[start:cut + 1], stream)
            start = cut + 1
        cut = data.rfind(b"\n", start)
        if cut < 0:
            carry = data[start:] if start else data
        elif start == 0 and cut == n - 1:
            parser.feed(data, stream)  # no copy
        else:
            parser.feed(data[start:cut + 1], stream)
            carry = data[cut + 1:]
    if carry:
        parser.feed(carry, stream)
