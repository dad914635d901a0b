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

The remote-work loops (the training runner, CodeBuild's wait, cleanup's
stop-and-wait, all through ``remote_job.RemoteJobRunner``) share the two helpers below: ``ExecutionContext.ride_out``
(a call retried through an outage, giving way to a termination) and
``stop_within`` (the stop on termination, bounded by a few seconds whatever
the outage budget, and the sentence that says whether it was accepted and, when
not, the exact command that stops the work by hand). A terminated pod gets
SIGKILL 30 s after SIGTERM on Kubernetes: what it could not stop must be said
before that.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

from kfp_sagemaker_blackwell.common.aws import is_transient

T = TypeVar("T")
TERMINATED_EXIT_CODE = 143  # 128 + SIGTERM, whichever signal asked (SIGINT is treated alike)
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
SLEEP_SLICE_S = 0.1  # how often ``sleep`` looks at the flag
# The stop on termination gets this long, whatever the outage budget: with SageMaker
# unreachable, the step must say what it could not stop well within KFP's 30 s grace.
DEFAULT_STOP_TIMEOUT_S = 5.0
DEFAULT_MAX_OUTAGE_S = 300.0  # how long following remote work rides out an unreachable endpoint
RETRY_PAUSE_S = 0.2  # between two attempts of a bounded stop
MAX_RETRY_BACKOFF_S = 30.0  # the longest pause between two attempts while riding out an outage


class Terminated(RuntimeError):
    """The process was asked to terminate; the message says what became of what it owned.
    A command line's ``cli_errors`` prints it and exits with its code."""

    exit_code = TERMINATED_EXIT_CODE


class AwsUnreachable(RuntimeError):
    """The AWS endpoint could not be reached for longer than the outage budget."""


class TerminationRequested(Exception):
    """``ride_out``: termination was requested while waiting out an outage."""


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def retry_within(left: Callable[[], float], call: Callable[[], T]) -> T:
    """``call()``, retried on transient failures while ``left()`` seconds remain."""
    while True:
        try:
            return call()
        except Exception as exc:
            if not is_transient(exc) or left() <= RETRY_PAUSE_S:
                raise
            time.sleep(RETRY_PAUSE_S)


class NoAnswer(TimeoutError):
    """``call_within``: the call had not returned when its time was up."""


def call_within(budget_s: float, call: Callable[[], T], *,
                give_up: Callable[[], bool] = lambda: False) -> T:
    """``call()`` on a daemon thread, its result or its exception; ``NoAnswer`` when it has
    not returned within ``budget_s`` (an endpoint that accepts the connection and never
    answers holds a call for the client's whole read timeout, times its attempts), and
    ``TerminationRequested`` as soon as ``give_up()`` says so. The abandoned call ends on
    its own client's timeouts; its answer is dropped."""
    done = threading.Event()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name="aws-call", daemon=True).start()
    deadline = time.monotonic() + max(0.0, budget_s)
    while not done.wait(min(SLEEP_SLICE_S, max(0.0, deadline - time.monotonic()))):
        if give_up():
            raise TerminationRequested()
        if time.monotonic() >= deadline:
            raise NoAnswer(f"no answer within {budget_s:.3g} s")
    if "error" in box:
        raise box["error"]
    return box["result"]  # type: ignore[no-any-return]


def stop_within(what: str, stop: Callable[[Callable[[], float]], str | None], *,
                budget_s: float, stop_command: str, said_s: float | None = None) -> str:
    """Tries to stop ``what`` (e.g. "training job X") within ``budget_s``; returns the sentence.

    The budget is kept whatever the endpoint does (``call_within``): a stop that got no
    answer in time is reported as not accepted. ``said_s``: the budget as the sentence
    says it (the stop timeout, when ``budget_s`` is what is left of it since the SIGTERM).

    ``stop(left)`` does it (``left()``: seconds of the budget left; its clients need
    timeouts that fit, ``aws.bounded_client_config``) and returns the state once the
    stop was accepted ("it is Stopping"), None when ``what`` does not exist, or raises
    when the stop could not be delivered: then the sentence says that ``what`` may still
    be running and gives ``stop_command``, the exact command that stops it by hand.
    """
    deadline = time.monotonic() + budget_s

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    try:  # on its own thread: the budget holds whatever the clients' timeouts
        state = call_within(budget_s, lambda: stop(left))
    except Exception as exc:
        return (f"the stop of {what} was NOT accepted within "
                f"{budget_s if said_s is None else said_s:.3g} s "
                f"({_one_line(exc)}): {what} may still be running. Stop it with: "
                f"{stop_command}")
    if state is None:
        return f"{what} does not exist: nothing was created"
    return f"the stop of {what} was accepted: {state}"


