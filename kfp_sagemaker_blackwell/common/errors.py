"""Error types shared by all components, and how a command line reports them.

A ``UserError`` is a problem the user can fix (a bad parameter, a precision the
GPU cannot run...). It is raised before any AWS call and its message names the
field and the fix. Command-line entry points exit with ``USER_ERROR_EXIT_CODE``
for it, so that a retry policy can tell it from an internal failure.

Some problems only AWS can see (a bucket that does not exist, a value the service's
own validation refuses, no credentials, an endpoint that does not answer). botocore
raises them; ``explain`` turns each into the same one line (field, problem, fix) and
an exit code, and ``cli_errors`` does that at every command line's boundary, so the
user reads one line, not a traceback. Exit codes, one meaning each:

- 1: the remote work failed, or AWS refused a request for a reason not listed here;
- 2 (``USER_ERROR_EXIT_CODE``): a value to change (a parameter, a bucket name...);
- 69 (``AWS_UNREACHABLE_EXIT_CODE``, sysexits' EX_UNAVAILABLE): the endpoint did not answer;
- 77 (``AWS_CREDENTIALS_EXIT_CODE``, sysexits' EX_NOPERM): no credentials, or the ones
  found are refused (expired, unknown, not allowed).
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from kfp_sagemaker_blackwell.catalog.errors import FieldError

USER_ERROR_EXIT_CODE = 2
# The AWS endpoint stayed unreachable past the step's outage budget (sysexits'
# EX_UNAVAILABLE): distinct from 1 (the remote work failed) and 2 (a user error).
AWS_UNREACHABLE_EXIT_CODE = 69
AWS_CREDENTIALS_EXIT_CODE = 77
AWS_REFUSED_EXIT_CODE = 1


class UserError(FieldError):
    """A problem the user can fix, raised before any side effect: ``field: problem Fix: fix``."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        text = f"{field}: {problem}"
        if fix:
            text += f" Fix: {fix}"
        super().__init__(field, problem, fix, text=text)

    @classmethod
    def of(cls, exc: FieldError, field: str = "", fix: str = "") -> UserError:
        """``exc`` (a FieldError raised below the components: the trainer's catalog and
        checks) as a UserError, its field, problem and fix carried (``field``/``fix``:
        when the caller knows them better)."""
        return cls(field or exc.field, exc.problem, fix or exc.fix)


