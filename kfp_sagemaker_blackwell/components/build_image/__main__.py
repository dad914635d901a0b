"""``python -m kfp_sagemaker_blackwell.components.build_image``: build an image with CodeBuild (or reuse it) from a laptop.

Builds an image from this package's checkout with AWS CodeBuild and pushes it to
ECR, unless its content-addressed tag (a hash of the Dockerfile, the files it
copies and the build args) is already there. Prints the result as JSON. The
flags and their defaults are the build_image component's parameters.

Examples::

    # the trainer image, in the pipeline's account and region
    python -m kfp_sagemaker_blackwell.components.build_image --run-id manual-2026-11-29 \\
        --s3-uri s3://my-bucket/kfp-sagemaker --codebuild-role-arn arn:aws:iam::123456789012:role/kfp-sagemaker-codebuild

    # the components image (its tag must be the package version: see images/components/Dockerfile)
    python -m kfp_sagemaker_blackwell.components.build_image --run-id manual-1 --dockerfile images/components/Dockerfile \\
        --pipeline manual --repository kfp-sagemaker-blackwell/components --s3-uri s3://my-bucket/kfp-sagemaker

    # just print the content-addressed tag (no AWS call)
    python -m kfp_sagemaker_blackwell.components.build_image --run-id x --print-tag --base-image example.com/base:1
"""

from __future__ import annotations

import argparse
import json
import sys

from kfp_sagemaker_blackwell.common import cli
from kfp_sagemaker_blackwell.common.errors import (
    AWS_UNREACHABLE_EXIT_CODE,
    cli_errors,
)
from kfp_sagemaker_blackwell.common.execution_context import (
    AwsUnreachable,
)
from kfp_sagemaker_blackwell.components.build_image import launcher as b

# The component's signature, read from its source: importing component.py would import kfp
# (0.4 s at every start) for a parser.
COMPONENT = "kfp_sagemaker_blackwell.components.build_image.component:build_image"

# Old spellings, still accepted with a deprecation message.
ALIASES = {"--context-path": "context_paths", "--build-arg": "build_args", "--tag": "tags",
           "--pipeline-name": "pipeline", "--poll-interval": "poll_interval_seconds"}


def build_parser() -> tuple[argparse.ArgumentParser, list[cli.Parameter]]:
    p, params = cli.derived_parser(COMPONENT, doc=__doc__, aliases=ALIASES)
    p.add_argument("--print-tag", action="store_true",
                   help="only print the content-addressed tag and the files hashed; no AWS call")
    return p, params


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args, values = cli.parse(build_parser(), argv)
    try:
        req = b.BuildRequest.from_parameters(values)
        if args.print_tag:
            context = b.plan_context(req, log=lambda line: print(line, file=sys.stderr))
            print(json.dumps({"tag": context.tag, "files": [f.path for f in context.files],
                              "build_args": dict(context.build_args)}, indent=2))
            return 0
        result = b.build_image(req, log=lambda line: print(line, file=sys.stderr, flush=True))
    except AwsUnreachable as exc:  # the build may still run: a re-run re-attaches to it
        print(f"error: {exc}. The build may still be running; re-run this command to "
              "re-attach to it.", file=sys.stderr)
        return AWS_UNREACHABLE_EXIT_CODE
    print(json.dumps({"image_uri": result.image_uri, "tag_uri": result.tag_uri,
                      "digest": result.digest, "outcome": result.outcome,
                      "message": result.message}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
