"""The local backend: one loopback endpoint that stands in for AWS.

``LocalBackend`` starts one threaded werkzeug server on 127.0.0.1. Every request must
first pass ``kfp_sagemaker_blackwell.local_backend.auth`` (signed with this start's random credentials, no
Origin, the bound Host); a boto3 client pointed at it (``backend.env()``) then reaches
either

- the local training-job executor (``kfp_sagemaker_blackwell.local_backend.executor``), for the
  SageMaker operations moto cannot serve faithfully (jobs that really run,
  stop, fail and restart; training plans registered with
  ``register_training_plan``), recognised by their ``X-Amz-Target`` header; or
- moto's ``DomainDispatcherApplication`` for everything else (S3, ECR,
  CloudWatch Logs, IAM, CodeBuild, STS, SageMaker tags and search...): moto
  picks the service from the SigV4 credential scope, so one host:port serves
  every service, and boto3 uses path-style S3 addressing for an IP endpoint.

moto is not thread-safe and its state is process-global, so every call into it
(HTTP requests and the executor's direct bookkeeping) holds one lock. State
lives as long as the server; the first backend started in a process starts
from an empty moto (later ones started while it runs share its state).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from kfp_sagemaker_blackwell.common import aws
from kfp_sagemaker_blackwell.common.shipped import CHECKOUT
from kfp_sagemaker_blackwell.local_backend import admin, auth, moto_state, pricing_api, validation
from kfp_sagemaker_blackwell.local_backend.api import ApiError, encode
from kfp_sagemaker_blackwell.local_backend.executor import TrainingJobExecutor
from kfp_sagemaker_blackwell.local_backend.settings import (
    DEFAULT_LATENCY,
    DEFAULT_OFFERINGS,
    DEFAULT_SPOT_SAVINGS,
    LATENCY_PROFILES,
    ExecutorSettings,
    LatencyProfile,
    OfferingTemplate,
)

DEFAULT_REGION = "us-west-2"
LOOPBACK = "127.0.0.1"
# The SageMaker Python SDK's defaults config: telemetry off (its TelemetryOptOut key).
SDK_CONFIG = """SchemaVersion: '1.0'
SageMaker:
  PythonSDK:
    Modules:
      TelemetryOptOut: true
