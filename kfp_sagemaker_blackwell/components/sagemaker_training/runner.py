"""The life cycle of a SageMaker training job, from the component's side.

Modelled on GCPC's ``job_remote_runner``: create the job (or re-attach to it),
record it in ``aws_resources`` the moment it exists, poll until it ends,
stream its CloudWatch logs meanwhile, stop it when the component is
terminated, and raise with SageMaker's FailureReason when it fails. The
following, the stop and the outage ride-out are the shared
``kfp_sagemaker_blackwell.common.remote_job.RemoteJobRunner``'s (CodeBuild and cleanup use
it too); what is particular to the training job is here.

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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kfp_sagemaker_blackwell.common import resources, tags
from kfp_sagemaker_blackwell.common.aws import error_code, is_transient
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.common.execution_context import (
    DEFAULT_MAX_OUTAGE_S,
    DEFAULT_STOP_TIMEOUT_S,
    AwsUnreachable,
    ExecutionContext,
    Terminated,
)
from kfp_sagemaker_blackwell.common.remote_job import DEFAULT_POLL_INTERVAL_S, RemoteJobRunner
from kfp_sagemaker_blackwell.common.training_job import TrainingJob

__all__ = ["DEFAULT_MAX_OUTAGE_S", "DEFAULT_POLL_INTERVAL_S", "AwsUnreachable",
           "JobStoppedAfterError", "Terminated", "TrainingJobFailed", "TrainingJobRunner"]


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


@dataclass
class TrainingJobRunner:
    """Runs one training job to its end. ``out`` receives every progress line.

    Following, stopping and riding out outages is ``remote_job.RemoteJobRunner``'s,
    with ``training_job.TrainingJob`` as the adapter; what is the training job's own
    is here: re-attaching to this run's job (and only this run's), recording it in
    ``aws_resources`` the moment it exists, and a Create whose answer was lost.
    """

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
    _jobs: dict[str, TrainingJob] = field(default_factory=dict)
    _remote: RemoteJobRunner | None = None

    @property
    def remote(self) -> RemoteJobRunner:
        if self._remote is None:
            follow = self.follow or self.sagemaker
            self._remote = RemoteJobRunner(
                follow=follow, stopper=self.stopper or follow, logs=self.logs, ctx=self.ctx,
                out=self.out, poll_interval_s=self.poll_interval_s,
                max_outage_s=self.max_outage_s, stop_timeout_s=self.stop_timeout_s)
        return self._remote

    def job(self, name: str) -> TrainingJob:
        """The adapter of job ``name`` (one per job: it remembers the progress reported)."""
        return self._jobs.setdefault(name, TrainingJob(name, self.region))

    def describe(self, name: str, client: Any = None) -> dict[str, Any] | None:
        return self.job(name).describe(client or self.follow or self.sagemaker)

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
        name = job["TrainingJobName"]
        self.owned = name
        self._record(name, job["TrainingJobArn"])
        self.out(f"re-attached to existing training job {name} "
                 f"({job['TrainingJobStatus']}/{job.get('SecondaryStatus', '')})")
        self.remote.safe_point(self.job(name))
        return job

    def _create(self, request: dict[str, Any]) -> None:
        name = request["TrainingJobName"]
        arn = self.sagemaker.create_training_job(**request)["TrainingJobArn"]
        self.created = True
        self.owned = name
        self._record(name, arn)
        self.out(f"created training job {name}")

    def create_or_attach(self, request: dict[str, Any], run_id: str) -> dict[str, Any]:
        name = request["TrainingJobName"]
        job = self.remote.poll_or_stop(self.job(name))
        if job is not None:
            return self._attach(job, run_id)
        create_error: Exception | None = None
        try:  # the job is stopped right after Create returns if a termination came meanwhile
            self.remote.create(self.job(name), lambda: self._create(request))
        except Terminated:
            raise
        except Exception as exc:
            if error_code(exc) != "ResourceInUse" and not (
                    is_transient(exc) or self.ctx.terminating):
                raise
            # Another attempt won the race (ResourceInUse), or Create's response never
            # arrived: the job may exist under its deterministic name. Look it up.
            create_error = exc
            if error_code(exc) != "ResourceInUse":
                self.owned = name  # if it exists, this request made it
        job = self.remote.poll_or_stop(self.job(name))
        if job is None:
            self.remote.safe_point(self.job(name))
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
            job = self.create_or_attach(request, run_id)
            name = job["TrainingJobName"]
            self.out(f"console: {resources.training_job_console_uri(self.region, name)}")
            return self.remote.run_to_end(self.job(name), job)
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
                f"{self.remote.stop(self.job(name))}") from exc

    def check(self, job: dict[str, Any]) -> None:
        if job["TrainingJobStatus"] != "Completed":
            raise TrainingJobFailed(job["TrainingJobName"], job["TrainingJobStatus"],
                                    job.get("SecondaryStatus", ""), job.get("FailureReason", ""))
