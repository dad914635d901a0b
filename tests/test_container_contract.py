"""Stop and spot signals through the container as SageMaker runs it: the image's entry point as
PID 1 of its own PID namespace, the sagemaker-training toolkit's ``train``, then train.sh.

The "before" behaviour is the stock DLC's entry point (bash as PID 1, no trap): SIGTERM is
dropped, the trainer is SIGKILLed after the grace period and its final checkpoint is lost.
The project's entry point (images/trainer/entrypoint.py) delivers it: the trainer checkpoints
at the step it reached, the checkpoint reaches S3 and the restart continues the exact losses.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import job_ended, local_backend_with_bucket, losses, wait_for

from kfp_sagemaker_blackwell.catalog import logformat
from kfp_sagemaker_blackwell.local_backend import container

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "container-contract"
ROLE = "arn:aws:iam::123456789012:role/SageMakerTraining"
PROJECT_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/kfp-sagemaker-trainer:test"
DLC_IMAGE = ("763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:"
             "2.9.0-gpu-py312-cu130-ubuntu22.04-sagemaker")
# The interruption is sent once CloudWatch shows step HOLD; the trainer holds after that step
# (the trainer's hold_* test hook) while the test's hold file exists and no SIGTERM came, so
# the stop lands mid-run however loaded the machine is, and a few steps are enough.
STEPS = 8
HOLD = 2
# checkpoint-every 0: the only checkpoint is the one written on SIGTERM.
HPS = {"model-preset": "tiny", "batch-size": "4", "seq-length": "32", "max-steps": str(STEPS),
       "log-every": "1", "checkpoint-every": "0", "warmup-steps": "2"}
GROUP = "/aws/sagemaker/TrainingJobs"

pytestmark = pytest.mark.skipif(bool(container.toolkit_missing()),
                                reason=container.toolkit_missing() or "toolkit installed")


@pytest.fixture(scope="module")
def backend():
    yield from local_backend_with_bucket(BUCKET, stop_grace_s=4, log_flush_s=0.1)


def create(backend: Any, name: str, image: str, hosts: int, prefix: str = "",
           **hps: str) -> None:
    backend.client("sagemaker").create_training_job(
        TrainingJobName=name, RoleArn=ROLE,
        AlgorithmSpecification={"TrainingImage": image, "TrainingInputMode": "File"},
        HyperParameters={**HPS, **hps},
        OutputDataConfig={"S3OutputPath": f"s3://{BUCKET}/out"},
        CheckpointConfig={"S3Uri": f"s3://{BUCKET}/ckpt/{prefix or name}"},
        ResourceConfig={"InstanceType": "ml.p6-b200.48xlarge", "InstanceCount": hosts,
                        "VolumeSizeInGB": 50},
        EnableManagedSpotTraining=True,
        StoppingCondition={"MaxRuntimeInSeconds": 900, "MaxWaitTimeInSeconds": 1800})


def streams(backend: Any, name: str, host: str = "algo-1") -> list[list[str]]:
    """The host's log lines, one list per start (stream), oldest first."""
    logs = backend.client("logs")
    try:
        found = logs.describe_log_streams(logGroupName=GROUP, logStreamNamePrefix=f"{name}/{host}-")
    except logs.exceptions.ResourceNotFoundException:
        return []
    names = sorted((s["logStreamName"] for s in found["logStreams"]),
                   key=lambda s: int(s.rsplit("-", 1)[1]))
    return [[e["message"] for e in logs.get_log_events(
        logGroupName=GROUP, logStreamName=n, startFromHead=True)["events"]] for n in names]


def parsed(lines: list[str], kind: str) -> list[dict[str, Any]]:
    return [p[1] for p in map(logformat.parse_json, lines) if p and p[0] == kind]


def finished(backend: Any, name: str, timeout: float = 240) -> dict[str, Any]:
    return job_ended(backend.client("sagemaker"), name, timeout)


