"""One life cycle for every remote job a component owns: a training job, a CodeBuild build.

Modelled on GCPC's ``gcp_launcher/job_remote_runner.py`` (one runner for every Vertex
job type: create, poll at a fixed interval, ride out connection errors, cancel on
SIGTERM) and on the retired AWS SageMaker components' ``common/sagemaker_component.py``
(a base loop calling per-job hooks: ``_create_job``, ``_get_job_status``,
``_on_job_terminated``, ``_print_logs_for_job``). Here the per-job part is a small
adapter (``RemoteJob``: how to describe, stop, what is terminal, where the logs are,
what progress to report) and ``RemoteJobRunner`` owns what every job shares:

- ``poll``: one Describe through an outage (``ExecutionContext.ride_out``: transient
  failures retried with back-off for ``max_outage_s``, ``AwsUnreachable`` past it,
  ``TerminationRequested`` as soon as a termination is asked for meanwhile);
- ``create``: the create request sent at a safe point: refused when a termination
  came first, the job stopped when one came while the request was on its way;
- ``follow``: polls at ``poll_interval_s`` until a terminal state, reporting progress
  and copying the job's CloudWatch log into this process's log meanwhile;
- ``terminate``/``stop``: the termination context. The stop gets ``stop_timeout_s``
  (a few seconds whatever the outage budget: KFP kills a terminated pod 30 s after
  SIGTERM), through ``execution_context.stop_within``, which says whether the stop
  was accepted or gives the exact command that stops the job by hand; ``Terminated``
  (or the adapter's subclass of it) carries that sentence to the command line, which
  exits 143.

Users: the training runner (``sagemaker_training/runner.py``), CodeBuild's wait
(``build_image/codebuild.py``) and cleanup's stop-and-wait (``cleanup/launcher.py``). The
adapters of the two job kinds live beside their facts, in ``common/`` since cleanup
handles both: ``training_job.TrainingJob`` and ``build_marks.CodeBuildBuild``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol, TypeVar

from kfp_sagemaker_blackwell.common.aws import is_transient
from kfp_sagemaker_blackwell.common.cloudwatch import LogEvent, LogTail
from kfp_sagemaker_blackwell.common.execution_context import (
    DEFAULT_MAX_OUTAGE_S,
    DEFAULT_STOP_TIMEOUT_S,
    RETRY_PAUSE_S,
    ExecutionContext,
    Terminated,
    TerminationRequested,
    call_within,
    retry_within,
    stop_within,
)

T = TypeVar("T")
DEFAULT_POLL_INTERVAL_S = 5.0


def _print(line: str) -> None:
    print(line, flush=True)


class RemoteJob(Protocol):
    """What the runner needs to know of one job kind (one instance per job)."""

    # Read-only (properties or class attributes of the adapter):
    @property
    def what(self) -> str:
        """The job in a sentence: "training job NAME", "CodeBuild build ID"."""

    @property
    def ident(self) -> str:
        """Its name or id, as the API calls take it."""

    @property
    def describe_call(self) -> str:
        """The API call of ``describe``, for messages: "DescribeTrainingJob"."""

    @property
    def create_call(self) -> str:
        """E.g. "CreateTrainingJob", "StartBuild"."""

    @property
    def stop_call(self) -> str:
        """E.g. "StopTrainingJob", "StopBuild"."""

    @property
    def service(self) -> str:
        """E.g. "SageMaker", "CodeBuild"."""

    @property
    def stop_command(self) -> str:
        """The exact aws command that stops the job by hand."""

    @property
    def log_name(self) -> str:
        """How a failing log read names the log: "CloudWatch logs"."""

    @property
    def after_stop(self) -> str:
        """Said when the job still runs once the stop was accepted: " (it moves to ...)"."""

    @property
    def terminated(self) -> type[Terminated]:
        """What a termination raises (``Terminated`` or a subclass)."""

    def describe(self, client: Any) -> dict[str, Any] | None:
        """The job as the service reports it; None when it does not exist."""

    def status(self, job: dict[str, Any]) -> str: ...

    def is_terminal(self, job: dict[str, Any]) -> bool:
        """The job never changes again."""

    def is_running(self, job: dict[str, Any]) -> bool:
        """A stop applies to it (not ended, not already stopping)."""

    def stop(self, client: Any) -> str:
        """Sends the stop request; what the service answered, in words."""

    def progress(self, job: dict[str, Any]) -> list[str]:
        """The progress lines due since the last call (status transitions, phases)."""

    def log_location(self, job: dict[str, Any]) -> tuple[str, str]:
        """(log group, stream prefix) of the job's CloudWatch log."""

    def log_line(self, event: LogEvent) -> str: ...


