"""``python -m components.build_image``: build an image with CodeBuild (or reuse it) from a laptop.

Examples::

    # the trainer image, in the pipeline's account and region
    python -m components.build_image --run-id manual-2026-11-29 \\
        --s3-uri s3://my-bucket/kfp-sagemaker --codebuild-role-arn arn:aws:iam::123456789012:role/kfp-sagemaker-codebuild

    # the components image (its tag must be the package version: see images/components/Dockerfile)
    python -m components.build_image --run-id manual-1 --dockerfile images/components/Dockerfile \\
        --repository kfp-sagemaker-blackwell/components --s3-uri s3://my-bucket/kfp-sagemaker

    # just print the content-addressed tag (no AWS call)
    python -m components.build_image --run-id x --print-tag --base-image example.com/base:1
"""

from __future__ import annotations

import argparse
import json
import sys

from components.build_image import build as b
from components.common.cli import key_values
from components.common.errors import USER_ERROR_EXIT_CODE, UserError
from components.common.execution_context import TERMINATED_EXIT_CODE, Terminated


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m components.build_image",
        description="Build an image from this package's checkout with AWS CodeBuild and push it "
        "to ECR, unless its content-addressed tag (a hash of the Dockerfile, the files it "
        "copies and the build args) is already there. Prints the result as JSON.",
        epilog=__doc__.split("Examples::", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-id", required=True, help="tags what is created; cleanup finds it by it")
    p.add_argument("--s3-uri", default="", help="s3://bucket/prefix for the build context zip")
    p.add_argument("--region", default="", help="default: AWS_REGION")
    p.add_argument("--repository", default=b.DEFAULT_REPOSITORY, help="ECR repository")
    p.add_argument("--dockerfile", default=b.DEFAULT_DOCKERFILE,
                   help="relative to --context-dir (default %(default)s)")
    p.add_argument("--context-dir", default="", help="default: this package's checkout")
    p.add_argument("--context-path", action="append", default=[], dest="context_paths",
                   help="a file/folder the build reads (repeatable); default: from COPY/ADD")
    p.add_argument("--build-arg", action="append", default=[], dest="build_args",
                   metavar="KEY=VALUE", help="extra docker build argument (repeatable)")
    p.add_argument("--base-image", default="", help="full base image URI (skips the DLC lookup)")
    p.add_argument("--base-image-tag", default=b.DLC_TAG,
                   help="DLC tag (default %(default)s); '' = the SageMaker SDK's own")
    p.add_argument("--instance-type", default=b.DEFAULT_INSTANCE_TYPE)
    p.add_argument("--builder", default="auto", choices=b.BUILDERS)
    p.add_argument("--codebuild-project", default=b.DEFAULT_PROJECT)
    p.add_argument("--codebuild-role-arn", default="",
                   help="service role, needed to create the project the first time")
    p.add_argument("--codebuild-compute-type", default=b.DEFAULT_COMPUTE_TYPE)
    p.add_argument("--timeout-minutes", type=int, default=b.DEFAULT_TIMEOUT_MINUTES)
    p.add_argument("--pipeline", default="manual", help="pipeline name for the tags")
    p.add_argument("--tag", action="append", default=[], dest="tags", metavar="KEY=VALUE",
                   help="extra resource tag (repeatable)")
    p.add_argument("--poll-interval", type=float, default=15.0, help="seconds")
    p.add_argument("--print-tag", action="store_true",
                   help="only print the content-addressed tag and the files hashed; no AWS call")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        req = b.BuildRequest(
            run_id=args.run_id, region=args.region, s3_uri=args.s3_uri,
            repository=args.repository, dockerfile=args.dockerfile, context_dir=args.context_dir,
            context_paths=args.context_paths,
            build_args=key_values("--build-arg", args.build_args),
            base_image=args.base_image, base_image_tag=args.base_image_tag,
            instance_type=args.instance_type, builder=args.builder,
            codebuild_project=args.codebuild_project, codebuild_role_arn=args.codebuild_role_arn,
            codebuild_compute_type=args.codebuild_compute_type,
            timeout_minutes=args.timeout_minutes, pipeline=args.pipeline,
            extra_tags=key_values("--tag", args.tags), poll_interval_s=args.poll_interval)
        if args.print_tag:
            context = b.plan_context(req, log=lambda line: print(line, file=sys.stderr))
            print(json.dumps({"tag": context.tag, "files": [f.path for f in context.files],
                              "build_args": dict(context.build_args)}, indent=2))
            return 0
        result = b.build_image(req, log=lambda line: print(line, file=sys.stderr, flush=True))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    except Terminated as exc:  # SIGTERM/SIGINT: the running build was stopped
        print(f"error: {exc}", file=sys.stderr)
        return TERMINATED_EXIT_CODE
    print(json.dumps({"image_uri": result.image_uri, "tag_uri": result.tag_uri,
                      "digest": result.digest, "outcome": result.outcome,
                      "message": result.message}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