def check_count(field: str, value: object, *, low: int = 1, fix: str = "") -> int:
    """``value`` when it is an integer >= ``low`` (a count: GPUs, instances, objects...),
    else a UserError naming ``field``: the one check of a count a component is given."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        want = "a positive integer" if low == 1 else f"an integer >= {low}"
        raise UserError(field, f"={value!r} must be {want}.", fix)
    return value


def unknown_name(field: str, exc: ValueError) -> UserError:
    """The trainer's ``UnknownName`` (a preset, precision, instance type or GPU not in its
    catalog: the value and its "did you mean" are the problem, the catalog the fix) as a
    UserError naming ``field`` (the caller's parameter, e.g. ``precisions``)."""
    if isinstance(exc, FieldError):
        return UserError(field, exc.problem, exc.fix)
    return UserError(field, str(exc))


CREDENTIALS_FIX = ("set AWS_PROFILE (after `aws configure` or `aws sso login`) or "
                   "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; on a cluster, give the pod "
                   "an IAM role (IRSA) or a Kubernetes secret; for the local backend, "
                   "`python -m kfp_sagemaker_blackwell.local_backend serve` prints the variables to export.")
# ClientError codes, by what the user has to change.
CREDENTIAL_CODES = frozenset({
    "AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "InvalidClientTokenId",
    "UnrecognizedClientException", "ExpiredToken", "ExpiredTokenException",
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidSignatureException"})
VALIDATION_CODES = frozenset({
    "ValidationException", "ValidationError", "InvalidParameterValue",
    "InvalidParameterValueException", "InvalidParameterCombination", "InvalidRequest",
    "InvalidArgument", "InvalidBucketName", "MalformedPolicyDocument"})
NOT_FOUND_CODES = frozenset({
    "NoSuchKey", "ResourceNotFound", "ResourceNotFoundException",
    "RepositoryNotFoundException", "NoSuchEntity", "ImageNotFoundException"})


def _client_error(exc: Any) -> tuple[int, UserError]:
    error = exc.response.get("Error", {}) if isinstance(exc.response, dict) else {}
    code, message = str(error.get("Code", "")), str(error.get("Message", "")).strip()
    operation = getattr(exc, "operation_name", "") or "a request"
    said = f"AWS refused {operation} ({code}: {message or 'no message'})."
    if code == "NoSuchBucket":
        bucket = str(error.get("BucketName") or "")
        name = f"s3://{bucket}" if bucket else "the S3 bucket"
        return USER_ERROR_EXIT_CODE, UserError(
            "bucket", f"{name} does not exist ({operation}: NoSuchBucket).",
            f"create it (aws s3 mb {name if bucket else 's3://<bucket>'} --region <region>) "
            "or pass a bucket that exists, in the run's region.")
    if code in CREDENTIAL_CODES:
        return AWS_CREDENTIALS_EXIT_CODE, UserError(
            "AWS credentials", said, "use credentials that are current and allowed to do "
            f"{operation} (see iam/policy.py for the policy the "
            "components need); " + CREDENTIALS_FIX)
    if code in VALIDATION_CODES:
        # AWS names the field as "... at 'trainingJobName' failed to satisfy constraint"
        # or as a request path: "... of OutputDataConfig.S3OutputPath does not exist"
        field = (re.search(r"at '([^']+)'", message)
                 or re.search(r"\b([A-Z][A-Za-z0-9]+(?:\.[A-Z][A-Za-z0-9]+)+)\b", message))
        return USER_ERROR_EXIT_CODE, UserError(
            field.group(1) if field else f"{operation} request", said,
            "change the value the message names and run again (nothing was created by "
            "the refused request).")
    if code in NOT_FOUND_CODES:
        return USER_ERROR_EXIT_CODE, UserError(
            "resource", said, "pass the name of one that exists in this account and region.")
    return AWS_REFUSED_EXIT_CODE, UserError(
        operation, said, "see the message; run again with the cause fixed.")


def explain(exc: BaseException) -> tuple[int, str] | None:
    """(exit code, one line naming the field or missing piece and the fix) for an error
    the user can act on; None for anything else (a bug, which should keep its traceback)."""
    if isinstance(exc, UserError):
        return USER_ERROR_EXIT_CODE, str(exc)
    code = getattr(exc, "exit_code", None)  # says its own (execution_context.Terminated)
    if isinstance(code, int):
        return code, str(exc)
    try:
        from botocore import exceptions as bx
    except ImportError:  # pragma: no cover (botocore is a dependency)
        return None
    if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        return AWS_CREDENTIALS_EXIT_CODE, str(UserError(
            "AWS credentials", f"none found ({exc}).", CREDENTIALS_FIX))
    if isinstance(exc, bx.NoRegionError):
        return USER_ERROR_EXIT_CODE, str(UserError(
            "region", "no AWS region given.", "pass --region or set AWS_REGION."))
    if isinstance(exc, (bx.EndpointConnectionError, bx.ConnectTimeoutError)):
        return AWS_UNREACHABLE_EXIT_CODE, str(UserError(
            "endpoint", f"{exc}.", "check the region and the network; with the local "
            "backend, check that `python -m kfp_sagemaker_blackwell.local_backend serve` is running and "
            "AWS_ENDPOINT_URL is its address."))
    if isinstance(exc, bx.ClientError):
        code, error = _client_error(exc)
        return code, str(error)
    return None


F = TypeVar("F", bound=Callable[..., int])


def cli_errors(main: F) -> F:
    """Decorates a command line's ``main``: an error ``explain`` knows prints as
    ``error: <one line>`` on stderr and returns its exit code; anything else raises."""

    @functools.wraps(main)
    def wrapper(*args: Any, **kwargs: Any) -> int:
        try:
            return main(*args, **kwargs)
        except Exception as exc:
            found = explain(exc)
            if found is None:
                raise
            print(f"error: {found[1]}", file=sys.stderr, flush=True)
            return found[0]

    return wrapper  # type: ignore[return-value]