@dataclass
class RemoteJobRunner:
    """Follows and stops remote jobs for one component; ``out`` receives every line.

    ``follow``: the client that polls (``aws.FOLLOW_CLIENT``: no botocore retries, short
    timeouts, so that a termination is looked at within seconds); ``stopper``: the
    client of the stop (``aws.bounded_client_config(stop_timeout_s)``); ``logs``: a
    CloudWatch Logs client, or None not to copy logs. ``prefix`` starts the runner's
    own lines ("[build_image] "). ``wait_after_stop``: the stop on termination waits
    (within ``stop_timeout_s``) until the job has left its running state.
    """

    follow: Any
    stopper: Any
    logs: Any = None
    ctx: ExecutionContext = field(default_factory=ExecutionContext)
    out: Callable[[str], None] = _print
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    max_outage_s: float = DEFAULT_MAX_OUTAGE_S
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S
    prefix: str = ""
    wait_after_stop: bool = True  # whether ``stop`` waits for the job to leave its running state
    _tail: LogTail | None = None
    _logs_failing: bool = False

    # ---- describe ----
    def poll(self, job: RemoteJob, *, budget_s: float | None = None) -> dict[str, Any] | None:
        """``job.describe`` ridden out through an outage of ``budget_s`` (default
        ``max_outage_s``); raises ``AwsUnreachable`` or ``TerminationRequested``."""
        return self.ctx.ride_out(
            f"{job.describe_call} {job.ident}",
            lambda: job.describe(self.follow),
            budget_s=self.max_outage_s if budget_s is None else budget_s, out=self.out,
            first_pause_s=min(1.0, self.poll_interval_s))

    def poll_or_stop(self, job: RemoteJob) -> dict[str, Any] | None:
        """``poll``; a termination during an outage stops the job (``terminate``)."""
        try:
            return self.poll(job)
        except TerminationRequested:
            self.terminate(job)

    # ---- create ----
    def create(self, job: RemoteJob, send: Callable[[], T], *,
               created: Callable[[T], RemoteJob] | None = None) -> T:
        """``send()`` (the create request) at a safe point: ``Terminated`` before it when a
        termination came first (nothing was created), and the job stopped right after it
        when one came while the request was on its way. ``created``: the job to stop, from
        ``send``'s result, when only the answer names it (a build's id); else ``job``."""
        self.ctx.check(f"before {job.create_call}{' ' + job.ident if job.ident else ''}: "
                       "nothing was created")
        result = send()
        self.safe_point(created(result) if created else job)
        return result

    def safe_point(self, job: RemoteJob) -> None:
        """Stops ``job`` and raises if a termination was requested."""
        if self.ctx.terminating:
            self.terminate(job)

    # ---- follow ----
    def run_to_end(self, job: RemoteJob, described: dict[str, Any]) -> dict[str, Any]:
        """Polls every ``poll_interval_s`` from ``described`` on until the job is terminal,
        reporting progress and copying its log; the last description."""
        self.safe_point(job)
        while True:
            self.report(job, described)
            if job.is_terminal(described):
                self.copy_logs(job, described)  # lines delivered after the status flipped
                return described
            self.ctx.sleep(self.poll_interval_s)
            self.safe_point(job)  # the safe point between polls
            polled = self.poll_or_stop(job)
            if polled is None:
                raise RuntimeError(f"{job.what} disappeared (deleted?) while running")
            described = polled

    def report(self, job: RemoteJob, described: dict[str, Any]) -> None:
        for line in job.progress(described):
            self.out(self.prefix + line)
        self.copy_logs(job, described)

    def copy_logs(self, job: RemoteJob, described: dict[str, Any]) -> None:
        """The job's new log lines to ``out``; a failing read is said once, not raised
        (the log is a convenience, the job's status is what counts)."""
        if self.logs is None or self.ctx.terminating:  # the stop comes first
            return
        group, prefix = job.log_location(described)
        if self._tail is None or (self._tail.group, self._tail.prefix) != (group, prefix):
            self._tail = LogTail(self.logs, group, prefix, sleep=self.ctx.sleep,
                                 max_backoff_s=2 * self.poll_interval_s)
        try:  # given up on a termination (the next safe point stops the job)
            events = self.ctx.call(self._tail.poll)
        except TerminationRequested:
            return
        except Exception as exc:
            if not self._logs_failing:
                self.out(f"{self.prefix}(could not read {job.log_name}: {exc})")
            self._logs_failing = True
            return
        self._logs_failing = False
        for event in events:
            self.out(job.log_line(event))

    # ---- termination ----
    def terminate(self, job: RemoteJob) -> NoReturn:
        """Stops ``job`` within ``stop_timeout_s`` of the termination request; raises
        ``job.terminated`` saying how it went."""
        why = f"terminated ({self.ctx.signal_name or 'requested'})"
        budget = self.ctx.stop_budget(self.stop_timeout_s)
        self.out(f"{self.prefix}{why}: stopping {job.what} "
                 f"(for up to {self.stop_timeout_s:g} s from the termination)")
        raise job.terminated(f"{why}; {self.stop(job, budget_s=budget, said_s=self.stop_timeout_s)}")

    def stop(self, job: RemoteJob, *, wait: bool | None = None,
             budget_s: float | None = None, said_s: float | None = None) -> str:
        """The stop within ``budget_s`` (default ``stop_timeout_s``), as ``stop_within``'s
        sentence; ``wait`` (default ``wait_after_stop``): then poll until the job leaves
        its running state or the budget ends."""
        budget = self.stop_timeout_s if budget_s is None else budget_s
        wait = self.wait_after_stop if wait is None else wait
        return stop_within(job.what, lambda left: self._stop_and_wait(job, left, wait, budget),
                           budget_s=budget, stop_command=job.stop_command, said_s=said_s)

    def stop_or_raise(self, job: RemoteJob, *, budget_s: float | None = None) -> str:
        """The stop request alone (no wait) as ``stop`` sends it, within ``budget_s``
        (default ``stop_timeout_s``) whatever the endpoint does; what became of the job
        ("it is Stopping", "it had already ended Completed", "gone"); raises when the
        stop could not be delivered (``NoAnswer`` when no answer came in time)."""
        budget = self.stop_timeout_s if budget_s is None else budget_s
        deadline = time.monotonic() + budget

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        state = call_within(budget, lambda: self._stop_and_wait(job, left, False, budget))
        return "gone" if state is None else state

    def _stop_and_wait(self, job: RemoteJob, left: Callable[[], float], wait: bool,
                       budget_s: float) -> str | None:
        client = self.stopper
        described = retry_within(left, lambda: job.describe(client))
        if described is None:
            return None
        status = job.status(described)
        if not job.is_running(described):
            return (f"it had already ended {status}" if job.is_terminal(described)
                    else f"it is {status}")
        try:
            answer = retry_within(left, lambda: job.stop(client))
        except Exception as exc:
            if is_transient(exc):
                raise
            # e.g. it ended between the describe and the stop (ValidationException)
            described = retry_within(left, lambda: job.describe(client))
            if described is not None and job.is_running(described):
                raise
            status = job.status(described) if described else "gone"
            return f"it is {status} ({job.stop_call}: {exc})"
        if not wait:
            return answer
        while described is not None and job.is_running(described) and left() > RETRY_PAUSE_S:
            time.sleep(min(0.5, self.poll_interval_s, left()))
            try:
                described = job.describe(client)
            except Exception:  # the stop was accepted: a lost Describe changes nothing
                break
        if described is not None and job.is_running(described):
            return (f"{job.stop_call} was accepted; {job.service} still reported it "
                    f"{job.status(described)} after {budget_s:g} s{job.after_stop}")
        return f"it is {job.status(described) if described else 'gone'}"
