"""Who may drive the local backend: only its own user, by requests signed with its credentials.

A training job's ``ContainerEntrypoint`` runs on this host as the backend's user, so anyone
who can reach the endpoint can run commands. The endpoint is on loopback, which keeps other
hosts out but not other local users' processes, nor a web page the developer opens (a browser
can send requests to 127.0.0.1, and DNS rebinding makes a page's own host name resolve there).
So every request, on every route (moto's services, the executor's, ``/_local/``), must

- carry no ``Origin`` header and not be a CORS preflight (``OPTIONS``): browsers add both,
  AWS SDKs and the CLI never do; no response carries ``Access-Control-*`` headers;
- name the address the server bound in ``Host`` (``127.0.0.1:<port>``): a rebound
  ``evil.example`` page sends its own name;
- be signed with AWS Signature Version 4 using the per-start random credentials
  (``Credentials.generate``) that ``LocalBackend.env()`` exports and ``serve`` prints, with an
  ``X-Amz-Date`` within 15 minutes of now (AWS's window), the payload hash matching the body.

The expected signature is computed by botocore's own signer (``SigV4Auth``, ``S3SigV4Auth``
for S3, which does not normalise the path) over the request as it arrived (method, raw path
and query, the headers it lists as signed, the body) and compared in constant time. Refusals
take the error shape the calling client parses: JSON ``__type`` for JSON-protocol services
(SageMaker, Logs, ECR, CodeBuild, KMS), query-protocol XML for IAM/STS, S3's XML for S3.
Presigned URLs (query-string signatures) are not accepted: nothing here uses them.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW = _dt.timedelta(minutes=15)  # AWS refuses signatures older or newer than this
# x-amz-content-sha256 values that do not hash the body (S3 allows them; the headers and
# the rest of the request are still signed).
UNHASHED_PAYLOADS = frozenset({"UNSIGNED-PAYLOAD", "STREAMING-UNSIGNED-PAYLOAD-TRAILER"})


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str

    @classmethod
    def generate(cls) -> Credentials:
        """Fresh random credentials (an AWS-like 20-character key id, a 40-character secret)."""
        return cls("LOCAL" + secrets.token_hex(8).upper()[:15], secrets.token_hex(20))


# problem -> (HTTP status, JSON-protocol code, query-protocol code, S3 code)
CODES: dict[str, tuple[int, str, str, str]] = {
    "forbidden": (403, "AccessDeniedException", "AccessDenied", "AccessDenied"),
    "missing": (403, "MissingAuthenticationTokenException", "MissingAuthenticationToken",
                "AccessDenied"),
    "incomplete": (400, "IncompleteSignatureException", "IncompleteSignature",
                   "AuthorizationHeaderMalformed"),
    "unknown-key": (403, "UnrecognizedClientException", "InvalidClientTokenId",
                    "InvalidAccessKeyId"),
    "expired": (403, "InvalidSignatureException", "SignatureDoesNotMatch",
                "RequestTimeTooSkewed"),
    "mismatch": (403, "InvalidSignatureException", "SignatureDoesNotMatch",
                 "SignatureDoesNotMatch"),
    "payload": (400, "InvalidSignatureException", "SignatureDoesNotMatch",
                "XAmzContentSHA256Mismatch"),
}


class Refusal(Exception):
    def __init__(self, problem: str, message: str) -> None:
        super().__init__(message)
        self.problem = problem
        self.message = message


def check(environ: dict[str, Any], body: bytes, credentials: Credentials, host: str,
          now: _dt.datetime | None = None) -> str:
    """Raises ``Refusal`` unless the request is same-origin, for ``host`` and signed with
    ``credentials``; returns the signing name of the service it was signed for."""
    if environ.get("HTTP_ORIGIN") is not None or environ.get("REQUEST_METHOD") == "OPTIONS":
        raise Refusal("forbidden", "Cross-origin requests (an Origin header, a CORS preflight) "
                      "are refused: the local backend serves only processes of its own user, "
                      "signing with the credentials `serve` printed, never a browser page.")
    if environ.get("HTTP_HOST") != host:
        raise Refusal("forbidden", f"Host {environ.get('HTTP_HOST')!r} is not {host}, the "
                      "address the local backend listens on (DNS-rebinding requests are "
                      f"refused). Use AWS_ENDPOINT_URL=http://{host}.")
    return verify_signature(environ, body, credentials, now)


def _authorization(environ: dict[str, Any]) -> tuple[list[str], list[str], str]:
    """(credential scope parts, signed header names, signature) of the Authorization header."""
    header = environ.get("HTTP_AUTHORIZATION", "")
    if not header:
        raise Refusal("missing", "The request is not signed. Sign it (AWS SigV4) with the "
                      "credentials `python -m kfp_sagemaker_blackwell.local_backend serve` printed "
                      "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) or LocalBackend.env().")
    algorithm, _, rest = header.strip().partition(" ")
    fields = dict(part.strip().partition("=")[::2] for part in rest.split(","))
    scope = fields.get("Credential", "").split("/")
    signed = [h for h in fields.get("SignedHeaders", "").split(";") if h]
    signature = fields.get("Signature", "")
    if (algorithm != ALGORITHM or len(scope) != 5 or scope[4] != "aws4_request"
            or "host" not in signed or not signature):
        raise Refusal("incomplete", f"Authorization header is not {ALGORITHM} with "
                      "Credential=KEY/DATE/REGION/SERVICE/aws4_request, SignedHeaders "
                      "(including host) and Signature.")
    return scope, signed, signature


def verify_signature(environ: dict[str, Any], body: bytes, credentials: Credentials,
                     now: _dt.datetime | None = None) -> str:
    from botocore.auth import S3SigV4Auth, SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as BotoCredentials

    scope, signed, signature = _authorization(environ)
    access_key, date, region, service, _ = scope
    if not hmac.compare_digest(access_key.encode(), credentials.access_key.encode()):
        raise Refusal("unknown-key", f"The access key {access_key!r} is not this local "
                      "backend's (its credentials are new at every start): use the "
                      "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY it printed.")
    amz_date = environ.get("HTTP_X_AMZ_DATE", "")
    try:
        when = _dt.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=_dt.timezone.utc)
    except ValueError:
        raise Refusal("incomplete", "X-Amz-Date is missing or not YYYYMMDDTHHMMSSZ.") from None
    now = now or _dt.datetime.now(_dt.timezone.utc)
    if abs(now - when) > MAX_SKEW or date != amz_date[:8]:
        raise Refusal("expired", f"Signature expired: X-Amz-Date {amz_date} is more than 15 "
                      f"minutes from the server's time {now:%Y%m%dT%H%M%SZ} (or the scope's "
                      "date differs).")
    payload_hash = environ.get("HTTP_X_AMZ_CONTENT_SHA256")
    if payload_hash is not None and payload_hash not in UNHASHED_PAYLOADS and not (
            hmac.compare_digest(payload_hash, hashlib.sha256(body).hexdigest())):
        raise Refusal("payload", "The x-amz-content-sha256 header does not match the body.")
    headers = {name: _header(environ, name) for name in signed}
    request = AWSRequest(method=environ.get("REQUEST_METHOD", "GET"),
                         url=f"http://{environ.get('HTTP_HOST', '')}{_raw_target(environ)}",
                         headers=headers, data=body)
    request.context["timestamp"] = amz_date
    signer_class = S3SigV4Auth if service == "s3" else SigV4Auth
    signer = signer_class(BotoCredentials(credentials.access_key, credentials.secret_key),
                          service, region)
    expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)),
                                request)
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        raise Refusal("mismatch", "The request signature we calculated does not match the "
                      "signature you provided. Check your AWS Secret Access Key and signing "
                      "method (the local backend's credentials are new at every start).")
    return service


def _header(environ: dict[str, Any], name: str) -> str:
    key = name.upper().replace("-", "_")
    if key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        return str(environ.get(key, ""))
    return str(environ.get(f"HTTP_{key}", ""))


def _raw_target(environ: dict[str, Any]) -> str:
    """The path and query as sent (the signature covers the encoded form; PATH_INFO is
    decoded)."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw:
        if not raw.startswith("/"):  # absolute-form request target
            parts = urlsplit(raw)
            raw = parts.path + (f"?{parts.query}" if parts.query else "")
        return str(raw)
    query = environ.get("QUERY_STRING", "")
    path = quote(environ.get("PATH_INFO", ""), safe="/~!$&'()*+,;=:@%")
    return path + (f"?{query}" if query else "")