def checkpoint_keys(backend: Any, name: str) -> list[str]:
    listing = backend.client("s3").list_objects_v2(Bucket=BUCKET, Prefix=f"ckpt/{name}/")
    return sorted(o["Key"][len(f"ckpt/{name}/"):] for o in listing.get("Contents", []))


_REFERENCE: dict[int, dict[int, float]] = {}


def reference(backend: Any, hosts: int) -> dict[int, float]:
    """Losses of the same job uninterrupted: the DLC case's restart (which trains from step 1),
    or a run of its own when that case did not run."""
    if hosts not in _REFERENCE:
        name = f"reference-{hosts}"
        create(backend, name, PROJECT_IMAGE, hosts)
        assert finished(backend, name)["TrainingJobStatus"] == "Completed"
        _REFERENCE[hosts] = losses(streams(backend, name)[0])
    return _REFERENCE[hosts]


@pytest.mark.slow
@pytest.mark.parametrize("hosts", [1, 2], ids=["1-host", "2-hosts"])
@pytest.mark.parametrize("image", ["dlc-entry-point-before", "project-entry-point"])
def test_a_spot_interruption_reaches_the_trainer_through_pid_1_and_the_toolkit(
        backend, image, hosts, tmp_path):
    name = f"{image.split('-')[0]}-spot-{hosts}"
    hold = tmp_path / "hold"
    hold.touch()
    create(backend, name, DLC_IMAGE if image.startswith("dlc") else PROJECT_IMAGE, hosts,
           **{"hold-after-step": str(HOLD), "hold-file": str(hold)})
    wait_for(lambda: any(max(losses(s), default=0) >= HOLD for s in streams(backend, name)),
             180, f"step {HOLD} in CloudWatch (the trainer holds there)")
    backend.interrupt_spot(name)
    # The restart is under way (its stream exists): from here on the trainer need not hold (the
    # DLC's restart trains from step 1 again, past the hold).
    wait_for(lambda: len(streams(backend, name)) >= 2, 180, "the restart's log stream")
    hold.unlink()
    job = finished(backend, name)
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    statuses = [t["Status"] for t in job["SecondaryStatusTransitions"]]
    assert "Interrupted" in statuses and statuses[-2:] == ["Uploading", "Completed"]
    first, second = streams(backend, name)
    # The toolkit really ran the program: hyperparameters became its arguments.
    assert any("/bin/sh -c ./train.sh" in line and f"--max-steps {STEPS}" in line for line in first)
    saved = [c for c in parsed(first, "checkpoint") if c.get("action") == "saved"]
    resumed = [c for c in parsed(second, "checkpoint") if c.get("action") == "resumed"]
    if image.startswith("dlc"):
        # Before: bash as PID 1 dropped the SIGTERM, the trainer was SIGKILLed after the grace
        # period without a word, and the restart trained again from step 1.
        assert not parsed(first, "event") or all(e["kind"] != "sigterm" for e in parsed(first, "event"))
        assert saved == [] and resumed == [] and checkpoint_keys(backend, name) == []
        assert sorted(losses(second)) == list(range(1, STEPS + 1))
        _REFERENCE.setdefault(hosts, losses(second))  # an uninterrupted run, from step 1
        return
    # After: the stop reached the trainer's ranks on every host, which checkpointed the step
    # they had reached; that checkpoint reached S3 and the restart resumed from it.
    [stop] = [e for e in parsed(first, "event") if e["kind"] == "sigterm"]
    [final] = saved
    last = max(losses(first))
    assert final["step"] == last == HOLD + 1 and f"{last}" in stop["message"]
    assert f"step_{last:08d}/meta.json" in checkpoint_keys(backend, name)
    assert resumed and resumed[0]["step"] == last
    if hosts == 2:
        other_first = streams(backend, name, "algo-2")[0]
        assert any("SIGTERM: forwarded" in line for line in other_first)
    run = {**losses(first), **losses(second)}
    ref = reference(backend, hosts)
    assert sorted(run) == sorted(ref) == list(range(1, STEPS + 1))
    assert [run[s] for s in sorted(run)] == [ref[s] for s in sorted(ref)]


