"""Event detection: what the trainer's records and the rare lines around them say.

The trainer's non-step records (recipe, config, summary, checkpoint, event) and the
rare lines in the noise (errors, OOM, NCCL, SIGTERM, TE's fsdp.py prints, recipe
phrases) become events, the confirmed recipe, the last payload of each record kind
and TE's values. The noise is looked at only where a cheap ``needle in noise`` test
says a buffer holds a line of interest (see :meth:`Findings.on_noise`).
"""

from __future__ import annotations

import itertools
import json
import math
import operator
import re
from collections.abc import Callable, Iterable
from typing import Any

from kfp_sagemaker_blackwell.catalog.precisions import TE_RECIPES
from kfp_sagemaker_blackwell.common.step_series import META_FIELDS, TRAINING_FIELDS
from kfp_sagemaker_blackwell.components.parse_logs.scan import (
    JSON_KINDS,
    MAX_LINE_CHARS,
    RECIPE_BULK_RE,
    TAG,
    Scan,
    decode,
    json_payload,
    lines_holding,
)

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
# Phrases that confirm a recipe in TE's users' words (kfp_sagemaker_blackwell.catalog.logformat.recipe_phrase
# writes them; TE's fsdp.py prints the first one).
_PHRASE_RE = re.compile(r"Using FP8 recipe: (\w+)|(MXFP8|NVFP4) enabled(?:: (\w+))?")
_STREAM_RE = re.compile(r"(algo-\d+)-(\d+)$")
# The fields of the trainer's records that parse_logs carries into the series' metadata,
# with the type the series contract (kfp_sagemaker_blackwell.common.step_series) declares:
# a record whose field breaks it is set aside with a warning, so that a damaged or foreign
# record cannot make parse_logs write metadata its own readers refuse.
RECORD_FIELDS: dict[str, dict[str, tuple[str, Callable[[Any], bool]]]] = {
    "config": {**TRAINING_FIELDS, "seed": META_FIELDS["seed"]},
    "world": {k: META_FIELDS[k] for k in ("world_size", "gpu")},
    "data": {k: META_FIELDS[k] for k in ("entropy_floor",)},
    "summary": {k: META_FIELDS[k] for k in ("status", "precision", "recipe", "backend",
                                              "world_size", "gpu", "entropy_floor")},
}
RECIPE_TO_PRECISION = {recipe: precision for precision, recipe in TE_RECIPES.items()}

# A needle is a substring every line of interest holds (Findings.needles pairs each
# with its handler).
ERROR_NEEDLE = b"rror"  # Error/error: OOM, NCCL, exceptions
TRACEBACK = b"Traceback (most recent call last)"
MAX_EVENTS_PER_KIND = 50  # events beyond this are counted, not kept


def _size_bytes(value: str, unit: str) -> int | None:
    try:
        return int(float(value) * _UNITS[unit])
    except (ValueError, KeyError, OverflowError):
        return None


def _bad_field(kind: str, payload: dict[str, Any]) -> str | None:
    """What is wrong with the first field of a ``kind`` record that breaks its declared
    type (:data:`RECORD_FIELDS`), or None."""
    for key, (want, check) in RECORD_FIELDS.get(kind, {}).items():
        value = payload.get(key)
        if value is not None and not check(value):
            shown = json.dumps(value, default=str)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            return f"its {key} is {shown}; it must be {want}."
    return None


class Findings:
    """Everything but the steps: events (at most MAX_EVENTS_PER_KIND kept per kind, all
    counted), the recipe, the last payload of each trainer record kind, TE's values."""

    def __init__(self) -> None:
        self.recipe: dict[str, Any] | None = None
        self.records: dict[str, dict[str, Any]] = {}
        self.te: dict[str, Any] = {}
        self.events: list[dict[str, Any]] = []
        self.event_counts: dict[str, int] = {}
        self._oom_by_step: dict[int | None, dict[str, Any]] = {}
        self._seen: set[tuple[Any, ...]] = set()
        self.warnings: list[str] = []

    def add_event(self, kind: str, **payload: Any) -> None:
        self.event_counts[kind] = self.event_counts.get(kind, 0) + 1
        if self.event_counts[kind] <= MAX_EVENTS_PER_KIND:
            event = {"kind": kind}
            event.update(payload)
            self.events.append(event)

    # ---- rare lines in the noise ------------------------------------------------------------
    def on_noise(self, noise: bytes, step_at: Callable[[int], int | None]) -> int:
        """Looks at the lines of interest in ``noise`` (``step_at(offset)``: the step
        before that offset); returns how many tracebacks it holds."""
        has_error = ERROR_NEEDLE in noise
        tracebacks = noise.count(TRACEBACK) if has_error and TRACEBACK in noise else 0
        seen: set[int] = set()
        for needle, handler in self.needles(has_error):
            if not (has_error if needle is ERROR_NEEDLE else needle in noise):
                continue
            for start, line in lines_holding(noise, needle):
                if start in seen:  # one line, two needles (e.g. TE's recipe line)
                    continue
                seen.add(start)
                handler(decode(line[:MAX_LINE_CHARS]), step_at(start))
        return tracebacks

    def needles(self, has_error: bool) -> list[tuple[bytes, Callable[[str, int | None], None]]]:
        """(needle, handler) for the rare lines worth a look in a buffer."""
        needles: list[tuple[bytes, Callable[[str, int | None], None]]] = [
            (ERROR_NEEDLE, self._on_error_line),
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

    # ---- trainer records other than steps ---------------------------------------------------
    def on_records(self, scan: Scan) -> int:
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
                                r.group(4) == b"1", "trainer", decode(line[:MAX_LINE_CHARS]))
            elif kind in JSON_KINDS and rest.startswith(b" {"):
                payload = json_payload(rest[1:])
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
        elif (problem := _bad_field(kind, payload)) is not None:
            if len(self.warnings) < MAX_EVENTS_PER_KIND:
                where = f" at step {step}" if step is not None else ""
                self.warnings.append(f"the trainer's {kind} record{where} was set aside: "
                                     f"{problem}")
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

    # ---- once all input is read ---------------------------------------------------------------
    def stream_restarts(self, streams: Iterable[str]) -> None:
        """SageMaker starts new streams ({job}/algo-N-{epoch}) when a host starts again."""
        by_host: dict[str, list[tuple[int, str]]] = {}
        for name in streams:
            m = _STREAM_RE.search(name)
            if m:
                by_host.setdefault(m.group(1), []).append((int(m.group(2)), name))
        for host, started in sorted(by_host.items()):
            for _, name in sorted(started)[1:]:
                self.add_event("restart", host=host, stream=name,
                               reason=f"{host} started again (new log stream {name}): "
                               "a spot interruption or a restart")


def loss_events(found: Findings, series: dict[str, list[Any]], spike_threshold: float) -> None:
    """NaN/inf losses and loss spikes (a loss above (1 + spike_threshold) x the running
    average, EMA with alpha 0.1, of the finite losses before it, after 10 of them)."""
    losses = series["loss"]
    threshold = 1.0 + spike_threshold
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
                found.add_event("loss_spike", step=step, loss=loss, running_average=ema_now,
                               ratio=loss / ema_now if ema_now else None,
                               message=f"loss {loss:.5g} is {loss / ema_now:.2f}x its "
                               f"running average {ema_now:.5g}")
            in_spike = True
        else:
            in_spike = False
        ema_now = loss if ema_now is None else ema_now + 0.1 * (loss - ema_now)
        seen += 1
    if first_bad is not None and not found.event_counts.get("nan_loss"):
        found.add_event("nan_loss", step=first_bad[0], loss=str(first_bad[1]),
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
