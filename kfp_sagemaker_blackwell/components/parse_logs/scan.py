"""Line classification: one buffer of log bytes split into step lines, other trainer
records and the noise between them.

Speed matters (a long multi-host job logs millions of lines), so nothing here loops over
lines in Python. It works on whole byte buffers:

- one ``re.split`` over the buffer finds every ``[trainer] `` record: step lines
  come back as their field values (sliced into columns, converted with ``map``),
  other records as their kind word, and what lies between them is the noise;
- the fast pattern takes any non-space number and the numbers are then checked
  in bulk against the contract's number syntax; a buffer with a value the
  contract refuses is split again with the exact pattern (same result as
  ``kfp_sagemaker_blackwell.catalog.logformat.parse_step`` line by line, proven by the tests);
- rare lines are found in the noise with ``lines_holding`` (a needle, not a loop
  over lines); :mod:`kfp_sagemaker_blackwell.components.parse_logs.events` says what they mean.

Bytes, not text: noise is never decoded, so non-UTF-8 output costs nothing and
cannot raise; the few interesting lines are decoded with replacement.

The line format itself belongs to :mod:`kfp_sagemaker_blackwell.catalog.logformat`; the patterns here
are built from that module's field list and recipe pattern.
"""

from __future__ import annotations

import bisect
import itertools
import json
import re
from collections.abc import Iterable
from typing import Any

from kfp_sagemaker_blackwell.catalog import logformat

# The number syntax of kfp_sagemaker_blackwell.catalog.logformat (same language), written so that a
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
MAX_LINES_PER_NEEDLE = 2000  # per buffer: hostile input cannot make the slow path unbounded
MAX_LINE_CHARS = 4000  # longer interesting lines are cut in events


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


def decode(line: bytes) -> str:
    """An interesting line as text (never raises: bad bytes are replaced)."""
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


class Scan:
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


def lines_holding(chunk: bytes, needle: bytes) -> Iterable[tuple[int, bytes]]:
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


def json_payload(rest: bytes) -> dict[str, Any] | None:
    """The JSON object that ends the line, as kfp_sagemaker_blackwell.catalog.logformat.parse_json reads it."""
    text = decode(rest).rstrip()
    if not (text.startswith("{") and text.endswith("}")):
        return None
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return payload if isinstance(payload, dict) else None