@pytest.mark.slow
def test_checkpoints_reach_s3_while_the_job_runs_and_a_host_lost_mid_save_resumes_from_s3(
        backend, tmp_path):
    name = "sync-while-running"
    # A model whose save takes long enough (tenths of a second) to be caught in the middle.
    big = {"hidden-size": "256", "ffn-hidden-size": "704", "num-layers": "2"}
    # Long enough to be still running when the first sync lands (a step takes ~0.05 s on
    # a quiet CPU); which checkpoint the 1 s sync catches first is timing (older ones are
    # pruned within tenths of a second), so any complete one counts.
    # The trainer holds after step 5 (its step-4 checkpoint complete) until the test has seen
    # a complete checkpoint in S3: on a loaded machine the 1 s sync could otherwise keep
    # missing the complete ones, which the trainer prunes within tenths of a second.
    hold = tmp_path / "hold"
    hold.touch()
    create(backend, name, PROJECT_IMAGE, 1, **{"checkpoint-every": "2", "max-steps": "2000",
                                               "hold-after-step": "5", "hold-file": str(hold),
                                               **big})
    sm = backend.client("sagemaker")
    wait_for(lambda: any(k.endswith("/meta.json") and ".tmp" not in k
                         for k in checkpoint_keys(backend, name)), 180,
             "a complete checkpoint in S3 while the job runs (the trainer holds after step 5)")
    assert sm.describe_training_job(TrainingJobName=name)["TrainingJobStatus"] == "InProgress"
    hold.unlink()  # on with the training: the next saves are the ones to kill in the middle of
    # The instance is lost in the middle of the next save: every process SIGKILLed. The hosts
    # are frozen (SIGSTOP) the moment a save is seen in progress, and killed only if it still
    # is: a save that ended between the look and the signal (a loaded machine) is let go and
    # the next one caught, so the kill lands in a save whatever the timing.
    local = backend.host_dir(name) / "checkpoints"
    hosts = list(backend.executor.state.jobs[(backend.region, name)].hosts)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if any(local.glob("*.tmp/*")):
            for host in hosts:
                host.signal(signal.SIGSTOP)
            if any(local.glob("*.tmp/*")):
                break
            for host in hosts:
                host.signal(signal.SIGCONT)
        time.sleep(0.005)
    for host in hosts:
        host.signal(signal.SIGKILL)
    assert finished(backend, name)["TrainingJobStatus"] == "Failed"
    synced = checkpoint_keys(backend, name)
    partial = sorted({k.split("/")[0] for k in synced if k.split("/")[0].endswith(".tmp")})
    assert partial, f"the kill did not land in a save: {synced}"
    complete = [int(k[5:13]) for k in synced if k.endswith("/meta.json") and ".tmp" not in k]
    newest = max(complete)
    assert int(partial[-1][5:13]) > newest
    # A new job on the same checkpoint prefix starts from the newest complete one S3 holds.
    again = "sync-while-running-again"
    create(backend, again, PROJECT_IMAGE, 1, prefix=name,
           **{"checkpoint-every": "0", "max-steps": str(newest + 1), **big})
    assert finished(backend, again)["TrainingJobStatus"] == "Completed"
    [lines] = streams(backend, again)
    resumed = [c for c in parsed(lines, "checkpoint") if c.get("action") == "resumed"]
    assert resumed and resumed[0]["step"] == newest and sorted(losses(lines)) == [newest + 1]


