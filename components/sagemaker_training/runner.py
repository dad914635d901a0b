"""The life cycle of a SageMaker training job, from the component's side.

Modelled on GCPC's ``job_remote_runner``: create the job (or re-attach to it),
record it in ``aws_resources`` before anything else can fail, poll until it
ends, stream its CloudWatch logs meanwhile, stop it when the component is
terminated, and raise with SageMaker's FailureReason when it fails.

Re-attaching is what makes retries safe: the job name is deterministic (run id
+ task + precision), so a retried or restarted component finds the job its
first attempt created and follows it instead of launching a second one. It
only does so when the job carries this run's ``kfp-sagemaker:run-id`` tag;
a job of the same name from anywhere else is refused, never adopted.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from components.common import resources, tags
from components.common.aws import error_code, is_throttling
from components.common.cloudwatch import LogTail, training_job_tail
from components.common.errors import UserError

TERMINAL = frozenset({"Completed", "Failed", "Stopped"})
DEFAULT_POLL_INTERVAL_S = 5.0
DEFAULT_STOP_WAIT_S = 60.0
MAX_POLL_FAILURES = 8
TRANSIENT_ERRORS = frozenset({"EndpointConnectionError", "ConnectionClosedError",
                              "ReadTimeoutError", "ConnectTimeoutError"})


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


class Terminated(RuntimeError):
    """The component got SIGTERM (KFP terminate); the job was asked to stop."""


def _is_not_found(exc: BaseException) -> bool:
    code = error_code(exc)
    message = str(getattr(exc, "response", {}).get("Error", {}).get("Message", ""))
    return code in ("ResourceNotFound", "ResourceNotFoundException") or (
        code == "ValidationException" and "not found" in message.lower())


@dataclass
class TrainingJobRunner:
    """Runs one training job to its end. ``out`` receives every progress line."""

    sagemaker: Any
    logs: Any
    region: str
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    stop_wait_s: float = DEFAULT_STOP_WAIT_S
    out: Callable[[str], None] = _print
    sleep: Callable[[float], None] = time.sleep
    created: bool = False  # whether this attempt created the job (False: re-attached)
    _transitions_seen: int = 0
    _tail: LogTail | None = None
    _terminating: bool = field(default=False)

    def describe(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.sagemaker.describe_training_job(TrainingJobName=name))
        except Exception as exc:
            if _is_not_found(exc):
                return None
            raise

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

    def create_or_attach(self, request: dict[str, Any], run_id: str) -> dict[str, Any]:
        name = request["TrainingJobName"]
        job = self.describe(name)
        if job is None:
            try:
                self.sagemaker.create_training_job(**request)
                self.created = True
                self.out(f"created training job {name}")
            except Exception as exc:
                if error_code(exc) != "ResourceInUse":
                    raise
                # Another attempt of this task won the race: follow its job.
            job = self.describe(name)
            if job is None:
                raise RuntimeError(f"training job {name} was created but cannot be described")
        if not self.created:
            self._check_owner(job, run_id)
            self.out(f"re-attached to existing training job {name} "
                     f"({job['TrainingJobStatus']}/{job.get('SecondaryStatus', '')})")
        return job

    def record(self, job: dict[str, Any], path: str) -> None:
        name = job["TrainingJobName"]
        resources.write(path, [resources.AwsResource(
            resourceType=resources.TRAINING_JOB,
            resourceUri=job["TrainingJobArn"],
            name=name,
            region=self.region,
            consoleUri=resources.training_job_console_uri(self.region, name),
        )])

    def run(self, request: dict[str, Any], *, run_id: str,
            resources_path: str | None = None) -> dict[str, Any]:
        """Creates or re-attaches, then waits; returns the final DescribeTrainingJob."""
        job = self.create_or_attach(request, run_id)
        name = job["TrainingJobName"]
        if resources_path:
            self.record(job, resources_path)
        self.out(f"console: {resources.training_job_console_uri(self.region, name)}")
        self._tail = training_job_tail(self.logs, name)
        with self._stop_on_sigterm(name):
            while True:
                self._report(job)
                if job["TrainingJobStatus"] in TERMINAL:
                    break
                self.sleep(self.poll_interval_s)
                job = self._poll(name) or job
        self._drain_logs()
        return job

    def _poll(self, name: str) -> dict[str, Any] | None:
        """DescribeTrainingJob, riding out connection errors and throttling past botocore's
        own retries (the job keeps running on SageMaker meanwhile)."""
        failures = 0
        while True:
            try:
                return self.describe(name)
            except Exception as exc:
                transient = is_throttling(exc) or type(exc).__name__ in TRANSIENT_ERRORS
                failures += 1
                if not transient or failures > MAX_POLL_FAILURES:
                    raise
                self.out(f"(DescribeTrainingJob failed, retrying: {exc})")
                self.sleep(min(60.0, self.poll_interval_s * 2 ** failures))

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
            events = self._tail.poll(sleep=self.sleep)
        except Exception as exc:  # logs are a convenience; the job's status is what counts
            self.out(f"(could not read CloudWatch logs: {exc})")
            return
        for event in events:
            host = event.stream.split("/", 1)[-1]
            self.out(f"[{host}] {event.message}")

    # ---- termination ----
    def stop(self, name: str) -> None:
        """Asks SageMaker to stop the job and waits (briefly) until it is Stopping."""
        try:
            self.sagemaker.stop_training_job(TrainingJobName=name)
        except Exception as exc:
            self.out(f"StopTrainingJob {name}: {exc}")
        deadline = time.monotonic() + self.stop_wait_s
        while time.monotonic() < deadline:
            job = self.describe(name)
            status = job["TrainingJobStatus"] if job else "gone"
            if status != "InProgress":
                self.out(f"training job {name} is {status}")
                return
            time.sleep(min(1.0, self.poll_interval_s))
        self.out(f"training job {name} did not reach Stopping within {self.stop_wait_s:.0f} s")

    def _stop_on_sigterm(self, name: str) -> Any:
        runner = self

        class _Handler:
            previous: Any = None
            installed = False

            def __enter__(self) -> None:
                if threading.current_thread() is not threading.main_thread():
                    return  # signals can only be handled on the main thread
                self.previous = signal.getsignal(signal.SIGTERM)
                signal.signal(signal.SIGTERM, self.handle)
                self.installed = True

            def handle(self, signum: int, frame: Any) -> None:
                if runner._terminating:
                    return
                runner._terminating = True
                runner.out(f"SIGTERM: stopping training job {name}")
                runner.stop(name)
                raise Terminated(f"terminated; training job {name} was asked to stop")

            def __exit__(self, *exc: object) -> None:
                if self.installed:
                    signal.signal(signal.SIGTERM, self.previous)

        return _Handler()
