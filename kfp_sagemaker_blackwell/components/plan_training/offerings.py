"""Training-plan offerings: SearchTrainingPlanOfferings for a candidate's instances and hours.

A Flexible Training Plan is bought for a whole reservation and paid up front
(``UpfrontFee`` in ``CurrencyCode``), so the planner asks SageMaker for the exact
offerings of ``InstanceCount`` x ``InstanceType`` for the run's hours (its
``max_runtime_seconds``, rounded up to the hour: ``DurationHours`` is whole hours),
ending before the deadline when there is one. Nothing is bought: the chosen offering's
id goes into the plan, and CreateTrainingPlan is the user's decision
(https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_SearchTrainingPlanOfferings.html).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from kfp_sagemaker_blackwell.common import aws

TARGET = "training-job"


def searcher(region: str, now: Callable[[], dt.datetime] | None = None
             ) -> Callable[[str, int, int, float], list[dict[str, Any]]]:
    """A ``search.OfferingSearch`` calling SearchTrainingPlanOfferings in ``region``; the
    calls are memoised (one per instance type, count, hours and deadline)."""
    client = aws.client("sagemaker", region)
    memo: dict[tuple[str, int, int, float], list[dict[str, Any]]] = {}
    clock = now or (lambda: dt.datetime.now(dt.timezone.utc))

    def offerings(instance_type: str, count: int, hours: int,
                  deadline_hours: float) -> list[dict[str, Any]]:
        key = (instance_type, count, hours, deadline_hours)
        if key not in memo:
            request: dict[str, Any] = {"TargetResources": [TARGET], "InstanceType": instance_type,
                                       "InstanceCount": count, "DurationHours": hours}
            if deadline_hours:
                request["EndTimeBefore"] = clock() + dt.timedelta(hours=deadline_hours)
            response: dict[str, Any] = dict(client.search_training_plan_offerings(**request))
            memo[key] = [dict(o) for o in response.get("TrainingPlanOfferings", [])
                         if _reserves(dict(o), instance_type, count)]
        return memo[key]

    return offerings


def _reserves(offering: dict[str, Any], instance_type: str, count: int) -> bool:
    """Whether the offering reserves ``count`` x ``instance_type`` in all (SageMaker may
    split a reservation over several capacity offerings)."""
    total = sum(int(r.get("InstanceCount") or 0)
                for r in offering.get("ReservedCapacityOfferings") or []
                if r.get("InstanceType") == instance_type)
    return total >= count


def window(offering: dict[str, Any]) -> tuple[str, str]:
    """The reservation's start and end (ISO 8601, UTC) over its capacity offerings."""
    starts = [r["StartTime"] for r in offering.get("ReservedCapacityOfferings") or []
              if r.get("StartTime")]
    ends = [r["EndTime"] for r in offering.get("ReservedCapacityOfferings") or []
            if r.get("EndTime")]
    return (_iso(min(starts)) if starts else "", _iso(max(ends)) if ends else "")


def _iso(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.timezone.utc).replace(microsecond=0).isoformat()
    return str(value)


def summary(offering: dict[str, Any]) -> dict[str, Any]:
    """What the plan records of the chosen offering (JSON-ready) and how to buy it."""
    start, end = window(offering)
    oid = offering.get("TrainingPlanOfferingId", "")
    return {
        "training_plan_offering_id": oid,
        "upfront_fee": float(offering.get("UpfrontFee") or 0),
        "currency": offering.get("CurrencyCode") or "USD",
        "duration_hours": int(offering.get("DurationHours") or 0),
        "start": start,
        "end": end,
        "buy": (f"aws sagemaker create-training-plan --training-plan-name <name> "
                f"--training-plan-offering-id {oid}, then pass its ARN as training_plan_arn "
                "(paid up front, not refundable)"),
    }
