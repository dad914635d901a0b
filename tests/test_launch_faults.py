"""Fault tests of the training launcher on the local backend: nothing paid is leaked.

The jobs here do not run the trainer: the backend runs conftest's ``STEP_SCRIPT`` (sleeps
``max-steps`` x 50 ms, logs a line per step, exits on SIGTERM), so that every
case takes about a second. Signals are sent to this very process (the launcher
runs on pytest's main thread, as in a KFP executor) from botocore event hooks,
i.e. at exact points of the job's life cycle: before Create, while Create is
on the wire (request sent, response not yet returned), when Create's response
is lost, right after Create returns, while polling, while stopping. Each point
is repeated ``REPEAT`` times, SIGTERM and SIGINT alike; after each case no job
may be left running on the backend.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ConnectionClosedError, EndpointConnectionError
from conftest import (
    STEP_SCRIPT,
    client_hooks,
    local_backend_with_bucket,
    training_cli_args,
    training_config,
    wait_for,
)

from kfp_sagemaker_blackwell.common import aws, remote_job, resources
from kfp_sagemaker_blackwell.common.errors import AWS_UNREACHABLE_EXIT_CODE, UserError
from kfp_sagemaker_blackwell.common.execution_context import (
    TERMINATED_EXIT_CODE,
    ExecutionContext,
    Terminated,
)
from kfp_sagemaker_blackwell.components.sagemaker_training import __main__ as cli
from kfp_sagemaker_blackwell.components.sagemaker_training import launcher
from kfp_sagemaker_blackwell.components.sagemaker_training.request import TrainingJobConfig

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "kfp-sagemaker-faults"
REPEAT = 3


@pytest.fixture(scope="module")
def backend():
    yield from local_backend_with_bucket(
        BUCKET, stop_grace_s=2, log_flush_s=0.1, max_concurrent_jobs=8,
        command=[sys.executable, "-c", STEP_SCRIPT])


def config(steps: int = 40, **changes: Any) -> TrainingJobConfig:
    return training_config(BUCKET, "fault", max_steps=steps, **changes)


def jobs(backend: Any) -> dict[str, str]:
    summaries = backend.client("sagemaker").list_training_jobs(MaxResults=100)
    return {s["TrainingJobName"]: s["TrainingJobStatus"]
            for s in summaries["TrainingJobSummaries"]}


def status(backend: Any, name: str) -> str | None:
    return jobs(backend).get(name)


def wait_stopped(backend: Any, name: str) -> None:
    wait_for(lambda: status(backend, name) == "Stopped", 15, f"{name} Stopped")


def assert_nothing_running(backend: Any) -> None:
    """No job of the backend stays InProgress (Stopping jobs get the grace period)."""
    wait_for(lambda: "InProgress" not in jobs(backend).values()
             and "Stopping" not in jobs(backend).values(), 15, f"no running job: {jobs(backend)}")


@pytest.fixture
def hooks(monkeypatch):
    """``hooks.append((event, handler))``: registered on every client the launcher makes."""
    return client_hooks(monkeypatch)


def signal_once(sig: int, when: Callable[..., bool] = lambda **kw: True) -> Callable[..., None]:
    sent: list[bool] = []

    def handler(**kwargs: Any) -> None:
        if not sent and when(**kwargs):
            sent.append(True)
            os.kill(os.getpid(), sig)
    return handler


def launch(cfg: TrainingJobConfig, lines: list[str] | None = None, **kwargs: Any) -> Any:
    out = lines.append if lines is not None else (lambda line: None)
    return launcher.launch(cfg, poll_interval_s=0.1, out=out, **kwargs)


def in_training(parsed: Any = None, **kwargs: Any) -> bool:
    return bool(parsed) and parsed.get("SecondaryStatus") == "Training"


class LoseResponse:
    """An after-call hook: the job was created on the backend, its response never arrives."""

    def __init__(self, sig: int) -> None:
        self.sig, self.done = sig, False

    def __call__(self, **kwargs: Any) -> None:
        if not self.done:
            self.done = True
            os.kill(os.getpid(), self.sig)
            raise ConnectionClosedError(endpoint_url="http://127.0.0.1 (response lost)")


# (point of the life cycle, event, handler factory, whether the job comes to exist)
POINTS: list[tuple[str, str, Callable[[int], Callable[..., Any]], bool]] = [
    ("before-create", "before-call.sagemaker.DescribeTrainingJob",
     lambda sig: signal_once(sig), False),
    ("create-on-the-wire", "before-send.sagemaker.CreateTrainingJob",
     lambda sig: signal_once(sig), True),
    ("create-returned", "after-call.sagemaker.CreateTrainingJob",
     lambda sig: signal_once(sig), True),
    ("create-response-lost", "after-call.sagemaker.CreateTrainingJob", LoseResponse, True),
    ("while-polling", "after-call.sagemaker.DescribeTrainingJob",
     lambda sig: signal_once(sig, in_training), True),
]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("point", [p[0] for p in POINTS])
def test_a_signal_at_any_point_of_the_life_cycle_leaves_no_job_running(
        backend, hooks, point, sig):
    _, event, factory, exists = next(p for p in POINTS if p[0] == point)
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for _ in range(REPEAT):
        hooks.clear()
        hooks.append((event, factory(sig)))
        cfg = config(steps=400)
        name = launcher.prepare(cfg)[0].job_name
        record = Path(os.environ.get("TMPDIR", "/tmp")) / f"{name}.aws_resources.json"
        with pytest.raises(Terminated) as err:
            launch(cfg, resources_path=str(record))
        assert signal.Signals(sig).name in str(err.value)
        if exists:
            assert status(backend, name) in ("Stopping", "Stopped"), (point, jobs(backend))
            wait_stopped(backend, name)
            assert resources.read(str(record))[0].name == name  # recorded before stopping
            record.unlink()
        else:
            assert status(backend, name) is None and "nothing was created" in str(err.value)
        assert_nothing_running(backend)
    # The launcher restored the handlers it replaced.
    assert {s: signal.getsignal(s) for s in previous} == previous


def test_a_second_signal_while_stopping_still_ends_stopped(backend, hooks):
    for _ in range(REPEAT):
        hooks.clear()
        hooks.append(("after-call.sagemaker.DescribeTrainingJob",
                      signal_once(signal.SIGTERM, in_training)))
        hooks.append(("before-call.sagemaker.StopTrainingJob", signal_once(signal.SIGINT)))
        cfg = config(steps=400)
        name = launcher.prepare(cfg)[0].job_name
        with pytest.raises(Terminated) as err:
            launch(cfg)
        wait_stopped(backend, name)
        assert f"the stop of training job {name} was accepted: it is Stopp" in str(err.value)
    assert_nothing_running(backend)


def _execed(pid: int, marker: bytes) -> bool:
    """Whether process ``pid`` runs the program whose command line holds ``marker`` (Linux)."""
    try:
        return marker in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def start_cli(backend: Any, cfg: TrainingJobConfig, sigint: Any) -> subprocess.Popen[str]:
    """The training command line against ``backend``, its output piped, started with SIGINT
    set to ``sigint`` (``SIG_DFL``: Ctrl-C reaches it as from a terminal, whatever this test
    process was started with; ``SIG_IGN``: as a shell script's background job starts)."""
    previous = signal.signal(signal.SIGINT, sigint)  # a handled signal is reset at exec
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "kfp_sagemaker_blackwell.components.sagemaker_training",
             *training_cli_args(cfg)],
            cwd=ROOT, env={**os.environ, **backend.env()}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_the_command_line_exits_143_on_sigterm_and_on_ctrl_c_at_random_instants(backend):
    """Real processes, signals at random instants from start-up to training (repeated)."""
    delays = [0.0, 0.4, 0.8, 1.2, 1.6, 2.0]
    handled = 0
    for i, delay in enumerate(delays):
        sig = (signal.SIGTERM, signal.SIGINT)[i % 2]
        cfg = config(steps=400)
        name = launcher.prepare(cfg)[0].job_name
        proc = start_cli(backend, cfg, signal.default_int_handler)  # Ctrl-C as from a terminal
        instant = f"{sig.name} {delay} s after the exec"
        try:
            wait_for(lambda p=proc: p.poll() is not None or _execed(p.pid, b"kfp_sagemaker_blackwell.components.sagemaker_training"), 30,
                     "the command line's process to exec")
            time.sleep(delay)
            proc.send_signal(sig)
            output, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        if proc.returncode == -sig:  # still starting Python: no handler yet, nothing created
            assert status(backend, name) is None, (instant, output)
            continue
        if proc.returncode == 1 and "init_import_site" in output:
            # Ctrl-C while Python imports its site module: CPython's own fatal error, before
            # any code of ours ran (nothing created).
            assert status(backend, name) is None, (instant, output)
            continue
        assert proc.returncode == TERMINATED_EXIT_CODE, (instant, output)
        assert "Traceback" not in output, (instant, output)
        assert status(backend, name) in (None, "Stopping", "Stopped"), (instant, output)
        handled += 1
    assert handled >= len(delays) - 2
    assert_nothing_running(backend)


