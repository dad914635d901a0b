"""What the training-job executor is given: its settings and a way to make AWS clients.

The executor never sees the ``LocalBackend`` object: the backend builds an
``ExecutorSettings`` and a ``ClientFactory`` (boto3 clients pointed at its own
endpoint) and hands both over, so the dependency runs one way, backend -> executor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# (service, region) -> a boto3 client talking to the local backend.
ClientFactory = Callable[[str, str], Any]


@dataclass(frozen=True)
class LatencyProfile:
    """Seconds each secondary status lasts at least, beyond the work done in it.

    SageMaker takes minutes to provision instances and to restart a spot job;
    ``short`` (the default) keeps every transition observable (non-zero, ordered
    timestamps) at well under a second per job; ``realistic`` is of SageMaker's
    order of magnitude, for tests of polling, waiting and log-tailing code.
    """

    starting_s: float = 0.0
    downloading_s: float = 0.0
    uploading_s: float = 0.0
    restarting_s: float = 0.0  # Interrupted -> Restarting -> Starting, each this long

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


LATENCY_PROFILES: dict[str, LatencyProfile] = {
    "none": LatencyProfile(),
    # a spot restart longer than one second gives its new log streams a later epoch
    "short": LatencyProfile(starting_s=0.1, downloading_s=0.05, uploading_s=0.05,
                            restarting_s=0.6),
    "realistic": LatencyProfile(starting_s=90.0, downloading_s=30.0, uploading_s=15.0,
                                restarting_s=60.0),
}
DEFAULT_LATENCY = "short"


@dataclass(frozen=True)
class OfferingTemplate:
    """Capacity SearchTrainingPlanOfferings can offer: up to ``max_instance_count`` instances
    of ``instance_type``, starting ``lead_time_hours`` after the requested start, for
    ``upfront_fee_per_instance_hour`` (USD; the local backend charges nothing, so 0 unless set)."""

    instance_type: str
    max_instance_count: int = 4
    availability_zone: str = "a"  # appended to the region
    lead_time_hours: float = 0.0
    upfront_fee_per_instance_hour: float = 0.0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OfferingTemplate:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"training-plan offering: unknown keys {sorted(unknown)}; "
                             f"known: {sorted(known)}")
        return cls(**data)


DEFAULT_OFFERINGS = (
    OfferingTemplate("ml.p6-b200.48xlarge", max_instance_count=4),
    OfferingTemplate("ml.p5.48xlarge", max_instance_count=4),
)

# SageMaker bills a managed spot job's BillableTimeInSeconds so that
# 1 - Billable/Training is the saving it reports; 0.7 is a typical saving.
DEFAULT_SPOT_SAVINGS = 0.7


@dataclass(frozen=True)
class ExecutorSettings:
    """How local training jobs run (see ``LocalBackend`` for each setting's meaning).

    ``endpoint_env`` is the environment that points a job's boto3 at the backend
    (``AWS_ENDPOINT_URL``, the backend's credentials, region).
    """

    region: str
    repo_root: Path
    work_dir: Path
    endpoint_env: dict[str, str]
    max_concurrent_jobs: int = 2
    stop_grace_s: float = 120.0
    log_flush_s: float = 0.5
    command: list[str] | None = field(default=None)
    latency: LatencyProfile = LATENCY_PROFILES[DEFAULT_LATENCY]
    spot_savings: float = DEFAULT_SPOT_SAVINGS
    strict_resources: bool = False
    quotas: dict[str, int] = field(default_factory=dict)
    offerings: tuple[OfferingTemplate, ...] = DEFAULT_OFFERINGS
    # Local seconds per SageMaker second for MaxPendingTimeInSeconds and the warm pool's
    # KeepAlivePeriodInSeconds (their minimums are 1,800 s and 1 s; tests scale them down).
    capacity_time_scale: float = 1.0