# ---------------------------------------------------------------- refusals, in AWS's shapes
def protocol_of(environ: dict[str, Any], body: bytes, service: str | None) -> str:
    """'json', 'query' or 's3': which error shape the calling client parses."""
    if environ.get("HTTP_X_AMZ_TARGET"):
        return "json"
    content_type = environ.get("CONTENT_TYPE", "")
    if content_type.startswith("application/x-www-form-urlencoded") and b"Action=" in body:
        return "query"
    if service in (None, "s3"):
        return "s3"
    return "json"  # rest-json services read the code from the body's __type


def error_response(protocol: str, status: int, code: str, message: str,
                   request_id: str) -> tuple[int, str, bytes]:
    """(status, content type, body) of an AWS error for a client of ``protocol``."""
    from xml.sax.saxutils import escape

    if protocol == "json":
        import json

        return status, "application/x-amz-json-1.1", json.dumps(
            {"__type": code, "message": message}).encode()
    if protocol == "query":
        xml = (f"<ErrorResponse><Error><Type>Sender</Type><Code>{escape(code)}</Code>"
               f"<Message>{escape(message)}</Message></Error>"
               f"<RequestId>{request_id}</RequestId></ErrorResponse>")
    else:
        xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{escape(code)}</Code>'
               f"<Message>{escape(message)}</Message><RequestId>{request_id}</RequestId>"
               "</Error>")
    return status, "text/xml", xml.encode()