def test_the_entry_point_forwards_sigterm_past_wrappers_and_outlives_the_trainer(tmp_path):
    """images/trainer/entrypoint.py on its own: ``train`` is a stand-in that, like the
    toolkit, has no handler and waits for a child that checkpoints for 1 s after SIGTERM."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    done = tmp_path / "checkpoint-done"
    trainer = textwrap.dedent(f"""
        import signal, sys, time
        def stop(*_):
            time.sleep(1.0)
            open({str(done)!r}, "w").write("ok")
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        print("ready", flush=True)
        time.sleep(60)
    """)
    (tmp_path / "trainer.py").write_text(trainer)
    train = bin_dir / "train"
    # A wrapper with the default SIGTERM action, as the toolkit and `sh -c` are.
    train.write_text(f"#!/bin/sh\n{sys.executable} {tmp_path / 'trainer.py'}\nexit $?\n")
    train.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "SAGEMAKER_BASE_DIR": str(tmp_path)}
    init = subprocess.Popen([sys.executable, str(ROOT / "images" / "trainer" / "entrypoint.py"),
                             "train"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    assert init.stdout is not None
    assert init.stdout.readline().strip() == "ready"
    init.send_signal(signal.SIGTERM)
    out, _ = init.communicate(timeout=30)
    assert init.returncode == 0, out
    assert done.read_text() == "ok", "the entry point exited before the trainer's checkpoint"
    assert "forwarded to 1 process(es)" in out


def test_jobs_die_with_a_backend_killed_by_sigkill(tmp_path):
    marker = f"die-with-backend-{os.getpid()}"
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT / 'tests')!r})
        from kfp_sagemaker_blackwell.local_backend import LocalBackend
        with LocalBackend(stop_grace_s=1) as b:
            b.client("s3").create_bucket(Bucket="{BUCKET}",
                CreateBucketConfiguration={{"LocationConstraint": b.region}})
            b.client("sagemaker").create_training_job(
                TrainingJobName="{marker}", RoleArn="{ROLE}",
                AlgorithmSpecification={{"TrainingImage": "{PROJECT_IMAGE}",
                    "TrainingInputMode": "File",
                    "ContainerEntrypoint": ["bash", "-c", "sleep 300 & sleep 300; wait"]}},
                OutputDataConfig={{"S3OutputPath": "s3://{BUCKET}/out"}},
                ResourceConfig={{"InstanceType": "ml.p6-b200.48xlarge", "InstanceCount": 2,
                                 "VolumeSizeInGB": 50}},
                StoppingCondition={{"MaxRuntimeInSeconds": 600}})
            print("created", flush=True)
            time.sleep(600)
    """)
    backend = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert backend.stdout is not None and backend.stdout.readline().strip() == "created"
        job_pids = lambda: [p for p in _pids_with_env(f"TRAINING_JOB_NAME={marker}")]  # noqa: E731
        pids = wait_for(lambda: len(job_pids()) >= 6 and job_pids(), 60, "the job's processes")
        backend.kill()
        backend.wait(timeout=10)
        wait_for(lambda: not job_pids(), 10, f"processes {pids} to die with the backend")
    finally:
        if backend.poll() is None:
            backend.kill()


def _pids_with_env(entry: str) -> list[int]:
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if entry.encode() in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found


def test_the_dockerfile_entry_point_is_the_one_the_executor_runs():
    dockerfile = (ROOT / "images" / "trainer" / "Dockerfile").read_text()
    entry = [line for line in dockerfile.splitlines() if line.startswith("ENTRYPOINT")]
    assert len(entry) == 1 and json.loads(entry[0].split(None, 1)[1])[-1].endswith(
        "entrypoint.py")
    assert "COPY images/trainer/entrypoint.py" in dockerfile
    assert container.image_entry_point(PROJECT_IMAGE, ROOT)[-2:] == [
        str(ROOT / "images" / "trainer" / "entrypoint.py"), "train"]
    assert container.image_entry_point(DLC_IMAGE, ROOT)[:2] == ["bash", "-m"]


@pytest.mark.parametrize("program", ["/usr/bin/curl", "/tmp/payload.sh", "./train.sh", "nc",
                                     "/home/dev/.venv/bin/python"])
