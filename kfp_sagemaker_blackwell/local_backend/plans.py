"""Training plans (reserved capacity): the plans API and the offerings it sells.

``PlansApi`` answers DescribeTrainingPlan, ListTrainingPlans, SearchTrainingPlanOfferings
and CreateTrainingPlan, registers plans (the backend's ``register_training_plan``) and
checks the plan a CreateTrainingJob names (``check_job_plan``).

The offerings come from ``OfferingTemplate``s (the backend's ``offerings``
setting, changeable while serving): each offers up to ``max_instance_count``
instances of one type for the requested duration, starting at the requested
start (or now) plus the template's lead time. The upfront fee is the template's
per-instance-hour fee times instances times hours (0 unless configured: the
local backend charges nothing).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Sequence
from typing import Any

from kfp_sagemaker_blackwell.catalog.hardware import DEFAULT_INSTANCE_TYPE
from kfp_sagemaker_blackwell.common.naming import SAGEMAKER_NAME_RE
from kfp_sagemaker_blackwell.local_backend.api import ApiError, validation
from kfp_sagemaker_blackwell.local_backend.jobs import (
    PLAN_STATUSES,
    TrainingPlan,
    now,
    training_plan_arn,
)
from kfp_sagemaker_blackwell.local_backend.settings import OfferingTemplate
from kfp_sagemaker_blackwell.local_backend.state import ExecutorState
from kfp_sagemaker_blackwell.local_backend.validation import page, validate_list_request

TARGET = "training-job"


def _as_time(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value
    return dt.datetime.fromtimestamp(float(value), dt.timezone.utc)


def search(templates: Sequence[OfferingTemplate], req: dict[str, Any],
           region: str) -> list[dict[str, Any]]:
    """SearchTrainingPlanOfferings' ``TrainingPlanOfferings`` for ``req``."""
    targets = req.get("TargetResources") or []
    if targets != [TARGET]:
        raise validation(f"TargetResources {targets}: the local backend offers training plans "
                         f"for [{TARGET!r}] only.")
    hours = req.get("DurationHours")
    if not isinstance(hours, int) or hours < 1:
        raise validation("DurationHours is required: the length of the reservation in hours "
                         "(at least 1).")
    count = int(req.get("InstanceCount") or 1)
    after = max(_as_time(req.get("StartTimeAfter")) or now(), now())
    before = _as_time(req.get("EndTimeBefore"))
    out = []
    for t in templates:
        if req.get("InstanceType") and req["InstanceType"] != t.instance_type:
            continue
        if count > t.max_instance_count:
            continue
        start = after + dt.timedelta(hours=t.lead_time_hours)
        end = start + dt.timedelta(hours=hours)
        if before is not None and end > before:
            continue
        key = f"{region}|{t.instance_type}|{count}|{start.isoformat()}|{hours}"
        offer_id = "tpo-" + hashlib.sha256(key.encode()).hexdigest()[:24]
        out.append({
            "TrainingPlanOfferingId": offer_id,
            "TargetResources": [TARGET],
            "RequestedStartTimeAfter": after,
            **({"RequestedEndTimeBefore": before} if before else {}),
            "DurationHours": hours,
            "DurationMinutes": 0,
            "UpfrontFee": f"{t.upfront_fee_per_instance_hour * count * hours:.2f}",
            "CurrencyCode": "USD",
            "ReservedCapacityOfferings": [{
                "InstanceType": t.instance_type,
                "InstanceCount": count,
                "AvailabilityZone": f"{region}{t.availability_zone}",
                "DurationHours": hours,
                "DurationMinutes": 0,
                "StartTime": start,
                "EndTime": end,
            }],
        })
    return out


class PlansApi:
    """The training-plan operations over the shared records; offerings changeable while
    serving (``set_offerings``)."""

    def __init__(self, state: ExecutorState) -> None:
        self.state = state
        self.offerings: tuple[OfferingTemplate, ...] = tuple(state.settings.offerings)
        self._offers: dict[str, dict[str, Any]] = {}  # offering ID -> what it reserves

    def describe_training_plan(self, region: str, req: dict[str, Any]) -> dict[str, Any]:
        name = str(req.get("TrainingPlanName") or "")
        with self.state.lock:
            plan = self._find(region, name)
            if plan is None:
                raise ApiError("ResourceNotFound", f"Training plan {name} does not exist.")
            return plan.describe()

    def search_training_plan_offerings(self, region: str,
                                       req: dict[str, Any]) -> dict[str, Any]:
        with self.state.lock:
            offers = search(self.offerings, req, region)
            for offer in offers:
                self._offers[offer["TrainingPlanOfferingId"]] = {"region": region, **offer}
        return {"TrainingPlanOfferings": offers}

    def create_training_plan(self, region: str, req: dict[str, Any]) -> dict[str, Any]:
        name = str(req.get("TrainingPlanName") or "")
        if not SAGEMAKER_NAME_RE.match(name):
            raise validation(f"TrainingPlanName {name!r} must match {SAGEMAKER_NAME_RE.pattern}.")
        with self.state.lock:
            offer = self._offers.get(str(req.get("TrainingPlanOfferingId") or ""))
            if offer is None or offer["region"] != region:
                raise validation(f"TrainingPlanOfferingId {req.get('TrainingPlanOfferingId')!r} "
                                 "is not an offering SearchTrainingPlanOfferings returned in "
                                 f"{region}.")
            if self._find(region, name) is not None:
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
        with self.state.lock:
            plans = [p.describe() for p in self.state.plans.values() if p.region == region]

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
        region = region or self.state.settings.region
        start = start_time or now()
        end = end_time or start + dt.timedelta(hours=duration_hours)
        arn = training_plan_arn(region, name)
        plans = self.state.plans
        with self.state.lock:
            in_use = plans[arn].in_use if arn in plans else 0
            plans[arn] = TrainingPlan(name, arn, region, status, instance_type, instance_count,
                                      start, end, in_use, f"{float(upfront_fee):.2f}", currency)
            self.state.capacity.notify_all()
        return arn

    def set_offerings(self, offerings: list[OfferingTemplate]) -> None:
        with self.state.lock:
            self.offerings = tuple(offerings)

    def check_job_plan(self, region: str, req: dict[str, Any]) -> TrainingPlan | None:
        """The plan a CreateTrainingJob request names (ResourceConfig.TrainingPlanArn), after
        checking it exists there, is usable and reserves the job's instances; None if none."""
        arn = req.get("ResourceConfig", {}).get("TrainingPlanArn")
        if not arn:
            return None
        plan = self.state.plans.get(arn)
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

    def _find(self, region: str, name_or_arn: str) -> TrainingPlan | None:
        for plan in self.state.plans.values():
            if plan.region == region and name_or_arn in (plan.name, plan.arn):
                return plan
        return None
