"""Build an image (the trainer image by default) and push it to ECR, unless it is already there.

``build_image(...)`` is what the KFP component and ``python -m kfp_sagemaker_blackwell.components.build_image``
call. The steps, in order:

1. Check every parameter and resolve the base image (no AWS call yet).
2. Hash the build context: the tag is ``ctx-<hash>``.
3. Create the ECR repository if it is missing (scan on push, the run's tags).
4. If ``repository:tag`` is in ECR: return it (outcome ``reused``), nothing built.
5. Otherwise build with the chosen builder:
   - ``codebuild`` (the default on AWS): zip the context to S3, run CodeBuild;
   - ``docker``: a local Docker daemon (the default on the local backend when a
     daemon answers);
   - ``none`` (the default on the local backend without a daemon): nothing is
     built and the output says so; the URI is the content-addressed one in the
     local ECR.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.parse
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from kfp_sagemaker_blackwell.common import build_marks, cli, resources, shipped, tags
from kfp_sagemaker_blackwell.common.aws import client, resolve_region
from kfp_sagemaker_blackwell.common.ecr_images import ecr_registry_of
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.common.execution_context import ExecutionContext
from kfp_sagemaker_blackwell.common.s3 import split_s3_uri
from kfp_sagemaker_blackwell.components.build_image import codebuild as cb
from kfp_sagemaker_blackwell.components.build_image import context as ctx
from kfp_sagemaker_blackwell.components.build_image import ecr as ecr_mod

# The AWS PyTorch training DLC the article builds on. The SDK resolves the regional
# registry and repository; the component's base_image_tag pins the exact image (the SDK's
# own tag for version "2.9" is the floating alias "2.9-gpu-py312").
DLC_FRAMEWORK_VERSION = "2.9"
DLC_PY_VERSION = "py312"
BASE_IMAGE_ARG = "BASE_IMAGE"
BUILDERS = ("auto", "codebuild", "docker", "none")
COMPONENT = "build_image"  # the component tag of what it creates
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
SOURCE_DIR_ENV = shipped.SOURCE_DIR_ENV


def _as_given(request: Any) -> None:
    """The parameters as the build reads them, whoever hands them over: the context's
    paths a tuple, the build arguments and the extra tags str -> str."""
    for name, value in (
            ("context_paths", tuple(str(p) for p in request.context_paths or [])),
            ("build_args", {str(k): str(v) for k, v in (request.build_args or {}).items()}),
            ("tags", {str(k): str(v) for k, v in (request.tags or {}).items()})):
        object.__setattr__(request, name, value)  # frozen: set while it is made


_Declared: Any = cli.dataclass_of(cli.source_parameters(
    "kfp_sagemaker_blackwell.components.build_image.component", "build_image"),
    "BuildRequest", frozen=True, namespace={"__post_init__": _as_given})


class BuildRequest(_Declared):  # type: ignore[misc]
    """The build_image component's parameters as values: a frozen keyword-only dataclass
    derived from its signature (components/build_image/component.py, the one declaration:
    names, kinds, defaults; a parameter added there is a field here and a flag of the
    CLI), checked by :meth:`validate`: what the build trusts. Elsewhere than the component
    and its CLI: ``BuildRequest.from_parameters(cli.declared(build_image, ...))``.
    """

    @classmethod
    def from_parameters(cls, params: Mapping[str, Any]) -> BuildRequest:
        """The checked request for the component's parameters by name (other keys, the
        outputs, are ignored); a bad value is a UserError naming its parameter."""
        return cls(**{f.name: params[f.name] for f in fields(cls)}).validate()

    @functools.cached_property
    def run_tags(self) -> dict[str, str]:
        """The run's tags merged with ``tags``: what everything the build creates gets."""
        return tags.merge(tags.run_tags(self.run_id, self.pipeline, COMPONENT), self.tags)

    def validate(self) -> BuildRequest:
        """Every parameter checked before any AWS call (a UserError naming it); itself."""
        try:
            tags.validate_run_id(self.run_id)
        except ValueError as exc:
            raise UserError("run_id", str(exc), "pass the KFP run id.") from exc
        try:
            self.run_tags  # noqa: B018 - merged once here, where a bad tag is the user's error
        except ValueError as exc:
            raise UserError("tags", str(exc), "drop or shorten the extra tags.") from exc
        _check(self)
        return self


