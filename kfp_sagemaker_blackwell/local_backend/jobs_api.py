"""The training-jobs API: Create, Describe, Stop, Delete and List training jobs.

Create checks the request as SageMaker does before anything runs (``validation``:
its shapes, enums, defaults and the resources it names; ``check_entry_point``: what
the job may run; the training plan and the quotas), records the job and hands it to
the ``Supervisor``, whose thread runs it. The other operations read or change the
job records (``jobs.Job``) under the shared lock.
"""

from __future__ import annotations

import datetime as dt
import re
import sys
from typing import Any

from kfp_sagemaker_blackwell.common.training_job import TERMINAL_STATUSES
from kfp_sagemaker_blackwell.local_backend.api import ApiError, validation
from kfp_sagemaker_blackwell.local_backend.capacity import Capacity
from kfp_sagemaker_blackwell.local_backend.jobs import Job, now, training_job_arn
from kfp_sagemaker_blackwell.local_backend.plans import PlansApi
from kfp_sagemaker_blackwell.local_backend.state import ExecutorState
from kfp_sagemaker_blackwell.local_backend.supervisor import Supervisor
from kfp_sagemaker_blackwell.local_backend.validation import (
    check_resources,
    matches,
    normalize_create_request,
    page,
    validate_list_request,
)

# What a request may make a job run (issue 28: the executor runs only what a training image
# would run). Without ContainerEntrypoint: the image's entry point (container.image_entry_point),
# which runs the sagemaker-training toolkit's `train`, which runs the code dir's train.sh. With
# one: a program the trainer image has (the DLC's shells and Python, the toolkit's `train`,
# torchrun), named bare or by its path in the image's system directories, or this Python; any
# other program (a host path such as /usr/bin/curl or ~/bin/x) is refused at Create. What an
# allowed program then does is the request's own (`bash -c ...` runs anything, as it would in the
# image), as the backend's user, in the job's namespaces and its /opt/ml tree: that is why only
# holders of the backend's own credentials may send requests. The backend's ``command`` (set by
# whoever starts the backend in-process) is not checked: it is not a request's.
IMAGE_PROGRAMS = frozenset({"bash", "sh", "python", "python3", "train", "torchrun"})
IMAGE_BIN_DIRS = frozenset({"/bin", "/usr/bin", "/usr/local/bin", "/opt/conda/bin"})


def check_entry_point(req: dict[str, Any]) -> None:
    """Refuses a ContainerEntrypoint whose program the trainer image does not have
    (``IMAGE_PROGRAMS``)."""
    entry = (req.get("AlgorithmSpecification") or {}).get("ContainerEntrypoint")
    if not entry:
        return
    program = str(entry[0])
    folder, _, base = program.rpartition("/")
    known = re.sub(r"^python3\.\d+$", "python3", base) in IMAGE_PROGRAMS
    if known and (not folder or folder in IMAGE_BIN_DIRS) or program == sys.executable:
        return
    raise validation(
        f"AlgorithmSpecification.ContainerEntrypoint: {program!r} is not a program of the "
        f"training image; the local backend runs only {', '.join(sorted(IMAGE_PROGRAMS))} "
        f"(bare or in {', '.join(sorted(IMAGE_BIN_DIRS))}). Leave ContainerEntrypoint out to "
        "run the image's own entry point (train.sh under the training toolkit).")


class JobsApi:
    """The training-job operations over the shared records."""

    def __init__(self, state: ExecutorState, capacity: Capacity, plans: PlansApi,
                 supervisor: Supervisor) -> None:
        self.state = state
        self.capacity = capacity
        self.plans = plans
        self.supervisor = supervisor

    def create_training_job(self, region: str, req: dict[str, Any]) -> dict[str, Any]:
        state, settings = self.state, self.state.settings
        req = normalize_create_request(req)
        check_entry_point(req)
        name = req["TrainingJobName"]
        with state.lock:
            self._check_unique(region, name)
        check_resources(req, region, state.client, strict=settings.strict_resources)
        with state.lock:
            self._check_unique(region, name)
            plan = self.plans.check_job_plan(region, req)
            wait = not self.capacity.select(region, req)
            job = Job(name, training_job_arn(region, name), region, req, now(),
                      spot_savings=settings.spot_savings, capacity_wait=wait)
            if not wait:
                self.capacity.reuse_warm_pool(job)
            job.last_modified_time = job.creation_time
            state.transition(job, "Starting")
            state.jobs[(region, name)] = job
            state.mirror.create(job)
            self.supervisor.start(job, plan)
        return {"TrainingJobArn": job.arn}

    def _check_unique(self, region: str, name: str) -> None:
        existing = self.state.jobs.get((region, name))
        if existing is not None:
            raise ApiError(
                "ResourceInUse",
                f"Training job names must be unique within an AWS account and region, and "
                f"a training job with this name already exists ({existing.arn})",
            )

    def describe_training_job(self, region: str, req: dict[str, Any]) -> dict[str, Any]:
        with self.state.lock:
            return self.state.job(region, req.get("TrainingJobName")).describe()

    def stop_training_job(self, region: str, req: dict[str, Any]) -> dict[str, Any]:
        state = self.state
        with state.lock:
            job = state.job(region, req.get("TrainingJobName"))
            if job.status == "Stopping":
                return {}
            if job.status != "InProgress":
                raise validation(
                    f"The request was rejected because the training job is in status "
                    f"{job.status}."
                )
            job.status = "Stopping"
            state.transition(job, "Stopping")
            job.stop_event.set()
            state.capacity.notify_all()
        return {}

    def delete_training_job(self, region: str, req: dict[str, Any]) -> dict[str, Any]:
        state = self.state
        with state.lock:
            job = state.job(region, req.get("TrainingJobName"))
            if job.status not in TERMINAL_STATUSES:
                raise validation(
                    f"Training job {job.name} is in status {job.status}; only a Completed, "
                    "Failed or Stopped training job can be deleted."
                )
            del state.jobs[(region, job.name)]
        state.mirror.delete(job)
        return {}

    def list_training_jobs(self, region: str, req: dict[str, Any]) -> dict[str, Any]:
        validate_list_request(req, "ListTrainingJobs")
        with self.state.lock:
            jobs = [j for (r, _), j in self.state.jobs.items() if r == region]
            summaries = [j.summary() for j in jobs if matches(j, req)]
        key = {"Name": "TrainingJobName", "Status": "TrainingJobStatus",
               "CreationTime": "CreationTime"}[req.get("SortBy", "CreationTime")]

        def cursor(s: dict[str, Any]) -> list[Any]:
            value = s[key]
            return [value.timestamp() if isinstance(value, dt.datetime) else value,
                    s["TrainingJobName"]]

        descending = req.get("SortOrder", "Descending") == "Descending"
        summaries.sort(key=cursor, reverse=descending)
        return page(summaries, req, "TrainingJobSummaries", 10, cursor, descending)
