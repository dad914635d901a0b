"""Building an image with AWS CodeBuild: no Docker daemon needed in the pod.

The build context is a zip in S3 (CodeBuild's S3 source). One CodeBuild project
(created on first use, then reused) runs every build; everything that differs
between builds is a StartBuild override: the source zip, the buildspec, the
privileged Docker environment, the run id. The buildspec logs in to the base
image's ECR registry (the AWS DLC account) and to the target registry, builds,
and pushes the content tag and the run marker tag.

While the build runs, its CloudWatch log (``/aws/codebuild/<project>``, one stream
per build) is copied into this process's log, BatchGetBuilds is polled, and a
SIGTERM (KFP's Terminate) or SIGINT stops the build before the process exits
(``kfp_sagemaker_blackwell.common.execution_context``: the caller enters it before its first
AWS call; the wait loop checks it between polls). A retried
component re-attaches to a build of the same image that is still running
instead of starting a second one. The polls ride out an unreachable endpoint
for ``max_outage_s``; a termination meanwhile still ends the step within
``stop_timeout_s``, saying whether StopBuild was accepted or giving the
``aws codebuild stop-build`` command: the shared ``remote_job.RemoteJobRunner``
does the waiting and the stop, ``build_marks.CodeBuildBuild`` tells it what a build is.
"""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kfp_sagemaker_blackwell.common import aws, tags
from kfp_sagemaker_blackwell.common.aws import error_code
from kfp_sagemaker_blackwell.common.build_marks import RUN_ID_VARIABLE, CodeBuildBuild, log_group
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.common.execution_context import (
    DEFAULT_MAX_OUTAGE_S,
    DEFAULT_STOP_TIMEOUT_S,
    ExecutionContext,
    Terminated,
)
from kfp_sagemaker_blackwell.common.naming import short_hash
from kfp_sagemaker_blackwell.common.remote_job import RemoteJobRunner

BUILD_ENVIRONMENT_IMAGE = "aws/codebuild/standard:7.0"  # Ubuntu 22.04, Docker, AWS CLI v2
COMPUTE_TYPES = ("BUILD_GENERAL1_MEDIUM", "BUILD_GENERAL1_LARGE", "BUILD_GENERAL1_2XLARGE")
IMAGE_VARIABLE = "KFP_SAGEMAKER_IMAGE"
CODEBUILD_PROJECT = "CodeBuildProject"
CODEBUILD_BUILD = "CodeBuildBuild"


class BuildStopped(Terminated):
    """The build was stopped because this process got SIGTERM or SIGINT."""


@dataclass(frozen=True)
class BuildTarget:
    context_location: str  # "<bucket>/<key>" of the zip, CodeBuild's S3 source format
    dockerfile: str
    build_args: tuple[tuple[str, str], ...]
    image: str  # <repository uri>:<content tag>
    marker_image: str  # <repository uri>:<run marker>
    base_registry: tuple[str, str] | None  # (host, region) of the base image's ECR registry
    target_registry: tuple[str, str]


def render_buildspec(target: BuildTarget) -> str:
    """The buildspec, as JSON (a subset of YAML, so quoting is never ambiguous)."""
    def login(host: str, region: str) -> str:
        return (f"aws ecr get-login-password --region {shlex.quote(region)} | "
                f"docker login --username AWS --password-stdin {shlex.quote(host)}")

    logins = []
    if target.base_registry and target.base_registry != target.target_registry:
        logins.append(login(*target.base_registry))
    logins.append(login(*target.target_registry))
    build = ["docker", "build", "--file", target.dockerfile]
    for key, value in target.build_args:
        build += ["--build-arg", f"{key}={value}"]
    build += ["--tag", target.image, "."]
    spec = {
        "version": 0.2,
        "env": {"shell": "bash"},
        "phases": {
            "pre_build": {"on-failure": "ABORT", "commands": logins},
            "build": {
                "on-failure": "ABORT",
                "commands": [
                    " ".join(shlex.quote(part) for part in build),
                    f"docker tag {shlex.quote(target.image)} {shlex.quote(target.marker_image)}",
                    f"docker push {shlex.quote(target.image)}",
                    f"docker push {shlex.quote(target.marker_image)}",
                ],
            },
        },
    }
    return json.dumps(spec, indent=2)