@dataclass
class BuildResult:
    image_uri: str  # repo@sha256:... when the digest is known, else repo:tag
    tag_uri: str  # repo:ctx-<hash>
    digest: str
    outcome: str  # "built" | "reused" | "not-built"
    message: str
    context: ctx.BuildContext
    resources: list[resources.AwsResource]

    @property
    def built(self) -> bool:
        return self.outcome == "built"


# ---- checks and the base image (before any AWS call) ----

def declares_arg(dockerfile_text: str, name: str) -> bool:
    return any(re.match(rf"^ARG\s+{re.escape(name)}(\s*=|\s*$)", line, re.IGNORECASE)
               for line in ctx._logical_lines(dockerfile_text))


def lookup_dlc(region: str, instance_type: str) -> str:
    """The regional AWS PyTorch training DLC, from the SageMaker SDK (offline lookup)."""
    try:
        from sagemaker.core import image_uris  # lazy: ~1.7 s and ~350 MB of dependencies
    except ImportError as exc:
        raise UserError(
            "base_image",
            "the SageMaker SDK (package sagemaker-core) is not installed, so the regional "
            "PyTorch DLC cannot be looked up.",
            "pass base_image=<full image URI> (e.g. 763104351884.dkr.ecr.us-west-2.amazonaws.com/"
            "pytorch-training:2.9.0-gpu-py312-cu130-ubuntu22.04-sagemaker), or pip install "
            "'kfp-sagemaker-blackwell[sagemaker]'.",
        ) from exc
    return str(image_uris.retrieve(
        framework="pytorch", region=region, version=DLC_FRAMEWORK_VERSION,
        py_version=DLC_PY_VERSION, instance_type=instance_type, image_scope="training",
    ))


def resolve_base_image(req: BuildRequest, region: str,
                       lookup: Callable[[str, str], str] = lookup_dlc) -> str:
    if req.base_image:
        return req.base_image
    uri = lookup(region, req.instance_type)
    if req.base_image_tag:
        uri = f"{uri.rsplit(':', 1)[0]}:{req.base_image_tag}"
    return uri


def _check(req: BuildRequest) -> None:
    """What :meth:`BuildRequest.validate` checks beyond the run id and the tags."""
    ecr_mod.validate_repository(req.repository)
    if req.builder not in BUILDERS:
        raise UserError("builder", f"{req.builder!r} is not one of {', '.join(BUILDERS)}.",
                        "use auto (CodeBuild on AWS, Docker or nothing locally).")
    cb.validate_project_name(req.codebuild_project)
    if req.codebuild_compute_type not in cb.COMPUTE_TYPES:
        raise UserError("codebuild_compute_type", f"{req.codebuild_compute_type!r} is not "
                        f"one of {', '.join(cb.COMPUTE_TYPES)}.",
                        "use BUILD_GENERAL1_LARGE: the DLC base needs its disk and memory.")
    if req.codebuild_role_arn and not re.match(r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$",
                                               req.codebuild_role_arn):
        raise UserError("codebuild_role_arn", f"{req.codebuild_role_arn!r} is not an IAM "
                        "role ARN.", "pass arn:aws:iam::<account>:role/<name>.")
    if not 5 <= req.timeout_minutes <= 2160:
        raise UserError("timeout_minutes", f"{req.timeout_minutes} is outside CodeBuild's "
                        "5-2160 minutes.", "use e.g. 120.")
    for key in req.build_args:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise UserError("build_args", f"{key!r} is not a valid build argument name.",
                            "use letters, digits and _.")
    if req.s3_uri:
        split_s3_uri(req.s3_uri)


# ---- the builders ----

def is_local_endpoint(any_client: Any) -> bool:
    host = urllib.parse.urlparse(any_client.meta.endpoint_url or "").hostname or ""
    return host in LOOPBACK_HOSTS


