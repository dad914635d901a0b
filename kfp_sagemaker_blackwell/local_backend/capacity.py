"""Capacity: per-instance-type quotas, the backend's concurrency, training plans' instances
and warm pools.

A job is admitted at Create when one of its instance types is within its quota
(``select``), or waits Pending for quota when it has MaxPendingTimeInSeconds; its
thread then ``acquire``s a run slot (``max_concurrent_jobs``) and its plan's instances,
and ``release``s them when it ends. Warm pools (KeepAlivePeriodInSeconds) stay
Available after a job for a matching job to take over.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from kfp_sagemaker_blackwell.common.training_job import TERMINAL_STATUSES
from kfp_sagemaker_blackwell.local_backend.api import ApiError
from kfp_sagemaker_blackwell.local_backend.jobs import Job, TrainingPlan, WarmPool
from kfp_sagemaker_blackwell.local_backend.state import ExecutorState
from kfp_sagemaker_blackwell.local_backend.validation import instance_types


class Stopped(Exception):
    """The job was stopped before its processes started."""


class PendingTimeout(Exception):
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


def instance_list(job: Job) -> str:
    """'2 x ml.p5.48xlarge, 1 x ...': the job's instance types, in preference order."""
    return ", ".join(f"{n} x {t}" for t, n in instance_types(job.request["ResourceConfig"]))


class Capacity:
    """Quotas (changeable while serving), run slots and warm pools, over the shared state."""

    def __init__(self, state: ExecutorState) -> None:
        self.state = state
        self.quotas: dict[str, int] = dict(state.settings.quotas)
        self.running = 0

    @property
    def _scale(self) -> float:
        return self.state.settings.capacity_time_scale

    def set_quotas(self, quotas: dict[str, int]) -> None:
        """Per-instance-type quotas (instances in use at once); replaces the current ones."""
        for itype, limit in quotas.items():
            if not isinstance(limit, int) or limit < 0:
                raise ValueError(f"quota for {itype}: {limit!r} is not a count >= 0")
        with self.state.lock:
            self.quotas = dict(quotas)

    def in_use(self, region: str, itype: str) -> int:
        return sum(j.instance_count for (r, _), j in self.state.jobs.items()
                   if r == region and j.status not in TERMINAL_STATUSES
                   and not j.capacity_wait and j.instance_type == itype)

    def select(self, region: str, req: dict[str, Any]) -> bool:
        """SageMaker's per-instance-type quota ("<type> for training job usage"): the first of
        the request's instance types (InstancePreferences, in order) within its quota is
        selected (ResourceConfig.SelectedInstanceType/Count); returns False when none is and
        the job may wait (MaxPendingTimeInSeconds), else raises ResourceLimitExceeded."""
        rc = req["ResourceConfig"]
        for itype, count in instance_types(rc):
            limit = self.quotas.get(itype)
            if limit is None or self.in_use(region, itype) + count <= limit:
                if rc.get("InstancePreferences"):
                    rc["SelectedInstanceType"], rc["SelectedInstanceCount"] = itype, count
                return True
        if (req.get("StoppingCondition") or {}).get("MaxPendingTimeInSeconds"):
            return False
        itype, count = instance_types(rc)[-1]
        limit, in_use = self.quotas[itype], self.in_use(region, itype)
        raise ApiError(
            "ResourceLimitExceeded",
            f"The account-level service limit '{itype} for training job usage' is {limit} "
            f"Instances, with current utilization of {in_use} Instances and a request delta "
            f"of {count} Instances. Please use AWS Service Quotas to request an increase "
            "for this quota. If AWS Service Quotas is not available, contact AWS support "
            "to request an increase for this quota.")

    # ---------------------------------------------------------------- run slots
    def acquire(self, job: Job, plan: TrainingPlan | None) -> None:
        """Waits (Pending while the plan is full) for quota, a run slot and the plan's
        instances; raises Stopped or PendingTimeout."""
        state = self.state
        with state.lock:
            pending_shown = False
            if job.capacity_wait:
                self._wait_for_quota(job)
            while True:
                if job.stop_event.is_set():
                    raise Stopped
                plan_ok = plan is None or plan.in_use + job.instance_count <= plan.instance_count
                if plan_ok and self.running < state.settings.max_concurrent_jobs:
                    self.running += 1
                    if plan is not None:
                        plan.in_use += job.instance_count
                    return
                if not plan_ok and not pending_shown:
                    state.transition(job, "Pending")
                    pending_shown = True
                state.capacity.wait(timeout=0.5)

    def release(self, job: Job, plan: TrainingPlan | None) -> None:
        with self.state.lock:
            self.running -= 1
            if plan is not None:
                plan.in_use -= job.instance_count
            self.state.capacity.notify_all()
        self._retain_warm_pool(job)

    def _wait_for_quota(self, job: Job) -> None:
        """Pending until one of the job's instance types is within its quota (then selected),
        for at most MaxPendingTimeInSeconds (scaled by ``capacity_time_scale``)."""
        state = self.state
        limit = int(job.request["StoppingCondition"]["MaxPendingTimeInSeconds"])
        deadline = time.monotonic() + limit * self._scale
        state.transition(job, "Pending", CAPACITY_MESSAGE.format(types=instance_list(job),
                                                                 limit=limit))
        while True:
            if job.stop_event.is_set():
                raise Stopped
            if self.select(job.region, job.request):
                job.capacity_wait = False
                self.reuse_warm_pool(job)
                state.transition(job, "Starting")
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise PendingTimeout
            state.capacity.wait(timeout=min(0.5, left))

    # ---------------------------------------------------------------- warm pools
    def reuse_warm_pool(self, job: Job) -> None:
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
        for other in self.state.jobs.values():
            pool = other.warm_pool
            if pool is not None and pool.status == "Available" and key(other) == key(job):
                pool.status, pool.reused_by = "Reused", job.name
                pool.retained_s = (time.monotonic() - pool.released_at) / self._scale
                pool.done.set()
                job.warm_pool.reused_from = other.name
                self.state.mirror.update(other)
                return

    def _retain_warm_pool(self, job: Job) -> None:
        """After the job, its instances stay Available for KeepAlivePeriodInSeconds (billed as
        ResourceRetainedBillableTimeInSeconds), unless a matching job reuses them first."""
        pool, state = job.warm_pool, self.state
        if pool is None or not job.keep_alive_s:
            return
        with state.lock:
            pool.status, pool.released_at = "Available", time.monotonic()
        state.mirror.update(job)

        def expire() -> None:
            if pool.done.wait(job.keep_alive_s * self._scale):
                return  # reused
            with state.lock:
                if pool.status == "Available":
                    pool.status, pool.retained_s = "Terminated", float(job.keep_alive_s)
            state.mirror.update(job)

        threading.Thread(target=expire, name=f"warm-pool-{job.name}", daemon=True).start()
