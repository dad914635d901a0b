"""The log parser: trainer lines, TE's fsdp.py lines and the noise around them.

``LogParser`` takes byte buffers and accumulates the step series; the work is split
by concern:

- :mod:`kfp_sagemaker_blackwell.components.parse_logs.scan` classifies a buffer's lines (step lines, other
  trainer records, noise) in bulk, never looping over lines in Python;
- :mod:`kfp_sagemaker_blackwell.components.parse_logs.events` turns the other records and the rare lines in
  the noise into events, the recipe and TE's values;
- this module keeps the step rows in order (a restart's re-run steps: the later lines
  win) and assembles the :class:`ParsedLog`.

The line format itself belongs to :mod:`kfp_sagemaker_blackwell.catalog.logformat`.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kfp_sagemaker_blackwell.common import cli
from kfp_sagemaker_blackwell.components.parse_logs.events import (
    MAX_EVENTS_PER_KIND,
    Findings,
    loss_events,
)
from kfp_sagemaker_blackwell.components.parse_logs.scan import (
    EXACT_SCAN_RE,
    NUMERIC_STEP_FIELDS,
    SCAN_RE,
    Scan,
)

__all__ = ["EXACT_SCAN_RE", "NUMERIC_STEP_FIELDS", "SCAN_RE", "LogParser", "ParsedLog", "Stream",
           "feed_blocks", "parse_bytes"]


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


# A finite loss more than this fraction above the running average of the losses before
# it is a loss spike: the parser's default, the component's spike_threshold as its
# signature declares it (read with ast: KFP runs the function's source text, without
# this module's names, and its module imports kfp.dsl, which KFP's executor leaves out).
SPIKE_THRESHOLD: float = cli.source_defaults(
    "kfp_sagemaker_blackwell.components.parse_logs.component", "parse_logs")["spike_threshold"]


class LogParser:
    """Incremental parser. ``feed`` complete lines (bytes), then ``result()``.

    Args:
        spike_threshold: a finite loss more than this fraction above the running
            average (EMA, alpha 0.1) of the losses before it is a loss spike.
    """

    def __init__(self, *, spike_threshold: float = SPIKE_THRESHOLD) -> None:
        self.spike_threshold = spike_threshold
        self._steps: list[int] = []
        self._cols: dict[str, list[float]] = {name: [] for name in NUMERIC_STEP_FIELDS}
        self._precision: list[str] = []
        self._emulated: list[bool] = []
        self.found = Findings()
        self.warnings: list[str] = []
        self.stats = {"lines": 0, "bytes": 0, "trainer_records": 0, "step_lines": 0,
                      "unparsed_trainer_records": 0, "tracebacks": 0}
        self._streams: list[Stream] = []
        self._stream_index: dict[str, int] = {}
        self._last_step: int | None = None
        self._finished: ParsedLog | None = None

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
        scan = Scan(SCAN_RE.split(chunk), last_step_before)
        if not scan.take_steps(exact=False):  # a value the contract refuses: read it exactly
            scan = Scan(EXACT_SCAN_RE.split(chunk), last_step_before)
            scan.take_steps(exact=True)
        self._add_steps(scan)
        noise = scan.noise(chunk)
        lines = noise.count(b"\n") + (0 if chunk.endswith(b"\n") else 1)
        self._streams[sidx].lines += lines
        self.stats["lines"] += lines
        self.stats["bytes"] += len(chunk)
        self.stats["trainer_records"] += scan.matches
        unparsed = scan.matches - len(scan.steps)
        if unparsed:
            unparsed -= self.found.on_records(scan)
        self.stats["unparsed_trainer_records"] += unparsed
        self.stats["tracebacks"] += self.found.on_noise(noise, scan.step_at_noise)

    def _add_steps(self, scan: Scan) -> None:
        if not scan.steps:
            return
        self._steps.extend(scan.steps)
        for name, values in zip(NUMERIC_STEP_FIELDS, scan.numbers, strict=True):
            self._cols[name].extend(values)
        self._precision.extend(scan.precision)
        self._emulated.extend(scan.emulated)
        self.stats["step_lines"] += len(scan.steps)
        self._last_step = scan.steps[-1]

    # ---- result -------------------------------------------------------------------------
    def result(self) -> ParsedLog:
        """What was parsed; call once all input is fed (later calls return the same)."""
        if self._finished is None:
            series = self._series()
            self.found.stream_restarts(s.name for s in self._streams)
            self._finished = ParsedLog(
                series=series,
                recipe=self.found.recipe,
                records=dict(self.found.records),
                te=dict(self.found.te),
                events=self.found.events,
                event_counts=self.found.event_counts,
                warnings=self.warnings + self.found.warnings,
                stats=dict(self.stats),
                streams=[s.name for s in self._streams],
            )
        return self._finished

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
            if not self.found.event_counts.get("restart"):
                for before, after in went_back[:MAX_EVENTS_PER_KIND]:
                    self.found.add_event("restart", step=after,
                                         reason=f"step went back from {before} to {after}")
            steps = list(map(steps.__getitem__, order))
            cols = {name: list(map(col.__getitem__, order)) for name, col in cols.items()}
            precision = list(map(precision.__getitem__, order))
            emulated = list(map(emulated.__getitem__, order))
        out: dict[str, list[Any]] = {"step": steps, **cols, "precision": precision,
                                     "emulated": emulated}
        loss_events(self.found, out, self.spike_threshold)
        return out


def parse_bytes(data: bytes, *, stream: str = "", spike_threshold: float = SPIKE_THRESHOLD,
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
