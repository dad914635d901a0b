"""KFP definition of the image build (the work is in ``launcher``).

The base image is the AWS PyTorch training Deep Learning Container of the
region (``pytorch-training:2.9.0-gpu-py312-cu130-ubuntu22.04-sagemaker``),
found with the SageMaker SDK's image-URI lookup (package ``sagemaker-core``),
passed as ``--build-arg BASE_IMAGE`` to Dockerfiles that declare it.

On the local backend nothing is sent to CodeBuild: the image is built with a
local Docker daemon when one answers, otherwise it is NOT built and the step
returns the content-addressed URI in the local ECR and says so (the local
training executor runs the trainer from the checkout, not from an image).

See https://docs.aws.amazon.com/codebuild/latest/APIReference/API_StartBuild.html
and iam/README.md for the permissions (pod, CodeBuild service role).
"""

from typing import NamedTuple

from kfp.dsl import OutputPath

from kfp_sagemaker_blackwell.common.component import component


@component(aws=True, retries=2)  # a retry re-attaches to its build; skipped when the tag exists
def build_image(
    run_id: str,
    aws_resources: OutputPath(str),  # type: ignore[valid-type]
    s3_uri: str = "",
    region: str = "",
    repository: str = "kfp-sagemaker-blackwell/trainer",
    dockerfile: str = "images/trainer/Dockerfile",
    context_dir: str = "",
    context_paths: list = [],  # noqa: B006 (KFP default)
    build_args: dict = {},  # noqa: B006 (KFP default)
    base_image: str = "",
    base_image_tag: str = "2.9.0-gpu-py312-cu130-ubuntu22.04-sagemaker",
    instance_type: str = "ml.p6-b200.48xlarge",
    builder: str = "auto",
    codebuild_project: str = "kfp-sagemaker-blackwell-image-build",
    codebuild_role_arn: str = "",
    codebuild_compute_type: str = "BUILD_GENERAL1_LARGE",
    timeout_minutes: int = 120,
    pipeline: str = "",
    tags: dict = {},  # noqa: B006 (KFP default)
    poll_interval_seconds: float = 15.0,
) -> NamedTuple(  # type: ignore[valid-type]
    "Outputs", [("image_uri", str), ("built", bool), ("outcome", str)]
):
    """Builds the trainer image (or any Dockerfile in this package) and pushes it to ECR, once.

    The image tag is a hash of the build context: the Dockerfile, the files its
    COPY/ADD instructions read (``trainer/`` for the trainer image) and the build
    arguments, ignoring caches and bytecode, the same on every machine. When that
    tag is already in the ECR repository nothing is built and the existing image is
    returned, so re-running a pipeline costs nothing. Otherwise the context is
    zipped to ``s3_uri`` and built by AWS CodeBuild (no Docker daemon needed in the
    pod): a privileged build that logs in to the base image's registry and to ECR,
    builds and pushes; its log is streamed into this step's log, a Terminate stops
    the build, a retried step re-attaches to a build still running. The ECR
    repository is created when missing (scan on push, tagged with the run id).

    Args:
        run_id: The KFP run id (``dsl.PIPELINE_JOB_ID_PLACEHOLDER``): tags the
            repository, build context and CodeBuild project; cleanup finds them by it.
        s3_uri: ``s3://bucket/prefix`` for the build context zip
            (``<prefix>/build-contexts/<tag>.zip``); needed only when CodeBuild builds.
        region: AWS region (default: the pod's AWS_REGION).
        repository: ECR repository name (created when missing).
        dockerfile: Dockerfile path relative to ``context_dir``
            (``images/components/Dockerfile`` builds the components image).
        context_dir: Build context folder; default: this package's checkout.
        context_paths: Files/folders the build reads, when the Dockerfile's
            COPY/ADD sources cannot be read from it (variables in paths).
        build_args: Extra ``--build-arg`` values (part of the hash).
        base_image: Full base image URI; overrides the DLC lookup.
        base_image_tag: Tag of the DLC to use; empty = the SDK's own tag.
        instance_type: Training instance type the DLC is looked up for.
        builder: ``auto`` (CodeBuild on AWS; Docker or nothing locally),
            ``codebuild``, ``docker`` (local backend only) or ``none``.
        codebuild_project: CodeBuild project (created when missing, then reused).
        codebuild_role_arn: CodeBuild service role; needed to create the project
            (iam/codebuild-service-policy.json).
        codebuild_compute_type: BUILD_GENERAL1_LARGE suits the ~20 GB DLC base.
        timeout_minutes: CodeBuild build timeout.
        pipeline: Pipeline name for the tags.
        tags: Extra tags for what this step creates.
        poll_interval_seconds: Seconds between BatchGetBuilds polls.

    Returns:
        image_uri: ``<repo>@sha256:<digest>`` when the image is in ECR (built or
            reused), else ``<repo>:ctx-<hash>`` (not built).
        built: True when this step built and pushed the image.
        outcome: ``built``, ``reused`` or ``not-built``.
        aws_resources: JSON record of what this step created (repository, build
            context, CodeBuild project and build, image), written as each appears.
    """
    from collections import namedtuple

    from kfp_sagemaker_blackwell.common import resources
    from kfp_sagemaker_blackwell.common.execution_context import TERMINATED_EXIT_CODE, Terminated
    from kfp_sagemaker_blackwell.components.build_image.launcher import BuildRequest
    from kfp_sagemaker_blackwell.components.build_image.launcher import build_image as run_build

    resources.write(aws_resources, [])  # the record exists before anything can fail
    # every parameter but the output, by its name (tests/test_declarations.py holds them)
    request = BuildRequest(
        run_id=run_id,
        s3_uri=s3_uri,
        region=region,
        repository=repository,
        dockerfile=dockerfile,
        context_dir=context_dir,
        context_paths=context_paths,
        build_args=build_args,
        base_image=base_image,
        base_image_tag=base_image_tag,
        instance_type=instance_type,
        builder=builder,
        codebuild_project=codebuild_project,
        codebuild_role_arn=codebuild_role_arn,
        codebuild_compute_type=codebuild_compute_type,
        timeout_minutes=timeout_minutes,
        pipeline=pipeline,
        tags=tags,
        poll_interval_seconds=poll_interval_seconds,
    ).validate()
    try:
        result = run_build(
            request, on_resources=lambda recorded: resources.write(aws_resources, recorded))
    except Terminated as exc:  # the message says whether the build's stop was accepted
        print(f"error: {exc}", flush=True)
        raise SystemExit(TERMINATED_EXIT_CODE) from None
    resources.write(aws_resources, result.resources)
    Outputs = namedtuple("Outputs", ["image_uri", "built", "outcome"])
    return Outputs(result.image_uri, result.built, result.outcome)
