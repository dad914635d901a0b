"""Deterministic names for the resources a run creates.

SageMaker names (training jobs, ...) must match
``[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}``: 1-63 characters, alphanumerics and
hyphens, no leading or trailing hyphen. The same run id + task + precision
always gives the same name, so a retried component re-attaches to its job; a
different run id always gives a different name (a hash of the full inputs is
part of every name), so a run never adopts another run's job.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

SAGEMAKER_NAME_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
MAX_SAGEMAKER_NAME = 63
_HASH_LEN = 8


def slug(text: str) -> str:
    """ASCII alphanumerics and single hyphens; accents folded, the rest dropped."""
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[^a-zA-Z0-9]+", "-", folded).strip("-").lower()


def short_hash(*parts: str, length: int = _HASH_LEN) -> str:
    digest = hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()
    return digest[:length]


def resource_name(*parts: str, max_length: int = MAX_SAGEMAKER_NAME) -> str:
    """``slug(part1)-slug(part2)-...-<hash>`` cut to ``max_length``.

    The hash covers the raw parts, so two inputs that slug alike (``my_run`` and
    ``my-run``, or two long ids sharing a prefix) still get different names.
    """
    if not parts or not any(p for p in parts):
        raise ValueError("resource_name needs at least one non-empty part")
    digest = short_hash(*parts)
    body = "-".join(s for s in (slug(p) for p in parts) if s)
    room = max_length - len(digest) - 1
    body = body[:room].strip("-")
    name = f"{body}-{digest}" if body else f"r{digest}"
    assert SAGEMAKER_NAME_RE.match(name), name
    return name


def training_job_name(run_id: str, task: str, precision: str) -> str:
    """Training job name, stable for the same run id + task + precision.

    Precision and task come first (readable in the console), then as much of the
    run id as fits, then a hash of all three.
    """
    if not run_id or not run_id.strip():
        raise ValueError("run_id must not be empty")
    return resource_name(precision, task, run_id)


def is_valid_sagemaker_name(name: str) -> bool:
    return bool(SAGEMAKER_NAME_RE.match(name))
