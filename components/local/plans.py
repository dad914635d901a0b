"""Training-plan offerings: what SearchTrainingPlanOfferings answers, CreateTrainingPlan buys.

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

from components.local.api import validation
from components.local.jobs import now
from components.local.settings import OfferingTemplate

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
