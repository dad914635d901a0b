"""The one place that creates AWS clients.

Every AWS call in this project goes through ``client()``: boto3 with botocore's
retry modes, the region from the argument or the environment, and the endpoint
from ``AWS_ENDPOINT_URL`` (boto3 honours it natively), which is how the local
backend (``python -m kfp_sagemaker_blackwell.local_backend serve``) stands in for AWS.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, overload

from kfp_sagemaker_blackwell.common.errors import UserError

if TYPE_CHECKING:  # boto3 is an optional dependency (extra "aws"); the stubs: extra "dev"
    from botocore.config import Config
    from botocore.exceptions import HTTPClientError
    from mypy_boto3_codebuild import CodeBuildClient
    from mypy_boto3_ecr import ECRClient
    from mypy_boto3_iam import IAMClient
    from mypy_boto3_logs import CloudWatchLogsClient
    from mypy_boto3_resourcegroupstaggingapi import ResourceGroupsTaggingAPIClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sagemaker import SageMakerClient

DEFAULT_MAX_ATTEMPTS = 10
DEFAULT_RETRY_MODE = "adaptive"  # client-side rate limiting on throttling, on top of "standard"
# Clients that follow remote work (polls, log tails): no botocore retries (the loop rides
# out an outage itself, looking at the termination flag between attempts; botocore's own
# back-off, up to minutes, would hide it) and timeouts short enough that a SIGTERM
# arriving during a call is looked at within seconds. botocore's ``max_attempts`` counts
# retries after the first call: 0 is one call (botocore/config.py, Config's ``retries`` doc:
# "setting this value to 0 will result in no retries ever being attempted after the initial
# request"; ``total_max_attempts`` would count the first call).
FOLLOW_CLIENT: dict[str, Any] = {"max_attempts": 0, "connect_timeout": 3, "read_timeout": 15}
# botocore's names for a request that never got an answer (connection refused, reset, timed out).
TRANSIENT_ERRORS = frozenset({"EndpointConnectionError", "ConnectionClosedError",
                              "ReadTimeoutError", "ConnectTimeoutError", "ConnectionError",
                              "ProxyConnectionError", "HTTPClientError", "TruncatedResponse"})
TRANSIENT_CODES = frozenset({"InternalFailure", "InternalServerError", "ServiceUnavailable",
                             "InternalError"})


def resolve_region(region: str | None = None) -> str:
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region:
        raise UserError(
            "region",
            "no AWS region given and neither AWS_REGION nor AWS_DEFAULT_REGION is set.",
            "pass region (e.g. us-west-2) or export AWS_REGION.",
        )
    return region


@functools.cache
def known_regions(service: str) -> frozenset[str]:
    """Every region of every partition where botocore's endpoint data has ``service``."""
    import botocore.session

    session = botocore.session.get_session()
    session.register_component("data_loader", _shared_loader())
    return frozenset(
        r for partition in session.get_available_partitions()
        for r in session.get_available_regions(service, partition_name=partition))


def check_region(region: str, service: str) -> str:
    """``region`` if botocore knows ``service`` there; else a UserError (before any call,
    instead of connection errors after ten retries)."""
    regions = known_regions(service)
    if regions and region not in regions:
        import difflib

        close = difflib.get_close_matches(region, sorted(regions), n=3)
        raise UserError("region", f"{region!r} is not a region where botocore knows "
                        f"{service}.", f"use one of {', '.join(close or sorted(regions)[:5])}"
                        " (or update botocore if the region is new).")
    return region


def client_config(
    max_attempts: int = DEFAULT_MAX_ATTEMPTS, retry_mode: str = DEFAULT_RETRY_MODE, **kwargs: Any
) -> Config:
    from botocore.config import Config

    return Config(
        retries={"max_attempts": max_attempts, "mode": retry_mode},  # type: ignore[arg-type]
        user_agent_extra="kfp-sagemaker-blackwell",
        **kwargs,
    )


@overload
def client(service: Literal["s3"], region: str | None = None, **kwargs: Any) -> S3Client: ...
@overload
def client(service: Literal["sagemaker"], region: str | None = None,
           **kwargs: Any) -> SageMakerClient: ...
