"""SageMaker's facts the sides share: its default stopping condition and what an image
reference is.

The launcher, the local backend (which answers as SageMaker does) and the pipelines read
``MAX_RUNTIME_SECONDS``; the components image setting, the training launcher and the
local backend read an image reference with ``parse_image``, one grammar for all three.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# StoppingCondition.MaxRuntimeInSeconds when the request has none (CreateTrainingJob's API
# reference): one day. The training component's default too.
MAX_RUNTIME_SECONDS = 86400

# One repository path component, ECR's grammar (CreateRepository's repositoryName:
# lower-case letters and digits, separated by one of . _ -); components are joined by /.
_NAME = r"[a-z0-9]+(?:[._-][a-z0-9]+)*"
# <registry host>[:<port>]/<repository>[:<tag>][@sha256:<digest>], the Docker reference
# grammar (distribution/reference) with ECR's repository names; tags as Docker's.
IMAGE_REFERENCE_RE = re.compile(
    r"^(?P<host>[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?(?::\d+)?)"
    rf"/(?P<repository>{_NAME}(?:/{_NAME})*)"
    r"(?::(?P<tag>\w[\w.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")
# A private Amazon ECR registry: <account>.dkr.ecr.<region>.amazonaws.com[.cn].
ECR_HOST_RE = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$")


@dataclass(frozen=True)
class ImageReference:
    host: str  # the registry, with its port when it has one
    repository: str
    tag: str = ""
    digest: str = ""  # sha256:<64 hex digits>
    account: str = ""  # a private ECR registry's account and region, else ""
    region: str = ""

    @property
    def in_ecr(self) -> bool:
        return bool(self.account)


def parse_image(reference: str) -> ImageReference | None:
    """The parts of an image reference, or None when ``reference`` is not one."""
    m = IMAGE_REFERENCE_RE.match(reference or "")
    if m is None:
        return None
    ecr = ECR_HOST_RE.match(m["host"])
    return ImageReference(m["host"], m["repository"], m["tag"] or "", m["digest"] or "",
                          ecr["account"] if ecr else "", ecr["region"] if ecr else "")
