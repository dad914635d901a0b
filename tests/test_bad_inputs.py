"""Bad inputs: each exits non-zero before any AWS call, names the field, leaves nothing behind.

One table for every command line of the project. A case is
``(id, command, argv, field)``: ``command`` is the module run as
``python -m <command>`` (called in-process through its ``main``), ``argv`` its
arguments, ``field`` the text the error message must name. Every case runs
against the local backend; no AWS call may be recorded and the backend's state
(training jobs, S3 objects, ECR repositories, CodeBuild projects, log groups)
must be what it was before. To add a case, append a tuple to ``CASES``.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

import pytest
from conftest import local_backend_with_bucket

from kfp_sagemaker_blackwell.common import aws

BUCKET = "kfp-sagemaker-bad-inputs"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/kfp-sagemaker-trainer:test"
ROLE = "arn:aws:iam::123456789012:role/SageMakerTraining"
# How each command is called in-process: the module holding its ``main(argv)``.
MAINS = {
    "kfp_sagemaker_blackwell.components.sagemaker_training": "kfp_sagemaker_blackwell.components.sagemaker_training.__main__",
    "kfp_sagemaker_blackwell.components.memory_estimate": "kfp_sagemaker_blackwell.components.memory_estimate.__main__",
}

# A valid tiny launch; each case below breaks one thing.
TRAIN = ["--run-id", "bad-inputs", "--task", "train", "--image-uri", IMAGE, "--role-arn", ROLE,
         "--output-s3-uri", f"s3://{BUCKET}/out", "--model-preset", "tiny", "--batch-size", "2",
         "--seq-length", "32", "--max-steps", "2", "--poll-interval-seconds", "0.1"]


def train(*extra: str, drop: tuple[str, ...] = ()) -> list[str]:
    """TRAIN with the flags in ``drop`` (and their values) removed, then ``extra``."""
    argv: list[str] = []
    skip = False
    for word in TRAIN:
        if skip:
            skip = False
            continue
        if word in drop:
            skip = True
            continue
        argv.append(word)
    return argv + list(extra)


def many(flag: str, prefix: str, n: int) -> list[str]:
    return [flag, ",".join(f"{prefix}{i:08x}" for i in range(n))]


TRAINING = "kfp_sagemaker_blackwell.components.sagemaker_training"
MEMORY = "kfp_sagemaker_blackwell.components.memory_estimate"
SPOT = ("--use-spot", "--checkpoint-s3-uri", f"s3://{BUCKET}/ckpt")

CASES: list[tuple[str, str, list[str], str]] = [
    # ---- sagemaker_training: SageMaker's limits (botocore's service model) ----
    ("17-subnets", TRAINING, train(*many("--vpc-subnet-ids", "subnet-", 17),
                                   "--vpc-security-group-ids", "sg-00000001"), "vpc_subnet_ids"),
    ("6-security-groups", TRAINING, train("--vpc-subnet-ids", "subnet-00000001",
                                          *many("--vpc-security-group-ids", "sg-", 6)),
     "vpc_security_group_ids"),
    ("subnet-not-an-id", TRAINING, train("--vpc-subnet-ids", "vpc-123",
                                         "--vpc-security-group-ids", "sg-1"), "vpc_subnet_ids"),
    ("subnets-without-groups", TRAINING, train("--vpc-subnet-ids", "subnet-1"), "vpc_subnet_ids"),
    ("image-not-in-ecr", TRAINING, train("--image-uri", "docker.io/library/foo:1",
                                         drop=("--image-uri",)), "image_uri"),
    ("image-bad-tag", TRAINING, train("--image-uri", IMAGE.replace(":test", ":bad tag!"),
                                      drop=("--image-uri",)), "image_uri"),
    ("tag-value-characters", TRAINING, train("--tags", "team=a!b"), "tags"),
    ("tag-key-too-long", TRAINING, train("--tags", "k" * 129 + "=v"), "tags"),
    ("tag-not-key-value", TRAINING, train("--tags", "team"), "--tags"),
    ("unknown-region", TRAINING, train("--region", "us-west-99"), "region"),
    ("role-not-an-arn", TRAINING, train("--role-arn", "SageMakerTraining", drop=("--role-arn",)),
     "role_arn"),
    ("output-not-s3", TRAINING, train("--output-s3-uri", f"{BUCKET}/out",
                                      drop=("--output-s3-uri",)), "output_s3_uri"),
    ("job-name-characters", TRAINING, train("--job-name", "bad_name!"), "job_name"),
    ("run-id-characters", TRAINING, train("--run-id", "run id!", drop=("--run-id",)), "run_id"),
    ("environment-name", TRAINING, train("--environment", "1BAD=x"), "environment"),
    ("channel-name", TRAINING, train("--input-channels", f"bad name=s3://{BUCKET}/data"),
     "input_channels"),
    ("channel-dot-dot", TRAINING, train("--input-channels", f"..=s3://{BUCKET}/data"),
     "input_channels"),
    ("channel-dot", TRAINING, train("--input-channels", json.dumps({".": f"s3://{BUCKET}/d"})),
     "input_channels"),
    ("channel-not-s3", TRAINING, train("--input-channels", "train=/local/data"),
     "input_channels[train]"),
    ("instance-type-unknown", TRAINING, train("--instance-type", "ml.p9.bogus"), "instance_type"),
    ("instance-count-0", TRAINING, train("--instance-count", "0"), "instance_count"),
    ("volume-size-0", TRAINING, train("--volume-size-gb", "0"), "volume_size_gb"),
    ("max-runtime-0", TRAINING, train("--max-runtime-seconds", "0"), "max_runtime_seconds"),
    ("max-runtime-30-days", TRAINING, train("--max-runtime-seconds", str(30 * 86400)),
     "max_runtime_seconds"),
    ("retry-attempts-31", TRAINING, train("--max-retry-attempts", "31"), "max_retry_attempts"),
    ("training-plan-not-an-arn", TRAINING, train("--training-plan-arn", "plan-1"),
     "training_plan_arn"),
    ("output-kms-key-not-a-key", TRAINING, train("--output-kms-key-id", "my key"),
     "output_kms_key_id"),
    ("volume-kms-key-other-region", TRAINING, train(
        "--volume-kms-key-id",
        "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"),
     "volume_kms_key_id"),
    # ---- capacity ----
    ("spot-without-checkpoints", TRAINING, train("--use-spot", "--max-wait-seconds", "90000"),
     "checkpoint_s3_uri"),
    ("spot-wait-below-runtime", TRAINING, train(*SPOT, "--max-wait-seconds", "60"),
     "max_wait_seconds"),
    ("wait-without-spot", TRAINING, train("--max-wait-seconds", "100"), "max_wait_seconds"),
    # ---- following the job ----
    ("poll-interval-negative", TRAINING, train("--poll-interval-seconds", "-1",
                                               drop=("--poll-interval-seconds",)),
     "poll_interval_seconds"),
    ("poll-interval-0", TRAINING, train("--poll-interval-seconds", "0",
                                        drop=("--poll-interval-seconds",)),
     "poll_interval_seconds"),
    ("max-outage-0", TRAINING, train("--max-outage-seconds", "0"), "max_outage_seconds"),
    ("price-not-a-number", TRAINING, train("--instance-hour-prices", "ml.p5.48xlarge=abc"),
     "instance_hour_prices"),
    ("worst-case-over-budget", TRAINING, train("--max-cost-usd", "100"), "max_cost_usd"),
    ("budget-negative", TRAINING, train("--max-cost-usd", "-5"), "max_cost_usd"),
    ("budget-without-a-price", TRAINING, train("--max-cost-usd", "100",
                                               "--instance-type", "ml.p5e.48xlarge"),
     "max_cost_usd"),
    # ---- the model and the trainer's own flags ----
    ("num-layers-negative", TRAINING, train("--num-layers", "-1"), "num_layers"),
    ("hidden-size-negative", TRAINING, train("--hidden-size", "-64"), "hidden_size"),
    ("vocab-size-below-minus-1", TRAINING, train("--vocab-size", "-2"), "vocab_size"),
    ("preset-unknown", TRAINING, train("--model-preset", "huge", drop=("--model-preset",)),
     "model_preset"),
    ("precision-unknown", TRAINING, train("--precision", "fp6"), "precision"),
    ("precision-not-on-hopper", TRAINING, train("--precision", "mxfp8",
                                                "--instance-type", "ml.p5.48xlarge"),
     "precision"),
    ("batch-size-0", TRAINING, train("--batch-size", "0", drop=("--batch-size",)), "batch_size"),
    ("seq-length-1", TRAINING, train("--seq-length", "1", drop=("--seq-length",)), "seq_length"),
    ("max-steps-0", TRAINING, train("--max-steps", "0", drop=("--max-steps",)), "max_steps"),
    ("hyperparameter-unknown", TRAINING, train("--hyperparameters", "bogus-flag=1"),
     "bogus-flag"),
    ("hyperparameter-misspelt", TRAINING, train("--hyperparameters", "checkpoint-evry=5"),
     "did you mean checkpoint-every"),
    ("hyperparameter-type", TRAINING, train("--hyperparameters", "lr=abc"), "--lr"),
    ("hyperparameter-choice", TRAINING, train("--hyperparameters", "backend=jax"), "backend"),
    ("hyperparameter-range", TRAINING, train("--hyperparameters", "warmup-steps=-1"),
     "warmup-steps"),
    ("hyperparameter-owned", TRAINING, train("--hyperparameters", "batch-size=4"), "batch_size"),
    ("hyperparameter-owned-model-preset", TRAINING, train("--hyperparameters", "model-preset=1b"),
     "set by the model_preset parameter"),
    ("hyperparameter-owned-old-preset", TRAINING, train("--hyperparameters", "preset=1b"),
     "set by the model_preset parameter"),
    ("hyperparameter-too-long", TRAINING, train("--hyperparameters", "data-dir=" + "x" * 2501),
     "hyperparameters"),
    # ---- memory: a plan, or the pre-flight estimate when there is none ----
    ("64b-does-not-fit", TRAINING, train("--model-preset", "64b", "--batch-size", "64",
                                         "--seq-length", "8192", "--no-activation-checkpointing",
                                         drop=("--model-preset", "--batch-size", "--seq-length")),
     "batch_size"),
    ("memory-plan-not-json", TRAINING, train("--memory-plan", "not json"), "memory_plan"),
    ("memory-plan-missing-file", TRAINING, train("--memory-plan", "@/nonexistent/plan.json"),
     "memory_plan"),
    ("memory-plan-unknown-key", TRAINING, train(
        "--memory-plan", '{"schema": "kfp-sagemaker/memory-plan/v1", "precision": {}}'),
     "memory_plan: the plan has unknown key(s) 'precision' (did you mean 'precisions'"),
    # ---- this command line's own output files (issue 44): refused while parsing ----
    ("aws-resources-path-a-directory", TRAINING, train("--aws-resources-path", "/tmp"),
     "--aws-resources-path"),
    ("output-json-in-no-directory", TRAINING, train("--output-json", "/nonexistent-44/out.json"),
     "--output-json"),
    ("memory-plan-file-a-directory", TRAINING, train("--memory-plan", "@/tmp"), "memory_plan"),
    # ---- memory_estimate ----
    ("estimate-precision-unknown", MEMORY, ["--instance-type", "ml.p6-b200.48xlarge",
                                            "--precision", "fp6"], "precision"),
    ("estimate-instance-unknown", MEMORY, ["--instance-type", "ml.p9.bogus"], "instance_type"),
    ("estimate-batch-negative", MEMORY, ["--instance-type", "ml.p6-b200.48xlarge",
                                         "--batch-size", "-1"], "batch_size"),
    ("estimate-headroom-1", MEMORY, ["--instance-type", "ml.p6-b200.48xlarge",
                                     "--headroom", "1.5"], "headroom"),
    ("estimate-world-size-3", MEMORY, ["--instance-type", "ml.p6-b200.48xlarge",
                                       "--world-size", "3"], "world_size"),
    ("estimate-world-size-0", MEMORY, ["--gpu", "H200", "--world-size", "0"], "world_size"),
    ("estimate-gpu-and-instance-disagree", MEMORY, ["--instance-type", "ml.p6-b200.48xlarge",
                                                    "--gpu", "H200"], "gpu"),
]


@pytest.fixture(scope="module")
def backend():
    yield from local_backend_with_bucket(BUCKET)


def backend_state(b: Any) -> dict[str, Any]:
    """What a command could have left on the backend."""
    s3 = b.client("s3")
    objects = sorted(
        (bucket["Name"], o["Key"]) for bucket in s3.list_buckets()["Buckets"]
        for o in s3.list_objects_v2(Bucket=bucket["Name"]).get("Contents", []))
    return {
        "training_jobs": b.client("sagemaker").list_training_jobs(
            MaxResults=100)["TrainingJobSummaries"],
        "s3_objects": objects,
        "ecr": b.client("ecr").describe_repositories()["repositories"],
        "codebuild": b.client("codebuild").list_projects()["projects"],
        "log_groups": b.client("logs").describe_log_groups()["logGroups"],
    }


def test_the_table_is_large_and_unique():
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("command", "argv", "field"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_input_exits_non_zero_before_any_aws_call_naming_the_field(
        backend, capsys, command, argv, field):
    main = importlib.import_module(MAINS[command]).main
    before = backend_state(backend)
    with aws.record_calls() as recording:
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's own errors
            code = exc.code
    out, err = capsys.readouterr()
    assert code not in (0, None), (out, err)
    assert field in err, err
    assert "Traceback" not in err, err
    assert recording.calls() == [], [c.operation for c in recording.calls()]
    assert backend_state(backend) == before


def test_the_launcher_refuses_every_case_with_the_user_error_exit_code(backend, capsys):
    """Launcher cases are user errors (exit 2), never a failure or a traceback."""
    main = importlib.import_module(MAINS[TRAINING]).main
    codes = {}
    for name, command, argv, _ in CASES:
        if command == TRAINING:
            try:
                codes[name] = main(list(argv))
            except SystemExit as exc:  # argparse: a malformed flag value
                codes[name] = exc.code
    capsys.readouterr()
    assert set(codes.values()) == {2}, json.dumps(codes)


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "launch"])
def test_damaged_token_data_the_launcher_can_reach_is_refused_before_any_call(
        backend, capsys, tmp_path, dry_run):
    """Issue 44: a data-dir hyperparameter that is a directory on this machine (the local
    backend's trainer runs here) is checked as the trainer checks it; one this machine does
    not have is the container's, left to the trainer."""
    main = importlib.import_module(MAINS[TRAINING]).main
    data = tmp_path / "tokens"
    data.mkdir()
    (data / "train_000.bin").write_bytes(b"\x01\x02\x03")  # not a whole number of uint16 ids
    flags = ["--dry-run"] if dry_run else []
    before = backend_state(backend)
    with aws.record_calls() as recording:
        code = main(train("--hyperparameters", f"data-dir={data}", *flags))
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"error: hyperparameters[data-dir]: {data / 'train_000.bin'}: is 3 bytes" in err, err
    assert recording.calls() == [] and backend_state(backend) == before
    # the container's own path (not on this machine) is not the launcher's to check
    assert main(train("--hyperparameters", "data-dir=/opt/ml/input/data/train",
                      "--dry-run")) == 0, capsys.readouterr().err