def docker_daemon_available() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        probe = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                               capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0 and bool(probe.stdout.strip())


def choose_builder(requested: str, local: bool, docker_ok: Callable[[], bool]) -> str:
    if requested != "auto":
        return requested
    if not local:
        return "codebuild"
    return "docker" if docker_ok() else "none"


def _docker_build_local(context: ctx.BuildContext, ecr: Any, repo: ecr_mod.Repository,
                        marker: str, log: Callable[[str], None]) -> None:
    """Builds with the local daemon from exactly the hashed files, and records the tag
    in the local ECR (moto serves ECR's API, not its registry: the image itself stays
    in the local daemon under the same name)."""
    with tempfile.TemporaryDirectory(prefix="build-context-") as tmp:
        with zipfile.ZipFile(io.BytesIO(ctx.write_zip(context))) as zf:
            zf.extractall(Path(tmp) / "ctx")
        for entry in context.files:
            if entry.executable:
                os.chmod(Path(tmp) / "ctx" / entry.path, 0o755)
        image = f"{repo.uri}:{context.tag}"
        command = ["docker", "build", "--file", context.dockerfile]
        for key, value in context.build_args:
            command += ["--build-arg", f"{key}={value}"]
        command += ["--tag", image, "."]
        log(f"[build_image] {' '.join(command)}")
        subprocess.run(command, cwd=Path(tmp) / "ctx", check=True)
    image_id = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", image],
                              capture_output=True, text=True, check=True).stdout.strip()
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "digest": image_id, "size": 0},
        "layers": [],
    }, sort_keys=True)
    for tag in (context.tag, marker):
        ecr.put_image(repositoryName=repo.name, imageManifest=manifest, imageTag=tag)


def _codebuild(req: BuildRequest, region: str, context: ctx.BuildContext,
               repo: ecr_mod.Repository, marker: str, run_tags: dict[str, str],
               base_image: str | None, record: Callable[[resources.AwsResource], None],
               log: Callable[[str], None], ectx: ExecutionContext) -> None:
    if not req.s3_uri:
        raise UserError("s3_uri", "CodeBuild needs an S3 location for the build context.",
                        "pass s3_uri=s3://<bucket>/<prefix>.")
    bucket, prefix = split_s3_uri(req.s3_uri)
    prefix = prefix.strip("/")
    key = "/".join(p for p in (prefix, "build-contexts", f"{context.tag}.zip") if p)
    body = ctx.write_zip(context)
    s3 = client("s3", region)
    s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/zip",
                  Tagging=urllib.parse.urlencode(run_tags))
    record(resources.AwsResource(resources.S3_PREFIX, f"s3://{bucket}/{key}", name=key,
                                 region=region))
    log(f"[build_image] build context: {len(context.files)} files, {context.total_bytes} bytes "
        f"-> s3://{bucket}/{key} ({len(body)} bytes zipped)")

    codebuild = client("codebuild", region)
    project_tags = {**run_tags, tags.CREATED_KEY: run_tags[tags.RUN_ID_KEY]}
    project_arn, created = cb.ensure_project(
        codebuild, req.codebuild_project, source_location=f"{bucket}/{key}",
        role_arn=req.codebuild_role_arn, compute_type=req.codebuild_compute_type,
        timeout_minutes=req.timeout_minutes, project_tags=project_tags)
    log(f"[build_image] CodeBuild project {req.codebuild_project} "
        f"{'created' if created else 'reused'}")
    if created:
        record(resources.AwsResource(cb.CODEBUILD_PROJECT, project_arn,
                                     name=req.codebuild_project, region=region))
    target = cb.BuildTarget(
        context_location=f"{bucket}/{key}",
        dockerfile=context.dockerfile,
        build_args=context.build_args,
        image=f"{repo.uri}:{context.tag}",
        marker_image=f"{repo.uri}:{marker}",
        base_registry=ecr_registry_of(base_image) if base_image else None,
        target_registry=(repo.registry, region),
    )
    def record_build(build: dict[str, Any]) -> None:
        record(resources.AwsResource(
            resources.CODEBUILD_BUILD, str(build.get("arn", build["id"])),
            name=str(build["id"]), region=region,
            consoleUri=(f"https://{region}.console.aws.amazon.com/codesuite/codebuild/"
                        f"projects/{req.codebuild_project}/build/"
                        f"{urllib.parse.quote(str(build['id']), safe='')}")))

    # The termination handler is in place since before the first AWS call; StartBuild is
    # sent through the remote-job runner (refused when a termination came first, the
    # build stopped right after it when one came meanwhile), which then follows it.
    runner = cb.build_runner(codebuild, client("logs", region),
                             poll_interval_s=req.poll_interval_seconds, log=log, ctx=ectx)
    build = cb.running_build_for(codebuild, req.codebuild_project, target.image)
    if build:
        log(f"[build_image] re-attaching to running build {build['id']}")
        record_build(build)
    else:
        def start() -> dict[str, Any]:
            started = cb.start_build(codebuild, req.codebuild_project, target,
                                     run_id=req.run_id, role_arn=req.codebuild_role_arn,
                                     compute_type=req.codebuild_compute_type,
                                     timeout_minutes=req.timeout_minutes)
            log(f"[build_image] started CodeBuild build {started['id']}")
            record_build(started)  # recorded before a termination could stop it
            return started

        build = cb.start_with(runner, start, req.codebuild_project, region)
    final = cb.wait_for_build(codebuild, client("logs", region), build,
                              req.codebuild_project, poll_interval_s=req.poll_interval_seconds,
                              log=log, ctx=ectx, runner=runner)
    if final["buildStatus"] != "SUCCEEDED":
        raise RuntimeError(
            f"CodeBuild build {final['id']} ended {final['buildStatus']}: "
            f"{cb.failure_summary(final)}. Its log is in CloudWatch Logs group "
            f"{build_marks.build_log_location(final, req.codebuild_project)[0]}."
        )


