"""What SageMaker checks in a request before acting on it, and how it pages its lists.

botocore checks types, lengths and required members on the client side; what
SageMaker itself refuses (name patterns, spot/wait rules, list limits...) is
checked here, with SageMaker's error codes and messages.
"""

from __future__ import annotations

from typing import Any

from components.local import storage
from components.local.api import validation
from components.local.jobs import NAME_RE, Job


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
    _check_counts(req)
    _check_spot(req)


def _check_counts(req: dict[str, Any]) -> None:
    if len(req.get("HyperParameters") or {}) > 100:
        raise validation("HyperParameters: at most 100 entries.")
    if len(req.get("Environment") or {}) > 100:
        raise validation("Environment: at most 100 entries.")
    if len(req.get("Tags") or []) > 50:
        raise validation("Tags: at most 50 tags.")
    count = req["ResourceConfig"].get("InstanceCount", 1)
    if not isinstance(count, int) or count < 1:
        raise validation("ResourceConfig.InstanceCount must be at least 1.")


def _check_spot(req: dict[str, Any]) -> None:
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


def matches(job: Job, req: dict[str, Any]) -> bool:
    """Whether ``job`` passes ListTrainingJobs' filters in ``req``."""
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


def page(items: list[dict[str, Any]], req: dict[str, Any], key: str,
         default_max: int) -> dict[str, Any]:
    """One page of ``items`` under ``key``, from the request's NextToken and MaxResults."""
    try:
        start = int(req.get("NextToken") or 0)
    except ValueError:
        raise validation("Invalid NextToken.") from None
    size = int(req.get("MaxResults") or default_max)
    out: dict[str, Any] = {key: items[start:start + size]}
    if start + size < len(items):
        out["NextToken"] = str(start + size)
    return out