@overload
def client(service: Literal["logs"], region: str | None = None,
           **kwargs: Any) -> CloudWatchLogsClient: ...
@overload
def client(service: Literal["ecr"], region: str | None = None, **kwargs: Any) -> ECRClient: ...
@overload
def client(service: Literal["iam"], region: str | None = None, **kwargs: Any) -> IAMClient: ...
@overload
def client(service: Literal["codebuild"], region: str | None = None,
           **kwargs: Any) -> CodeBuildClient: ...
@overload
def client(service: Literal["resourcegroupstaggingapi"], region: str | None = None,
           **kwargs: Any) -> ResourceGroupsTaggingAPIClient: ...
@overload
def client(service: str, region: str | None = None, **kwargs: Any) -> Any: ...


def client(
    service: str,
    region: str | None = None,
    *,
    endpoint_url: str | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    retry_mode: str = DEFAULT_RETRY_MODE,
    **config_kwargs: Any,
) -> Any:
    """A boto3 client with the project's retry policy.

    ``endpoint_url`` overrides ``AWS_ENDPOINT_URL``/``AWS_ENDPOINT_URL_<SERVICE>``,
    which boto3 reads itself when no explicit endpoint is given.
    """
    try:
        import boto3
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise RuntimeError(
            "boto3 is not installed: pip install 'kfp-sagemaker-blackwell[aws]'"
        ) from exc
    import botocore.session

    # A fresh botocore session per client (credentials and the environment are read
    # anew), sharing one loader: botocore's JSON models (endpoints, the SageMaker
    # service model) are then parsed once per process instead of once per client.
    core = botocore.session.get_session()
    core.register_component("data_loader", _shared_loader())
    session = boto3.session.Session(botocore_session=core, region_name=resolve_region(region))
    made = session.client(  # type: ignore[call-overload]
        service,
        endpoint_url=endpoint_url,
        config=client_config(max_attempts, retry_mode, **config_kwargs),
    )
    made.meta.events.register(
        "before-parameter-build", functools.partial(_record_call, region=made.meta.region_name)
    )
    made.meta.events.register("before-parse", _reject_truncated)
    return made


@functools.cache
def truncated_response_error() -> type[HTTPClientError]:
    """The class of ``_reject_truncated``'s error (botocore is imported only when used)."""
    from botocore.exceptions import HTTPClientError as _HTTPClientError

    class TruncatedResponse(_HTTPClientError):  # a connection error: transient, retried
        fmt = ("the response to {operation} was cut short ({detail}): the connection broke "
               "mid-response, so nothing in it is used")

    return TruncatedResponse


def _reject_truncated(operation_model: Any, response_dict: dict[str, Any], **_: Any) -> None:
    """Raises ``TruncatedResponse`` for a response the connection cut short.

    botocore turns off urllib3's Content-Length check (``enforce_content_length=False`` in
    ``httpsession.py``) and checks the length itself only for streaming bodies, so a
    non-streaming response cut mid-body (an endpoint that died, a proxy that dropped the
    connection) parses without an error into a dict missing its fields: a
    DescribeTrainingJob "succeeds" with no TrainingJobStatus, a BatchGetBuilds with no
    builds. Seen when the local backend was killed -9 while answering: the follower took
    the empty answer for a result instead of riding the outage out. Checked here, before
    the parse: a response with no headers at all or neither Content-Length nor chunked
    framing (cut inside the header block), or a body shorter or longer than its
    Content-Length (HEAD, 204 and 304 have no body to check).
    """
    headers = response_dict.get("headers") or {}
    body = response_dict.get("body")
    detail = ""
    if not headers:
        detail = "no headers"
    elif (isinstance(body, bytes) and response_dict.get("status_code") not in (204, 304)
          and (operation_model.http or {}).get("method") != "HEAD"):
        length = str(headers.get("content-length", ""))
        if length.isdigit() and int(length) != len(body):
            detail = f"{len(body)} of {length} bytes"
        elif not length and "chunked" not in str(headers.get("transfer-encoding", "")).lower():
            # AWS frames every answer (Content-Length, or chunked, which urllib3 checks):
            # neither means the header block itself was cut
            detail = "no Content-Length"
    if detail:
        raise truncated_response_error()(operation=operation_model.name, detail=detail)