def validate_project_name(name: str) -> str:
    import re

    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9\-_]{1,254}$", name or ""):
        raise UserError("codebuild_project", f"{name!r} is not a valid CodeBuild project name.",
                        "use 2-255 letters, digits, - and _, starting with a letter or digit.")
    return name


def ensure_project(
    codebuild: Any,
    project: str,
    *,
    source_location: str,
    role_arn: str,
    compute_type: str,
    timeout_minutes: int,
    project_tags: dict[str, str],
) -> tuple[str, bool]:
    """``(project ARN, created)``: the project, created privileged when it is missing."""
    found = codebuild.batch_get_projects(names=[project]).get("projects", [])
    if found:
        return str(found[0]["arn"]), False
    if not role_arn:
        raise UserError(
            "codebuild_role_arn",
            f"CodeBuild project {project!r} does not exist and no service role was given to "
            "create it.",
            "pass codebuild_role_arn (a role CodeBuild can assume, see iam/README.md), "
            "or create the project once by hand.",
        )
    try:
        made = codebuild.create_project(
            name=project,
            description="kfp-sagemaker-blackwell image builds (build_image component)",
            source={"type": "S3", "location": source_location},
            artifacts={"type": "NO_ARTIFACTS"},
            environment={
                "type": "LINUX_CONTAINER",
                "image": BUILD_ENVIRONMENT_IMAGE,
                "computeType": compute_type,
                "privilegedMode": True,  # docker build needs the Docker daemon
                "imagePullCredentialsType": "CODEBUILD",
            },
            serviceRole=role_arn,
            timeoutInMinutes=timeout_minutes,
            logsConfig={"cloudWatchLogs": {"status": "ENABLED", "groupName": log_group(project)}},
            tags=tags.as_lower_key_value(project_tags),
        )["project"]
    except Exception as exc:  # created by a concurrent run meanwhile
        if error_code(exc) != "ResourceAlreadyExistsException":
            raise
        return ensure_project(codebuild, project, source_location=source_location,
                              role_arn=role_arn, compute_type=compute_type,
                              timeout_minutes=timeout_minutes, project_tags=project_tags)
    return str(made["arn"]), True


def _variables(build: dict[str, Any]) -> dict[str, str]:
    env = build.get("environment", {}).get("environmentVariables", [])
    return {v.get("name", ""): v.get("value", "") for v in env}


def running_build_for(codebuild: Any, project: str, image: str) -> dict[str, Any] | None:
    """A build of the same image still in progress (a retried component re-attaches to it)."""
    ids = codebuild.list_builds_for_project(projectName=project, sortOrder="DESCENDING").get(
        "ids", [])[:100]
    if not ids:
        return None
    for build in codebuild.batch_get_builds(ids=ids).get("builds", []):
        if build.get("buildStatus") == "IN_PROGRESS" and _variables(build).get(
            IMAGE_VARIABLE) == image:
            return dict(build)
    return None


def start_build(
    codebuild: Any,
    project: str,
    target: BuildTarget,
    *,
    run_id: str,
    role_arn: str,
    compute_type: str,
    timeout_minutes: int,
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "projectName": project,
        "sourceTypeOverride": "S3",
        "sourceLocationOverride": target.context_location,
        "buildspecOverride": render_buildspec(target),
        "environmentTypeOverride": "LINUX_CONTAINER",
        "imageOverride": BUILD_ENVIRONMENT_IMAGE,
        "computeTypeOverride": compute_type,
        "privilegedModeOverride": True,
        "timeoutInMinutesOverride": timeout_minutes,
        "environmentVariablesOverride": [
            {"name": RUN_ID_VARIABLE, "value": run_id, "type": "PLAINTEXT"},
            {"name": IMAGE_VARIABLE, "value": target.image, "type": "PLAINTEXT"},
        ],
        "logsConfigOverride": {
            "cloudWatchLogs": {"status": "ENABLED", "groupName": log_group(project)}},
        # The same request within 5 minutes (a component retried at once) starts one build.
        "idempotencyToken": short_hash(run_id, target.image, length=32),
    }
    if role_arn:
        kwargs["serviceRoleOverride"] = role_arn
    return dict(codebuild.start_build(**kwargs)["build"])


