"""The life cycle of a SageMaker training job, from the component's side.

Modelled on GCPC's ``job_remote_runner``: create the job (or re-attach to it),
record it in ``aws_resources`` the moment it exists, poll until it ends,
stream its CloudWatch logs meanwhile, stop it when the component is
terminated, and raise with SageMaker's FailureReason when it fails.

Re-attaching is what makes retries safe: the job name is deterministic (run id
+ task + precision), so a retried or restarted component finds the job its
first attempt created and follows it instead of launching a second one. It
only does so when the job carries this run's ``kfp-sagemaker:run-id`` tag;
a job of the same name from anywhere else is refused, never adopted.

Termination (SIGTERM from a KFP Terminate, SIGINT from Ctrl-C) arrives through
an ``ExecutionContext`` the launcher entered before its first AWS call; this
runner looks at it at its safe points: before Create, right after Create
returns (or fails: the job is then looked up by its deterministic name), and
between polls. It then stops the job and raises ``Terminated``.

An outage of the AWS endpoint while the job runs is ridden out for
``max_outage_s`` (the job keeps running on SageMaker meanwhile); after that the
runner gives up with ``AwsUnreachable``, naming the job, which may still run.
A termination is honoured during an outage too: the stop then gets
``stop_timeout_s`` (a few seconds, whatever ``max_outage_s``), and the message
says whether it was accepted or gives the command that stops the job by hand.
Any other exception once this attempt owns the job (it created it, or
re-attached to this run's job) stops the job the same way (``JobStoppedAfterError``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from components.common import resources, tags
from components.common.aws import error_code, is_transient
from components.common.cloudwatch import LogTail, training_job_tail
from components.common.errors import UserError
from components.common.execution_context import (
    DEFAULT_MAX_OUTAGE_S,
    DEFAULT_STOP_TIMEOUT_S,
    RETRY_PAUSE_S,
    AwsUnreachable,
    ExecutionContext,
    Terminated,
    TerminationRequested,
    retry_within,
    stop_within,
)
from components.common.training_job import TERMINAL_STATUSES

DEFAULT_POLL_INTERVAL_S = 5.0

__all__ = ["AwsUnreachable", "JobStoppedAfterError", "Terminated", "TrainingJobFailed",
           "TrainingJobRunner"]


def _print(line: str) -> None:
    print(line, flush=True)


class TrainingJobFailed(RuntimeError):
    """The job ended Failed or Stopped; the message carries SageMaker's reason."""

    def __init__(self, job_name: str, status: str, secondary: str, reason: str) -> None:
        self.job_name, self.status, self.secondary, self.reason = (
            job_name, status, secondary, reason)
        text = f"training job {job_name} ended {status} ({secondary})"
        if reason:
            text += f": {reason}"
        super().__init__(text)


class JobStoppedAfterError(RuntimeError):
    """An unexpected error after CreateTrainingJob: the job was stopped (or could not be,
    the message says which and how to stop it)."""


def _is_not_found(exc: BaseException) -> bool:
    code = error_code(exc)
    message = str(exc)
    return code in ("ResourceNotFound", "ResourceNotFoundException") or (
        code == "ValidationException" and "not found" in message.lower())


