"""Python's garbage collector, run when the trainer says instead of when its thresholds say.

CPython collects cycles automatically once enough objects have been allocated; every tenth
collection of the middle generation may become a full one, which walks every tracked object
of the process. A trainer's process holds millions of them (torch, TransformerEngine, the
modules, the autograd graph of a step), so a full collection takes a noticeable fraction of a
second. It lands at a point fixed by the allocation counts, mid-step: on one H200 the
24-layer te-fsdp-example preset's step 6 took about twice as long as its neighbours in every
run (issue 26; benchmarks/trainer/README.md has the measurement).

So, as torchtitan does (``training.gc_freq``, its ``GarbageCollection``): after setup, one
full collection, then ``gc.freeze()`` (the objects that exist now, which live as long as the
run, move to the permanent generation, so no later collection walks them) and
``gc.disable()``; during the steps, ``gc.collect(1)`` every ``every`` steps collects the young
cycles a step leaves behind. ``every=0`` leaves Python's automatic collection as it is (the
diagnostic: the callback below still records what it does).

Every collection during the run, automatic or scheduled, is timed through ``gc.callbacks``;
the step lines carry the seconds spent collecting since the previous line (``gc_s``), and the
summary the counts and the longest pause, so a stall that is the collector shows as such.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class GcSchedule:
    every: int  # steps between scheduled generation-1 collections; 0: Python's thresholds
    scheduled: int = 0
    scheduled_s: float = 0.0
    automatic: int = 0  # collections the thresholds started during the run
    automatic_full: int = 0  # ... of them, full (generation 2)
    automatic_s: float = 0.0
    max_s: float = 0.0
    max_at_step: int | None = None
    frozen: int = 0  # objects moved to the permanent generation after setup
    setup_s: float = 0.0  # the full collection before freezing (not a step's)
    _in_setup: bool = False
    _pending_s: float = 0.0  # collecting time since the last take()
    _began: float | None = None
    _in_schedule: bool = False
    _step: int = 0
    _was_enabled: bool = True
    _active: bool = False

    def start(self) -> None:
        """After setup, before the first step."""
        self._was_enabled = gc.isenabled()
        gc.callbacks.append(self._callback)
        self._active = True
        if self.every:
            began = time.perf_counter()
            self._in_setup = True
            try:
                gc.collect()
            finally:
                self._in_setup = False
            self.setup_s = time.perf_counter() - began
            gc.freeze()
            self.frozen = gc.get_freeze_count()
            gc.disable()

    def before_step(self, step: int) -> None:
        """Called at the start of ``step`` (1-based): the scheduled collection, when due."""
        self._step = step
        if self.every and step > 1 and step % self.every == 0:
            self._in_schedule = True
            try:
                gc.collect(1)
            finally:
                self._in_schedule = False

    def take(self) -> float:
        """Seconds spent collecting since the last call."""
        out, self._pending_s = self._pending_s, 0.0
        return out

    def stop(self) -> None:
        """Restores the collector as it was (``run`` may be called again in one process)."""
        if not self._active:
            return
        self._active = False
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
        if self.every:
            gc.unfreeze()
            if self._was_enabled:
                gc.enable()

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if self._in_setup:
            return
        if phase == "start":
            self._began = time.perf_counter()
            return
        if self._began is None:
            return
        seconds = time.perf_counter() - self._began
        self._began = None
        self._pending_s += seconds
        if self._in_schedule:
            self.scheduled += 1
            self.scheduled_s += seconds
        else:
            self.automatic += 1
            self.automatic_s += seconds
            if info.get("generation") == 2:
                self.automatic_full += 1
        if seconds > self.max_s:
            self.max_s, self.max_at_step = seconds, self._step

    def summary(self) -> dict[str, Any]:
        return {
            "gc_every": self.every,
            "gc_scheduled": self.scheduled,
            "gc_scheduled_s": round(self.scheduled_s, 4),
            "gc_automatic": self.automatic,
            "gc_automatic_full": self.automatic_full,
            "gc_automatic_s": round(self.automatic_s, 4),
            "gc_max_pause_s": round(self.max_s, 4),
            "gc_max_pause_step": self.max_at_step,
            "gc_frozen_objects": self.frozen,
            "gc_setup_s": round(self.setup_s, 4),
        }