"""

# Operations the executor answers; everything else goes to moto.
INTERCEPTED = frozenset(
    {
        "CreateTrainingJob",
        "DescribeTrainingJob",
        "StopTrainingJob",
        "ListTrainingJobs",
        "DeleteTrainingJob",
        "DescribeTrainingPlan",
        "ListTrainingPlans",
        "SearchTrainingPlanOfferings",
        "CreateTrainingPlan",
    }
)

_running_lock = threading.Lock()
_running = 0  # LocalBackends started in this process and not yet stopped


def region_from_environ(environ: dict[str, Any], default: str) -> str:
    """The region of the SigV4 credential scope (Credential=AK/date/REGION/service/...)."""
    auth = environ.get("HTTP_AUTHORIZATION", "")
    try:
        scope = auth.split("Credential=", 1)[1].split(",", 1)[0]
        return scope.split("/")[2] or default
    except IndexError:
        return default


# The services this backend serves, by SigV4 signing name. A request signed for any other
# (EC2, DynamoDB, ...) is answered "not emulated" at once: moto implements many more, but a
# call that succeeds here and means nothing on AWS (or that AWS would bill) is worse than an
# error naming the service.
SERVED = {
    "s3": "S3", "ecr": "ECR", "logs": "CloudWatch Logs", "iam": "IAM", "kms": "KMS",
    "codebuild": "CodeBuild", "tagging": "Resource Groups Tagging", "sts": "STS",
    "sagemaker": "SageMaker", "pricing": "Price List (from a fixture)",
}
# moto's own routes (its dashboard, /moto-api/data.json with all state, /moto-api/reset,
# the fake instance metadata): not part of AWS, never served.
MOTO_ROUTES = ("/moto-api", "/favicon.ico", "/latest/")


class _Application:
    """WSGI: refuses what ``auth.check`` refuses, then routes intercepted SageMaker operations
    to the executor, ``/_local/`` to ``admin`` and the rest to moto."""

    def __init__(self, moto_app: Any, moto_lock: threading.RLock, default_region: str,
                 credentials: auth.Credentials) -> None:
        self.moto_app = moto_app
        self.moto_lock = moto_lock
        self.default_region = default_region
        self.credentials = credentials
        self.host = ""  # 127.0.0.1:<port>, set once the server is bound
        self.executor: TrainingJobExecutor | None = None

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        raw = _body(environ)
        _rewind(environ, raw)
        try:
            service = auth.check(environ, raw, self.credentials, self.host)
        except auth.Refusal as refusal:
            protocol = auth.protocol_of(environ, raw, auth.signing_service(environ))
            return _send(start_response, *auth.refusal_response(refusal, protocol, _request_id()))
        path = environ.get("PATH_INFO", "")
        if path.startswith(admin.PREFIX) and self.executor is not None:
            status, payload = admin.handle(self.executor, environ.get("REQUEST_METHOD", "GET"),
                                           path, raw)
            return _reply(start_response, status, payload, "application/json")
        refused = self._not_served(environ, raw, path, service)
        if refused is not None:
            return _send(start_response, *refused)
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        service_name, _, operation = target.partition(".")
        if service_name == pricing_api.TARGET:  # the Price List API, from its fixture
            return _reply(start_response, *pricing_api.handle(operation, raw))
        if service_name == "SageMaker" and self.executor is not None:
            if operation in INTERCEPTED:
                return self._executor_call(operation, environ, start_response)
            if not moto_state.moto_serves("sagemaker", operation):
                return _reply(start_response, 400, unsupported(operation))
        if target == "Logs_20140328.FilterLogEvents":
            answer = self._filter_log_events(environ)
            if answer is not None:
                return _reply(start_response, *answer)
        return self._moto_call(environ, start_response)

    def _not_served(self, environ: dict[str, Any], raw: bytes, path: str,
                    service: str) -> tuple[int, str, bytes] | None:
        """The error for moto's own routes, services not emulated and JSON bodies that do
        not parse; None when the request may go on."""
        protocol = auth.protocol_of(environ, raw, service)
        if path.startswith(MOTO_ROUTES):
            return auth.error_response(protocol, 404, "NotFound", f"{path} is not served: the "
                                       "local backend serves AWS APIs only (moto's own "
                                       "routes are off).", _request_id())
        if service not in SERVED:
            code = {"json": "UnknownOperationException", "query": "InvalidAction",
                    "s3": "NotImplemented"}[protocol]
            return auth.error_response(
                protocol, 400, code, f"The local backend (python -m kfp_sagemaker_blackwell.local_backend) does "
                f"not emulate the service {service!r}: it serves "
                f"{', '.join(SERVED.values())}. Run this call against AWS.", _request_id())
        if environ.get("HTTP_X_AMZ_TARGET") and raw.strip():
            try:
                parsed = json.loads(raw)
            except ValueError as exc:
                parsed = exc
            if not isinstance(parsed, dict):
                why = parsed if isinstance(parsed, ValueError) else "not a JSON object"
                return auth.error_response("json", 400, "SerializationException",
                                           f"The request body is not valid JSON: {why}",
                                           _request_id())
        return None

    def _moto_call(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        def no_cors(status: str, headers: list[tuple[str, str]], *rest: Any) -> Any:
            # moto (flask-cors) allows every origin; the local backend allows none.
            kept = [(k, v) for k, v in headers if not k.lower().startswith("access-control-")]
            return start_response(status, kept, *rest)

        with self.moto_lock:
            result = self.moto_app(environ, no_cors)
            try:  # consume the whole body while holding the lock
                body = b"".join(result)
            finally:
                close = getattr(result, "close", None)
                if close:
                    close()
        return [body]

    def _filter_log_events(self, environ: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        """moto ignores FilterLogEvents' logStreamNamePrefix (every stream's events come
        back): turn the prefix into the stream names it matches before moto sees it."""
        raw = _body(environ)
        request = json.loads(raw or b"{}")
        prefix = request.get("logStreamNamePrefix")
        if prefix is None:
            _rewind(environ, raw)
            return None
        if request.get("logStreamNames"):
            return 400, ApiError("InvalidParameterException", "logStreamNames and "
                                 "logStreamNamePrefix are mutually exclusive").payload()
        region = region_from_environ(environ, self.default_region)
        with self.moto_lock:
            names = moto_state.log_stream_names(region, request.get("logGroupName", ""), prefix)
        if names == []:
            return 200, {"events": [], "searchedLogStreams": []}
        if names is not None:  # None: no such group, moto answers ResourceNotFound
            request = {k: v for k, v in request.items() if k != "logStreamNamePrefix"}
            request["logStreamNames"] = names
        _rewind(environ, json.dumps(request).encode())
        return None

    def _executor_call(self, operation: str, environ: dict[str, Any], start_response: Any) -> Any:
        assert self.executor is not None
        region = region_from_environ(environ, self.default_region)
        try:
            request = json.loads(_body(environ) or b"{}")
            validation.check_request(operation, request)
            status, payload = 200, self.executor.handle(operation, region, request)
        except ApiError as err:
            status, payload = err.status, err.payload()
        except Exception as exc:  # an executor bug must not kill the server thread
            status, payload = 500, {"__type": "InternalFailure", "message": repr(exc)}
        return _reply(start_response, status, payload)


def unsupported(operation: str) -> dict[str, Any]:
    """SageMaker's JSON error for an operation neither the executor nor moto serves."""
    return {"__type": "UnknownOperationException",
            "message": f"The local backend (python -m kfp_sagemaker_blackwell.local_backend) does not serve the "
                       f"SageMaker operation {operation}. It serves training jobs "
                       f"({', '.join(sorted(INTERCEPTED))}) and what moto implements "
                       "(tags, Search, ...); run this call against AWS."}