def _like(made: Any, service: str, **config: Any) -> Any:
    """A client of ``service`` for the region and endpoint of ``made``, with ``config``."""
    return aws.client(service, made.meta.region_name, endpoint_url=made.meta.endpoint_url,
                      **config)


def build_runner(
    codebuild: Any,
    logs: Any,
    *,
    poll_interval_s: float,
    log: Callable[[str], None],
    ctx: ExecutionContext,
    max_outage_s: float = DEFAULT_MAX_OUTAGE_S,
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
) -> RemoteJobRunner:
    """The remote-job runner of a build: polls with clients like ``codebuild`` and ``logs``
    without botocore's retries, stops with a client bounded by ``stop_timeout_s``."""
    return RemoteJobRunner(
        follow=_like(codebuild, "codebuild", **aws.FOLLOW_CLIENT),
        stopper=_like(codebuild, "codebuild", **aws.bounded_client_config(stop_timeout_s)),
        logs=_like(logs, "logs", **aws.FOLLOW_CLIENT),
        ctx=ctx, out=log, poll_interval_s=poll_interval_s, max_outage_s=max_outage_s,
        stop_timeout_s=stop_timeout_s, prefix="[build_image] ",
        wait_after_stop=False)  # StopBuild's answer is reported as it comes


def build_job(build: dict[str, Any], project: str, region: str) -> CodeBuildBuild:
    """The runner's adapter of ``build`` (a StartBuild or BatchGetBuilds answer)."""
    return CodeBuildBuild(str(build["id"]), project, region, terminated=BuildStopped)


def start_with(runner: RemoteJobRunner, send: Callable[[], dict[str, Any]], project: str,
               region: str) -> dict[str, Any]:
    """``send()`` (StartBuild, returning the build) through ``runner.create``: refused when a
    termination came first, the build stopped right after it when one came meanwhile."""
    return runner.create(CodeBuildBuild("", project, region, terminated=BuildStopped), send,
                         created=lambda build: build_job(build, project, region))


def wait_for_build(
    codebuild: Any,
    logs: Any,
    build: dict[str, Any],
    project: str,
    *,
    poll_interval_s: float,
    log: Callable[[str], None],
    ctx: ExecutionContext | None = None,
    max_outage_s: float = DEFAULT_MAX_OUTAGE_S,
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
    runner: RemoteJobRunner | None = None,
) -> dict[str, Any]:
    """Polls BatchGetBuilds until the build ends, copying its log lines to ``log``.

    ``ctx``: the ``ExecutionContext`` the caller entered before its first AWS call
    (so that no SIGTERM/SIGINT is missed); else one is entered here. When it
    reports termination, the build is stopped within ``stop_timeout_s`` and
    ``BuildStopped`` raised, saying whether StopBuild was accepted. The polls use
    clients like ``codebuild`` and ``logs`` without botocore's retries and ride out
    an unreachable endpoint for ``max_outage_s`` (then ``AwsUnreachable``); the
    life cycle is ``remote_job.RemoteJobRunner``'s (``runner``: the one that started
    the build, else ``build_runner``'s), with ``build_marks.CodeBuildBuild`` as the
    adapter.
    """
    job = build_job(build, project, codebuild.meta.region_name)
    with contextlib.ExitStack() as stack:
        runner = runner or build_runner(
            codebuild, logs, poll_interval_s=poll_interval_s, log=log,
            ctx=ctx or stack.enter_context(ExecutionContext("build_image")),
            max_outage_s=max_outage_s, stop_timeout_s=stop_timeout_s)
        return runner.run_to_end(job, dict(build))


def failure_summary(build: dict[str, Any]) -> str:
    """The failed phases and their messages, as CodeBuild reports them."""
    problems = []
    for phase in build.get("phases", []):
        if phase.get("phaseStatus") not in (None, "SUCCEEDED"):
            messages = "; ".join(c.get("message", "") for c in phase.get("contexts", [])
                                 if c.get("message"))
            problems.append(f"{phase.get('phaseType')}: {phase.get('phaseStatus')}"
                            + (f" ({messages})" if messages else ""))
    return ", ".join(problems) or "no failed phase reported"