@dataclass
class TrainingJobRunner:
    """Runs one training job to its end. ``out`` receives every progress line."""

    sagemaker: Any
    logs: Any
    region: str
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S
    max_outage_s: float = DEFAULT_MAX_OUTAGE_S
    out: Callable[[str], None] = _print
    ctx: ExecutionContext = field(default_factory=ExecutionContext)
    follow: Any = None  # the SageMaker client for Describe (default: ``sagemaker``)
    # The SageMaker client of the stop path: timeouts within ``stop_timeout_s``
    # (``aws.bounded_client_config``), no retries of its own (default: ``follow``).
    stopper: Any = None
    created: bool = False  # whether this attempt created the job (False: re-attached)
    resources_path: str | None = None
    owned: str = ""  # the job this attempt answers for (created, or this run's, re-attached)
    _transitions_seen: int = 0
    _tail: LogTail | None = None
    _logs_failing: bool = False

    # ---- AWS calls that ride out an outage ----
    def describe(self, name: str, client: Any = None) -> dict[str, Any] | None:
        try:
            return dict((client or self.follow or self.sagemaker).describe_training_job(
                TrainingJobName=name))
        except Exception as exc:
            if _is_not_found(exc):
                return None
            raise

    def _describe_following(self, name: str) -> dict[str, Any] | None:
        try:
            return self.ctx.ride_out(f"DescribeTrainingJob {name}", lambda: self.describe(name),
                                     budget_s=self.max_outage_s, out=self.out,
                                     first_pause_s=min(1.0, self.poll_interval_s))
        except TerminationRequested:
            self._terminate(name)

    # ---- create or attach ----
    def _check_owner(self, job: dict[str, Any], run_id: str) -> None:
        job_tags = tags.from_key_value(
            self.sagemaker.list_tags(ResourceArn=job["TrainingJobArn"]).get("Tags"))
        if not tags.belongs_to_run(job_tags, run_id):
            owner = job_tags.get(tags.RUN_ID_KEY, "no run tag")
            raise UserError(
                "run_id",
                f"training job {job['TrainingJobName']} already exists and belongs to another "
                f"run ({tags.RUN_ID_KEY}={owner}); it will not be adopted or overwritten.",
                "use a different task name or run id, or pass an explicit job_name.")

    def _attach(self, job: dict[str, Any], run_id: str) -> dict[str, Any]:
        self._check_owner(job, run_id)  # before anything could stop it
        self.owned = job["TrainingJobName"]
        self._record(job["TrainingJobName"], job["TrainingJobArn"])
        self.out(f"re-attached to existing training job {job['TrainingJobName']} "
                 f"({job['TrainingJobStatus']}/{job.get('SecondaryStatus', '')})")
        if self.ctx.terminating:
            self._terminate(job["TrainingJobName"])
        return job

    def create_or_attach(self, request: dict[str, Any], run_id: str) -> dict[str, Any]:
        name = request["TrainingJobName"]
        job = self._describe_following(name)
        if job is not None:
            return self._attach(job, run_id)
        self.ctx.check(f"before CreateTrainingJob {name}: nothing was created")
        create_error: Exception | None = None
        try:
            arn = self.sagemaker.create_training_job(**request)["TrainingJobArn"]
        except Exception as exc:
            if error_code(exc) != "ResourceInUse" and not (
                    is_transient(exc) or self.ctx.terminating):
                raise
            # Another attempt won the race (ResourceInUse), or Create's response never
            # arrived: the job may exist under its deterministic name. Look it up.
            create_error = exc
            if error_code(exc) != "ResourceInUse":
                self.owned = name  # if it exists, this request made it
        else:
            self.created = True
            self.owned = name
            self._record(name, arn)
            self.out(f"created training job {name}")
            if self.ctx.terminating:  # the safe point right after Create returns
                self._terminate(name)
        job = self._describe_following(name)
        if job is None:
            if self.ctx.terminating:
                self._terminate(name)
            raise RuntimeError(f"CreateTrainingJob {name} failed ({create_error}) and no "
                               "training job of that name exists; nothing was created")
        if self.created:
            return job
        self.out(f"CreateTrainingJob {name}: {create_error}; the job exists")
        self.owned = ""  # owned once the tag check of _attach says it is this run's
        return self._attach(job, run_id)

    def _record(self, name: str, arn: str) -> None:
        if not self.resources_path:
            return
        resources.write(self.resources_path, [resources.AwsResource(
            resourceType=resources.TRAINING_JOB,
            resourceUri=arn,
            name=name,
            region=self.region,
            consoleUri=resources.training_job_console_uri(self.region, name),
        )])

    # ---- following ----
    def run(self, request: dict[str, Any], *, run_id: str,
            resources_path: str | None = None) -> dict[str, Any]:
        """Creates or re-attaches, then waits; returns the final DescribeTrainingJob.

        Once the job is this attempt's, an exception other than a termination or an
        outage past its budget (after which the job is left to a re-attaching retry)
        stops it and raises ``JobStoppedAfterError``, which names the job.
        """
        if resources_path:
            self.resources_path = resources_path
        try:
            return self._follow(self.create_or_attach(request, run_id))
        except (Terminated, AwsUnreachable, UserError):
            raise
        except Exception as exc:
            if not self.owned:
                raise
            name = self.owned
            self.out(f"unexpected {type(exc).__name__} after CreateTrainingJob {name}: "
                     f"stopping the job (for up to {self.stop_timeout_s:g} s)")
            raise JobStoppedAfterError(
                f"{type(exc).__name__} after CreateTrainingJob {name}: {exc}; "
                f"{self._stop(name)}") from exc

    def _follow(self, job: dict[str, Any]) -> dict[str, Any]:
        name = job["TrainingJobName"]
        self.out(f"console: {resources.training_job_console_uri(self.region, name)}")
        self._tail = training_job_tail(self.logs, name, sleep=self.ctx.sleep,
                                       max_backoff_s=2 * self.poll_interval_s)
        while True:
            self._report(job)
            if job["TrainingJobStatus"] in TERMINAL_STATUSES:
                break
            self.ctx.sleep(self.poll_interval_s)
            if self.ctx.terminating:  # the safe point between polls
                self._terminate(name)
            polled = self._describe_following(name)
            if polled is None:
                raise RuntimeError(f"training job {name} disappeared (deleted?) while running")
            job = polled
        self._drain_logs()
        return job

    def check(self, job: dict[str, Any]) -> None:
        if job["TrainingJobStatus"] != "Completed":
            raise TrainingJobFailed(job["TrainingJobName"], job["TrainingJobStatus"],
                                    job.get("SecondaryStatus", ""), job.get("FailureReason", ""))

    # ---- progress ----
    def _report(self, job: dict[str, Any]) -> None:
        transitions = job.get("SecondaryStatusTransitions") or []
        for t in transitions[self._transitions_seen:]:
            message = t.get("StatusMessage", "")
            self.out(f"[{job['TrainingJobName']}] {t['Status']}" + (f": {message}" if message
                                                                   else ""))
        self._transitions_seen = len(transitions)
        self._drain_logs()

    def _drain_logs(self) -> None:
        if self._tail is None:
            return
        try:
            events = self._tail.poll()
        except Exception as exc:  # logs are a convenience; the job's status is what counts
            if not self._logs_failing:
                self.out(f"(could not read CloudWatch logs: {exc})")
            self._logs_failing = True
            return
        self._logs_failing = False
        for event in events:
            host = event.stream.split("/", 1)[-1]
            self.out(f"[{host}] {event.message}")

    # ---- termination ----
    def _terminate(self, name: str) -> NoReturn:
        """Stops the job (if it exists and runs) within ``stop_timeout_s``; raises Terminated."""
        why = f"terminated ({self.ctx.signal_name or 'requested'})"
        self.out(f"{why}: stopping training job {name} (for up to {self.stop_timeout_s:g} s)")
        raise Terminated(f"{why}; {self._stop(name)}")

    def _stop(self, name: str) -> str:
        return stop_within(
            f"training job {name}", lambda left: self._stop_and_wait(name, left),
            budget_s=self.stop_timeout_s,
            stop_command=(f"aws sagemaker stop-training-job --training-job-name {name} "
                          f"--region {self.region}"))

    def _stop_and_wait(self, name: str, left: Callable[[], float]) -> str | None:
        """StopTrainingJob if the job runs, then Describe until it leaves InProgress or the
        budget ends; the state once the stop was accepted, None if there is no job."""
        client = self.stopper or self.follow or self.sagemaker
        job = retry_within(left, lambda: self.describe(name, client))
        if job is None:
            return None
        status = str(job["TrainingJobStatus"])
        if status != "InProgress":
            return f"it is {status}" if status == "Stopping" else (
                f"it had already ended {status}")
        try:
            retry_within(left, lambda: client.stop_training_job(TrainingJobName=name))
        except Exception as exc:
            if is_transient(exc):
                raise
            # e.g. it ended between the describe and the stop (ValidationException)
            job = retry_within(left, lambda: self.describe(name, client))
            status = str(job["TrainingJobStatus"]) if job else "gone"
            if status == "InProgress":
                raise
            return f"it is {status} (StopTrainingJob: {exc})"
        while status == "InProgress" and left() > RETRY_PAUSE_S:
            time.sleep(min(0.5, self.poll_interval_s, left()))
            try:
                job = self.describe(name, client)
            except Exception:  # the stop was accepted: a lost Describe changes nothing
                break
            status = str(job["TrainingJobStatus"]) if job else "gone"
        if status == "InProgress":
            return ("StopTrainingJob was accepted; SageMaker still reported it InProgress "
                    f"after {self.stop_timeout_s:g} s (it moves to Stopping, then Stopped)")
        return f"it is {status}"
