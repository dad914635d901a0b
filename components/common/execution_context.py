"""One termination path for everything that owns a remote resource (training job, build).

Modelled on GCPC's ``ExecutionContext``
(``google_cloud_pipeline_components/container/utils/execution_context.py``): the
component enters the context *before its first AWS call*, so that a KFP
Terminate (SIGTERM) or a Ctrl-C (SIGINT, treated the same) can never land in a
window without a handler. Unlike GCPC's, the handler does no work and raises
nothing: it only records the request. A signal handler runs between two
bytecodes of whatever the main thread is doing, which may be the middle of a
boto3 call, of a ``resources.write`` or of a ``print``; raising or calling AWS
from there loses the exception or corrupts that work. The owner of the remote
resource checks ``terminating`` at its safe points (right after Create
returns, between polls) and stops what it created itself, then raises
``Terminated``; the command lines turn that into exit status 143 (128 + SIGTERM,
what a shell reports for a process killed by SIGTERM).

Signals are only delivered to the main thread, so outside it the context
installs nothing (``request_termination`` still works, for tests and callers
that relay a cancellation themselves).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

TERMINATED_EXIT_CODE = 143  # 128 + SIGTERM, whichever signal asked (SIGINT is treated alike)
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
SLEEP_SLICE_S = 0.1  # how often ``sleep`` looks at the flag


class Terminated(RuntimeError):
    """The process was asked to terminate; what it owned was stopped (or found absent)."""


class ExecutionContext:
    """``with ExecutionContext() as ctx:`` around everything that calls AWS.

    ``ctx.terminating`` is False until SIGTERM or SIGINT arrives; ``ctx.sleep(s)``
    sleeps in short slices and returns early when it does; ``ctx.check(what)``
    raises ``Terminated`` when termination was requested and nothing is owned yet.
    """

    def __init__(self, name: str = "step") -> None:
        self.name = name
        self.signal_name = ""
        self._requested = False
        self._previous: dict[int, Any] = {}

    # ---- life cycle ----
    def __enter__(self) -> ExecutionContext:
        if threading.current_thread() is threading.main_thread():
            for sig in HANDLED_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Only a flag and one os.write: print() here could re-enter a print the
        # main thread is in the middle of (RuntimeError: reentrant call).
        first = not self._requested
        self._requested = True
        name = signal.Signals(signum).name
        if first:
            self.signal_name = name
            text = f"[{self.name}] {name} received: stopping what this step started\n"
        else:
            text = f"[{self.name}] {name} received again: already stopping\n"
        try:
            os.write(2, text.encode())
        except OSError:
            pass

    # ---- what the owner calls ----
    @property
    def terminating(self) -> bool:
        return self._requested

    def request_termination(self, reason: str = "requested") -> None:
        """Sets the flag without a signal (a caller relaying a cancellation, tests)."""
        if not self._requested:
            self.signal_name = reason
        self._requested = True

    def check(self, what: str) -> None:
        """Raises ``Terminated`` if termination was requested; ``what``: the state we are in."""
        if self._requested:
            raise Terminated(f"terminated ({self.signal_name}) {what}")

    def sleep(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        """Sleeps ``seconds``, returning as soon as termination is requested."""
        deadline = clock() + max(0.0, seconds)
        while not self._requested:
            left = deadline - clock()
            if left <= 0:
                return
            time.sleep(min(SLEEP_SLICE_S, left))
