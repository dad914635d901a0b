"""How a run's image builds are recognised: what build_image marks, cleanup finds.

CodeBuild builds carry no tags, so a build started for a run carries the run id in
an environment variable; ECR images cannot carry resource tags, so an image pushed
by a run also gets a second image tag, the run marker ``run-<hash of run id>-<context
hash>``. build_image writes these marks, cleanup reads them: this module is the
contract between the two, so that neither imports the other. ``CodeBuildBuild`` is
the ``remote_job`` adapter of a build, for both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kfp_sagemaker_blackwell.common import naming, tags
from kfp_sagemaker_blackwell.common.cloudwatch import LogEvent
from kfp_sagemaker_blackwell.common.execution_context import Terminated

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


# BatchGetBuilds' buildStatus values after which a build never changes again.
TERMINAL_BUILD_STATUSES = frozenset({"SUCCEEDED", "FAILED", "FAULT", "TIMED_OUT", "STOPPED"})


@dataclass
class CodeBuildBuild:
    """One CodeBuild build, as ``remote_job.RemoteJobRunner`` follows and stops it
    (build_image follows its build, cleanup stops a run's builds)."""

    build_id: str
    project: str
    region: str
    terminated: type[Terminated] = Terminated
    describe_call = "BatchGetBuilds"
    create_call = "StartBuild"
    stop_call = "StopBuild"
    service = "CodeBuild"
    log_name = "the build log"
    after_stop = ""
    _phase: str = field(default="", repr=False)

    @property
    def ident(self) -> str:
        return self.build_id

    @property
    def what(self) -> str:
        return f"CodeBuild build {self.build_id}"

    @property
    def stop_command(self) -> str:
        return f"aws codebuild stop-build --id {self.build_id} --region {self.region}"

    def describe(self, client: Any) -> dict[str, Any] | None:
        builds = client.batch_get_builds(ids=[self.build_id]).get("builds", [])
        return dict(builds[0]) if builds else None

    def status(self, build: dict[str, Any]) -> str:
        return str(build.get("buildStatus", "?"))

    def is_terminal(self, build: dict[str, Any]) -> bool:
        return build.get("buildStatus") in TERMINAL_BUILD_STATUSES

    def is_running(self, build: dict[str, Any]) -> bool:
        return bool(build.get("buildStatus") == "IN_PROGRESS")

    def stop(self, client: Any) -> str:
        made = client.stop_build(id=self.build_id)["build"]
        return f"StopBuild answered {made.get('buildStatus', '?')}"

    def progress(self, build: dict[str, Any]) -> list[str]:
        phase = build.get("currentPhase")
        if not phase or phase == self._phase:
            return []
        self._phase = phase
        return [f"CodeBuild phase: {phase}"]

    def log_location(self, build: dict[str, Any]) -> tuple[str, str]:
        return build_log_location(build, self.project)

    def log_line(self, event: LogEvent) -> str:
        return event.message.rstrip("\n")
