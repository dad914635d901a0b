"""The ``aws_resources`` record: what a component created, written as soon as it exists.

Like GCPC's ``gcp_resources``, it is a JSON string output parameter::

    {"resources": [{"resourceType": "SageMakerTrainingJob",
                    "resourceUri": "arn:aws:sagemaker:us-west-2:123:training-job/name",
                    "name": "name", "region": "us-west-2",
                    "consoleUri": "https://..."}]}

Written before anything can fail, so that cleanup and a human can find the job.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from kfp_sagemaker_blackwell.common.documents import check_keys
from kfp_sagemaker_blackwell.common.errors import UserError

TRAINING_JOB = "SageMakerTrainingJob"
ECR_IMAGE = "EcrImage"
CODEBUILD_BUILD = "CodeBuildBuild"
S3_PREFIX = "S3Prefix"


@dataclass(frozen=True)
class AwsResource:
    resourceType: str
    resourceUri: str
    name: str = ""
    region: str = ""
    consoleUri: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def training_job_console_uri(region: str, job_name: str) -> str:
    return (
        f"https://{region}.console.aws.amazon.com/sagemaker/home?region={region}"
        f"#/jobs/{job_name}"
    )


def dumps(resources: list[AwsResource]) -> str:
    return json.dumps({"resources": [asdict(r) for r in resources]}, sort_keys=True)


FIX = ('pass the aws_resources record a component wrote: {"resources": [{"resourceType": '
       '..., "resourceUri": ..., ...}]}.')


def loads(text: str, fld: str = "aws_resources") -> list[AwsResource]:
    """The record in ``text``; a UserError naming ``fld`` (the parameter it came in) when
    it is not JSON, not such a record, or an entry has a key AwsResource does not know
    (named with its close matches and the accepted keys: ``documents.check_keys``)."""
    if not text.strip():
        return []
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise UserError(fld, "is not valid JSON.", FIX) from None
    entries = check_keys(data, ["resources"], field=fld, what="the record",
                         fix=FIX).get("resources", [])
    if not isinstance(entries, list):
        raise UserError(fld, f"'resources' is {type(entries).__name__}, not a list.", FIX)
    accepted = [f.name for f in fields(AwsResource)]
    return [AwsResource(**check_keys(item, accepted, field=fld, what=f"resources[{i}]",
                                     fix=FIX, required=("resourceType", "resourceUri")))
            for i, item in enumerate(entries)]


def write(path: str, resources: list[AwsResource]) -> None:
    """Writes the record atomically (a crash never leaves half a file)."""
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(dumps(resources))
    os.replace(tmp, path)


def check_writable(path: str, fld: str) -> None:
    """A UserError naming ``fld`` unless a file can be written at ``path`` (its directory is
    made, and a probe file written in it and removed): run before the first AWS call, so
    that an output that cannot be written fails before anything exists, not after."""
    problem = ""
    if os.path.isdir(path):
        problem = "is a directory"
    else:
        directory = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(directory, exist_ok=True)
            fd, probe = tempfile.mkstemp(dir=directory, prefix=".write-check-")
            os.close(fd)
            os.unlink(probe)
            if os.path.exists(path) and not os.access(path, os.W_OK):
                problem = "exists and is not writable"
        except OSError as exc:
            problem = f"cannot be written ({exc.strerror or exc})"
    if problem:
        raise UserError(fld, f"{path} {problem}; nothing was created.",
                        "pass a file path in a writable directory.")


def read(path: str) -> list[AwsResource]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return loads(f.read())