@functools.lru_cache(maxsize=1)
def _shared_loader() -> Any:
    from botocore.loaders import create_loader

    return create_loader()


def account_id(region: str | None = None) -> str:
    return str(client("sts", region).get_caller_identity()["Account"])


def is_throttling(exc: BaseException) -> bool:
    return error_code(exc) in {"ThrottlingException", "Throttling", "TooManyRequestsException",
                    "RequestLimitExceeded", "SlowDown"}


def is_transient(exc: BaseException) -> bool:
    """A failure worth retrying: a connection problem, throttling or a 5xx of the service."""
    return (is_throttling(exc) or type(exc).__name__ in TRANSIENT_ERRORS
            or error_code(exc) in TRANSIENT_CODES)


def bounded_client_config(seconds: float) -> dict[str, Any]:
    """``client()`` settings for one call that must end within ``seconds`` (the stop on
    termination): no botocore retries, connect and read timeouts of half of it each."""
    half = max(0.25, float(seconds) / 2)
    return {"max_attempts": 0, "connect_timeout": half, "read_timeout": half}  # one call


def error_code(exc: BaseException) -> str:
    """The AWS error code of a botocore ClientError; "" for anything else (botocore's
    connection errors carry no response, some exceptions carry ``response = None``)."""
    response = getattr(exc, "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    return str(error.get("Code", "")) if isinstance(error, dict) else ""


# ---- Opt-in record of every API call made through client() ----
#
# ``with record_calls() as rec: ...`` then ``rec.calls()``: every call made by a
# client from ``client()`` while the recording is open, in this process or in a
# child process started inside the block (KFP's local runner runs each task in a
# subprocess). The hook is registered on every client but does nothing unless
# ``RECORD_CALLS_ENV`` names a file; the calls are JSON lines appended to it
# (one small write per call, O_APPEND, so concurrent processes do not interleave).
# ``kfp_sagemaker_blackwell.iam.policy.check_calls`` checks a recording against an IAM
# policy.

RECORD_CALLS_ENV = "KFP_SAGEMAKER_RECORD_CALLS"
_BULKY_PARAMS = ("Body",)  # request payloads: not needed to judge permissions


@dataclass(frozen=True)
class ApiCall:
    service: str  # botocore's service name, as passed to client(): "s3", "sagemaker", ...
    operation: str  # the API operation: "PutObject", "CreateTrainingJob", ...
    region: str
    params: dict[str, Any]


@dataclass(frozen=True)
class CallRecording:
    path: str

    def calls(self) -> list[ApiCall]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, encoding="utf-8") as f:
            return [ApiCall(**json.loads(line)) for line in f if line.strip()]


def _record_call(params: dict[str, Any], model: Any, region: str, **kwargs: Any) -> None:
    path = os.environ.get(RECORD_CALLS_ENV)
    if not path:
        return
    line = json.dumps(
        {
            "service": model.service_model.service_name,
            "operation": model.name,
            "region": region,
            "params": {k: v for k, v in params.items() if k not in _BULKY_PARAMS},
        },
        default=str,
        sort_keys=True,
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode("utf-8"))
    finally:
        os.close(fd)


@contextlib.contextmanager
def record_calls(path: str | None = None) -> Iterator[CallRecording]:
    """Records every API call made through ``client()`` (here and in child processes).

    Opt-in and for tests and audits: nothing is recorded outside the block.
    """
    previous = os.environ.get(RECORD_CALLS_ENV)
    if path is None:  # kept after the block so that the recording can be read
        fd, path = tempfile.mkstemp(prefix="aws-calls-", suffix=".jsonl")
        os.close(fd)
    os.environ[RECORD_CALLS_ENV] = path
    try:
        yield CallRecording(path)
    finally:
        if previous is None:
            os.environ.pop(RECORD_CALLS_ENV, None)
        else:
            os.environ[RECORD_CALLS_ENV] = previous
