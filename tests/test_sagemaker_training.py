"""The SageMaker training component on the local backend, with the real trainer.

Every job here runs ``trainer/train.sh`` from this checkout on the tiny preset
(a few seconds of CPU each). One backend serves the whole module.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import local_backend_with_bucket, losses, wait_for

from kfp_sagemaker_blackwell.catalog import logformat
from kfp_sagemaker_blackwell.common import aws, resources, tags
from kfp_sagemaker_blackwell.common.cloudwatch import training_job_tail
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.components.sagemaker_training import launcher
from kfp_sagemaker_blackwell.components.sagemaker_training.request import TrainingJobConfig
from kfp_sagemaker_blackwell.components.sagemaker_training.runner import TrainingJobFailed
from kfp_sagemaker_blackwell.local_backend import LocalBackend
from kfp_sagemaker_blackwell.planning import pricing

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "kfp-sagemaker-test"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/kfp-sagemaker-trainer:test"
ROLE = "arn:aws:iam::123456789012:role/SageMakerTraining"
# Enough steps that a spot interruption lands mid-run; checkpoints every 2 steps.
TINY_HPS = {"log-every": 1, "checkpoint-every": 2, "warmup-steps": 2}
TINY_STEPS = 12


@pytest.fixture(scope="module")
def backend():
    yield from local_backend_with_bucket(BUCKET, stop_grace_s=30)


def tiny(run_id: str, **changes: Any) -> TrainingJobConfig:
    cfg = TrainingJobConfig(
        image_uri=IMAGE, role_arn=ROLE, output_s3_uri=f"s3://{BUCKET}/out", run_id=run_id,
        task="train", pipeline="tests", model_preset="tiny", batch_size=4, seq_length=32,
        max_steps=TINY_STEPS, hyperparameters=dict(TINY_HPS),
    )
    return replace(cfg, **changes)


def job_count(backend: LocalBackend) -> int:
    return len(backend.client("sagemaker").list_training_jobs(MaxResults=100)
               ["TrainingJobSummaries"])


def job_logs(backend: LocalBackend, job_name: str) -> dict[str, list[str]]:
    events = training_job_tail(backend.client("logs"), job_name).read_all()
    out: dict[str, list[str]] = {}
    for e in events:
        out.setdefault(e.stream, []).append(e.message)
    return out


def describe(backend: LocalBackend, name: str) -> dict[str, Any]:
    return backend.client("sagemaker").describe_training_job(TrainingJobName=name)


@pytest.fixture(scope="module")
def completed(backend, tmp_path_factory):
    """One tiny job run through the KFP component under kfp.local."""
    from kfp import local

    from kfp_sagemaker_blackwell.components.sagemaker_training import sagemaker_training

    root = tmp_path_factory.mktemp("kfp-root")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root))
    task = sagemaker_training(
        image_uri=IMAGE, role_arn=ROLE, output_s3_uri=f"s3://{BUCKET}/out", run_id="run-a",
        task="train", pipeline="tests", model_preset="tiny", batch_size=4, seq_length=32,
        max_steps=TINY_STEPS, hyperparameters=dict(TINY_HPS), poll_interval_seconds=0.5,
    )
    return task.outputs


def test_tiny_job_completes_and_its_logs_and_model_reach_cloudwatch_and_s3(backend, completed):
    name = completed["job_name"]
    assert completed["status"] == "Completed"
    job = describe(backend, name)
    assert [t["Status"] for t in job["SecondaryStatusTransitions"]] == [
        "Starting", "Downloading", "Training", "Uploading", "Completed"]
    assert job["BillableTimeInSeconds"] == completed["billable_seconds"] > 0
    assert completed["estimated_cost_usd"] == pytest.approx(
        completed["billable_seconds"] / 3600
        * pricing.shipped_price("ml.p6-b200.48xlarge").per_instance_hour, abs=1e-3)

    # The aws_resources record names the job; the Model artifact points at S3.
    record = resources.loads(completed["aws_resources"])
    assert [(r.resourceType, r.resourceUri) for r in record] == [
        (resources.TRAINING_JOB, job["TrainingJobArn"])]
    uri = f"s3://{BUCKET}/out/{name}/output/model.tar.gz"
    assert completed["model"].uri == job["ModelArtifacts"]["S3ModelArtifacts"] == uri
    body = backend.client("s3").get_object(Bucket=BUCKET, Key=f"out/{name}/output/model.tar.gz")
    with tarfile.open(fileobj=io.BytesIO(body["Body"].read()), mode="r:gz") as tar:
        assert tar.getnames(), "model.tar.gz is empty"

    # Logs: one stream {job}/algo-1-{epoch}, every step, the run's summary.
    logs = job_logs(backend, name)
    [stream] = logs
    assert stream.startswith(f"{name}/algo-1-") and stream.rsplit("-", 1)[1].isdigit()
    assert sorted(losses(logs[stream])) == list(range(1, TINY_STEPS + 1))
    assert any(p and p[0] == "summary" and p[1]["status"] == "completed"
               for p in map(logformat.parse_json, logs[stream]))

    # Tags: the run's tags are on the job, visible through moto's ListTags.
    job_tags = tags.from_key_value(backend.client("sagemaker").list_tags(
        ResourceArn=job["TrainingJobArn"])["Tags"])
    assert job_tags[tags.RUN_ID_KEY] == "run-a"
    assert job_tags[tags.COMPONENT_KEY] == "sagemaker_training"


def test_second_launch_for_the_same_run_and_task_reattaches_instead_of_creating_a_job(
        backend, completed, capsys):
    before = job_count(backend)
    result = launcher.launch(tiny("run-a"), poll_interval_s=0.2)
    assert result.job_name == completed["job_name"]
    assert result.created is False and result.status == "Completed"
    assert job_count(backend) == before
    assert "re-attached to existing training job" in capsys.readouterr().out


def test_a_job_of_the_same_name_from_another_run_is_refused_not_adopted(backend, completed):
    before = job_count(backend)
    with pytest.raises(UserError) as err:
        launcher.launch(tiny("run-b", job_name=completed["job_name"]), poll_interval_s=0.2)
    assert err.value.field == "run_id" and "belongs to another run" in str(err.value)
    assert job_count(backend) == before


def test_interrupted_spot_job_resumes_from_its_checkpoint_with_the_same_losses(
        backend, completed, tmp_path):
    # The trainer holds after step 3 (its step-2 checkpoint written) until the interruption's
    # SIGTERM: the interruption lands mid-run however slow or fast the machine is.
    hold = tmp_path / "hold"
    hold.touch()
    cfg = tiny("run-spot", use_spot=True, checkpoint_s3_uri=f"s3://{BUCKET}/ckpt/spot",
               max_runtime_seconds=3600, max_wait_seconds=7200,
               hyperparameters={**TINY_HPS, "hold-after-step": "3", "hold-file": str(hold)})
    name = launcher.prepare(cfg)[0].job_name
    outcome: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: outcome.update(
        result=launcher.launch(cfg, poll_interval_s=0.5, out=lambda line: None)))
    thread.start()
    # Interrupt as soon as the trainer has written its first checkpoint (every 2 steps).
    def checkpointed() -> bool:
        try:
            return any(backend.host_dir(name).glob("checkpoints/step_*/meta.json"))
        except ValueError:  # the job does not exist yet
            return False

    wait_for(checkpointed, 120, "a first checkpoint", interval=0.05)
    backend.interrupt_spot(name)
    wait_for(lambda: len(job_logs(backend, name)) > 1, 120, "the restart's log stream")
    hold.unlink()
    thread.join(timeout=180)
    assert outcome["result"].status == "Completed"

    job = describe(backend, name)
    statuses = [t["Status"] for t in job["SecondaryStatusTransitions"]]
    assert statuses[statuses.index("Interrupted"):] == [
        "Interrupted", "Restarting", "Starting", "Downloading", "Training", "Uploading",
        "Completed"]
    logs = job_logs(backend, name)
    first, second = sorted(logs, key=lambda s: int(s.rsplit("-", 1)[1]))
    resumed = [p for p in map(logformat.parse_json, logs[second])
               if p and p[0] == "checkpoint" and p[1].get("action") == "resumed"]
    assert resumed and resumed[0][1]["step"] >= 2, "the restart did not resume from a checkpoint"
    assert max(losses(logs[first])) < TINY_STEPS, "the interruption came after training ended"

    reference = losses(job_logs(backend, completed["job_name"]).popitem()[1])
    spot = losses(logs[first] + logs[second])
    assert sorted(spot) == sorted(reference) == list(range(1, TINY_STEPS + 1))
    assert [spot[s] for s in sorted(spot)] == [reference[s] for s in sorted(reference)]


def test_failing_trainer_fails_the_component_with_sagemakers_failure_reason(backend):
    cfg = tiny("run-oom", max_steps=3, hyperparameters={"simulate-oom-at-step": 1})
    with pytest.raises(TrainingJobFailed) as err:
        launcher.launch(cfg, poll_interval_s=0.5, out=lambda line: None)
    job = describe(backend, err.value.job_name)
    assert job["TrainingJobStatus"] == "Failed"
    reason = job["FailureReason"]
    assert "out of memory" in reason.lower() and len(reason) <= 1024
    assert err.value.reason == reason and reason in str(err.value)


def test_damaged_token_data_fails_the_job_with_a_failure_reason_naming_the_shard(backend):
    """Issue 44: the train channel's damaged shard fails the job at the trainer's start-up;
    SageMaker's FailureReason (the container's failure file) names the file and the fix."""
    s3 = backend.client("s3")
    s3.put_object(Bucket=BUCKET, Key="bad-tokens/meta.json",
                  Body=b'{"dtype": "uint16", "vocab_size": 256}')
    s3.put_object(Bucket=BUCKET, Key="bad-tokens/train_000.bin", Body=b"\x01" * 201)
    cfg = tiny("run-bad-data", max_steps=3,
               input_channels={"train": f"s3://{BUCKET}/bad-tokens"})
    with pytest.raises(TrainingJobFailed) as err:
        launcher.launch(cfg, poll_interval_s=0.5, out=lambda line: None)
    reason = describe(backend, err.value.job_name)["FailureReason"]
    assert reason.startswith("data-dir: ") and "train_000.bin: is 201 bytes, not a whole " \
        "number of uint16 token ids" in reason and " Fix: " in reason, reason
    assert "Traceback" not in reason and "\n" not in reason


def test_two_instance_job_trains_across_two_local_hosts(backend):
    cfg = tiny("run-2host", instance_count=2, max_steps=3)
    printed: list[str] = []
    try:
        result = launcher.launch(cfg, poll_interval_s=0.5, out=printed.append)
    except TrainingJobFailed as exc:  # say why: the hosts' log lines as the launcher printed them
        raise AssertionError("\n".join(printed[-60:])) from exc
    assert result.status == "Completed"
    logs = {s.split("/")[1].rsplit("-", 1)[0]: lines
            for s, lines in job_logs(backend, result.job_name).items()}
    assert sorted(logs) == ["algo-1", "algo-2"]
    # Each host launched its own node of one torchrun rendezvous...
    assert any("nnodes=2 node_rank=0" in line for line in logs["algo-1"])
    assert any("nnodes=2 node_rank=1" in line for line in logs["algo-2"])
    # ...and rank 0 (on algo-1) trained in a 2-process world spanning 2 nodes.
    world = [p[1] for p in map(logformat.parse_json, logs["algo-1"]) if p and p[0] == "world"]
    assert world and world[0]["world_size"] == 2 and world[0]["nodes"] == 2
    assert sorted(losses(logs["algo-1"])) == [1, 2, 3]
    assert result.billable_seconds == describe(backend, result.job_name)[
        "BillableTimeInSeconds"]
    price = pricing.shipped_price(cfg.instance_type).per_instance_hour
    assert result.estimated_cost_usd == round(result.billable_seconds * 2 / 3600 * price, 4)


def test_sigterm_to_the_component_stops_the_training_job_within_seconds(backend, tmp_path):
    cfg = tiny("run-sigterm", max_steps=2000)
    name = launcher.prepare(cfg)[0].job_name
    record = tmp_path / "aws_resources.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kfp_sagemaker_blackwell.components.sagemaker_training", "--run-id", cfg.run_id,
         "--task", cfg.task, "--image-uri", IMAGE, "--role-arn", ROLE,
         "--output-s3-uri", cfg.output_s3_uri, "--model-preset", "tiny", "--batch-size", "4",
         "--seq-length", "32", "--max-steps", "2000", "--hyperparameters", "log-every=1",
         "--hyperparameters", "checkpoint-every=2", "--hyperparameters", "warmup-steps=2",
         "--poll-interval-seconds", "0.5", "--aws-resources-path", str(record)],
        cwd=ROOT, env={**os.environ, **backend.env()}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: losses(sum(job_logs(backend, name).values(), [])), 120,
                 "the first training step")
        assert resources.read(str(record))[0].name == name  # written as soon as it existed
        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, output
    wait_for(lambda: describe(backend, name)["TrainingJobStatus"] == "Stopped", 30,
             "status Stopped")
    assert time.monotonic() - start < 30
    assert "terminated (SIGTERM): stopping training job" in output


# ---------------------------------------------------------------- validation
def _plan_json(fits: bool = True, supported: bool = True) -> str:
    from kfp_sagemaker_blackwell.catalog import spec
    from kfp_sagemaker_blackwell.planning.memory_plan import MemoryPlan, PrecisionPlan

    entry = PrecisionPlan(precision="bf16", supported=supported, fits=fits, batch_size=6,
                          activation_checkpointing=True, peak_bytes=2**34,
                          reason="" if fits and supported else "predicted 212 GiB > 179 GiB")
    return MemoryPlan(instance_type="ml.p6-b200.48xlarge", gpu="B200",
                      gpu_memory_bytes=192 * 2**30, world_size=8, seq_length=32,
                      model=spec.PRESETS["tiny"].to_dict(),
                      precisions={"bf16": entry}).to_json()


INVALID = {
    "job_name": dict(job_name="bad_name!"),
    "checkpoint_s3_uri": dict(use_spot=True, max_wait_seconds=90000),
    "max_wait_seconds": dict(use_spot=True, checkpoint_s3_uri=f"s3://{BUCKET}/c",
                             max_runtime_seconds=7200, max_wait_seconds=3600),
    "precision": dict(precision="mxfp8", instance_type="ml.p5.48xlarge"),
    "hyperparameters": dict(hyperparameters={f"extra-{i}": i for i in range(100)}),
    "environment": dict(environment={f"VAR_{i}": "x" for i in range(101)}),
    "tags": dict(tags={f"team-{i}": "x" for i in range(48)}),
    "output_s3_uri": dict(output_s3_uri=f"{BUCKET}/out"),
    "role_arn": dict(role_arn="SageMakerTraining"),
    "training_plan_arn": dict(training_plan_arn="plan-1"),
    "instance_count": dict(instance_count=0),
    "batch_size": dict(memory_plan=_plan_json(fits=False)),
}


@pytest.mark.parametrize("field", sorted(INVALID))
def test_invalid_parameter_is_refused_naming_the_field_and_no_job_is_created(backend, field):
    before = job_count(backend)
    with aws.record_calls() as recording, pytest.raises(UserError) as err:
        launcher.launch(tiny("run-invalid", **INVALID[field]), poll_interval_s=0.2)
    assert err.value.field == field and err.value.fix, str(err.value)
    assert recording.calls() == []  # refused before any AWS call
    assert job_count(backend) == before


def test_more_invalid_values_each_name_their_field(backend):
    cases = [
        (dict(precision="fp6"), "precision"),
        (dict(environment={"1BAD": "x"}), "environment"),
        (dict(hyperparameters={"batch-size": 4}), "hyperparameters"),
        (dict(checkpoint_s3_uri="s3:/nope"), "checkpoint_s3_uri"),
        (dict(training_plan_arn="arn:aws:sagemaker:us-west-2:123456789012:training-plan/p",
              use_spot=True, checkpoint_s3_uri=f"s3://{BUCKET}/c", max_wait_seconds=90000),
         "use_spot"),
        (dict(max_wait_seconds=100), "max_wait_seconds"),
        (dict(memory_plan=_plan_json(supported=False)), "precision"),
        (dict(run_id="{{$.pipeline_job_uuid}}"), "run_id"),
    ]
    before = job_count(backend)
    for changes, field in cases:
        with pytest.raises(UserError) as err:
            launcher.prepare(replace(tiny("run-invalid"), **changes))
        assert err.value.field == field, (changes, str(err.value))
    assert job_count(backend) == before


def test_memory_plan_fills_batch_size_and_activation_checkpointing():
    resolved, request = launcher.prepare(tiny("run-plan", memory_plan=_plan_json()))
    assert request["HyperParameters"]["batch-size"] == "6"
    assert request["HyperParameters"]["activation-checkpointing"] == "true"
    # The trainer's flag names: model_preset is sent as --model-preset, not the old --preset.
    assert request["HyperParameters"]["model-preset"] == "tiny"
    assert "preset" not in request["HyperParameters"]
    assert resolved.notes and "batch_size 4 -> 6" in resolved.notes[0]


def test_training_plan_must_be_active_or_scheduled_and_cover_the_instances(backend):
    expired = backend.register_training_plan("plan-expired", status="Expired")
    other = backend.register_training_plan("plan-h100", instance_type="ml.p5.48xlarge")
    small = backend.register_training_plan("plan-one", instance_count=1)
    before = job_count(backend)
    for arn, changes, field in ((expired, {}, "training_plan_arn"),
                                (other, {}, "training_plan_arn"),
                                (small, {"instance_count": 2}, "instance_count")):
        with aws.record_calls() as recording, pytest.raises(UserError) as err:
            launcher.launch(tiny("run-plan", training_plan_arn=arn, **changes),
                            poll_interval_s=0.2)
        assert err.value.field == field, str(err.value)
        assert [c.operation for c in recording.calls()] == ["DescribeTrainingPlan"]
    assert job_count(backend) == before
    resolved, _ = launcher.prepare(tiny("run-plan", training_plan_arn=small))
    plan = launcher.check_training_plan(backend.client("sagemaker"), resolved)
    assert plan["Status"] == "Active" and plan["TotalInstanceCount"] == 1


def test_dry_run_prints_the_exact_request_without_calling_aws(tmp_path):
    cfg = tiny("run-dry", use_spot=True, checkpoint_s3_uri=f"s3://{BUCKET}/ckpt/dry",
               max_wait_seconds=172800, precision="mxfp8", region="us-west-2")
    env = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    argv = [sys.executable, "-m", "kfp_sagemaker_blackwell.components.sagemaker_training", "--dry-run",
            "--run-id", cfg.run_id, "--task", cfg.task, "--pipeline", cfg.pipeline,
            "--image-uri", IMAGE, "--role-arn", ROLE, "--output-s3-uri", cfg.output_s3_uri,
            "--region", "us-west-2", "--precision", "mxfp8", "--model-preset", "tiny",
            "--batch-size", "4", "--seq-length", "32", "--max-steps", str(TINY_STEPS),
            "--use-spot", "--checkpoint-s3-uri", cfg.checkpoint_s3_uri,
            "--max-wait-seconds", "172800"]
    argv += [a for k, v in TINY_HPS.items() for a in ("--hyperparameters", f"{k}={v}")]
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == launcher.prepare(cfg)[1]

    bad = subprocess.run(argv + ["--max-wait-seconds", "60"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "max_wait_seconds" in bad.stderr

    help_text = subprocess.run([sys.executable, "-m", "kfp_sagemaker_blackwell.components.sagemaker_training", "--help"],
                               cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    for flag in ("--training-plan-arn", "--use-spot", "--memory-plan", "--dry-run"):
        assert flag in help_text


def test_precision_hyperparameters_apply_only_to_their_precision():
    from kfp_sagemaker_blackwell.components.sagemaker_training.request import (
        merge_precision_hyperparameters,
    )

    by_precision = {"nvfp4": {"high-precision-lm-head": "true"}, "fp8": {"lr": "1e-4"}}
    assert merge_precision_hyperparameters({"lr": "3e-4"}, by_precision, "nvfp4") == {
        "lr": "3e-4",
        "high-precision-lm-head": "true",
    }
    assert merge_precision_hyperparameters({"lr": "3e-4"}, by_precision, "fp8") == {"lr": "1e-4"}
    assert merge_precision_hyperparameters(None, by_precision, "bf16") == {}


@pytest.mark.parametrize(
    "by_precision,field_text",
    [({"fp9": {"lr": "1"}}, "not a precision"), ({"fp8": "lr=1"}, "must be a mapping")],
)
def test_bad_precision_hyperparameters_name_the_field(by_precision, field_text):
    from kfp_sagemaker_blackwell.components.sagemaker_training.request import (
        merge_precision_hyperparameters,
    )

    with pytest.raises(UserError, match=field_text) as exc:
        merge_precision_hyperparameters({}, by_precision, "fp8")
    assert exc.value.field == "precision_hyperparameters"


def test_enterprise_settings_reach_the_request_and_the_iam_policies_cover_them():
    key = "arn:aws:kms:us-west-2:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    _, request = launcher.prepare(tiny(
        "run-kms", output_kms_key_id=key, volume_kms_key_id="alias/training-volumes",
        enable_network_isolation=True, enable_inter_container_traffic_encryption=True))
    assert request["OutputDataConfig"]["KmsKeyId"] == key
    assert request["ResourceConfig"]["VolumeKmsKeyId"] == "alias/training-volumes"
    assert request["EnableNetworkIsolation"] is True
    assert request["EnableInterContainerTrafficEncryption"] is True
    _, plain = launcher.prepare(tiny("run-kms"))
    assert "KmsKeyId" not in plain["OutputDataConfig"] and "EnableNetworkIsolation" not in plain
    policies = {name: json.loads((ROOT / "iam" / f"{name}.json").read_text())
                for name in ("pod-policy", "sagemaker-execution-policy")}
    actions = {name: {a for s in p["Statement"] if "kms:ViaService" in json.dumps(s)
                      for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
               for name, p in policies.items()}
    assert "kms:CreateGrant" in actions["pod-policy"]  # attaching an encrypted volume
    assert "kms:GenerateDataKey" in actions["sagemaker-execution-policy"]  # SSE-KMS output


def test_the_cli_help_shows_the_components_defaults():
    from kfp_sagemaker_blackwell.components.sagemaker_training import __main__ as main_module

    help_text = main_module.build_parser()[0].format_help()
    assert "default: ml.p6-b200.48xlarge" in help_text and "(default: 100)" in help_text


def test_a_config_takes_the_components_defaults_and_refuses_an_unknown_field():
    cfg = TrainingJobConfig(image_uri=IMAGE, role_arn=ROLE, output_s3_uri="s3://b/o", run_id="r")
    assert (cfg.instance_type, cfg.max_steps, cfg.task, cfg.pipeline) == (
        "ml.p6-b200.48xlarge", 100, "sagemaker-training", "")
    assert cfg.hyperparameters == {} and cfg.hyperparameters is not TrainingJobConfig(
        image_uri=IMAGE, role_arn=ROLE, output_s3_uri="s3://b/o", run_id="r").hyperparameters
    with pytest.raises(TypeError, match="batch_sise"):
        TrainingJobConfig(image_uri=IMAGE, role_arn=ROLE, output_s3_uri="s3://b/o", run_id="r",
                          batch_sise=4)
    with pytest.raises(TypeError, match="run_id"):
        TrainingJobConfig(image_uri=IMAGE, role_arn=ROLE, output_s3_uri="s3://b/o")


@pytest.mark.parametrize("key", ["model-dir", "model_dir", "checkpoint-dir", "checkpoint_dir",
                                 "output-dir", "output_dir", "output-data-dir"])
def test_container_contract_paths_are_refused_as_hyperparameters(key):
    with pytest.raises(UserError, match="container contract") as exc:
        launcher.prepare(tiny("run-paths", hyperparameters={key: "/tmp/elsewhere"}))
    assert exc.value.field == "hyperparameters" and "output_s3_uri" in exc.value.fix


@pytest.mark.parametrize("key,needle", [
    ("SM_MODEL_DIR", "SM_\\* variables"), ("SM_HP_BATCH_SIZE", "SM_\\* variables"),
    ("sm_checkpoint_dir", "SM_\\* variables"),
    ("AWS_SECRET_ACCESS_KEY", "credential"), ("AWS_ACCESS_KEY_ID", "credential"),
    ("AWS_SESSION_TOKEN", "credential"), ("HF_TOKEN", "credential"),
    ("DB_PASSWORD", "credential"), ("WANDB_SECRET", "credential"),
])
def test_sagemaker_variables_and_secrets_are_refused_in_environment(key, needle):
    with pytest.raises(UserError, match=needle) as exc:
        launcher.prepare(tiny("run-env", environment={key: "x"}))
    assert exc.value.field == "environment"
    if needle == "credential":
        assert "execution role" in exc.value.fix and "Secrets Manager" in exc.value.fix


def test_ordinary_environment_and_data_dir_still_pass():
    _, request = launcher.prepare(tiny(
        "run-env-ok", environment={"TOKENIZERS_PARALLELISM": "false", "NCCL_DEBUG": "INFO"},
        hyperparameters={"data-dir": "/opt/ml/input/data/train"}))
    assert request["Environment"] == {"TOKENIZERS_PARALLELISM": "false", "NCCL_DEBUG": "INFO"}
    assert request["HyperParameters"]["data-dir"] == "/opt/ml/input/data/train"
