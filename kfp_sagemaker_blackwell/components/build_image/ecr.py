"""The ECR side of an image build: the repository, and whether a tag is already there.

ECR images cannot carry resource tags, so an image pushed by a run also gets a
second image tag, the run marker (``kfp_sagemaker_blackwell.common.build_marks``): that is how
cleanup finds the images a run pushed (and only those). The repository
itself carries the run's tags, plus ``kfp-sagemaker:created-by-run`` when this
run created it, so that cleanup deletes a repository only if its run made it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kfp_sagemaker_blackwell.common import tags
from kfp_sagemaker_blackwell.common.aws import error_code
from kfp_sagemaker_blackwell.common.errors import UserError

# ECR's own rules (CreateRepository): 2-256 characters, lowercase path segments.
REPOSITORY_RE = re.compile(r"^(?=.{2,256}$)(?:[a-z0-9]+(?:[._-][a-z0-9]+)*/)*[a-z0-9]+(?:[._-][a-z0-9]+)*$")
ECR_REPOSITORY = "EcrRepository"


def validate_repository(name: str) -> str:
    if not REPOSITORY_RE.match(name or ""):
        raise UserError(
            "repository",
            f"{name!r} is not a valid ECR repository name.",
            "use 2-256 lowercase letters, digits and . _ - / (e.g. kfp-sagemaker-blackwell/trainer).",
        )
    return name


@dataclass(frozen=True)
class Repository:
    name: str
    uri: str  # <account>.dkr.ecr.<region>.amazonaws.com/<name>
    arn: str
    created: bool  # by this call

    @property
    def registry(self) -> str:
        return self.uri.split("/", 1)[0]


def ensure_repository(ecr: Any, name: str, repo_tags: dict[str, str]) -> Repository:
    """Returns the repository, creating it (scan on push, tagged) when it is missing."""
    try:
        found = ecr.describe_repositories(repositoryNames=[name])["repositories"][0]
        return Repository(name, found["repositoryUri"], found["repositoryArn"], created=False)
    except Exception as exc:
        if error_code(exc) != "RepositoryNotFoundException":
            raise
    try:
        made = ecr.create_repository(
            repositoryName=name,
            imageScanningConfiguration={"scanOnPush": True},
            imageTagMutability="MUTABLE",  # the run marker may move; content tags never do
            tags=tags.as_key_value(repo_tags),
        )["repository"]
    except Exception as exc:  # another run created it between our two calls
        if error_code(exc) != "RepositoryAlreadyExistsException":
            raise
        return ensure_repository(ecr, name, repo_tags)
    return Repository(name, made["repositoryUri"], made["repositoryArn"], created=True)


def image_digest(ecr: Any, repository: str, tag: str) -> str | None:
    """The digest of ``repository:tag``, or None when that tag is not in ECR."""
    try:
        details = ecr.describe_images(repositoryName=repository, imageIds=[{"imageTag": tag}])
    except Exception as exc:
        if error_code(exc) in ("ImageNotFoundException", "RepositoryNotFoundException"):
            return None
        raise
    images = details.get("imageDetails", [])
    return str(images[0]["imageDigest"]) if images else None


def image_uri(repository_uri: str, tag: str, digest: str | None) -> str:
    """``repo@sha256:...`` when the digest is known (immutable, what SageMaker should run),
    else ``repo:tag``."""
    return f"{repository_uri}@{digest}" if digest else f"{repository_uri}:{tag}"