# ---- the whole step ----

def context_root(req: BuildRequest) -> Path:
    """The build context folder: ``context_dir``, else the package's source checkout.

    Looked for at ``$KFP_SAGEMAKER_SOURCE_DIR``, this file's checkout, the wheel's
    data directory (``share/kfp-sagemaker-blackwell``: the Dockerfiles and the
    trainer's sources), then the working directory (the components image's WORKDIR).
    """
    if req.context_dir:
        candidates = [Path(req.context_dir)]
    else:  # $KFP_SAGEMAKER_SOURCE_DIR, the checkout, the wheel's data (common/shipped.py)
        candidates = [*shipped.roots(), Path.cwd()]
    for root in candidates:
        if (root / req.dockerfile).is_file():
            return root
    raise UserError(
        "dockerfile", f"{req.dockerfile} was not found under "
        f"{', '.join(str(c) for c in candidates)}.",
        "pass context_dir (the folder holding the Dockerfile and the files it copies), or set "
        f"{SOURCE_DIR_ENV} to this package's source checkout.")


def plan_context(
    req: BuildRequest, *, log: Callable[[str], None] = print,
    lookup: Callable[[str, str], str] = lookup_dlc,
) -> ctx.BuildContext:
    """Hashes the build context of a checked request: everything before any AWS call."""
    root = context_root(req)
    dockerfile_path = root / req.dockerfile
    build_args = dict(req.build_args)
    if declares_arg(dockerfile_path.read_text(encoding="utf-8"), BASE_IMAGE_ARG) and (
            BASE_IMAGE_ARG not in build_args):
        region = "" if req.base_image else resolve_region(req.region or None)
        build_args[BASE_IMAGE_ARG] = resolve_base_image(req, region, lookup)
        log(f"[build_image] base image: {build_args[BASE_IMAGE_ARG]}")
    context = ctx.collect(root, req.dockerfile, build_args, list(req.context_paths) or None)
    log(f"[build_image] build context {context.tag}: {len(context.files)} files, "
        f"{context.total_bytes} bytes")
    return context