def refusal_response(refusal: Refusal, protocol: str, request_id: str) -> tuple[int, str, bytes]:
    status, json_code, query_code, s3_code = CODES[refusal.problem]
    code = {"json": json_code, "query": query_code, "s3": s3_code}[protocol]
    return error_response(protocol, status, code, refusal.message, request_id)


def signing_service(environ: dict[str, Any]) -> str | None:
    """The service named in the Authorization header's credential scope, if any."""
    scope = environ.get("HTTP_AUTHORIZATION", "").partition("Credential=")[2].split(",")[0]
    parts = scope.split("/")
    return parts[3] if len(parts) == 5 else None


LOCAL_SERVICE = "local"  # the signing name of the backend's own /_local/ routes


def signed_headers(method: str, url: str, body: bytes, region: str,
                   credentials: Credentials | None = None) -> dict[str, str]:
    """Headers that sign a request to ``url`` (the backend's ``/_local/`` routes, for clients
    that are not boto3: ``interrupt-spot``, tests) with ``credentials``, or with those of the
    environment (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, as ``serve`` printed them)."""
    import botocore.session
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as BotoCredentials

    if credentials is None:
        found = botocore.session.get_session().get_credentials()
        if found is None:
            raise RuntimeError("no AWS credentials in the environment: export the line "
                               "`python -m kfp_sagemaker_blackwell.local_backend serve` printed")
        creds = BotoCredentials(found.access_key, found.secret_key, found.token)
    else:
        creds = BotoCredentials(credentials.access_key, credentials.secret_key)
    request = AWSRequest(method=method, url=url, data=body,
                         headers={"Content-Type": "application/json"})
    SigV4Auth(creds, LOCAL_SERVICE, region).add_auth(request)
    return dict(request.headers.items())
