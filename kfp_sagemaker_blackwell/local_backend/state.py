"""What the executor's pieces share: the job and plan records, one lock, the moto mirror.

The jobs API, the plans API, capacity and the supervisor each get this one object
(composition: none of them subclasses another). Every read or write of a record holds
``lock``; ``capacity`` is a condition on that lock, notified whenever capacity may have
been freed (a job ended or was stopped, a plan or a quota changed).
"""

from __future__ import annotations

import threading
from typing import Any

from kfp_sagemaker_blackwell.common.training_job import MAX_FAILURE_REASON
from kfp_sagemaker_blackwell.local_backend.api import not_found, validation
from kfp_sagemaker_blackwell.local_backend.jobs import MESSAGES, Job, TrainingPlan, now
from kfp_sagemaker_blackwell.local_backend.moto_state import MotoMirror
from kfp_sagemaker_blackwell.local_backend.settings import ClientFactory, ExecutorSettings


class ExecutorState:
    """The records (jobs by (region, name), plans by ARN) and their status transitions."""

    def __init__(self, settings: ExecutorSettings, clients: ClientFactory,
                 mirror: MotoMirror) -> None:
        self.settings = settings
        self.mirror = mirror
        self._clients = clients
        self.lock = threading.RLock()
        self.capacity = threading.Condition(self.lock)
        self.jobs: dict[tuple[str, str], Job] = {}
        self.plans: dict[str, TrainingPlan] = {}
        self.shutting_down = threading.Event()  # the server is going away

    def client(self, service: str, region: str) -> Any:
        return self._clients(service, region)

    def job(self, region: str, name: Any) -> Job:
        """The job a request names (ValidationException as SageMaker answers otherwise)."""
        if not isinstance(name, str) or not name:
            raise validation("TrainingJobName is required.")
        job = self.jobs.get((region, name))
        if job is None:
            raise not_found()
        return job

    def local_job(self, region: str, name: str) -> Job:
        """The job a local control names (ValueError: the controls are not AWS APIs)."""
        job = self.jobs.get((region, name))
        if job is None:
            raise ValueError(f"no training job {name!r} in {region}")
        return job

    def transition(self, job: Job, secondary: str, message: str | None = None) -> None:
        with self.lock:
            t = now()
            if job.transitions and "EndTime" not in job.transitions[-1]:
                job.transitions[-1]["EndTime"] = t
            job.transitions.append({"Status": secondary, "StartTime": t,
                                    "StatusMessage": message or MESSAGES.get(secondary, "")})
            job.secondary_status = secondary
            job.last_modified_time = t
        self.mirror.update(job)

    def finish(self, job: Job, status: str, secondary: str, failure: str = "",
               message: str | None = None) -> None:
        with self.lock:
            job.status = status
            if failure:
                job.failure_reason = failure[:MAX_FAILURE_REASON]
            self.transition(job, secondary, message)
            job.transitions[-1]["EndTime"] = job.transitions[-1]["StartTime"]
            job.training_end_time = job.last_modified_time
            if job.training_start_time is None:
                job.training_start_time = job.training_end_time
        self.mirror.update(job)