def signal_a_running_job(backend: Any, steps: int, sig: int) -> tuple[int | None, str, str | None]:
    """Starts the command line with SIGINT ignored, sends ``sig`` once its job is InProgress;
    (exit status, output, the job's status at the end)."""
    cfg = config(steps=steps)
    name = launcher.prepare(cfg)[0].job_name
    proc = start_cli(backend, cfg, signal.SIG_IGN)
    try:
        wait_for(lambda: status(backend, name) == "InProgress", 60, "the job to start")
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, output, status(backend, name)


def test_a_command_line_started_to_ignore_ctrl_c_keeps_ignoring_it(backend):
    """Started with SIGINT ignored (`nohup`, a script's `&`), a Ctrl-C neither kills the
    command line during start-up nor stops its job later: one rule for its whole life, as
    Python's own. SIGTERM, what KFP sends, still stops it."""
    code, output, end = signal_a_running_job(backend, 30, signal.SIGINT)
    assert code == 0 and "received" not in output, output
    assert end == "Completed", output
    code, output, end = signal_a_running_job(backend, 400, signal.SIGTERM)
    assert code == TERMINATED_EXIT_CODE, output
    assert end in ("Stopping", "Stopped"), output
    assert_nothing_running(backend)


def test_kill_9_then_rerun_reattaches_to_the_same_job(backend, tmp_path):
    for _ in range(2):
        cfg = config(steps=60)
        name = launcher.prepare(cfg)[0].job_name
        record = tmp_path / f"{name}.json"
        proc = subprocess.Popen(
            [sys.executable, "-m", "kfp_sagemaker_blackwell.components.sagemaker_training",
             *training_cli_args(cfg, "--aws-resources-path", str(record))],
            cwd=ROOT, env={**os.environ, **backend.env()}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        try:
            wait_for(record.exists, 60, "the job's aws_resources record")
        finally:
            proc.kill()  # SIGKILL: no handler runs, the job keeps running on the backend
            proc.wait()
        assert status(backend, name) == "InProgress"
        before = len(jobs(backend))
        lines: list[str] = []
        result = launch(cfg, lines)
        assert result.status == "Completed" and not result.created
        assert result.job_name == name and len(jobs(backend)) == before
        assert any(line.startswith(f"re-attached to existing training job {name}")
                   for line in lines)
    assert_nothing_running(backend)


def test_two_launchers_at_once_make_one_job_and_both_follow_it(backend, hooks):
    for _ in range(REPEAT):
        cfg = config(steps=20)
        before = len(jobs(backend))
        results = launch_twice_at_once(cfg, hooks)
        assert len(results) == 2 and len(jobs(backend)) == before + 1
        assert {r.job_name for r in results} == {launcher.prepare(cfg)[0].job_name}
        assert sorted(r.created for r in results) == [False, True]
        assert {r.status for r in results} == {"Completed"}


def launch_twice_at_once(cfg: TrainingJobConfig, hooks: list[Any]) -> list[Any]:
    """Two launchers of one configuration in threads, both past Describe before either
    calls Create (the race a retried task and its first attempt can run)."""
    barrier = threading.Barrier(2, timeout=30)
    results: list[Any] = []

    def together(**kwargs: Any) -> None:
        barrier.wait()

    def one() -> None:
        results.append(launcher.launch(cfg, poll_interval_s=0.1, out=lambda line: None,
                                       ctx=ExecutionContext()))

    hooks.clear()
    hooks.append(("before-call.sagemaker.CreateTrainingJob", together))
    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def spot(cfg: TrainingJobConfig) -> TrainingJobConfig:
    return replace(cfg, use_spot=True, checkpoint_s3_uri=f"s3://{BUCKET}/ckpt/{cfg.run_id}",
                   max_wait_seconds=7200, max_runtime_seconds=3600)


def test_a_spot_interruption_is_followed_to_the_end_and_a_sigterm_after_it_stops(backend, hooks):
    for terminate in (False, True, False):
        cfg = spot(config(steps=80))
        name = launcher.prepare(cfg)[0].job_name
        seen: list[str] = []
        hooks.clear()
        hooks.append(("after-call.sagemaker.DescribeTrainingJob",
                      interrupt_once(backend, name, seen, then_signal=terminate)))
        if terminate:
            with pytest.raises(Terminated):
                launch(cfg)
            wait_stopped(backend, name)
            assert "signalled" in seen
        else:
            lines: list[str] = []
            result = launch(cfg, lines)
            assert result.status == "Completed", lines
            assert any("Interrupted" in line for line in lines), lines
        assert "interrupted" in seen
    assert_nothing_running(backend)


def interrupt_once(backend: Any, name: str, seen: list[str], *,
                   then_signal: bool) -> Callable[..., None]:
    """Reclaims the spot capacity once the job trains; SIGTERM once it trains again."""
    def handler(parsed: Any = None, **kwargs: Any) -> None:
        history = [t["Status"] for t in (parsed or {}).get("SecondaryStatusTransitions", [])]
        if not history or history[-1] != "Training":
            return
        if "interrupted" not in seen:
            seen.append("interrupted")
            backend.interrupt_spot(name)
        elif "Interrupted" in history and then_signal and "signalled" not in seen:
            seen.append("signalled")
            os.kill(os.getpid(), signal.SIGTERM)
    return handler


class Outage:
    """A before-send hook: while ``on``, every request fails as if the endpoint were down."""

    def __init__(self, duration: float = float("inf")) -> None:
        self.on = False
        self.started = 0.0
        self.duration = duration
        self.signalled = 0.0  # when the SIGTERM was sent (monotonic), 0: not yet

    def start(self) -> None:
        self.on, self.started = True, time.monotonic()

    def __call__(self, request: Any = None, **kwargs: Any) -> None:
        if self.on and time.monotonic() - self.started < self.duration:
            raise EndpointConnectionError(endpoint_url=str(getattr(request, "url", "")))


def start_outage_when_training(outage: Outage) -> Callable[..., None]:
    def handler(parsed: Any = None, **kwargs: Any) -> None:
        if in_training(parsed) and not outage.started:
            outage.start()
    return handler


def test_an_outage_longer_than_the_budget_exits_with_its_own_code_naming_the_job(
        backend, hooks, capsys):
    outage = Outage()
    hooks.extend([("after-call.sagemaker.DescribeTrainingJob", start_outage_when_training(outage)),
                  ("before-send", outage)])
    cfg = config(steps=400)
    name = launcher.prepare(cfg)[0].job_name
    code = cli.main(training_cli_args(cfg, "--max-outage-seconds", "1.5"))
    err = capsys.readouterr().err
    assert code == AWS_UNREACHABLE_EXIT_CODE, err
    # Timed from the outage's start (the event), not from the test's: the budget, then a stop.
    assert 1.5 <= time.monotonic() - outage.started < 10
    assert name in err and "re-attach" in err and "Traceback" not in err
    assert status(backend, name) == "InProgress"  # it was never told to stop: re-run re-attaches
    hooks.clear()
    hooks.append(("after-call.sagemaker.DescribeTrainingJob",
                  signal_once(signal.SIGTERM, in_training)))
    lines: list[str] = []
    with pytest.raises(Terminated):
        launch(cfg, lines)
    assert any(line.startswith(f"re-attached to existing training job {name}") for line in lines)
    wait_stopped(backend, name)


def test_a_short_outage_is_ridden_out(backend, hooks):
    outage = Outage(duration=1.0)
    hooks.extend([("after-call.sagemaker.DescribeTrainingJob", start_outage_when_training(outage)),
                  ("before-send", outage)])
    lines: list[str] = []
    result = launch(config(steps=60), lines, max_outage_s=30)
    assert result.status == "Completed"
    assert any("succeeded again" in line for line in lines), lines


@pytest.mark.parametrize("recovers", [True, False], ids=["outage-ends", "outage-persists"])
def test_sigterm_during_an_outage_still_exits_143(backend, hooks, capsys, recovers):
    for _ in range(2):
        outage = Outage()
        hooks.clear()
        hooks.extend([
            ("after-call.sagemaker.DescribeTrainingJob", start_outage_when_training(outage)),
            ("before-call.sagemaker.DescribeTrainingJob", signal_during(outage, recovers)),
            ("before-send", outage)])
        cfg = config(steps=400)
        name = launcher.prepare(cfg)[0].job_name
        code = cli.main(training_cli_args(cfg, "--max-outage-seconds", "60", "--stop-timeout-seconds", "2"))
        err = capsys.readouterr().err
        assert code == TERMINATED_EXIT_CODE, err
        # Timed from the SIGTERM (the event), not from the test's start.
        assert outage.signalled and time.monotonic() - outage.signalled < 20
        if recovers:
            wait_stopped(backend, name)
        else:
            assert f"stop-training-job --training-job-name {name}" in err, err
            outage.on = False
            backend.client("sagemaker").stop_training_job(TrainingJobName=name)
    assert_nothing_running(backend)


def signal_during(outage: Outage, recovers: bool) -> Callable[..., None]:
    """SIGTERM 0.3 s into the outage; the outage then ends 0.5 s later, or never."""
    def handler(**kwargs: Any) -> None:
        if outage.on and time.monotonic() - outage.started > 0.3 and not outage.signalled:
            outage.signalled = time.monotonic()
            if recovers:
                outage.duration = time.monotonic() - outage.started + 0.5
            os.kill(os.getpid(), signal.SIGTERM)
    return handler


@pytest.mark.parametrize("flag", ["--aws-resources-path", "--output-json"])
def test_an_output_path_that_cannot_be_written_is_refused_before_create(
        backend, tmp_path, capsys, flag):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cfg = config()
    name = launcher.prepare(cfg)[0].job_name
    with aws.record_calls(str(tmp_path / "calls.jsonl")) as recording, \
            pytest.raises(SystemExit) as exit_:  # refused while parsing (cli.output_file)
        cli.main(training_cli_args(cfg, flag, str(blocker / "sub" / "out.json")))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"error: argument {flag}: " in err, err
    assert f"{blocker} is a file, not a directory" in err and "Traceback" not in err, err
    assert recording.calls() == [] and status(backend, name) is None


def test_launch_refuses_an_unwritable_aws_resources_path_before_any_call(backend, tmp_path):
    (tmp_path / "a-file").write_text("")
    cfg = config()
    with pytest.raises(UserError) as err:
        launch(cfg, resources_path=str(tmp_path / "a-file" / "rec.json"))
    assert err.value.field == "aws_resources"
    assert status(backend, launcher.prepare(cfg)[0].job_name) is None


@pytest.mark.parametrize("where", ["recording-the-job", "following-the-job"])
def test_an_unexpected_error_after_create_stops_the_job_and_names_it(
        backend, hooks, monkeypatch, capsys, tmp_path, where):
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device (injected)")

    if where == "recording-the-job":
        monkeypatch.setattr(resources, "write", broken)
    else:
        monkeypatch.setattr(remote_job, "LogTail", broken)  # the runner's log copy
    cfg = config(steps=400)
    name = launcher.prepare(cfg)[0].job_name
    code = cli.main(training_cli_args(cfg, "--aws-resources-path", str(tmp_path / "rec.json")))
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    assert f"OSError after CreateTrainingJob {name}" in err, err
    assert f"the stop of training job {name} was accepted" in err, err
    assert status(backend, name) in ("Stopping", "Stopped")
    wait_stopped(backend, name)
