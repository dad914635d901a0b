"""Local SageMaker training jobs: the operations moto cannot serve faithfully.

moto's training jobs are "Completed" at creation and cannot be stopped. Here
``CreateTrainingJob`` really runs the training image's entry point from this
checkout (``bash <repo>/trainer/train.sh``, or the request's
``AlgorithmSpecification.ContainerEntrypoint``) as one process group per host,
under the container contract of ``components.local.container``, and goes
through SageMaker's life cycle::

    InProgress: Starting -> Downloading -> Training -> Uploading
    Completed | Failed (FailureReason from output/failure) | Stopping -> Stopped
    spot:       Training -> Interrupted -> Restarting -> Starting -> Downloading -> Training ...

Output goes to CloudWatch Logs (``/aws/sagemaker/TrainingJobs``, one stream
``{job}/algo-{n}-{epoch}`` per host and start, written in batches), the model
directory to ``{S3OutputPath}/{job}/output/model.tar.gz`` and the output data to
``output.tar.gz``; the checkpoint directory is restored from and synced to
``CheckpointConfig.S3Uri``. S3 and CloudWatch are reached through the backend's
own endpoint (moto), exactly as a container would. Each job is mirrored into
moto's training-job table so moto's AddTags/ListTags/DeleteTags/Search see it.

What is not emulated: the training image itself (the checkout's trainer runs
with this Python), VPC and network isolation, instance types (everything runs
on this machine), FastFile/Pipe input modes (channels are always downloaded),
RetryStrategy (nothing here fails with InternalServerError), warm pools.
"""

from __future__ import annotations

import collections
import datetime as dt
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.local import storage
from components.local.api import ApiError, not_found, validation
from components.local.container import HostLayout, free_port, local_gpu_count

if TYPE_CHECKING:
    from components.local.backend import LocalBackend

ACCOUNT_ID = "123456789012"  # moto's default account: STS and every moto ARN agree
LOG_GROUP = "/aws/sagemaker/TrainingJobs"
NAME_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
TERMINAL = frozenset({"Completed", "Failed", "Stopped"})
PLAN_STATUSES = ("Pending", "Active", "Scheduled", "Expired", "Failed")
MAX_FAILURE_REASON = 1024
MAX_EVENT_BYTES = 256 * 1024 - 26
MAX_BATCH_BYTES = 1_048_576
MAX_BATCH_EVENTS = 10_000
POLL_S = 0.1
CHECKPOINT_SYNC_S = 1.0
FAILED_PEER_GRACE_S = 10.0  # when one host fails, the others get this long after SIGTERM

MESSAGES = {
    "Starting": "Preparing the instances for training",
    "Pending": "Waiting for capacity in the training plan",
    "Downloading": "Downloading input data",
    "Training": "Training image download completed. Training in progress.",
    "Uploading": "Uploading generated training model",
    "Completed": "Training job completed",
    "Failed": "Training job failed",
    "Stopping": "Stopping the training job",
    "Stopped": "Training job stopped",
    "Interrupted": "The training job was interrupted because Spot capacity was reclaimed",
    "Restarting": "Restarting the training job after a Spot interruption",
    "MaxRuntimeExceeded": "Training job exceeded MaxRuntimeInSeconds provided",
    "MaxWaitTimeExceeded": "Training job exceeded MaxWaitTimeInSeconds provided",
}


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def training_job_arn(region: str, name: str) -> str:
    return f"arn:aws:sagemaker:{region}:{ACCOUNT_ID}:training-job/{name}"


def training_plan_arn(region: str, name: str) -> str:
    return f"arn:aws:sagemaker:{region}:{ACCOUNT_ID}:training-plan/{name}"


