"""The local backend: one loopback endpoint that stands in for AWS.

``LocalBackend`` starts one threaded werkzeug server on 127.0.0.1. Every boto3
client pointed at it (``AWS_ENDPOINT_URL``) reaches either

- the local training-job executor (``components.local.executor``), for the
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

import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from components.local import moto_state
from components.local.executor import TrainingJobExecutor
from components.local.settings import ExecutorSettings

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_REGION = "us-west-2"
ACCESS_KEY = "testing"
SECRET_KEY = "testing"  # noqa: S105 - moto's fake credentials
LOOPBACK = "127.0.0.1"

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


class _Application:
    """WSGI: routes intercepted SageMaker operations to the executor, the rest to moto."""

    def __init__(self, moto_app: Any, moto_lock: threading.RLock, default_region: str) -> None:
        self.moto_app = moto_app
        self.moto_lock = moto_lock
        self.default_region = default_region
        self.executor: TrainingJobExecutor | None = None

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        target = environ.get("HTTP_X_AMZ_TARGET", "")
        service, _, operation = target.partition(".")
        if service == "SageMaker" and operation in INTERCEPTED and self.executor is not None:
            return self._executor_call(operation, environ, start_response)
        with self.moto_lock:
            result = self.moto_app(environ, start_response)
            try:  # consume the whole body while holding the lock
                body = b"".join(result)
            finally:
                close = getattr(result, "close", None)
                if close:
                    close()
        return [body]

    def _executor_call(self, operation: str, environ: dict[str, Any], start_response: Any) -> Any:
        import json

        from components.local.api import ApiError, encode

        assert self.executor is not None
        length = int(environ.get("CONTENT_LENGTH") or 0)
        raw = environ["wsgi.input"].read(length) if length else b""
        region = region_from_environ(environ, self.default_region)
        try:
            request = json.loads(raw or b"{}")
            status, payload = 200, self.executor.handle(operation, region, request)
        except ApiError as err:
            status, payload = err.status, err.payload()
        except Exception as exc:  # an executor bug must not kill the server thread
            status, payload = 500, {"__type": "InternalFailure", "message": repr(exc)}
        body = encode(payload)
        start_response(
            f"{status} {'OK' if status == 200 else 'Error'}",
            [("Content-Type", "application/x-amz-json-1.1"), ("Content-Length", str(len(body))),
             ("x-amzn-RequestId", os.urandom(16).hex())],
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
    ) -> None:
        self.port = port
        self.region = region
        self.repo_root = Path(repo_root) if repo_root else REPO_ROOT
        self._work_dir_arg = Path(work_dir) if work_dir else None
        self.max_concurrent_jobs = max_concurrent_jobs
        self.stop_grace_s = stop_grace_s
        self.log_flush_s = log_flush_s
        self.log_requests = log_requests
        self.command = list(command) if command else None
        self.moto_lock = threading.RLock()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._app: _Application | None = None
        self.executor: TrainingJobExecutor | None = None
        self._clients: dict[tuple[str, str, str], Any] = {}
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
        self._app = _Application(
            DomainDispatcherApplication(create_backend_app), self.moto_lock, self.region
        )
        class QuietHandler(MotoRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass  # one line per request would drown the job logs

        handler = MotoRequestHandler if self.log_requests else QuietHandler
        self._server = make_server(
            LOOPBACK, self.port, self._app, threaded=True, request_handler=handler
        )
        self.port = int(self._server.server_address[1])
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
        """Environment variables that point boto3 (any client, any process) at this backend."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self, service: str, region: str | None = None) -> Any:
        """A boto3 client for ``service`` talking to this backend (explicit endpoint and keys).

        Clients are cached per service and region (boto3 clients are thread-safe).
        """
        key = (service, region or self.region, self.endpoint_url)
        with self._clients_lock:
            if key not in self._clients:
                import boto3

                self._clients[key] = boto3.session.Session(
                    aws_access_key_id=ACCESS_KEY,
                    aws_secret_access_key=SECRET_KEY,
                    region_name=key[1],
                ).client(service, endpoint_url=self.endpoint_url)  # type: ignore[call-overload]
            return self._clients[key]

    # ---- local-only controls (no AWS API equivalent) ----
    def register_training_plan(self, name: str, **kwargs: Any) -> str:
        """Registers a training plan that DescribeTrainingPlan will answer; returns its ARN.

        Keyword arguments: ``instance_type`` (default ml.p6-b200.48xlarge),
        ``instance_count`` (1), ``status`` (Active), ``region``, ``duration_hours``,
        ``start_time`` / ``end_time`` (datetimes).
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

    def _require_executor(self) -> TrainingJobExecutor:
        if self.executor is None:
            raise RuntimeError("LocalBackend is not started: call start() or use it as `with`")
        return self.executor
