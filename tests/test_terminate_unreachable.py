"""SIGTERM to a step that follows remote work, with the backend process really gone (issue 31).

The local backend runs in its own process here (``served``: a ``LocalBackend``
started the way ``python -m kfp_sagemaker_blackwell.local_backend serve`` starts it, its ``env()``
read back from the process, so whatever credentials it hands out are used),
and the test SIGKILLs that process: the port is closed, every request is
refused, nothing is simulated. Both orders are tested for each step that
follows remote work (the training launcher, build_image's CodeBuild wait,
cleanup's stop-and-wait): the outage first and then the SIGTERM (the step
rides the outage out, then must give up within the stop budget), and the
SIGTERM first with the backend dying before the stop reaches it. Every time the
step must exit 143 within 10 s with a message that names what it owned, says
whether its stop was accepted and, when not, gives the exact command that stops it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import conftest
import pytest
from conftest import STEP_SCRIPT, client_hooks, training_cli_args

from kfp_sagemaker_blackwell.common import aws, resources
from kfp_sagemaker_blackwell.common.execution_context import TERMINATED_EXIT_CODE
from kfp_sagemaker_blackwell.components.build_image import launcher as b
from kfp_sagemaker_blackwell.components.cleanup import launcher as cleanup_run
from kfp_sagemaker_blackwell.components.sagemaker_training import __main__ as training_cli
from kfp_sagemaker_blackwell.components.sagemaker_training import launcher
from kfp_sagemaker_blackwell.components.sagemaker_training.request import TrainingJobConfig

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "kfp-terminate-unreachable"
REGION = "us-west-2"
CODEBUILD_ROLE = "arn:aws:iam::123456789012:role/kfp-sagemaker-codebuild"
DEADLINE_S = 10.0  # issue 31: SIGTERM to the exit, backend gone
SERVE = r"""
import json, signal, sys, threading
from kfp_sagemaker_blackwell.local_backend import LocalBackend
done = threading.Event()
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *a: done.set())
bucket, script = sys.argv[1], sys.argv[2]
with LocalBackend(stop_grace_s=60, log_flush_s=0.1, max_concurrent_jobs=4,
                  command=[sys.executable, "-c", script]) as backend:
    backend.client("s3").create_bucket(
        Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": backend.region})
    print(json.dumps(backend.env()), flush=True)
    done.wait()
"""


@dataclass
class Served:
    proc: subprocess.Popen[str]
    env: dict[str, str]

    def client(self, service: str) -> Any:
        return aws.client(service, REGION, endpoint_url=self.env["AWS_ENDPOINT_URL"])

    def status(self, name: str) -> str:
        return str(self.client("sagemaker").describe_training_job(
            TrainingJobName=name)["TrainingJobStatus"])

    def secondary(self, name: str) -> str:
        return str(self.client("sagemaker").describe_training_job(
            TrainingJobName=name).get("SecondaryStatus", ""))

    def kill(self) -> None:
        """SIGKILL: the backend process is gone, its port closed."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def served(monkeypatch) -> Iterator[Served]:
    """The backend in its own process; this process's environment pointed at it."""
    proc = subprocess.Popen([sys.executable, "-c", SERVE, BUCKET, STEP_SCRIPT], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "the backend process did not start"
        env = json.loads(line)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        yield Served(proc, env)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """conftest's wait_for, a request that fails (the backend is dying) counting as not yet."""
    return conftest.wait_for(predicate, timeout, what, retry_on=(Exception,))


@pytest.fixture
def hooks(monkeypatch) -> list[tuple[str, Callable[..., Any]]]:
    """``hooks.append((event, handler))``: registered on every client the steps make
    (cleanup's runner binds ``client`` at its import, which an earlier test may have done)."""
    return client_hooks(monkeypatch, b, cleanup_run)


class Terminate:
    """Sends SIGTERM to this process once (now, or ``after_s`` later from a timer) and
    remembers when, so that the time to the step's exit can be measured."""

    def __init__(self) -> None:
        self.at: float | None = None

    def now(self) -> None:
        if self.at is None:
            self.at = time.monotonic()
            os.kill(os.getpid(), signal.SIGTERM)

    def later(self, after_s: float) -> None:
        threading.Timer(after_s, self.now).start()

    def elapsed(self) -> float:
        assert self.at is not None, "SIGTERM was never sent"
        return time.monotonic() - self.at


def assert_not_accepted(text: str, what: str, command: str) -> None:
    assert f"the stop of {what} was NOT accepted" in text, text
    assert f"{what} may still be running" in text, text
    assert command in text, text
    assert "Traceback" not in text, text


def sigterm_after_the_outage(module: str, args: list[str], served: Served, output: Path, *,
                             busy: Callable[[], Any], riding: str,
                             then: Callable[[], None] = lambda: None) -> tuple[int, float, str]:
    """Real processes: ``python -m MODULE ARGS`` against the served backend, its output in
    ``output``; once ``busy()`` (and ``then()`` checked), the backend is SIGKILLed; once
    the output says ``riding`` (the step rides the outage out), SIGTERM. Returns the exit
    code, the seconds from the SIGTERM to the exit and the output."""
    with output.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT,
                                env={**os.environ, **served.env}, stdout=sink,
                                stderr=subprocess.STDOUT)
        try:
            wait_for(busy, 60, f"{module} busy")
            then()
            served.kill()
            # the step's own exit ends the wait too: the assertion then shows what it said
            wait_for(lambda: riding in output.read_text() or proc.poll() is not None, 60,
                     f"{module} riding out the outage")
            assert riding in output.read_text(), (proc.poll(), output.read_text())
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            elapsed = time.monotonic() - started
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return proc.returncode, elapsed, output.read_text()


def sigterm_and_kill_when_training(term: Terminate, served: Served) -> Callable[..., None]:
    """An after-call hook of DescribeTrainingJob: SIGTERM once the job trains, then the
    backend is SIGKILLed before the launcher's stop can reach it."""
    def handler(parsed: Any = None, **kwargs: Any) -> None:
        if term.at is None and (parsed or {}).get("SecondaryStatus") == "Training":
            term.now()
            served.kill()
    return handler


# ---------------------------------------------------------------- the training launcher
def training_config(steps: int = 4000) -> TrainingJobConfig:
    return conftest.training_config(BUCKET, "unreachable", max_steps=steps)


def training_args(cfg: TrainingJobConfig, *extra: str) -> list[str]:
    return training_cli_args(cfg, "--max-outage-seconds", "300", *extra)


def stop_job_command(name: str) -> str:
    return f"aws sagemaker stop-training-job --training-job-name {name} --region {REGION}"


def test_training_backend_gone_then_sigterm_exits_143_within_10_s(served, tmp_path):
    """Real processes: the launcher follows its job, the backend is killed, the launcher
    rides out the outage (300 s allowed), then gets SIGTERM."""
    cfg = training_config()
    name = launcher.prepare(cfg)[0].job_name
    record = tmp_path / "aws_resources.json"
    code, elapsed, text = sigterm_after_the_outage(
        "kfp_sagemaker_blackwell.components.sagemaker_training", training_args(cfg, "--aws-resources-path", str(record)),
        served, tmp_path / "launcher.log", busy=lambda: served.secondary(name) == "Training",
        riding="retrying for up to 300 s")
    assert code == TERMINATED_EXIT_CODE, text
    assert elapsed < DEADLINE_S, (elapsed, text)
    assert_not_accepted(text, f"training job {name}", stop_job_command(name))
    assert resources.read(str(record))[0].name == name


def test_training_sigterm_then_backend_gone_exits_143_within_10_s(served, hooks, capsys):
    """SIGTERM while the job trains; the backend dies before the stop reaches it."""
    cfg = training_config()
    name = launcher.prepare(cfg)[0].job_name
    term = Terminate()
    hooks.append(("after-call.sagemaker.DescribeTrainingJob",
                  sigterm_and_kill_when_training(term, served)))
    code = training_cli.main(training_args(cfg))
    elapsed = term.elapsed()
    err = capsys.readouterr().err
    assert code == TERMINATED_EXIT_CODE, err
    assert elapsed < DEADLINE_S, (elapsed, err)
    assert_not_accepted(err, f"training job {name}", stop_job_command(name))
    assert "5 s" in err  # the stop budget, not --max-outage-seconds


def test_the_stop_budget_is_the_stop_timeout_whatever_the_outage_budget(served, hooks, capsys):
    cfg = training_config()
    term = Terminate()
    hooks.append(("after-call.sagemaker.DescribeTrainingJob",
                  sigterm_and_kill_when_training(term, served)))
    code = training_cli.main(training_args(cfg, "--stop-timeout-seconds", "1"))
    elapsed = term.elapsed()
    err = capsys.readouterr().err
    assert code == TERMINATED_EXIT_CODE and "NOT accepted within 1 s" in err, err
    assert elapsed < 3, (elapsed, err)


@pytest.mark.parametrize("bad", [0, -1, 26, float("inf")])
def test_a_stop_timeout_outside_the_grace_period_is_refused(bad, capsys):
    cfg = training_config()
    code = training_cli.main(training_args(cfg, "--stop-timeout-seconds", str(bad), "--dry-run"))
    err = capsys.readouterr().err
    assert code == 2 and "stop_timeout_seconds" in err, err


# ---------------------------------------------------------------- build_image (CodeBuild)
def write_checkout(root: Path) -> None:
    (root / "images" / "trainer").mkdir(parents=True)
    (root / "images" / "trainer" / "Dockerfile").write_text(
        "FROM public.ecr.aws/docker/library/python:3.12-slim\nCOPY trainer/ /opt/ml/code/\n")
    (root / "trainer").mkdir()
    (root / "trainer" / "train.py").write_text("print('train')\n")


def build_args(checkout: Path, run_id: str) -> list[str]:
    return ["--run-id", run_id, "--s3-uri", f"s3://{BUCKET}/pipelines",
            "--context-dir", str(checkout), "--builder", "codebuild",
            "--codebuild-role-arn", CODEBUILD_ROLE, "--poll-interval-seconds", "0.1"]


@pytest.mark.parametrize("order", ["outage-then-sigterm", "sigterm-then-outage"])
def test_build_image_sigterm_with_the_backend_gone_exits_143_within_10_s(
        served, hooks, capsys, tmp_path, order):
    from kfp_sagemaker_blackwell.components.build_image import __main__ as build_cli

    write_checkout(tmp_path / "checkout")
    term = Terminate()
    started: list[str] = []

    def after_start(parsed: Any = None, **kwargs: Any) -> None:
        started.append(parsed["build"]["id"])
        if order == "sigterm-then-outage":
            term.now()
            served.kill()

    def before_first_poll(**kwargs: Any) -> None:
        if order == "outage-then-sigterm" and served.proc.poll() is None:
            served.kill()
            term.later(1.0)  # while the poll rides out the outage

    hooks.append(("after-call.codebuild.StartBuild", after_start))
    hooks.append(("before-call.codebuild.BatchGetBuilds", before_first_poll))
    code = build_cli.main(build_args(tmp_path / "checkout", f"build-{order}"))
    elapsed = term.elapsed()
    err = capsys.readouterr().err
    assert code == TERMINATED_EXIT_CODE, err
    assert elapsed < DEADLINE_S, (elapsed, err)
    [build_id] = started
    assert_not_accepted(err, f"CodeBuild build {build_id}",
                        f"aws codebuild stop-build --id {build_id} --region {REGION}")
    if order == "outage-then-sigterm":
        assert "BatchGetBuilds" in err and "retrying for up to" in err, err


# ---------------------------------------------------------------- cleanup
def create_job(served: Served, *, ignore_sigterm: bool) -> tuple[TrainingJobConfig, str]:
    """A job of a fresh run, tagged as the launcher tags it, that trains (long)."""
    cfg = training_config(steps=4000)
    resolved, request = launcher.prepare(cfg)
    if ignore_sigterm:
        request["HyperParameters"]["ignore-sigterm"] = "true"
    served.client("sagemaker").create_training_job(**request)
    wait_for(lambda: served.secondary(resolved.job_name) == "Training", 60, "the job training")
    return cfg, resolved.job_name


def cleanup_args(run_id: str) -> list[str]:
    return ["--run-id", run_id, "--region", REGION, "--policy", "artifacts=delete",
            "--stop-wait-seconds", "120"]


def test_cleanup_waiting_for_a_stop_then_backend_gone_then_sigterm_exits_143(served, tmp_path):
    """Real processes: cleanup stopped the job (accepted) and waits for it to leave
    Stopping; the backend dies; SIGTERM."""
    cfg, name = create_job(served, ignore_sigterm=True)
    log = tmp_path / "cleanup.log"

    def still_stopping() -> None:
        assert served.status(name) == "Stopping"

    code, elapsed, text = sigterm_after_the_outage(
        "kfp_sagemaker_blackwell.components.cleanup", cleanup_args(cfg.run_id), served, log,
        busy=lambda: "to stop" in log.read_text(), then=still_stopping,
        riding="retrying for up to")
    assert code == TERMINATED_EXIT_CODE, text
    assert elapsed < DEADLINE_S, (elapsed, text)
    assert f"the stop of training job {name} was accepted (last seen Stopping)" in text, text
    assert "deletion(s) not done: run cleanup again" in text and "Traceback" not in text, text


def test_cleanup_sigterm_then_backend_gone_before_the_stop_exits_143(served, hooks, capsys):
    from kfp_sagemaker_blackwell.components.cleanup import __main__ as cleanup_cli

    cfg, name = create_job(served, ignore_sigterm=False)
    term = Terminate()

    def terminate_then_kill_the_backend(**kwargs: Any) -> None:
        if term.at is None:
            term.now()
            served.kill()

    hooks.append(("before-call.sagemaker.StopTrainingJob", terminate_then_kill_the_backend))
    code = cleanup_cli.main(cleanup_args(cfg.run_id))
    elapsed = term.elapsed()
    err = capsys.readouterr().err
    assert code == TERMINATED_EXIT_CODE, err
    assert elapsed < DEADLINE_S, (elapsed, err)
    assert_not_accepted(err, f"training job {name}", stop_job_command(name))


# ---------------------------------------------------------------- an endpoint that never answers
class Silent:
    """Silences the served backend with SIGSTOP: its port still accepts connections (the
    kernel completes them and queues the requests) but nothing ever answers: the endpoint
    of a hung server or a half-dead load balancer, where a request is held for the client's
    whole read timeout. The fixture's SIGKILL ends it."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.silent = threading.Event()

    def silence(self) -> None:
        if not self.silent.is_set():
            self.silent.set()
            os.kill(self.served.proc.pid, signal.SIGSTOP)


@pytest.fixture
def silent(served) -> Silent:
    return Silent(served)


STOP_BOUND_S = 5.0 + 1.5  # the default stop timeout, and the step's own exit


def test_cleanup_sigterm_while_its_stop_gets_no_answer_exits_within_the_stop_timeout(
        served, silent, hooks, capsys):
    """StopTrainingJob is sent to an endpoint that accepts and never answers; SIGTERM
    meanwhile. The action's wait is given up at once and the stop is retried within what
    is left of the stop timeout since the SIGTERM: not botocore's read timeout and retries."""
    from kfp_sagemaker_blackwell.components.cleanup import __main__ as cleanup_cli

    cfg, name = create_job(served, ignore_sigterm=False)
    term = Terminate()

    def silence_then_terminate(**kwargs: Any) -> None:
        if term.at is None and not silent.silent.is_set():
            silent.silence()
            term.later(0.5)

    hooks.append(("before-call.sagemaker.StopTrainingJob", silence_then_terminate))
    code = cleanup_cli.main(cleanup_args(cfg.run_id))
    elapsed = term.elapsed()
    err = capsys.readouterr().err
    assert code == TERMINATED_EXIT_CODE, err
    assert elapsed < STOP_BOUND_S, (elapsed, err)
    assert_not_accepted(err, f"training job {name}", stop_job_command(name))
    assert "within 5 s" in err, err


def test_training_sigterm_while_its_poll_gets_no_answer_exits_within_the_stop_timeout(
        served, silent, hooks, capsys):
    """The launcher's DescribeTrainingJob is in flight to an endpoint that never answers
    (its client's read timeout is 15 s) when SIGTERM comes: the poll is given up at once and
    the stop gets what is left of the stop timeout."""
    cfg = training_config()
    name = launcher.prepare(cfg)[0].job_name
    term = Terminate()

    def silence_when_training(parsed: Any = None, **kwargs: Any) -> None:
        if not silent.silent.is_set() and (parsed or {}).get("SecondaryStatus") == "Training":
            silent.silence()
            term.later(0.5)  # the next poll (every 0.1 s) is waiting for its answer

    hooks.append(("after-call.sagemaker.DescribeTrainingJob", silence_when_training))
    code = training_cli.main(training_args(cfg))
    elapsed = term.elapsed()
    err = capsys.readouterr().err
    assert code == TERMINATED_EXIT_CODE, err
    assert elapsed < STOP_BOUND_S, (elapsed, err)
    assert_not_accepted(err, f"training job {name}", stop_job_command(name))


def test_build_image_sigterm_while_its_poll_gets_no_answer_exits_within_the_stop_timeout(
        served, silent, hooks, capsys, tmp_path):
    from kfp_sagemaker_blackwell.components.build_image import __main__ as build_cli

    write_checkout(tmp_path / "checkout")
    term = Terminate()
    started: list[str] = []

    def after_start(parsed: Any = None, **kwargs: Any) -> None:
        started.append(parsed["build"]["id"])
        silent.silence()
        term.later(0.5)  # BatchGetBuilds is waiting for its answer

    hooks.append(("after-call.codebuild.StartBuild", after_start))
    code = build_cli.main(build_args(tmp_path / "checkout", "build-silent"))
    elapsed = term.elapsed()
    err = capsys.readouterr().err
    assert code == TERMINATED_EXIT_CODE, err
    assert elapsed < STOP_BOUND_S, (elapsed, err)
    [build_id] = started
    assert_not_accepted(err, f"CodeBuild build {build_id}",
                        f"aws codebuild stop-build --id {build_id} --region {REGION}")
