"""How a run's image builds are recognised: what build_image marks, cleanup finds.

CodeBuild builds carry no tags, so a build started for a run carries the run id in
an environment variable; ECR images cannot carry resource tags, so an image pushed
by a run also gets a second image tag, the run marker ``run-<hash of run id>-<context
hash>``. build_image writes these marks, cleanup reads them: this module is the
contract between the two, so that neither imports the other.
"""

from __future__ import annotations

from typing import Any

from components.common import naming, tags

RUN_ID_VARIABLE = "KFP_SAGEMAKER_RUN_ID"  # a build's environment variable naming its run
RUN_MARKER_PREFIX = "run-"
# The content tag ``ctx-<hash>`` names an image's build context, not a run: cleanup may
# remove it with the image but never counts it as another run's tag.
CONTENT_TAG_PREFIX = "ctx-"


def log_group(project: str) -> str:
    """The CloudWatch log group a CodeBuild project's builds log to."""
    return f"/aws/codebuild/{project}"


def build_log_location(build: dict[str, Any], project: str) -> tuple[str, str]:
    """(group, stream) of a build's log: CodeBuild names the stream after the build's UUID."""
    logs = build.get("logs") or {}
    group = logs.get("groupName") or log_group(project)
    stream = logs.get("streamName") or str(build["id"]).split(":", 1)[-1]
    return group, stream


def run_marker_prefix(run_id: str) -> str:
    """The image-tag prefix that marks images pushed by this run (valid ECR tag characters)."""
    return f"{RUN_MARKER_PREFIX}{naming.short_hash(tags.validate_run_id(run_id), length=16)}-"


def run_marker(run_id: str, content_tag: str) -> str:
    """The image tag marking the image of ``content_tag`` as pushed by this run."""
    return f"{run_marker_prefix(run_id)}{content_tag[-12:]}"