def test_a_container_entry_point_the_image_does_not_have_is_refused_at_create(backend, program):
    from botocore.exceptions import ClientError

    sm = backend.client("sagemaker")
    with pytest.raises(ClientError) as err:
        sm.create_training_job(
            TrainingJobName="not-in-the-image", RoleArn=ROLE,
            AlgorithmSpecification={"TrainingImage": PROJECT_IMAGE, "TrainingInputMode": "File",
                                    "ContainerEntrypoint": [program, "-c", "id"]},
            OutputDataConfig={"S3OutputPath": f"s3://{BUCKET}/out"},
            ResourceConfig={"InstanceType": "ml.p6-b200.48xlarge", "InstanceCount": 1,
                            "VolumeSizeInGB": 50},
            StoppingCondition={"MaxRuntimeInSeconds": 60})
    assert err.value.response["Error"]["Code"] == "ValidationException"
    message = err.value.response["Error"]["Message"]
    assert "ContainerEntrypoint" in message and repr(program) in message
    names = [j["TrainingJobName"] for j in sm.list_training_jobs()["TrainingJobSummaries"]]
    assert "not-in-the-image" not in names


def test_without_namespaces_the_fallback_still_delivers_the_stop(backend, monkeypatch, tmp_path):
    """Where ``unshare`` is not allowed the entry point is a session leader, not PID 1: this
    project's entry point (a subreaper then) still delivers the SIGTERM and the final
    checkpoint still reaches S3. (The DLC stand-in's SIGTERM-ignoring start there was checked
    by hand: no checkpoint; one more trainer run was not worth the suite's time.)"""
    monkeypatch.setattr(container, "namespace_prefix", lambda: ())
    name = "project-no-namespace"
    hold = tmp_path / "hold"
    hold.touch()
    create(backend, name, PROJECT_IMAGE, 1, **{"hold-after-step": str(HOLD),
                                               "hold-file": str(hold)})
    wait_for(lambda: any(max(losses(s), default=0) >= HOLD for s in streams(backend, name)),
             180, f"step {HOLD} in CloudWatch (the trainer holds there)")
    backend.client("sagemaker").stop_training_job(TrainingJobName=name)
    assert finished(backend, name)["TrainingJobStatus"] == "Stopped"
    [lines] = streams(backend, name)
    saved = [c["step"] for c in parsed(lines, "checkpoint") if c.get("action") == "saved"]
    assert saved == [max(losses(lines))] == [HOLD + 1]
    assert f"step_{saved[0]:08d}/meta.json" in checkpoint_keys(backend, name)


def test_the_entry_point_keeps_the_dlcs_hostname_workaround(tmp_path):
    """Where the hostname is not resourceconfig.json's current_host, ``train`` runs with the
    toolkit's compiled gethostname() override preloaded, as the DLC's script preloads its own.
    In a mount and UTS namespace: /opt is a fresh tmpfs holding /opt/ml/input/config."""
    if subprocess.run(["unshare", "--mount", "--uts", "true"], capture_output=True).returncode:
        pytest.skip("no mount/UTS namespace here")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "train").write_text(
        f"#!/bin/sh\nexec {sys.executable} -c 'import socket; print(\"host\", socket.gethostname())'\n")
    (bin_dir / "train").chmod(0o755)
    config = json.dumps({"current_host": "algo-7", "hosts": ["algo-7"]})
    setup = ("hostname other-name && mount -t tmpfs none /opt && mkdir -p /opt/ml/input/config && "
             f"printf '%s' '{config}' > /opt/ml/input/config/resourceconfig.json && exec \"$@\"")
    out = subprocess.run(
        ["unshare", "--mount", "--uts", "sh", "-c", setup, "sh", sys.executable,
         str(ROOT / "images" / "trainer" / "entrypoint.py"), "train"],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "host algo-7" in out.stdout
