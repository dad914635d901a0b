"""The one place that creates AWS clients.

Every AWS call in this project goes through ``client()``: boto3 with botocore's
retry modes, the region from the argument or the environment, and the endpoint
from ``AWS_ENDPOINT_URL`` (boto3 honours it natively), which is how the local
backend (``python -m components.local serve``) stands in for AWS.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from components.common.errors import UserError

if TYPE_CHECKING:  # boto3 is an optional dependency (extra "aws")
    from botocore.config import Config

DEFAULT_MAX_ATTEMPTS = 10
DEFAULT_RETRY_MODE = "adaptive"  # client-side rate limiting on throttling, on top of "standard"


def resolve_region(region: str | None = None) -> str:
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region:
        raise UserError(
            "region",
            "no AWS region given and neither AWS_REGION nor AWS_DEFAULT_REGION is set.",
            "pass region (e.g. us-west-2) or export AWS_REGION.",
        )
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
    session = boto3.session.Session(region_name=resolve_region(region))
    return session.client(  # type: ignore[call-overload]
        service,
        endpoint_url=endpoint_url,
        config=client_config(max_attempts, retry_mode, **config_kwargs),
    )


def account_id(region: str | None = None) -> str:
    return str(client("sts", region).get_caller_identity()["Account"])


def is_throttling(exc: BaseException) -> bool:
    code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
    return code in {"ThrottlingException", "Throttling", "TooManyRequestsException",
                    "RequestLimitExceeded", "SlowDown"}


def error_code(exc: BaseException) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