def _body(environ: dict[str, Any]) -> bytes:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    if length:
        return bytes(environ["wsgi.input"].read(length))
    if environ.get("wsgi.input_terminated"):  # chunked: werkzeug ends the stream itself
        return bytes(environ["wsgi.input"].read())
    return b""


def _rewind(environ: dict[str, Any], raw: bytes) -> None:
    environ["wsgi.input"] = io.BytesIO(raw)
    environ["CONTENT_LENGTH"] = str(len(raw))


def _reply(start_response: Any, status: int, payload: dict[str, Any],
           content_type: str = "application/x-amz-json-1.1") -> list[bytes]:
    return _send(start_response, status, content_type, encode(payload))


def _request_id() -> str:
    return os.urandom(16).hex()


def _send(start_response: Any, status: int, content_type: str, body: bytes) -> list[bytes]:
    start_response(
        f"{status} {'OK' if status == 200 else 'Error'}",
        [("Content-Type", content_type), ("Content-Length", str(len(body))),
         ("x-amzn-RequestId", _request_id())],
    )
    return [body]


class LocalBackend:
    """A local stand-in for AWS on 127.0.0.1, for tests and local runs.

    Usage::

        with LocalBackend() as backend:
            os.environ.update(backend.env())       # or pass env=backend.env() to a subprocess
            s3 = backend.client("s3")               # boto3 client pointed at the backend
            ...

    Args:
        port: TCP port to listen on; 0 (default) picks a free one.
        region: the region ``env()`` advertises (requests for any region are served).
        repo_root: the checkout whose ``trainer/train.sh`` training jobs run.
        work_dir: where jobs get their /opt/ml-like roots (default: a temporary
            directory removed by ``stop()``).
        max_concurrent_jobs: jobs running at once; more wait in ``Starting``.
        stop_grace_s: seconds between SIGTERM and SIGKILL on StopTrainingJob
            (SageMaker gives 120).
        log_flush_s: how often buffered job output is written to CloudWatch Logs.
        log_requests: print one line per HTTP request (werkzeug's access log).
        command: what a training job runs instead of ``bash <repo_root>/trainer/train.sh``
            (a request's ``AlgorithmSpecification.ContainerEntrypoint`` still wins).
        latency: how long secondary statuses last at least: a profile name (``none``,
            ``short`` (default: non-zero, well under a second per job), ``realistic``
            (minutes, for tests of polling code)) or a ``LatencyProfile``.
        spot_savings: the saving a managed spot job reports (1 - Billable/Training).
        strict_resources: also refuse at Create, as SageMaker does, a role that is not in the
            local IAM, a training image that is not in the local ECR and KMS keys that are not
            in the local KMS (off by default: this project's tests and local pipeline runs
            use images that are never pushed; ``serve`` turns it on). The output bucket is
            always checked.
        quotas: per-instance-type quota of instances in use at once (ResourceLimitExceeded
            beyond it); none by default.
        offerings: what SearchTrainingPlanOfferings offers (``OfferingTemplate``s).
        capacity_time_scale: local seconds per SageMaker second of MaxPendingTimeInSeconds
            and KeepAlivePeriodInSeconds (1: real time; tests pass e.g. 0.001).
    """

    def __init__(
        self,
        port: int = 0,
        *,
        region: str = DEFAULT_REGION,
        repo_root: str | os.PathLike[str] | None = None,
        work_dir: str | os.PathLike[str] | None = None,
        max_concurrent_jobs: int = 2,
        stop_grace_s: float = 120.0,
        log_flush_s: float = 0.5,
        log_requests: bool = False,
        command: list[str] | None = None,
        latency: str | LatencyProfile = DEFAULT_LATENCY,
        spot_savings: float = DEFAULT_SPOT_SAVINGS,
        strict_resources: bool = False,
        quotas: dict[str, int] | None = None,
        offerings: tuple[OfferingTemplate, ...] | list[OfferingTemplate] = DEFAULT_OFFERINGS,
        capacity_time_scale: float = 1.0,
    ) -> None:
        self.port = port
        self.region = region
        self.repo_root = Path(repo_root) if repo_root else CHECKOUT
        self._work_dir_arg = Path(work_dir) if work_dir else None
        self.max_concurrent_jobs = max_concurrent_jobs
        self.stop_grace_s = stop_grace_s
        self.log_flush_s = log_flush_s
        self.log_requests = log_requests
        self.command = list(command) if command else None
        if isinstance(latency, str):
            if latency not in LATENCY_PROFILES:
                raise ValueError(f"latency={latency!r}: choose one of "
                                 f"{', '.join(LATENCY_PROFILES)} or pass a LatencyProfile")
            latency = LATENCY_PROFILES[latency]
        if not 0.0 <= spot_savings < 1.0:
            raise ValueError(f"spot_savings={spot_savings}: a fraction in [0, 1)")
        self.latency = latency
        self.spot_savings = spot_savings
        self.strict_resources = strict_resources
        self.quotas = dict(quotas or {})
        self.offerings = tuple(offerings)
        if not 0.0 < capacity_time_scale <= 1.0:
            raise ValueError(f"capacity_time_scale={capacity_time_scale}: a fraction in (0, 1]")
        self.capacity_time_scale = capacity_time_scale
        self.moto_lock = threading.RLock()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._app: _Application | None = None
        self.credentials: auth.Credentials | None = None
        self.executor: TrainingJobExecutor | None = None
        self._clients: dict[tuple[str, str, str, str], Any] = {}
        self._clients_lock = threading.Lock()

    # ---- life cycle ----
    def start(self) -> LocalBackend:
        global _running
        if self._server is not None:
            return self
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        with _running_lock:
            if _running == 0:
                moto_state.reset(self.moto_lock)
            _running += 1
        self.credentials = auth.Credentials.generate()
        self._app = _Application(DomainDispatcherApplication(create_backend_app),
                                 self.moto_lock, self.region, self.credentials)
        class QuietHandler(MotoRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass  # one line per request would drown the job logs

        handler = MotoRequestHandler if self.log_requests else QuietHandler
        self._server = make_server(
            LOOPBACK, self.port, self._app, threaded=True, request_handler=handler
        )
        self.port = int(self._server.server_address[1])
        self._app.host = f"{LOOPBACK}:{self.port}"
        if self._work_dir_arg is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="kfp-sagemaker-local-")
            work_dir = Path(self._tmp.name)
        else:
            work_dir = self._work_dir_arg
            work_dir.mkdir(parents=True, exist_ok=True)
        self.work_dir = work_dir
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"local-backend-{self.port}", daemon=True
        )
        self._thread.start()
        self._start_executor()
        return self

    def _start_executor(self) -> None:
        assert self._app is not None
        settings = ExecutorSettings(
            region=self.region, repo_root=self.repo_root, work_dir=self.work_dir,
            endpoint_env=self.env(), max_concurrent_jobs=self.max_concurrent_jobs,
            stop_grace_s=self.stop_grace_s, log_flush_s=self.log_flush_s, command=self.command,
            latency=self.latency, spot_savings=self.spot_savings,
            strict_resources=self.strict_resources, quotas=self.quotas, offerings=self.offerings,
            capacity_time_scale=self.capacity_time_scale,
        )
        self.executor = TrainingJobExecutor(
            settings, self.client, moto_state.MotoMirror(self.moto_lock))
        self._app.executor = self.executor

    def stop(self) -> None:
        global _running
        if self._server is None:
            return
        if self.executor is not None:
            self.executor.shutdown()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = None
        self._thread = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        with _running_lock:
            _running -= 1

    def __enter__(self) -> LocalBackend:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._server is not None

    # ---- how to reach it ----
    @property
    def endpoint_url(self) -> str:
        if self._server is None:
            raise RuntimeError("LocalBackend is not started: call start() or use it as `with`")
        return f"http://{LOOPBACK}:{self.port}"

    def env(self) -> dict[str, str]:
        """Environment variables that point boto3 (any client, any process) at this backend,
        with its credentials (random at every start: nothing else can drive it)."""
        url, creds = self.endpoint_url, self._require_credentials()
        return {
            "AWS_ENDPOINT_URL": url,
            "AWS_ACCESS_KEY_ID": creds.access_key,
            "AWS_SECRET_ACCESS_KEY": creds.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
            # The SageMaker SDKs (v2 and sagemaker-core) send telemetry to an AWS host after
            # fit()/create unless their config opts out: nothing may leave 127.0.0.1.
            "SAGEMAKER_USER_CONFIG_OVERRIDE": str(self._sdk_config()),
        }

    def _sdk_config(self) -> Path:
        path = Path(self.work_dir) / "sagemaker-sdk-config.yaml"
        if not path.exists():
            path.write_text(SDK_CONFIG)
        return path

    def client(self, service: str, region: str | None = None) -> Any:
        """A boto3 client for ``service`` talking to this backend (explicit endpoint and keys).

        Clients are cached per service and region (boto3 clients are thread-safe); their
        botocore sessions share ``common.aws``'s loader, so botocore's JSON models are parsed
        once per process, not again for every backend started in it (about a second each).
        """
        creds = self._require_credentials()
        key = (service, region or self.region, self.endpoint_url, creds.access_key)
        with self._clients_lock:
            if key not in self._clients:
                import boto3
                import botocore.session

                core = botocore.session.get_session()
                core.register_component("data_loader", aws._shared_loader())
                self._clients[key] = boto3.session.Session(
                    aws_access_key_id=creds.access_key,
                    aws_secret_access_key=creds.secret_key,
                    region_name=key[1],
                    botocore_session=core,
                ).client(service, endpoint_url=self.endpoint_url)  # type: ignore[call-overload]
            return self._clients[key]

    # ---- local-only controls (no AWS API equivalent) ----
    def register_training_plan(self, name: str, **kwargs: Any) -> str:
        """Registers a training plan that DescribeTrainingPlan will answer; returns its ARN.

        Keyword arguments: ``instance_type`` (default ml.p6-b200.48xlarge),
        ``instance_count`` (1), ``status`` (Active), ``region``, ``duration_hours``,
        ``start_time`` / ``end_time`` (datetimes), ``upfront_fee`` and ``currency`` (what
        DescribeTrainingPlan reports it was bought for; default 0 USD).
        """
        return self._require_executor().register_training_plan(name, **kwargs)

    def interrupt_spot(self, job_name: str, region: str | None = None) -> None:
        """Reclaims a running managed-spot job's capacity, as EC2 does.

        The trainer gets SIGTERM; the job goes to secondary status Interrupted,
        then Restarting, and runs again with its checkpoint restored from S3
        and new log streams.
        """
        self._require_executor().interrupt_spot(job_name, region or self.region)

    def host_dir(self, job_name: str, host: str = "algo-1", region: str | None = None) -> Path:
        """Where a local job's ``host`` keeps its /opt/ml tree (model/, checkpoints/, output/,
        input/) in its current attempt; for debugging and tests, removed by ``stop()`` unless
        ``work_dir`` was given."""
        return self._require_executor().host_dir(job_name, region or self.region, host)

    def _require_credentials(self) -> auth.Credentials:
        if self.credentials is None:
            raise RuntimeError("LocalBackend is not started: call start() or use it as `with`")
        return self.credentials

    def _require_executor(self) -> TrainingJobExecutor:
        if self.executor is None:
            raise RuntimeError("LocalBackend is not started: call start() or use it as `with`")
        return self.executor
