"""Facts of SageMaker's training-job API that the launcher, cleanup and the local backend share,
and the ``remote_job`` adapter of a training job (the launcher follows and stops one, cleanup
waits for and stops them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kfp_sagemaker_blackwell.common.aws import error_code
from kfp_sagemaker_blackwell.common.cloudwatch import (
    TRAINING_JOBS_LOG_GROUP,
    LogEvent,
    training_job_log_prefix,
)
from kfp_sagemaker_blackwell.common.execution_context import Terminated

# DescribeTrainingJob's TrainingJobStatus values after which a job never changes again.
TERMINAL_STATUSES = frozenset({"Completed", "Failed", "Stopped"})
# The longest FailureReason DescribeTrainingJob returns (and the failure file SageMaker reads).
MAX_FAILURE_REASON = 1024
# The longest MaxRuntimeInSeconds SageMaker accepts: 28 days (documented; botocore has min 1 only).
MAX_RUNTIME_LIMIT_S = 28 * 24 * 3600


def is_not_found(exc: BaseException) -> bool:
    """DescribeTrainingJob's answer for a job that does not exist (a ValidationException
    on AWS, ResourceNotFound on some emulators)."""
    code = error_code(exc)
    return code in ("ResourceNotFound", "ResourceNotFoundException") or (
        code == "ValidationException" and "not found" in str(exc).lower())


@dataclass
class TrainingJob:
    """One SageMaker training job, as ``remote_job.RemoteJobRunner`` follows and stops it."""

    name: str
    region: str
    terminated: type[Terminated] = Terminated
    describe_call = "DescribeTrainingJob"
    create_call = "CreateTrainingJob"
    stop_call = "StopTrainingJob"
    service = "SageMaker"
    log_name = "CloudWatch logs"
    after_stop = " (it moves to Stopping, then Stopped)"
    _transitions_seen: int = field(default=0, repr=False)

    @property
    def ident(self) -> str:
        return self.name

    @property
    def what(self) -> str:
        return f"training job {self.name}"

    @property
    def stop_command(self) -> str:
        return (f"aws sagemaker stop-training-job --training-job-name {self.name} "
                f"--region {self.region}")

    def describe(self, client: Any) -> dict[str, Any] | None:
        try:
            return dict(client.describe_training_job(TrainingJobName=self.name))
        except Exception as exc:
            if is_not_found(exc):
                return None
            raise

    def status(self, job: dict[str, Any]) -> str:
        return str(job["TrainingJobStatus"])

    def is_terminal(self, job: dict[str, Any]) -> bool:
        return job["TrainingJobStatus"] in TERMINAL_STATUSES

    def is_running(self, job: dict[str, Any]) -> bool:
        return bool(job["TrainingJobStatus"] == "InProgress")

    def stop(self, client: Any) -> str:
        client.stop_training_job(TrainingJobName=self.name)
        return "StopTrainingJob accepted"

    def progress(self, job: dict[str, Any]) -> list[str]:
        """The secondary-status transitions not reported yet ("[job] Training: ...")."""
        transitions = job.get("SecondaryStatusTransitions") or []
        lines = []
        for t in transitions[self._transitions_seen:]:
            message = t.get("StatusMessage", "")
            lines.append(f"[{self.name}] {t['Status']}" + (f": {message}" if message else ""))
        self._transitions_seen = len(transitions)
        return lines

    def log_location(self, job: dict[str, Any]) -> tuple[str, str]:
        return TRAINING_JOBS_LOG_GROUP, training_job_log_prefix(self.name)

    def log_line(self, event: LogEvent) -> str:
        return f"[{event.stream.split('/', 1)[-1]}] {event.message}"
