"""Local SageMaker training jobs: the job state machine.

moto's training jobs are "Completed" at creation and cannot be stopped. Here
``CreateTrainingJob`` really runs the training image's entry point from this
checkout as SageMaker starts a container, one per host (``kfp_sagemaker_blackwell.local_backend.container``):
PID 1 of its own PID namespace is the image's entry point (images/trainer/entrypoint.py,
or the DLC's bash for the stock DLC image), which runs the sagemaker-training toolkit's
``train``, which runs train.sh with the hyperparameters as arguments; or the request's
``AlgorithmSpecification.ContainerEntrypoint`` (a program the image has:
``jobs_api.IMAGE_PROGRAMS``). StopTrainingJob, a spot interruption and the limits send
SIGTERM to PID 1 alone, then SIGKILL after ``stop_grace_s``; /opt/ml/checkpoints is synced
to CheckpointConfig.S3Uri every ``supervisor.CHECKPOINT_SYNC_S`` while the job runs and once
more when its processes have ended (however they ended), and restored from it at every
start. The job goes through SageMaker's life cycle::

    InProgress: Starting -> Downloading -> Training -> Uploading
    Completed | Failed (FailureReason from output/failure) | Stopping -> Stopped
    spot:       Training -> Interrupted -> Restarting -> Starting -> Downloading -> Training ...

``TrainingJobExecutor`` only composes the pieces, each testable alone, and routes each
intercepted operation to the API class that answers it:

- ``jobs_api``: Create/Describe/Stop/Delete/List training jobs (request checks, job records);
- ``plans``: training plans and reserved capacity (Describe/List/Search/Create, registration);
- ``supervisor``: each job's thread and life cycle (stop = SIGTERM to PID 1, then SIGKILL
  after the grace; spot interruption; limits; checkpoint sync; status transitions);
- ``capacity``: quotas, run slots, training plans' instances, warm pools;
- ``instances``: the hosts' /opt/ml trees, what they run, their downloads and uploads;
- ``state``: the records they share, their lock and the status transitions.

Plumbing kept elsewhere:

- ``jobs``: the job and training-plan records and their Describe/List shapes;
- ``processes``: the hosts' process groups, their output and the FailureReason;
- ``logship``: output to CloudWatch Logs (``/aws/sagemaker/TrainingJobs``, one stream
  ``{job}/algo-{n}-{epoch}`` per host and start);
- ``validation``: what SageMaker refuses at Create (and its defaults), List filters and pages;
- ``settings``: what the backend hands over (latency profile, quotas, spot savings...);
- ``moto_state``: the mirror of each job into moto's table, so moto's tag and
  search APIs see it (every private moto API is there);
- ``storage``: S3 transfers (channels, checkpoints, ``model.tar.gz``/``output.tar.gz``).

S3 and CloudWatch are reached through the backend's own endpoint (moto), exactly
as a container would, with clients from the ``ClientFactory`` the backend gives.

What is not emulated: the training image itself (the checkout's trainer and the toolkit
run with this Python; the DLC's SAGEMAKER_TRAINING_MODULE, the PyTorch toolkit, is not
used: the base toolkit runs SAGEMAKER_PROGRAM itself), VPC, network isolation, inter-container traffic encryption and
KMS encryption (all validated and echoed by Describe, none enforced), instance
types (everything runs on this machine), FastFile/Pipe input modes (channels are
always downloaded), RetryStrategy (nothing here fails with InternalServerError),
heterogeneous clusters (InstanceGroups), debugger/profiler rules. Capacity is modelled by
per-type quotas: InstancePreferences select the first type within its quota, a job with
MaxPendingTimeInSeconds waits Pending for quota (then ends Stopped), and warm pools
(KeepAlivePeriodInSeconds) stay Available for a matching job (no Starting latency).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kfp_sagemaker_blackwell.local_backend.capacity import Capacity
from kfp_sagemaker_blackwell.local_backend.instances import Instances
from kfp_sagemaker_blackwell.local_backend.jobs_api import JobsApi
from kfp_sagemaker_blackwell.local_backend.moto_state import MotoMirror
from kfp_sagemaker_blackwell.local_backend.plans import PlansApi
from kfp_sagemaker_blackwell.local_backend.settings import (
    ClientFactory,
    ExecutorSettings,
    OfferingTemplate,
)
from kfp_sagemaker_blackwell.local_backend.state import ExecutorState
from kfp_sagemaker_blackwell.local_backend.supervisor import Supervisor

Handler = Callable[[str, dict[str, Any]], dict[str, Any]]


class TrainingJobExecutor:
    """Answers the intercepted SageMaker operations (``handle``) and the local controls, by
    composing the jobs API, the plans API, capacity and the supervisor over one state."""

    def __init__(self, settings: ExecutorSettings, clients: ClientFactory,
                 mirror: MotoMirror) -> None:
        self.state = ExecutorState(settings, clients, mirror)
        self.capacity = Capacity(self.state)
        self.plans = PlansApi(self.state)
        self.supervisor = Supervisor(self.state, self.capacity, Instances(self.state))
        self.jobs = JobsApi(self.state, self.capacity, self.plans, self.supervisor)
        self._handlers: dict[str, Handler] = {
            "CreateTrainingJob": self.jobs.create_training_job,
            "DescribeTrainingJob": self.jobs.describe_training_job,
            "StopTrainingJob": self.jobs.stop_training_job,
            "ListTrainingJobs": self.jobs.list_training_jobs,
            "DeleteTrainingJob": self.jobs.delete_training_job,
            "DescribeTrainingPlan": self.plans.describe_training_plan,
            "ListTrainingPlans": self.plans.list_training_plans,
            "SearchTrainingPlanOfferings": self.plans.search_training_plan_offerings,
            "CreateTrainingPlan": self.plans.create_training_plan,
        }

    def handle(self, operation: str, region: str, request: dict[str, Any]) -> dict[str, Any]:
        return self._handlers[operation](region, request)

    # ---------------------------------------------------------------- local controls
    @property
    def settings(self) -> ExecutorSettings:
        return self.state.settings

    @property
    def quotas(self) -> dict[str, int]:
        return self.capacity.quotas

    @property
    def offerings(self) -> tuple[OfferingTemplate, ...]:
        return self.plans.offerings

    def register_training_plan(self, name: str, **kwargs: Any) -> str:
        return self.plans.register_training_plan(name, **kwargs)

    def set_quotas(self, quotas: dict[str, int]) -> None:
        self.capacity.set_quotas(quotas)

    def set_offerings(self, offerings: list[OfferingTemplate]) -> None:
        self.plans.set_offerings(offerings)

    def interrupt_spot(self, job_name: str, region: str) -> None:
        self.supervisor.interrupt_spot(job_name, region)

    def host_dir(self, job_name: str, region: str, host: str = "algo-1") -> Path:
        return self.supervisor.host_dir(job_name, region, host)

    def shutdown(self) -> None:
        """Ends every running job quickly (the server is going away)."""
        self.supervisor.shutdown()