def check_stop_timeout(seconds: Any, fld: str = "stop_timeout_seconds") -> float:
    """``seconds`` if it is a usable stop budget; else a UserError naming ``fld``."""
    from kfp_sagemaker_blackwell.common.errors import UserError

    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
            0 < seconds <= 25):
        raise UserError(fld, f"{seconds!r}: must be a number of seconds in (0, 25] (KFP kills "
                        "a terminated task 30 s after SIGTERM).",
                        f"pass e.g. {fld}={DEFAULT_STOP_TIMEOUT_S:g}.")
    return float(seconds)


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
        self.requested_at: float | None = None  # time.monotonic() of the first request
        self._previous: dict[int, Any] = {}

    # ---- life cycle ----
    def __enter__(self) -> ExecutionContext:
        if threading.current_thread() is threading.main_thread():
            for sig in HANDLED_SIGNALS:
                if sig == signal.SIGINT and signal.getsignal(sig) == signal.SIG_IGN:
                    # Started to ignore Ctrl-C (a shell script's background job, nohup): it
                    # stays ignored, as Python itself leaves it. Handling it from here on
                    # only would make a SIGINT during start-up vanish while one a moment
                    # later stops the job. SIGTERM (what KFP and Kubernetes send) is always
                    # handled.
                    continue
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
        if first:
            self.requested_at = time.monotonic()
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
            self.requested_at = time.monotonic()
        self._requested = True

    def stop_budget(self, stop_timeout_s: float, least_s: float = 0.5) -> float:
        """Seconds left of ``stop_timeout_s`` counted from the termination request (all of
        it when none came yet), at least ``least_s``: every stop path ends within
        ``stop_timeout_s`` of the SIGTERM, whatever it was doing when it came."""
        if self.requested_at is None:
            return stop_timeout_s
        return max(least_s, self.requested_at + stop_timeout_s - time.monotonic())

    def call(self, call: Callable[[], T], *, budget_s: float = float("inf")) -> T:
        """``call()``, given up for ``TerminationRequested`` as soon as termination is
        requested (``call_within``): a request in flight to an endpoint that never answers
        does not hold the termination for its read timeout. Made after the request (a
        last look, e.g. whether a job whose Create answer was lost exists, so that it is
        recorded before it is stopped), it gets what is left of the default stop budget."""
        if self._requested:
            try:
                return call_within(self.stop_budget(DEFAULT_STOP_TIMEOUT_S), call)
            except NoAnswer:
                raise TerminationRequested() from None
        return call_within(budget_s, call, give_up=lambda: self._requested)

    def check(self, what: str) -> None:
        """Raises ``Terminated`` if termination was requested; ``what``: the state we are in."""
        if self._requested:
            raise Terminated(f"terminated ({self.signal_name}) {what}")

    def ride_out(self, what: str, call: Callable[[], T], *, budget_s: float,
                 out: Callable[[str], None], first_pause_s: float = 1.0) -> T:
        """``call()``, retried on transient failures for up to ``budget_s`` seconds.

        Raises ``AwsUnreachable`` past the budget and ``TerminationRequested`` as soon
        as termination is requested during the outage; says when it starts and ends.
        """
        started: float | None = None
        pause = max(0.05, first_pause_s)
        while True:
            try:
                result = self.call(call)
            except TerminationRequested:
                raise
            except Exception as exc:
                if not is_transient(exc):
                    raise
                now = time.monotonic()
                if started is None:
                    started = now
                    out(f"({what} failed: {_one_line(exc)}; retrying for up to "
                        f"{budget_s:.0f} s)")
                if now - started >= budget_s:
                    raise AwsUnreachable(f"{what}: AWS unreachable for {now - started:.0f} s "
                                         f"({_one_line(exc)})") from None
                if self._requested:
                    raise TerminationRequested() from None
                self.sleep(min(pause, budget_s - (now - started)))
                if self._requested:
                    raise TerminationRequested() from None
                pause = min(MAX_RETRY_BACKOFF_S, pause * 2)
                continue
            if started is not None:
                out(f"({what} succeeded again after {time.monotonic() - started:.0f} s)")
            return result

    def sleep(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        """Sleeps ``seconds``, returning as soon as termination is requested."""
        deadline = clock() + max(0.0, seconds)
        while not self._requested:
            left = deadline - clock()
            if left <= 0:
                return
            time.sleep(min(SLEEP_SLICE_S, left))
