"""Local SageMaker training jobs: the job state machine.

moto's training jobs are "Completed" at creation and cannot be stopped. Here
``CreateTrainingJob`` really runs the training image's entry point from this
checkout as SageMaker starts a container, one per host (``components.local.container``):
PID 1 of its own PID namespace is the image's entry point (images/trainer/entrypoint.py,
or the DLC's bash for the stock DLC image), which runs the sagemaker-training toolkit's
``train``, which runs train.sh with the hyperparameters as arguments; or the request's
``AlgorithmSpecification.ContainerEntrypoint`` (a program the image has: ``IMAGE_PROGRAMS``).
StopTrainingJob, a spot interruption and the limits send SIGTERM to PID 1 alone, then
SIGKILL after ``stop_grace_s``; /opt/ml/checkpoints is synced to CheckpointConfig.S3Uri
every ``CHECKPOINT_SYNC_S`` while the job runs and once more when its processes have
ended (however they ended), and restored from it at every start. The job goes
through SageMaker's life cycle::

    InProgress: Starting -> Downloading -> Training -> Uploading
    Completed | Failed (FailureReason from output/failure) | Stopping -> Stopped
    spot:       Training -> Interrupted -> Restarting -> Starting -> Downloading -> Training ...

A job's thread (``_run``) waits for capacity, then runs ``_life_cycle``: one
``_attempt`` per start on fresh instances (download, train under
``_supervise``, which acts on stop, spot interruption, runtime limits and failed
peers), then uploads and finishes. Everything else is plumbing kept elsewhere:

- ``jobs``: the job and training-plan records and their Describe/List shapes;
- ``processes``: the hosts' process groups, their output and the FailureReason;
- ``logship``: output to CloudWatch Logs (``/aws/sagemaker/TrainingJobs``, one stream
  ``{job}/algo-{n}-{epoch}`` per host and start);
- ``validation``: what SageMaker refuses at Create (and its defaults), List filters and pages;
- ``plans``: SearchTrainingPlanOfferings' offerings (CreateTrainingPlan buys one);
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

import datetime as dt
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from catalog.hardware import DEFAULT_INSTANCE_TYPE
from catalog.sagemaker import MAX_RUNTIME_SECONDS
from components.common.naming import SAGEMAKER_NAME_RE
from components.common.training_job import MAX_FAILURE_REASON, TERMINAL_STATUSES
from components.local import container, plans, processes, storage
from components.local.api import ApiError, not_found, validation
from components.local.container import HostLayout, free_port, local_gpu_count
from components.local.jobs import (
    MESSAGES,
    PLAN_STATUSES,
    Job,
    TrainingPlan,
    WarmPool,
    now,
    training_job_arn,
    training_plan_arn,
)
from components.local.logship import ensure_log_group
from components.local.moto_state import MotoMirror
from components.local.processes import HostProcess
from components.local.settings import ClientFactory, ExecutorSettings, OfferingTemplate
from components.local.validation import (
    check_resources,
    instance_types,
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

POLL_S = 0.1
CHECKPOINT_SYNC_S = 1.0
FAILED_PEER_GRACE_S = 10.0  # when one host fails, the others get this long after SIGTERM
SHUTDOWN_GRACE_S = 5.0  # a job stopped because the server is going away


class _Stopped(Exception):
    """The job was stopped before its processes started."""


class _PendingTimeout(Exception):
    """The job waited for capacity longer than its MaxPendingTimeInSeconds."""


PENDING_TIMEOUT_MESSAGE = ("Training job exceeded MaxPendingTimeInSeconds while waiting for "
                           "capacity for {types}")
CAPACITY_MESSAGE = "Waiting for capacity: {types} (MaxPendingTimeInSeconds {limit})"
# What SageMaker compares to reuse a warm pool: the same role, image, instance type and
# count, volume, KMS key and network (a job with another configuration starts afresh).
WARM_POOL_MATCH = (("RoleArn",), ("AlgorithmSpecification", "TrainingImage"),
                   ("ResourceConfig", "VolumeSizeInGB"), ("ResourceConfig", "VolumeKmsKeyId"),
                   ("VpcConfig",), ("EnableNetworkIsolation",),
                   ("EnableInterContainerTrafficEncryption",))


class TrainingJobExecutor:
    """Answers the intercepted SageMaker operations and runs each job on its own thread."""

    def __init__(self, settings: ExecutorSettings, clients: ClientFactory,
                 mirror: MotoMirror) -> None:
        self.settings = settings
        self._clients = clients
        self.mirror = mirror
        self._lock = threading.RLock()
        self._capacity = threading.Condition(self._lock)
        self._jobs: dict[tuple[str, str], Job] = {}
        self._plans: dict[str, TrainingPlan] = {}
        self._running = 0
        self._log_groups: set[str] = set()
        self._shutdown = threading.Event()
        self.num_gpus = local_gpu_count()
        # Changeable while serving (the admin endpoint): quotas and training-plan offerings.
        self.quotas: dict[str, int] = dict(settings.quotas)
        self.offerings: tuple[OfferingTemplate, ...] = tuple(settings.offerings)
        self._offers: dict[str, dict[str, Any]] = {}  # offering ID -> what it reserves

    # ---------------------------------------------------------------- plumbing
    def client(self, service: str, region: str) -> Any:
        return self._clients(service, region)

    def handle(self, operation: str, region: str, request: dict[str, Any]) -> dict[str, Any]:
        handler = {
            "CreateTrainingJob": self.create_training_job,
            "DescribeTrainingJob": self.describe_training_job,
            "StopTrainingJob": self.stop_training_job,
            "ListTrainingJobs": self.list_training_jobs,
            "DeleteTrainingJob": self.delete_training_job,
            "DescribeTrainingPlan": self.describe_training_plan,
            "ListTrainingPlans": self.list_training_plans,
            "SearchTrainingPlanOfferings": self.search_training_plan_offerings,
            "CreateTrainingPlan": self.create_training_plan,
        }[operation]
        return handler(region, request)

    def _job(self, region: str, name: Any) -> Job:
        if not isinstance(name, str) or not name:
            raise validation("TrainingJobName is required.")
        job = self._jobs.get((region, name))
        if job is None:
            raise not_found()
        return job

    # ---------------------------------------------------------------- API
    def create_training_job(self, region: str, req: dict[str, Any]) -> dict[str, Any]:
        req = normalize_create_request(req)
        check_entry_point(req)
        name = req["TrainingJobName"]
        with self._lock:
            self._check_unique(region, name)
        check_resources(req, region, self.client, strict=self.settings.strict_resources)
        with self._lock:
            self._check_unique(region, name)
            plan = self._check_plan(region, req)
            wait = not self._select(region, req)
            job = Job(name, training_job_arn(region, name), region, req, now(),
                      spot_savings=self.settings.spot_savings, capacity_wait=wait)
            if not wait:
                self._reuse_warm_pool(job)
            job.last_modified_time = job.creation_time
            self._transition(job, "Starting")
            self._jobs[(region, name)] = job
            self.mirror.create(job)
            job.thread = threading.Thread(
                target=self._run, args=(job, plan), name=f"job-{name}", daemon=True
            )
            job.thread.start()
        return {"TrainingJobArn": job.arn}

    def _check_unique(self, region: str, name: str) -> None:
        existing = self._jobs.get((region, name))
        if existing is not None:
            raise ApiError(
                "ResourceInUse",
                f"Training job names must be unique within an AWS account and region, and "
                f"a training job with this name already exists ({existing.arn})",
            )

    def _in_use(self, region: str, itype: str) -> int:
        return sum(j.instance_count for (r, _), j in self._jobs.items()
                   if r == region and j.status not in TERMINAL_STATUSES
                   and not j.capacity_wait and j.instance_type == itype)

    def _select(self, region: str, req: dict[str, Any]) -> bool:
        """SageMaker's per-instance-type quota ("<type> for training job usage"): the first of
        the request's instance types (InstancePreferences, in order) within its quota is
        selected (ResourceConfig.SelectedInstanceType/Count); returns False when none is and
        the job may wait (MaxPendingTimeInSeconds), else raises ResourceLimitExceeded."""
        rc = req["ResourceConfig"]
        for itype, count in instance_types(rc):
            limit = self.quotas.get(itype)
            if limit is None or self._in_use(region, itype) + count <= limit:
                if rc.get("InstancePreferences"):
                    rc["SelectedInstanceType"], rc["SelectedInstanceCount"] = itype, count
                return True
        if (req.get("StoppingCondition") or {}).get("MaxPendingTimeInSeconds"):
            return False
        itype, count = instance_types(rc)[-1]
        limit, in_use = self.quotas[itype], self._in_use(region, itype)
        raise ApiError(
            "ResourceLimitExceeded",
            f"The account-level service limit '{itype} for training job usage' is {limit} "
            f"Instances, with current utilization of {in_use} Instances and a request delta "
            f"of {count} Instances. Please use AWS Service Quotas to request an increase "
            "for this quota. If AWS Service Quotas is not available, contact AWS support "
            "to request an increase for this quota.")

    def _reuse_warm_pool(self, job: Job) -> None:
        """A job matching an Available warm pool (same instance type and count and the
        WARM_POOL_MATCH members) takes it over: the pool is Reused, its retained time ends."""
        def key(j: Job) -> list[Any]:
            values: list[Any] = [j.region, j.instance_type, j.instance_count]
            for path in WARM_POOL_MATCH:
                value: Any = j.request
                for part in path:
                    value = (value or {}).get(part)
                values.append(value)
            return values

        if not job.keep_alive_s:  # only a job that asks for a warm pool gets one
            return
        job.warm_pool = WarmPool()
        for other in self._jobs.values():
            pool = other.warm_pool
            if pool is not None and pool.status == "Available" and key(other) == key(job):
                pool.status, pool.reused_by = "Reused", job.name
                pool.retained_s = (time.monotonic() - pool.released_at) / self._scale
                pool.done.set()
                job.warm_pool.reused_from = other.name
                self.mirror.update(other)
                return

    @property
    def _scale(self) -> float:
        return self.settings.capacity_time_scale

    def describe_training_job(self, region: str, req: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            return self._job(region, req.get("TrainingJobName")).describe()

    def stop_training_job(self, region: str, req: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            job = self._job(region, req.get("TrainingJobName"))
            if job.status == "Stopping":
                return {}
            if job.status != "InProgress":
                raise validation(
                    f"The request was rejected because the training job is in status "
                    f"{job.status}."
                )
            job.status = "Stopping"
            self._transition(job, "Stopping")
            job.stop_event.set()
            self._capacity.notify_all()
        return {}

    def delete_training_job(self, region: str, req: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            job = self._job(region, req.get("TrainingJobName"))
            if job.status not in TERMINAL_STATUSES:
                raise validation(
                    f"Training job {job.name} is in status {job.status}; only a Completed, "
                    "Failed or Stopped training job can be deleted."
                )
            del self._jobs[(region, job.name)]
        self.mirror.delete(job)
        return {}

    def list_training_jobs(self, region: str, req: dict[str, Any]) -> dict[str, Any]:
        validate_list_request(req, "ListTrainingJobs")
        with self._lock:
            jobs = [j for (r, _), j in self._jobs.items() if r == region]
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

    def describe_training_plan(self, region: str, req: dict[str, Any]) -> dict[str, Any]:
        name = str(req.get("TrainingPlanName") or "")
        with self._lock:
            plan = self._find_plan(region, name)
            if plan is None:
                raise ApiError("ResourceNotFound", f"Training plan {name} does not exist.")
            return plan.describe()

    def search_training_plan_offerings(self, region: str,
                                       req: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            offers = plans.search(self.offerings, req, region)
            for offer in offers:
                self._offers[offer["TrainingPlanOfferingId"]] = {"region": region, **offer}
        return {"TrainingPlanOfferings": offers}

    def create_training_plan(self, region: str, req: dict[str, Any]) -> dict[str, Any]:
        name = str(req.get("TrainingPlanName") or "")
        if not SAGEMAKER_NAME_RE.match(name):
            raise validation(f"TrainingPlanName {name!r} must match {SAGEMAKER_NAME_RE.pattern}.")
        with self._lock:
            offer = self._offers.get(str(req.get("TrainingPlanOfferingId") or ""))
            if offer is None or offer["region"] != region:
                raise validation(f"TrainingPlanOfferingId {req.get('TrainingPlanOfferingId')!r} "
                                 "is not an offering SearchTrainingPlanOfferings returned in "
                                 f"{region}.")
            if self._find_plan(region, name) is not None:
                raise ApiError("ResourceInUse", f"Training plan {name} already exists.")
            [capacity] = offer["ReservedCapacityOfferings"]
            start = capacity["StartTime"]
            arn = self.register_training_plan(
                name, instance_type=capacity["InstanceType"],
                instance_count=capacity["InstanceCount"], region=region,
                status="Active" if start <= now() else "Scheduled",
                start_time=start, end_time=capacity["EndTime"], upfront_fee=offer["UpfrontFee"],
                currency=offer["CurrencyCode"])
            del self._offers[offer["TrainingPlanOfferingId"]]
        return {"TrainingPlanArn": arn}

    def list_training_plans(self, region: str, req: dict[str, Any]) -> dict[str, Any]:
        validate_list_request(req, "ListTrainingPlans")
        with self._lock:
            plans = [p.describe() for p in self._plans.values() if p.region == region]

        def cursor(p: dict[str, Any]) -> list[Any]:
            return [p["StartTime"].timestamp(), p["TrainingPlanArn"]]

        descending = req.get("SortOrder", "Ascending") == "Descending"
        plans.sort(key=cursor, reverse=descending)
        return page(plans, req, "TrainingPlanSummaries", 100, cursor, descending)

    # ---------------------------------------------------------------- local controls
    def register_training_plan(
        self,
        name: str,
        *,
        instance_type: str = DEFAULT_INSTANCE_TYPE,
        instance_count: int = 1,
        status: str = "Active",
        region: str | None = None,
        duration_hours: float = 24.0,
        start_time: dt.datetime | None = None,
        end_time: dt.datetime | None = None,
        upfront_fee: str | float = "0",
        currency: str = "USD",
    ) -> str:
        if status not in PLAN_STATUSES:
            raise ValueError(f"status={status!r}: choose one of {', '.join(PLAN_STATUSES)}")
        if not SAGEMAKER_NAME_RE.match(name):
            raise ValueError(f"name={name!r}: must match {SAGEMAKER_NAME_RE.pattern}")
        if instance_count < 1:
            raise ValueError("instance_count must be >= 1")
        region = region or self.settings.region
        start = start_time or now()
        end = end_time or start + dt.timedelta(hours=duration_hours)
        arn = training_plan_arn(region, name)
        with self._lock:
            in_use = self._plans[arn].in_use if arn in self._plans else 0
            self._plans[arn] = TrainingPlan(name, arn, region, status, instance_type,
                                            instance_count, start, end, in_use,
                                            f"{float(upfront_fee):.2f}", currency)
            self._capacity.notify_all()
        return arn

    def set_quotas(self, quotas: dict[str, int]) -> None:
        """Per-instance-type quotas (instances in use at once); replaces the current ones."""
        for itype, limit in quotas.items():
            if not isinstance(limit, int) or limit < 0:
                raise ValueError(f"quota for {itype}: {limit!r} is not a count >= 0")
        with self._lock:
            self.quotas = dict(quotas)

    def set_offerings(self, offerings: list[OfferingTemplate]) -> None:
        with self._lock:
            self.offerings = tuple(offerings)

    def interrupt_spot(self, job_name: str, region: str) -> None:
        with self._lock:
            job = self._jobs.get((region, job_name))
            if job is None:
                raise ValueError(f"no training job {job_name!r} in {region}")
            if not job.spot:
                raise ValueError(f"{job_name} is not a managed spot job "
                                 "(EnableManagedSpotTraining is not set)")
            if job.status != "InProgress" or job.secondary_status != "Training":
                raise ValueError(f"{job_name} is not training (status {job.status}/"
                                 f"{job.secondary_status}); only a training spot job can be "
                                 "interrupted")
            job.interrupt_event.set()

    def host_dir(self, job_name: str, region: str, host: str = "algo-1") -> Path:
        """The /opt/ml-like root of ``host`` in the job's current (or last) attempt."""
        with self._lock:
            job = self._jobs.get((region, job_name))
            if job is None:
                raise ValueError(f"no training job {job_name!r} in {region}")
            for layout in self._layouts(job):
                if layout.host == host:
                    return layout.root
        raise ValueError(f"{job_name} has no host {host!r}")

    def shutdown(self) -> None:
        """Ends every running job quickly (the server is going away)."""
        self._shutdown.set()
        with self._lock:
            jobs = list(self._jobs.values())
            for job in jobs:
                job.stop_event.set()
            self._capacity.notify_all()
        for job in jobs:
            for host in list(job.hosts):
                host.terminate()
        deadline = time.monotonic() + 5
        for job in jobs:
            if job.thread is not None:
                job.thread.join(timeout=max(0.1, deadline - time.monotonic()))
        for job in jobs:
            for host in list(job.hosts):
                host.signal(signal.SIGKILL)
            if job.thread is not None:
                job.thread.join(timeout=5)

    # ---------------------------------------------------------------- state
    def _transition(self, job: Job, secondary: str, message: str | None = None) -> None:
        with self._lock:
            t = now()
            if job.transitions and "EndTime" not in job.transitions[-1]:
                job.transitions[-1]["EndTime"] = t
            job.transitions.append({"Status": secondary, "StartTime": t,
                                    "StatusMessage": message or MESSAGES.get(secondary, "")})
            job.secondary_status = secondary
            job.last_modified_time = t
        self.mirror.update(job)

    def _finish(self, job: Job, status: str, secondary: str, failure: str = "",
                message: str | None = None) -> None:
        with self._lock:
            job.status = status
            if failure:
                job.failure_reason = failure[:MAX_FAILURE_REASON]
            self._transition(job, secondary, message)
            job.transitions[-1]["EndTime"] = job.transitions[-1]["StartTime"]
            job.training_end_time = job.last_modified_time
            if job.training_start_time is None:
                job.training_start_time = job.training_end_time
        self.mirror.update(job)

    def _find_plan(self, region: str, name_or_arn: str) -> TrainingPlan | None:
        for plan in self._plans.values():
            if plan.region == region and name_or_arn in (plan.name, plan.arn):
                return plan
        return None

    def _check_plan(self, region: str, req: dict[str, Any]) -> TrainingPlan | None:
        arn = req.get("ResourceConfig", {}).get("TrainingPlanArn")
        if not arn:
            return None
        plan = self._plans.get(arn)
        if plan is None or plan.region != region:
            raise validation(f"Training plan {arn} does not exist in {region}.")
        if plan.status not in ("Active", "Scheduled"):
            raise validation(f"Training plan {arn} is {plan.status}; it must be Active or "
                             "Scheduled.")
        rc = req["ResourceConfig"]
        if rc.get("InstanceType") != plan.instance_type:
            raise validation(f"Training plan {arn} reserves {plan.instance_type}, not "
                             f"{rc.get('InstanceType')}.")
        if int(rc.get("InstanceCount", 1)) > plan.instance_count:
            raise validation(f"Training plan {arn} reserves {plan.instance_count} instance(s); "
                             f"the job asks for {rc.get('InstanceCount')}.")
        return plan

    # ---------------------------------------------------------------- the job's life
    def _run(self, job: Job, plan: TrainingPlan | None) -> None:
        try:
            self._wait_for_capacity(job, plan)
        except _Stopped:
            self._finish(job, "Stopped", "Stopped")
            return
        except _PendingTimeout:
            # AWS Batch's guide to SageMaker jobs: a job that times out waiting for
            # capacity ends Stopped, its secondary status saying it timed out in Pending.
            self._finish(job, "Stopped", "Stopped", message=PENDING_TIMEOUT_MESSAGE.format(
                types=", ".join(f"{n} x {t}" for t, n in instance_types(
                    job.request["ResourceConfig"]))))
            return
        try:
            self._life_cycle(job)
        except Exception as exc:  # a bug here must still end the job
            self._kill(job)
            self._finish(job, "Failed", "Failed", f"InternalServerError: {exc!r}")
        finally:
            with self._lock:
                self._running -= 1
                if plan is not None:
                    plan.in_use -= job.instance_count
                self._capacity.notify_all()
            self._retain_warm_pool(job)

    def _retain_warm_pool(self, job: Job) -> None:
        """After the job, its instances stay Available for KeepAlivePeriodInSeconds (billed as
        ResourceRetainedBillableTimeInSeconds), unless a matching job reuses them first."""
        pool = job.warm_pool
        if pool is None or not job.keep_alive_s:
            return
        with self._lock:
            pool.status, pool.released_at = "Available", time.monotonic()
        self.mirror.update(job)

        def expire() -> None:
            if pool.done.wait(job.keep_alive_s * self._scale):
                return  # reused
            with self._lock:
                if pool.status == "Available":
                    pool.status, pool.retained_s = "Terminated", float(job.keep_alive_s)
            self.mirror.update(job)

        threading.Thread(target=expire, name=f"warm-pool-{job.name}", daemon=True).start()

    def _wait_for_capacity(self, job: Job, plan: TrainingPlan | None) -> None:
        with self._lock:
            pending_shown = False
            if job.capacity_wait:
                self._wait_for_quota(job)
            while True:
                if job.stop_event.is_set():
                    raise _Stopped
                plan_ok = plan is None or plan.in_use + job.instance_count <= plan.instance_count
                if plan_ok and self._running < self.settings.max_concurrent_jobs:
                    self._running += 1
                    if plan is not None:
                        plan.in_use += job.instance_count
                    return
                if not plan_ok and not pending_shown:
                    self._transition(job, "Pending")
                    pending_shown = True
                self._capacity.wait(timeout=0.5)

    def _wait_for_quota(self, job: Job) -> None:
        """Pending until one of the job's instance types is within its quota (then selected),
        for at most MaxPendingTimeInSeconds (scaled by ``capacity_time_scale``)."""
        limit = int(job.request["StoppingCondition"]["MaxPendingTimeInSeconds"])
        deadline = time.monotonic() + limit * self._scale
        types = ", ".join(f"{n} x {t}" for t, n in instance_types(job.request["ResourceConfig"]))
        self._transition(job, "Pending", CAPACITY_MESSAGE.format(types=types, limit=limit))
        while True:
            if job.stop_event.is_set():
                raise _Stopped
            if self._select(job.region, job.request):
                job.capacity_wait = False
                self._reuse_warm_pool(job)
                self._transition(job, "Starting")
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise _PendingTimeout
            self._capacity.wait(timeout=min(0.5, left))

    def _life_cycle(self, job: Job) -> None:
        sc = job.request.get("StoppingCondition") or {}
        max_runtime = float(sc.get("MaxRuntimeInSeconds") or MAX_RUNTIME_SECONDS)
        max_wait = float(sc.get("MaxWaitTimeInSeconds") or 0) if job.spot else 0.0
        while True:
            outcome, failure = self._attempt(job, max_runtime, max_wait)
            if outcome != "interrupted":
                break
            self._linger(job, self.settings.latency.restarting_s)
            self._transition(job, "Restarting")
            self._linger(job, self.settings.latency.restarting_s)
            job.attempt += 1
            self._transition(job, "Starting")
        s3 = self.client("s3", job.region)
        if outcome == "failed":
            self._upload_quietly(s3, job, model=False)
            self._finish(job, "Failed", "Failed", failure)
            return
        self._transition(job, "Uploading")
        t0 = time.monotonic()
        upload_error = self._upload_quietly(s3, job, model=True)
        time.sleep(self.settings.latency.uploading_s)
        job.billable_s += time.monotonic() - t0
        if upload_error:
            self._finish(job, "Failed", "Failed", f"ClientError: {upload_error}")
        elif outcome == "completed":
            self._finish(job, "Completed", "Completed")
        elif outcome == "stopped":
            self._finish(job, "Stopped", "Stopped")
        elif outcome == "maxruntime":
            self._finish(job, "Stopped", "MaxRuntimeExceeded")
        else:
            self._finish(job, "Stopped", "MaxWaitTimeExceeded")

    def _upload_quietly(self, s3: Any, job: Job, *, model: bool) -> str:
        """Uploads algo-1's model and output data; returns an error message or ''."""
        layout = self._layouts(job)[0]
        try:
            if model:
                storage.upload_tar(s3, layout.model_dir, job.model_uri)
            storage.upload_tar(s3, layout.output_data_dir, job.output_uri)
        except Exception as exc:
            return f"Uploading the model to {job.model_uri} failed: {exc}"
        return ""

    def _layouts(self, job: Job) -> list[HostLayout]:
        root = self.settings.work_dir / job.region / job.name / f"attempt-{job.attempt}"
        return [HostLayout(f"algo-{i + 1}", root / f"algo-{i + 1}")
                for i in range(job.instance_count)]

    def _command(self, job: Job) -> tuple[list[str], bool]:
        """(argv of the container's PID 1, whether it is the image's own entry point).

        What runs is what a training image would run (``check_entry_point``): the image's
        entry point (``container.image_entry_point``: this project's init, or the DLC's bash
        for the stock DLC image) running the toolkit's ``train``, which runs train.sh; or the
        request's ContainerEntrypoint, whose program must be one the trainer image has; or
        the in-process backend's ``command`` (its owner's own choice, not a request's)."""
        spec = job.request.get("AlgorithmSpecification") or {}
        entry = spec.get("ContainerEntrypoint")
        args = [str(a) for a in spec.get("ContainerArguments") or []]
        if entry:
            return [str(a) for a in entry] + args, False
        if self.settings.command:
            return list(self.settings.command) + args, False
        image = container.image_entry_point(str(spec.get("TrainingImage") or ""),
                                            self.settings.repo_root)
        return image + args, True

    def _attempt(self, job: Job, max_runtime: float, max_wait: float) -> tuple[str, str]:
        """One start of the job on fresh instances: ('completed'|'failed'|...,  failure)."""
        reused = job.attempt == 0 and job.warm_pool is not None and job.warm_pool.reused_from
        # a warm pool's instances are provisioned already: no Starting latency
        if self._linger(job, 0.0 if reused else self.settings.latency.starting_s):
            return "stopped", ""
        self._transition(job, "Downloading")
        with self._lock:
            if job.training_start_time is None:
                job.training_start_time = job.last_modified_time
        started = time.monotonic()
        layouts = self._layouts(job)
        s3 = self.client("s3", job.region)
        checkpoint_uri = (job.request.get("CheckpointConfig") or {}).get("S3Uri", "")
        try:
            self._prepare_hosts(s3, job, layouts, checkpoint_uri)
            self._linger(job, self.settings.latency.downloading_s)
        except Exception as exc:
            job.billable_s += time.monotonic() - started
            return "failed", f"ClientError: Data download failed: {exc}"
        if job.stop_event.is_set():
            job.billable_s += time.monotonic() - started
            return "stopped", ""

        self._transition(job, "Training")
        command, image = self._command(job)
        missing = container.toolkit_missing() if image else ""
        if missing:
            job.billable_s += time.monotonic() - started
            return "failed", f"ClientError: cannot start the training image: {missing}"
        try:
            procs = self._start_hosts(job, layouts, command, image)
        except OSError as exc:
            job.billable_s += time.monotonic() - started
            return "failed", f"ClientError: cannot start {command[0]}: {exc}"
        job.hosts = procs
        oom_kills = processes.oom_kill_count()
        reason, failed_host = self._supervise(job, procs, checkpoint_uri, started, max_runtime,
                                              max_wait)
        processes.reap(procs)
        job.hosts = []
        if checkpoint_uri:
            self._sync_checkpoints(s3, layouts, checkpoint_uri, {})
        elapsed = time.monotonic() - started
        job.billable_s += elapsed
        job.training_s += elapsed
        if reason:
            return reason, ""
        if all(p.proc.returncode == 0 for p in procs):
            return "completed", ""
        return "failed", processes.failure_reason(
            procs, failed_host, oom_kills=processes.oom_kill_count() - oom_kills,
            model=processes.describe_model(job.request.get("HyperParameters") or {}))

    def _linger(self, job: Job, seconds: float) -> bool:
        """Stays in the current secondary status ``seconds`` (the latency profile), less if
        the job is stopped; returns whether it was."""
        return job.stop_event.wait(seconds) if seconds > 0 else job.stop_event.is_set()

    def _prepare_hosts(self, s3: Any, job: Job, layouts: list[HostLayout],
                       checkpoint_uri: str) -> None:
        """Lays out each host's /opt/ml tree, downloads the channels and the checkpoints."""
        hosts = [lay.host for lay in layouts]
        for lay in layouts:
            lay.create()
            lay.write_config(job.request, hosts)
            lay.write_hosts(hosts)
            lay.stage_code(self.settings.repo_root)
            for channel in job.request.get("InputDataConfig") or []:
                self._download_channel(s3, channel, lay)
            if checkpoint_uri:
                storage.download_prefix(s3, checkpoint_uri, lay.checkpoint_dir)

    def _start_hosts(self, job: Job, layouts: list[HostLayout], command: list[str],
                     image: bool) -> list[HostProcess]:
        self._ensure_log_group(job.region)
        epoch = max(int(time.time()), job.last_stream_epoch + 1)
        job.last_stream_epoch = epoch
        hosts = [lay.host for lay in layouts]
        master_port = free_port()
        base_env = self._base_env(job)
        commands, envs = [], []
        for lay in layouts:
            argv, namespaced = container.container_command(command, lay)
            # Outside a namespace, the DLC's bash gets the PID-1 treatment of SIGTERM by hand.
            ignore = not namespaced and command[:len(container.DLC_ENTRY_POINT)] == \
                container.DLC_ENTRY_POINT
            commands.append((argv, namespaced, ignore))
            if image:
                envs.append(container.platform_environment(
                    job.request, lay, master_port=master_port, num_gpus=self.num_gpus,
                    base_env=base_env, namespaced=namespaced))
            else:
                envs.append(lay.environment(
                    job.request, hosts, repo_root=self.settings.repo_root,
                    master_port=master_port, num_gpus=self.num_gpus, base_env=base_env))
        # The trainer image's WORKDIR is /opt/ml/code.
        return processes.start_hosts(job.name, commands, layouts, envs,
                                     self.client("logs", job.region), epoch,
                                     self.settings.log_flush_s, cwd="code" if image else "")

    def _supervise(self, job: Job, procs: list[HostProcess], checkpoint_uri: str,
                   started: float, max_runtime: float, max_wait: float) -> tuple[str, int]:
        """Waits for the hosts, acting on stop, interruption, limits and failed peers."""
        reason = ""
        failed_host = -1
        kill_at: float | None = None
        seen: dict[str, tuple[int, int]] = {}
        last_sync = time.monotonic()
        s3 = self.client("s3", job.region)
        layouts = [p.layout for p in procs]

        def terminate(why: str, grace: float) -> None:
            nonlocal reason, kill_at
            reason = why
            kill_at = time.monotonic() + grace
            for p in procs:
                p.terminate()

        while any(p.proc.poll() is None for p in procs):
            time.sleep(POLL_S)
            t = time.monotonic()
            if kill_at is None:
                if job.stop_event.is_set():
                    terminate("stopped", SHUTDOWN_GRACE_S if self._shutdown.is_set()
                              else self.settings.stop_grace_s)
                elif job.interrupt_event.is_set():
                    self._transition(job, "Interrupted")
                    terminate("interrupted", self.settings.stop_grace_s)
                elif job.training_s + (t - started) > max_runtime:
                    terminate("maxruntime", self.settings.stop_grace_s)
                elif max_wait and (now() - job.creation_time).total_seconds() > max_wait:
                    terminate("maxwait", self.settings.stop_grace_s)
                else:
                    for i, p in enumerate(procs):
                        if p.proc.returncode not in (None, 0):
                            failed_host = i
                            kill_at = t + FAILED_PEER_GRACE_S
                            for other in procs:
                                other.terminate()
                            break
            elif t >= kill_at:
                for p in procs:
                    p.signal(signal.SIGKILL)
            if t - last_sync >= CHECKPOINT_SYNC_S:
                for p in procs:
                    p.sample_memory()
                if checkpoint_uri:
                    self._sync_checkpoints(s3, layouts, checkpoint_uri, seen)
                last_sync = t
        job.interrupt_event.clear()
        if not reason and failed_host < 0:
            bad = [i for i, p in enumerate(procs) if p.proc.returncode != 0]
            failed_host = bad[0] if bad else -1
        return reason, failed_host

    def _sync_checkpoints(self, s3: Any, layouts: list[HostLayout], uri: str,
                          seen: dict[str, tuple[int, int]]) -> None:
        for lay in layouts:
            try:
                storage.upload_dir(s3, lay.checkpoint_dir, uri, seen)
            except Exception as exc:  # SageMaker keeps training when a sync fails
                print(f"local backend: checkpoint sync to {uri} failed: {exc}", file=sys.stderr)

    def _download_channel(self, s3: Any, channel: dict[str, Any], lay: HostLayout) -> None:
        name = channel["ChannelName"]
        source = (channel.get("DataSource") or {}).get("S3DataSource")
        if not source:
            raise ValueError(f"channel {name}: only S3DataSource channels are emulated locally")
        if source.get("S3DataType", "S3Prefix") != "S3Prefix":
            raise ValueError(f"channel {name}: S3DataType {source.get('S3DataType')} is not "
                             "emulated locally (use S3Prefix)")
        count = storage.download_prefix(s3, source["S3Uri"], lay.channel_dir(name))
        if count == 0:
            raise ValueError(f"channel {name}: no objects under {source['S3Uri']}")

    def _ensure_log_group(self, region: str) -> None:
        if region in self._log_groups:
            return
        ensure_log_group(self.client("logs", region))
        self._log_groups.add(region)

    def _base_env(self, job: Job) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AWS_", "SM_", "TRAINER_", "MASTER_"))}
        env.update(self.settings.endpoint_env)
        env["AWS_REGION"] = env["AWS_DEFAULT_REGION"] = job.region
        user_env = job.request.get("Environment") or {}
        if "OMP_NUM_THREADS" not in user_env and not self.num_gpus:
            # Each local "instance" gets its share of this machine's cores.
            share = max(1, (os.cpu_count() or 1) // max(1, job.instance_count))
            env["OMP_NUM_THREADS"] = str(share)
        return env

    def _kill(self, job: Job) -> None:
        for host in list(job.hosts):
            host.signal(signal.SIGKILL)




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
