"""The local backend's own controls, on the same endpoint: ``/_local/...`` (JSON over HTTP).

SageMaker has no API for these, so other-language clients and the AWS CLI reach
them here (``curl``), and ``python -m kfp_sagemaker_blackwell.local_backend interrupt-spot`` wraps the
most used one::

    GET  /_local/settings                  quotas, offerings, latency, spot savings, strictness
    PUT  /_local/quotas                    {"ml.p6-b200.48xlarge": 1, ...} (replaces all)
    PUT  /_local/training-plan-offerings   [{"instance_type": ..., "max_instance_count": 4,
                                             "upfront_fee_per_instance_hour": 0, ...}, ...]
    POST /_local/spot-interruptions        {"TrainingJobName": "...", "Region": "us-west-2"}

Errors answer 400 (bad input) or 404 (no such control) with {"error": "..."}. Requests
are SigV4-signed like every other (``kfp_sagemaker_blackwell.local_backend.auth.signed_headers`` signs one).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from kfp_sagemaker_blackwell.local_backend.executor import TrainingJobExecutor
from kfp_sagemaker_blackwell.local_backend.settings import OfferingTemplate

PREFIX = "/_local/"


def handle(executor: TrainingJobExecutor, method: str, path: str,
           body: bytes) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON payload) for one admin request."""
    route = path[len(PREFIX):].strip("/")
    try:
        data = json.loads(body or b"null")
        if (method, route) == ("GET", "settings"):
            return 200, settings(executor)
        if (method, route) == ("PUT", "quotas"):
            if not isinstance(data, dict):
                raise ValueError('expected {"<instance type>": <count>, ...}')
            executor.set_quotas(data)
            return 200, settings(executor)
        if (method, route) == ("PUT", "training-plan-offerings"):
            if not isinstance(data, list):
                raise ValueError("expected a list of offerings")
            executor.set_offerings([OfferingTemplate.from_dict(o) for o in data])
            return 200, settings(executor)
        if (method, route) == ("POST", "spot-interruptions"):
            if not isinstance(data, dict) or not data.get("TrainingJobName"):
                raise ValueError('expected {"TrainingJobName": "...", "Region": "..."}')
            executor.interrupt_spot(str(data["TrainingJobName"]),
                                    str(data.get("Region") or executor.settings.region))
            return 200, {"interrupted": data["TrainingJobName"]}
    except (ValueError, TypeError) as exc:
        return 400, {"error": str(exc)}
    return 404, {"error": f"{method} {path}: no such control; see GET {PREFIX}settings and "
                          "local_backend/admin.py"}


def settings(executor: TrainingJobExecutor) -> dict[str, Any]:
    s = executor.settings
    return {
        "region": s.region,
        "quotas": dict(executor.quotas),
        "training_plan_offerings": [asdict(o) for o in executor.offerings],
        "latency": s.latency.as_dict(),
        "spot_savings": s.spot_savings,
        "strict_resources": s.strict_resources,
        "max_concurrent_jobs": s.max_concurrent_jobs,
        "stop_grace_s": s.stop_grace_s,
    }