def build_image(
    req: BuildRequest,
    *,
    log: Callable[[str], None] = print,
    on_resources: Callable[[list[resources.AwsResource]], None] | None = None,
    lookup: Callable[[str, str], str] = lookup_dlc,
    docker_ok: Callable[[], bool] = docker_daemon_available,
) -> BuildResult:
    """Builds ``req.dockerfile`` into ``req.repository`` unless the content tag exists.

    SIGTERM/SIGINT are handled from before the first AWS call on: a running build
    is stopped and ``codebuild.BuildStopped`` (a ``Terminated``) raised.
    """
    with ExecutionContext("build_image") as ectx:
        return _build_image(req, ectx, log=log, on_resources=on_resources, lookup=lookup,
                            docker_ok=docker_ok)


def _build_image(
    req: BuildRequest,
    ectx: ExecutionContext,
    *,
    log: Callable[[str], None],
    on_resources: Callable[[list[resources.AwsResource]], None] | None,
    lookup: Callable[[str, str], str],
    docker_ok: Callable[[], bool],
) -> BuildResult:
    context = plan_context(req, log=log, lookup=lookup)
    region = resolve_region(req.region or None)
    base_image = dict(context.build_args).get(BASE_IMAGE_ARG)
    run_tags = req.run_tags

    recorded: list[resources.AwsResource] = []

    def record(resource: resources.AwsResource) -> None:
        recorded.append(resource)
        if on_resources:
            on_resources(list(recorded))

    ectx.check("before any AWS call: nothing was created")
    ecr = client("ecr", region)
    repo = ecr_mod.ensure_repository(
        ecr, req.repository, {**run_tags, tags.CREATED_KEY: run_tags[tags.RUN_ID_KEY]})
    log(f"[build_image] ECR repository {repo.uri} {'created' if repo.created else 'exists'}")
    if repo.created:
        record(resources.AwsResource(ecr_mod.ECR_REPOSITORY, repo.arn, name=repo.name,
                                     region=region))
    tag_uri = f"{repo.uri}:{context.tag}"
    digest = ecr_mod.image_digest(ecr, repo.name, context.tag)
    if digest:
        message = f"{tag_uri} is already in ECR ({digest}): nothing to build."
        log(f"[build_image] {message}")
        return BuildResult(ecr_mod.image_uri(repo.uri, context.tag, digest), tag_uri, digest,
                           "reused", message, context, recorded)

    local = is_local_endpoint(ecr)
    builder = choose_builder(req.builder, local, docker_ok)
    marker = build_marks.run_marker(req.run_id, context.tag)
    if builder == "docker" and not local:
        raise UserError("builder", "builder=docker builds with a local Docker daemon and only "
                        "records the image in the local backend's ECR; it cannot push to AWS.",
                        "use builder=codebuild (or auto) against AWS.")
    if builder == "none":
        why = "the local backend has no Docker daemon" if local else "builder=none was asked for"
        message = (
            f"NOT BUILT: {why}, so {tag_uri} was not built and is not in ECR. The URI is the "
            "content-addressed one a build would push; the local training executor runs the "
            "trainer from the checkout, not from this image."
        )
        log(f"[build_image] {message}")
        return BuildResult(tag_uri, tag_uri, "", "not-built", message, context, recorded)
    if builder == "docker":
        _docker_build_local(context, ecr, repo, marker, log)
    else:
        _codebuild(req, region, context, repo, marker, run_tags, base_image, record, log, ectx)
    digest = ecr_mod.image_digest(ecr, repo.name, context.tag)
    if not digest:
        raise RuntimeError(
            f"the {builder} build succeeded but {tag_uri} is not in ECR: the push step did not "
            "push the content tag; read the build log above."
        )
    uri = ecr_mod.image_uri(repo.uri, context.tag, digest)
    record(resources.AwsResource(resources.ECR_IMAGE, uri, name=f"{repo.name}:{context.tag}",
                                 region=region, extra={"runMarkerTag": marker}))
    message = f"built and pushed {tag_uri} ({digest}) with {builder}."
    log(f"[build_image] {message}")
    return BuildResult(uri, tag_uri, digest, "built", message, context, recorded)