# ---------------------------------------------------------------- training plans
@dataclass
class TrainingPlan:
    name: str
    arn: str
    region: str
    status: str
    instance_type: str
    instance_count: int
    start_time: dt.datetime
    end_time: dt.datetime
    in_use: int = 0

    def describe(self) -> dict[str, Any]:
        hours = (self.end_time - self.start_time).total_seconds() / 3600
        return {
            "TrainingPlanArn": self.arn,
            "TrainingPlanName": self.name,
            "Status": self.status,
            "StatusMessage": f"Training plan is {self.status} (registered with the local backend)",
            "DurationHours": int(hours),
            "DurationMinutes": int(round((hours - int(hours)) * 60)),
            "StartTime": self.start_time,
            "EndTime": self.end_time,
            "UpfrontFee": "0",
            "CurrencyCode": "USD",
            "TotalInstanceCount": self.instance_count,
            "AvailableInstanceCount": max(0, self.instance_count - self.in_use),
            "InUseInstanceCount": self.in_use,
            "TargetResources": ["training-job"],
            "ReservedCapacitySummaries": [{
                "ReservedCapacityArn": f"{self.arn}/reserved-capacity/1",
                "InstanceType": self.instance_type,
                "TotalInstanceCount": self.instance_count,
                "Status": self.status,
                "StartTime": self.start_time,
                "EndTime": self.end_time,
            }],
        }


# ---------------------------------------------------------------- CloudWatch output
class LogShipper:
    """Buffers one host's output lines and writes them to its stream in batches."""

    def __init__(self, logs: Any, stream: str, flush_s: float) -> None:
        self.logs = logs
        self.stream = stream
        self.flush_s = flush_s
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
        self._thread = threading.Thread(target=self._loop, name=f"logs-{stream}", daemon=True)
        self._thread.start()

    def add(self, line: str) -> None:
        if not line.strip():
            return  # CloudWatch rejects empty messages
        data = line.encode("utf-8")
        if len(data) > MAX_EVENT_BYTES:
            line = data[:MAX_EVENT_BYTES].decode("utf-8", "ignore")
        with self._lock:
            self._events.append({"timestamp": int(time.time() * 1000), "message": line})

    def _loop(self) -> None:
        while not self._closed.wait(self.flush_s):
            self.flush()
        self.flush()

    def flush(self) -> None:
        with self._lock:
            events, self._events = self._events, []
        batch: list[dict[str, Any]] = []
        size = 0
        for event in events:
            n = len(event["message"].encode("utf-8")) + 26
            if batch and (len(batch) >= MAX_BATCH_EVENTS or size + n > MAX_BATCH_BYTES):
                self._put(batch)
                batch, size = [], 0
            batch.append(event)
            size += n
        if batch:
            self._put(batch)

    def _put(self, batch: list[dict[str, Any]]) -> None:
        try:
            self.logs.put_log_events(
                logGroupName=LOG_GROUP, logStreamName=self.stream, logEvents=batch
            )
        except Exception as exc:  # losing log lines must not kill the job
            print(f"local backend: could not write logs to {self.stream}: {exc}", file=sys.stderr)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=30)


