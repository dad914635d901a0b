"""The records the executor keeps: training jobs and training plans, and how they read back.

``Job.describe()`` and ``Job.summary()`` build DescribeTrainingJob's and
ListTrainingJobs' answers from the request and the job's state;
``TrainingPlan.describe()`` builds DescribeTrainingPlan's.
"""

from __future__ import annotations

import copy
import datetime as dt
import functools
import math
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kfp_sagemaker_blackwell.local_backend import storage

if TYPE_CHECKING:
    from kfp_sagemaker_blackwell.local_backend.processes import HostProcess

ACCOUNT_ID = "123456789012"  # moto's default account: STS and every moto ARN agree
PLAN_STATUSES = ("Pending", "Active", "Scheduled", "Expired", "Failed")

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


# Computed here, never echoed from the request.
_STATE_MEMBERS = frozenset({
    "TrainingJobName", "TrainingJobArn", "ModelArtifacts", "TrainingJobStatus",
    "SecondaryStatus", "FailureReason", "CreationTime", "TrainingStartTime", "TrainingEndTime",
    "LastModifiedTime", "SecondaryStatusTransitions", "TrainingTimeInSeconds",
    "BillableTimeInSeconds", "ProfilingStatus", "WarmPoolStatus",
})


@functools.lru_cache(maxsize=1)
def describe_members() -> frozenset[str]:
    """Request members DescribeTrainingJob echoes: those of its output shape (botocore)."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    shape = model.operation_model("DescribeTrainingJob").output_shape
    assert shape is not None
    return frozenset(shape.members) - _STATE_MEMBERS


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
    upfront_fee: str = "0"  # what the plan was bought for (its offering's UpfrontFee)
    currency: str = "USD"

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
            "UpfrontFee": self.upfront_fee,
            "CurrencyCode": self.currency,
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


@dataclass
class WarmPool:
    """A job's warm pool (ResourceConfig.KeepAlivePeriodInSeconds): InUse while the job runs,
    Available for the keep-alive period after it, then Reused (by ``reused_by``) or
    Terminated; ``retained_s`` (SageMaker seconds, billed x InstanceCount) is known once
    it is Reused or Terminated, as botocore's model says."""

    status: str = "InUse"
    released_at: float = 0.0  # time.monotonic() when the job ended
    retained_s: float | None = None
    reused_by: str = ""
    reused_from: str = ""  # the job whose warm pool this job took over
    done: threading.Event = field(default_factory=threading.Event)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"Status": self.status}
        if self.retained_s is not None:
            out["ResourceRetainedBillableTimeInSeconds"] = int(math.ceil(self.retained_s))
        if self.reused_by:
            out["ReusedByJob"] = self.reused_by
        return out


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
    spot_savings: float = 0.0
    capacity_wait: bool = False  # Pending for quota (MaxPendingTimeInSeconds), none held
    warm_pool: WarmPool | None = None

    @property
    def instance_type(self) -> str:
        """What runs (and is billed): SelectedInstanceType with InstancePreferences."""
        rc = self.request.get("ResourceConfig", {})
        return str(rc.get("SelectedInstanceType") or rc.get("InstanceType") or "")

    @property
    def instance_count(self) -> int:
        rc = self.request.get("ResourceConfig", {})
        return int(rc.get("SelectedInstanceCount") or rc.get("InstanceCount", 1) or 1)

    @property
    def keep_alive_s(self) -> int:
        return int(self.request.get("ResourceConfig", {}).get("KeepAlivePeriodInSeconds") or 0)

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
        """DescribeTrainingJob's answer: the (normalised) request's members that SageMaker
        echoes, SageMaker's defaults where the request left a member out, and the state."""
        r = self.request
        out: dict[str, Any] = {k: copy.deepcopy(v) for k, v in r.items()
                               if k in describe_members() and v is not None}
        out.setdefault("HyperParameters", {})
        out["OutputDataConfig"].setdefault("KmsKeyId", "")
        if "ProfilerConfig" in r:
            out["ProfilingStatus"] = ("Disabled" if r["ProfilerConfig"].get("DisableProfiler")
                                      else "Enabled")
        out.update({
            "TrainingJobName": self.name,
            "TrainingJobArn": self.arn,
            "ModelArtifacts": {"S3ModelArtifacts": self.model_uri},
            "TrainingJobStatus": self.status,
            "SecondaryStatus": self.secondary_status,
            "CreationTime": self.creation_time,
            "LastModifiedTime": self.last_modified_time or self.creation_time,
            "SecondaryStatusTransitions": [dict(t) for t in self.transitions],
        })
        if self.failure_reason:
            out["FailureReason"] = self.failure_reason
        if self.warm_pool is not None:
            out["WarmPoolStatus"] = self.warm_pool.describe()
        if self.training_start_time:
            out["TrainingStartTime"] = self.training_start_time
        if self.training_end_time:
            out["TrainingEndTime"] = self.training_end_time
            out["TrainingTimeInSeconds"] = max(1, int(math.ceil(self.training_s)))
            out["BillableTimeInSeconds"] = self.billable_seconds()
        return out

    def billable_seconds(self) -> int:
        """BillableTimeInSeconds, PER INSTANCE as SageMaker reports it (botocore's model:
        multiply by InstanceCount for the bill). A managed spot job reports the on-demand
        equivalent of its spot price, so 1 - Billable/Training is the saving."""
        seconds = self.billable_s * ((1.0 - self.spot_savings) if self.spot else 1.0)
        return max(1, int(math.ceil(seconds)))

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
