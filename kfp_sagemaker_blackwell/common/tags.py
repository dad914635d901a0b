"""The tag set every resource a run creates carries.

Cleanup finds a run's resources by these tags and touches nothing else, so
every create call in the project takes its tags from here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from kfp_sagemaker_blackwell.catalog.errors import FieldError

TAG_PREFIX = "kfp-sagemaker"
RUN_ID_KEY = f"{TAG_PREFIX}:run-id"
PIPELINE_KEY = f"{TAG_PREFIX}:pipeline"
COMPONENT_KEY = f"{TAG_PREFIX}:component"
CREATED_KEY = f"{TAG_PREFIX}:created-by-run"  # marks resources the run created (vs reused)

MAX_TAGS = 50
MAX_KEY = 128
MAX_VALUE = 256
# AWS tag values: letters, numbers, spaces and _ . : / = + - @ (Unicode letters allowed).
_BAD_VALUE_CHARS = re.compile(r"[^\w .:/=+\-@]", re.UNICODE)
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$")


def _error(label: str, problem: str, *, field: str = "") -> FieldError:
    """A FieldError whose text is ``label: problem`` (what callers print as it is)."""
    return FieldError(field or label, problem, text=f"{label}: {problem}")


def validate_run_id(run_id: str) -> str:
    """Refuses empty, wildcard or malformed run ids (cleanup relies on exact matches)."""
    if not run_id or not run_id.strip():
        raise _error("run_id", "empty; pass the KFP run id (dsl.PIPELINE_JOB_ID_PLACEHOLDER)")
    if any(c in run_id for c in "*?[]%") or not _RUN_ID_RE.match(run_id):
        raise _error(f"run_id={run_id!r}", "malformed; expected letters, digits and . _ : - "
                     "(1-128 characters, no wildcards)", field="run_id")
    return run_id


def clean_value(value: str) -> str:
    return _BAD_VALUE_CHARS.sub("_", value)[:MAX_VALUE]


def run_tags(run_id: str, pipeline: str, component: str) -> dict[str, str]:
    """The standard tags as a plain dict (CloudWatch Logs takes this shape)."""
    return {
        RUN_ID_KEY: clean_value(validate_run_id(run_id)),
        PIPELINE_KEY: clean_value(pipeline or "unknown"),
        COMPONENT_KEY: clean_value(component or "unknown"),
    }


def merge(base: dict[str, str], extra: dict[str, str] | None) -> dict[str, str]:
    """User tags plus the standard ones; the standard ones win, limits are enforced."""
    merged = {**(extra or {}), **base}
    for key, value in merged.items():
        if not key or len(key) > MAX_KEY:
            raise _error("tags", f"key {key!r} must be 1-{MAX_KEY} characters")
        if key.lower().startswith("aws:"):
            raise _error("tags", f"key {key!r} uses the reserved 'aws:' prefix")
        if len(value) > MAX_VALUE:
            raise _error("tags", f"value of {key!r} is longer than {MAX_VALUE} characters")
    if len(merged) > MAX_TAGS:
        raise _error("tags", f"{len(merged)} tags, SageMaker allows at most {MAX_TAGS}")
    return merged


# Each AWS API wants its own shape.
def as_key_value(tags: dict[str, str]) -> list[dict[str, str]]:
    """SageMaker, ECR, IAM, S3 (TagSet): [{"Key": k, "Value": v}]."""
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def as_lower_key_value(tags: dict[str, str]) -> list[dict[str, str]]:
    """CodeBuild: [{"key": k, "value": v}]."""
    return [{"key": k, "value": v} for k, v in tags.items()]


def from_key_value(items: Iterable[Mapping[str, Any]] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key = item.get("Key", item.get("key"))
        value = item.get("Value", item.get("value", ""))
        if key is not None:
            out[key] = value
    return out


def belongs_to_run(tags: dict[str, str], run_id: str) -> bool:
    return tags.get(RUN_ID_KEY) == clean_value(run_id)