@dataclass
class HostProcess:
    layout: HostLayout
    proc: subprocess.Popen[bytes]
    shipper: LogShipper
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=30))
    reader: threading.Thread | None = None

    def signal(self, sig: int) -> None:
        """Signals the whole process group (the SIGKILL that ends an instance)."""
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def terminate(self) -> None:
        """SIGTERM to the entry point only, as ``docker stop`` signals a container's PID 1;
        the entry point forwards it (train.sh asks its workers to checkpoint and stop)."""
        try:
            self.proc.send_signal(signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass

    def read_output(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.tail.append(line)
            self.shipper.add(line)


# ---------------------------------------------------------------- jobs
@dataclass
class Job:
    name: str
    arn: str
    region: str
    request: dict[str, Any]
    creation_time: dt.datetime
    status: str = "InProgress"
    secondary_status: str = "Starting"
    failure_reason: str = ""
    transitions: list[dict[str, Any]] = field(default_factory=list)
    last_modified_time: dt.datetime | None = None
    training_start_time: dt.datetime | None = None
    training_end_time: dt.datetime | None = None
    billable_s: float = 0.0
    training_s: float = 0.0
    attempt: int = 0
    last_stream_epoch: int = 0
    stop_event: threading.Event = field(default_factory=threading.Event)
    interrupt_event: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    hosts: list[HostProcess] = field(default_factory=list)

    @property
    def instance_count(self) -> int:
        return int(self.request.get("ResourceConfig", {}).get("InstanceCount", 1) or 1)

    @property
    def plan_arn(self) -> str:
        return str(self.request.get("ResourceConfig", {}).get("TrainingPlanArn") or "")

    @property
    def spot(self) -> bool:
        return bool(self.request.get("EnableManagedSpotTraining"))

    @property
    def model_uri(self) -> str:
        out = self.request["OutputDataConfig"]["S3OutputPath"]
        return storage.join_s3(out, self.name, "output", "model.tar.gz")

    @property
    def output_uri(self) -> str:
        out = self.request["OutputDataConfig"]["S3OutputPath"]
        return storage.join_s3(out, self.name, "output", "output.tar.gz")

    def describe(self) -> dict[str, Any]:
        r = self.request
        out: dict[str, Any] = {
            "TrainingJobName": self.name,
            "TrainingJobArn": self.arn,
            "ModelArtifacts": {"S3ModelArtifacts": self.model_uri},
            "TrainingJobStatus": self.status,
            "SecondaryStatus": self.secondary_status,
            "HyperParameters": r.get("HyperParameters") or {},
            "AlgorithmSpecification": r.get("AlgorithmSpecification") or {},
            "RoleArn": r.get("RoleArn"),
            "OutputDataConfig": r.get("OutputDataConfig"),
            "ResourceConfig": r.get("ResourceConfig") or {},
            "StoppingCondition": r.get("StoppingCondition") or {},
            "CreationTime": self.creation_time,
            "LastModifiedTime": self.last_modified_time or self.creation_time,
            "SecondaryStatusTransitions": [dict(t) for t in self.transitions],
            "EnableNetworkIsolation": bool(r.get("EnableNetworkIsolation")),
            "EnableInterContainerTrafficEncryption":
                bool(r.get("EnableInterContainerTrafficEncryption")),
            "EnableManagedSpotTraining": self.spot,
        }
        for key in ("InputDataConfig", "VpcConfig", "CheckpointConfig", "Environment",
                    "RetryStrategy", "ExperimentConfig", "TensorBoardOutputConfig"):
            if r.get(key):
                out[key] = r[key]
        if self.failure_reason:
            out["FailureReason"] = self.failure_reason
        if self.training_start_time:
            out["TrainingStartTime"] = self.training_start_time
        if self.training_end_time:
            out["TrainingEndTime"] = self.training_end_time
            out["TrainingTimeInSeconds"] = max(1, int(math.ceil(self.training_s)))
            out["BillableTimeInSeconds"] = (
                max(1, int(math.ceil(self.billable_s))) * self.instance_count
            )
        return out

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "TrainingJobName": self.name,
            "TrainingJobArn": self.arn,
            "CreationTime": self.creation_time,
            "LastModifiedTime": self.last_modified_time or self.creation_time,
            "TrainingJobStatus": self.status,
            "SecondaryStatus": self.secondary_status,
        }
        if self.training_end_time:
            out["TrainingEndTime"] = self.training_end_time
        if self.plan_arn:
            out["TrainingPlanArn"] = self.plan_arn
        return out


class _Stopped(Exception):
    """The job was stopped before its processes started."""


class TrainingJobExecutor:
    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self._lock = threading.RLock()
        self._capacity = threading.Condition(self._lock)
        self._jobs: dict[tuple[str, str], Job] = {}
        self._plans: dict[str, TrainingPlan] = {}
        self._running = 0
        self._log_groups: set[str] = set()
        self._shutdown = threading.Event()
        self.num_gpus = local_gpu_count()

    # ---------------------------------------------------------------- plumbing
    def client(self, service: str, region: str) -> Any:
        return self.backend.client(service, region)

    def handle(self, operation: str, region: str, request: dict[str, Any]) -> dict[str, Any]:
        handler = {
            "CreateTrainingJob": self.create_training_job,
            "DescribeTrainingJob": self.describe_training_job,
            "StopTrainingJob": self.stop_training_job,
            "ListTrainingJobs": self.list_training_jobs,
            "DeleteTrainingJob": self.delete_training_job,
            "DescribeTrainingPlan": self.describe_training_plan,
            "ListTrainingPlans": self.list_training_plans,
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
        validate_create_request(req)
        name = req["TrainingJobName"]
        with self._lock:
            existing = self._jobs.get((region, name))
            if existing is not None:
                raise ApiError(
                    "ResourceInUse",
                    f"Training job names must be unique within an AWS account and region, and "
                    f"a training job with this name already exists ({existing.arn})",
                )
            plan = self._check_plan(region, req)
            job = Job(name, training_job_arn(region, name), region, req, now())
            job.last_modified_time = job.creation_time
            self._transition(job, "Starting")
            self._jobs[(region, name)] = job
            self._standin_create(job)
            job.thread = threading.Thread(
                target=self._run, args=(job, plan), name=f"job-{name}", daemon=True
            )
            job.thread.start()
        return {"TrainingJobArn": job.arn}

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
            if job.status not in TERMINAL:
                raise validation(
                    f"Training job {job.name} is in status {job.status}; only a Completed, "
                    "Failed or Stopped training job can be deleted."
                )
            del self._jobs[(region, job.name)]
        with self.backend.moto_lock:
            self._moto_jobs(region).pop(job.name, None)
        return {}

    def list_training_jobs(self, region: str, req: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            jobs = [j for (r, _), j in self._jobs.items() if r == region]
            summaries = [j.summary() for j in jobs if _matches(j, req)]
        sort_by = req.get("SortBy", "CreationTime")
        key = {"Name": "TrainingJobName", "Status": "TrainingJobStatus"}.get(sort_by, sort_by)
        summaries.sort(key=lambda s: (s[key], s["TrainingJobName"]),
                       reverse=req.get("SortOrder", "Descending") == "Descending")
        return _page(summaries, req, "TrainingJobSummaries", default_max=10)

    def describe_training_plan(self, region: str, req: dict[str, Any]) -> dict[str, Any]:
        name = str(req.get("TrainingPlanName") or "")
        with self._lock:
            plan = self._find_plan(region, name)
            if plan is None:
                raise ApiError("ResourceNotFound", f"Training plan {name} does not exist.")
            return plan.describe()

    def list_training_plans(self, region: str, req: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            plans = [p.describe() for p in self._plans.values() if p.region == region]
        plans.sort(key=lambda p: p["StartTime"],
                   reverse=req.get("SortOrder", "Ascending") == "Descending")
        return _page(plans, req, "TrainingPlanSummaries", default_max=100)

    # ---------------------------------------------------------------- local controls
    def register_training_plan(
        self,
        name: str,
        *,
        instance_type: str = "ml.p6-b200.48xlarge",
        instance_count: int = 1,
        status: str = "Active",
        region: str | None = None,
        duration_hours: float = 24.0,
        start_time: dt.datetime | None = None,
        end_time: dt.datetime | None = None,
    ) -> str:
        if status not in PLAN_STATUSES:
            raise ValueError(f"status={status!r}: choose one of {', '.join(PLAN_STATUSES)}")
        if not NAME_RE.match(name):
            raise ValueError(f"name={name!r}: must match {NAME_RE.pattern}")
        if instance_count < 1:
            raise ValueError("instance_count must be >= 1")
        region = region or self.backend.region
        start = start_time or now()
        end = end_time or start + dt.timedelta(hours=duration_hours)
        arn = training_plan_arn(region, name)
        with self._lock:
            in_use = self._plans[arn].in_use if arn in self._plans else 0
            self._plans[arn] = TrainingPlan(name, arn, region, status, instance_type,
                                            instance_count, start, end, in_use)
            self._capacity.notify_all()
        return arn

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
        self._standin_update(job)

    def _finish(self, job: Job, status: str, secondary: str, failure: str = "") -> None:
        with self._lock:
            job.status = status
            if failure:
                job.failure_reason = failure[:MAX_FAILURE_REASON]
            self._transition(job, secondary)
            job.transitions[-1]["EndTime"] = job.transitions[-1]["StartTime"]
            job.training_end_time = job.last_modified_time
            if job.training_start_time is None:
                job.training_start_time = job.training_end_time
        self._standin_update(job)

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

    # moto's table: stand-ins so moto's tag and search APIs see local jobs
    def _moto_jobs(self, region: str) -> dict[str, Any]:
        from moto.sagemaker.models import sagemaker_backends

        return sagemaker_backends[ACCOUNT_ID][region].training_jobs  # type: ignore[no-any-return]

    def _standin_create(self, job: Job) -> None:
        from moto.sagemaker.models import FakeTrainingJob

        r = job.request
        with self.backend.moto_lock:
            standin = FakeTrainingJob(
                account_id=ACCOUNT_ID, region_name=job.region, training_job_name=job.name,
                hyper_parameters=dict(r.get("HyperParameters") or {}),
                algorithm_specification=dict(r.get("AlgorithmSpecification") or {}),
                role_arn=r.get("RoleArn", ""), input_data_config=r.get("InputDataConfig") or [],
                output_data_config=dict(r["OutputDataConfig"]),
                resource_config=dict(r.get("ResourceConfig") or {}),
                vpc_config=r.get("VpcConfig") or {},
                stopping_condition=dict(r.get("StoppingCondition") or {}),
                tags=[dict(t) for t in r.get("Tags") or []],
                enable_network_isolation=bool(r.get("EnableNetworkIsolation")),
                enable_inter_container_traffic_encryption=False,
                enable_managed_spot_training=job.spot,
                checkpoint_config=r.get("CheckpointConfig") or {},
                debug_hook_config={}, debug_rule_configurations=[],
                tensor_board_output_config={}, experiment_config={},
            )
            standin.arn = job.arn
            standin.creation_time = job.creation_time
            self._moto_jobs(job.region)[job.name] = standin
        self._standin_update(job)

    def _standin_update(self, job: Job) -> None:
        with self.backend.moto_lock:
            standin = self._moto_jobs(job.region).get(job.name)
            if standin is None:
                return
            standin.training_job_status = job.status
            standin.secondary_status = job.secondary_status
            standin.last_modified_time = job.last_modified_time
            standin.training_start_time = job.training_start_time
            standin.training_end_time = job.training_end_time
            standin.secondary_status_transitions = [dict(t) for t in job.transitions]

    # ---------------------------------------------------------------- the job's life
    def _run(self, job: Job, plan: TrainingPlan | None) -> None:
        try:
            self._wait_for_capacity(job, plan)
        except _Stopped:
            self._finish(job, "Stopped", "Stopped")
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

    def _wait_for_capacity(self, job: Job, plan: TrainingPlan | None) -> None:
        with self._lock:
            pending_shown = False
            while True:
                if job.stop_event.is_set():
                    raise _Stopped
                plan_ok = plan is None or plan.in_use + job.instance_count <= plan.instance_count
                if plan_ok and self._running < self.backend.max_concurrent_jobs:
                    self._running += 1
                    if plan is not None:
                        plan.in_use += job.instance_count
                    return
                if not plan_ok and not pending_shown:
                    self._transition(job, "Pending")
                    pending_shown = True
                self._capacity.wait(timeout=0.5)

    def _life_cycle(self, job: Job) -> None:
        sc = job.request.get("StoppingCondition") or {}
        max_runtime = float(sc.get("MaxRuntimeInSeconds") or 86400)
        max_wait = float(sc.get("MaxWaitTimeInSeconds") or 0) if job.spot else 0.0
        while True:
            outcome, failure = self._attempt(job, max_runtime, max_wait)
            if outcome != "interrupted":
                break
            self._transition(job, "Restarting")
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
        root = Path(self.backend.work_dir) / job.region / job.name / f"attempt-{job.attempt}"
        return [HostLayout(f"algo-{i + 1}", root / f"algo-{i + 1}")
                for i in range(job.instance_count)]

    def _command(self, job: Job) -> list[str]:
        spec = job.request.get("AlgorithmSpecification") or {}
        entry = spec.get("ContainerEntrypoint")
        if entry:
            return [str(a) for a in entry] + [str(a) for a in spec.get("ContainerArguments") or []]
        args = [str(a) for a in spec.get("ContainerArguments") or []]
        if self.backend.command:
            return list(self.backend.command) + args
        return ["bash", str(self.backend.repo_root / "trainer" / "train.sh")] + args

    def _attempt(self, job: Job, max_runtime: float, max_wait: float) -> tuple[str, str]:
        """One start of the job on fresh instances: ('completed'|'failed'|...,  failure)."""
        self._transition(job, "Downloading")
        with self._lock:
            if job.training_start_time is None:
                job.training_start_time = job.last_modified_time
        started = time.monotonic()
        layouts = self._layouts(job)
        hosts = [lay.host for lay in layouts]
        s3 = self.client("s3", job.region)
        checkpoint_uri = (job.request.get("CheckpointConfig") or {}).get("S3Uri", "")
        try:
            for lay in layouts:
                lay.create()
                lay.write_config(job.request, hosts)
                for channel in job.request.get("InputDataConfig") or []:
                    self._download_channel(s3, channel, lay)
                if checkpoint_uri:
                    storage.download_prefix(s3, checkpoint_uri, lay.checkpoint_dir)
        except Exception as exc:
            job.billable_s += time.monotonic() - started
            return "failed", f"ClientError: Data download failed: {exc}"
        if job.stop_event.is_set():
            job.billable_s += time.monotonic() - started
            return "stopped", ""

        self._transition(job, "Training")
        self._ensure_log_group(job.region)
        logs = self.client("logs", job.region)
        epoch = max(int(time.time()), job.last_stream_epoch + 1)
        job.last_stream_epoch = epoch
        master_port = free_port()
        base_env = self._base_env(job)
        command = self._command(job)
        procs: list[HostProcess] = []
        for lay in layouts:
            env = lay.environment(job.request, hosts, repo_root=self.backend.repo_root,
                                  master_port=master_port, num_gpus=self.num_gpus,
                                  base_env=base_env)
            shipper = LogShipper(logs, f"{job.name}/{lay.host}-{epoch}", self.backend.log_flush_s)
            try:
                proc = subprocess.Popen(
                    command, cwd=str(lay.root), env=env, stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                )
            except OSError as exc:
                shipper.close()
                for p in procs:
                    p.signal(signal.SIGKILL)
                job.billable_s += time.monotonic() - started
                return "failed", f"ClientError: cannot start {command[0]}: {exc}"
            host = HostProcess(lay, proc, shipper)
            host.reader = threading.Thread(target=host.read_output, daemon=True,
                                           name=f"out-{job.name}-{lay.host}")
            host.reader.start()
            procs.append(host)
        job.hosts = procs
        reason, failed_host = self._supervise(job, procs, checkpoint_uri, started, max_runtime,
                                              max_wait)
        for p in procs:
            p.signal(signal.SIGKILL)  # strays of the group (a trainer's children)
            if p.reader is not None:
                p.reader.join(timeout=10)
            p.shipper.close()
        job.hosts = []
        if checkpoint_uri:
            self._sync_checkpoints(s3, layouts, checkpoint_uri, {})
        elapsed = time.monotonic() - started
        job.billable_s += elapsed
        job.training_s += elapsed
        if reason:
            return reason, ""
        codes = [p.proc.returncode for p in procs]
        if all(c == 0 for c in codes):
            return "completed", ""
        return "failed", self._failure_reason(procs, failed_host)

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
                    terminate("stopped", 5.0 if self._shutdown.is_set()
                              else self.backend.stop_grace_s)
                elif job.interrupt_event.is_set():
                    self._transition(job, "Interrupted")
                    terminate("interrupted", self.backend.stop_grace_s)
                elif job.training_s + (t - started) > max_runtime:
                    terminate("maxruntime", self.backend.stop_grace_s)
                elif max_wait and (now() - job.creation_time).total_seconds() > max_wait:
                    terminate("maxwait", self.backend.stop_grace_s)
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
            if checkpoint_uri and t - last_sync >= CHECKPOINT_SYNC_S:
                self._sync_checkpoints(s3, layouts, checkpoint_uri, seen)
                last_sync = t
        job.interrupt_event.clear()
        if not reason and failed_host < 0:
            bad = [i for i, p in enumerate(procs) if p.proc.returncode != 0]
            failed_host = bad[0] if bad else -1
        return reason, failed_host

    def _failure_reason(self, procs: list[HostProcess], failed_host: int) -> str:
        order = ([procs[failed_host]] if failed_host >= 0 else []) + procs
        for p in order:
            text = p.layout.failure_reason()
            if text:
                return text[:MAX_FAILURE_REASON]
        p = order[0]
        tail = "\n".join(line for line in p.tail if line.strip())[-700:]
        return (f"AlgorithmError: the training process on {p.layout.host} exited with code "
                f"{p.proc.returncode} and wrote no {p.layout.failure_file.name} file. "
                f"Last output:\n{tail}")[:MAX_FAILURE_REASON]

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
        logs = self.client("logs", region)
        try:
            logs.create_log_group(logGroupName=LOG_GROUP)
        except logs.exceptions.ResourceAlreadyExistsException:
            pass
        self._log_groups.add(region)

    def _base_env(self, job: Job) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AWS_", "SM_", "TRAINER_", "MASTER_"))}
        env.update(self.backend.env())
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


# ---------------------------------------------------------------- request checks
def validate_create_request(req: dict[str, Any]) -> None:
    """What SageMaker itself refuses (botocore only checks types, lengths and required)."""
    name = req.get("TrainingJobName") or ""
    if not NAME_RE.match(name):
        raise validation(
            f"1 validation error detected: Value '{name}' at 'trainingJobName' failed to "
            f"satisfy constraint: Member must satisfy regular expression pattern: "
            f"{NAME_RE.pattern[1:-1]}"
        )
    for key in ("AlgorithmSpecification", "ResourceConfig", "StoppingCondition"):
        if not req.get(key):
            raise validation(f"{key} is required.")
    if not (req.get("OutputDataConfig") or {}).get("S3OutputPath"):
        raise validation("OutputDataConfig.S3OutputPath is required.")
    for key, uri in (("OutputDataConfig.S3OutputPath", req["OutputDataConfig"]["S3OutputPath"]),
                     ("CheckpointConfig.S3Uri", (req.get("CheckpointConfig") or {}).get("S3Uri"))):
        if uri is not None:
            try:
                storage.split_s3_uri(uri)
            except ValueError as exc:
                raise validation(f"{key}: {exc}") from None
    spec = req["AlgorithmSpecification"]
    if not spec.get("TrainingImage") and not spec.get("AlgorithmName"):
        raise validation("AlgorithmSpecification needs a TrainingImage or an AlgorithmName.")
    if len(req.get("HyperParameters") or {}) > 100:
        raise validation("HyperParameters: at most 100 entries.")
    if len(req.get("Environment") or {}) > 100:
        raise validation("Environment: at most 100 entries.")
    if len(req.get("Tags") or []) > 50:
        raise validation("Tags: at most 50 tags.")
    count = req["ResourceConfig"].get("InstanceCount", 1)
    if not isinstance(count, int) or count < 1:
        raise validation("ResourceConfig.InstanceCount must be at least 1.")
    sc = req["StoppingCondition"]
    wait = sc.get("MaxWaitTimeInSeconds")
    if req.get("EnableManagedSpotTraining"):
        if wait is None:
            raise validation("MaxWaitTimeInSeconds is required for managed spot training.")
        if wait < sc.get("MaxRuntimeInSeconds", 86400):
            raise validation("MaxWaitTimeInSeconds must be greater than or equal to "
                             "MaxRuntimeInSeconds.")
    elif wait is not None:
        raise validation("MaxWaitTimeInSeconds is only valid with EnableManagedSpotTraining.")


def _matches(job: Job, req: dict[str, Any]) -> bool:
    if req.get("NameContains") and req["NameContains"].lower() not in job.name.lower():
        return False
    if req.get("StatusEquals") and job.status != req["StatusEquals"]:
        return False
    if req.get("TrainingPlanArnEquals") and job.plan_arn != req["TrainingPlanArnEquals"]:
        return False
    created = job.creation_time.timestamp()
    modified = (job.last_modified_time or job.creation_time).timestamp()
    for key, value, after in (("CreationTimeAfter", created, True),
                              ("CreationTimeBefore", created, False),
                              ("LastModifiedTimeAfter", modified, True),
                              ("LastModifiedTimeBefore", modified, False)):
        if key in req:
            bound = float(req[key])
            if (after and not value > bound) or (not after and not value < bound):
                return False
    return True


def _page(items: list[dict[str, Any]], req: dict[str, Any], key: str,
          default_max: int) -> dict[str, Any]:
    try:
        start = int(req.get("NextToken") or 0)
    except ValueError:
        raise validation("Invalid NextToken.") from None
    size = int(req.get("MaxResults") or default_max)
    out: dict[str, Any] = {key: items[start:start + size]}
    if start + size < len(items):
        out["NextToken"] = str(start + size)
    return out
