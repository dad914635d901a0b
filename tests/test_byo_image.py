"""Bring your own image (issue 29 item 3): sagemaker_training with trainer="custom" runs a
team's own entry point on the local backend, and parse_logs turns the job's
MetricDefinitions into the step series."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from conftest import local_backend_with_bucket

from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.common.step_series import read_series
from kfp_sagemaker_blackwell.components.parse_logs import metric_defs
from kfp_sagemaker_blackwell.components.parse_logs.launcher import parse_training_job
from kfp_sagemaker_blackwell.components.parse_logs.report import write_outputs
from kfp_sagemaker_blackwell.components.sagemaker_training import launcher
from kfp_sagemaker_blackwell.components.sagemaker_training.request import (
    CUSTOM_SKIPPED,
    TrainingJobConfig,
    resolve,
)

BUCKET = "kfp-sagemaker-byo"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/team-trainer:1.0"
ROLE = "arn:aws:iam::123456789012:role/SageMakerTraining"
# A team's tiny trainer: its own flags (--epochs), its own log format.
SCRIPT = ("import argparse as a;p=a.ArgumentParser();p.add_argument('--epochs',type=int,"
          "required=True);[print(f'epoch={i} loss={1-i/10:.1f} throughput={100*i} acc=0.{i}',"
          "flush=True) for i in range(1,p.parse_args().epochs+1)]")
METRICS = [{"Name": "epoch", "Regex": r"epoch=(\d+)"},
           {"Name": "train:loss", "Regex": r"loss=([0-9.]+)"},
           {"Name": "throughput", "Regex": r"throughput=([0-9.]+)"},
           {"Name": "accuracy", "Regex": r"acc=([0-9.]+)"}]
PRICES = {"ml.p6-b200.48xlarge": 113.0}  # no Price List lookup


@pytest.fixture(scope="module")
def backend():
    yield from local_backend_with_bucket(BUCKET)


def custom(run_id: str, **changes: Any) -> TrainingJobConfig:
    cfg = TrainingJobConfig(
        image_uri=IMAGE, role_arn=ROLE, output_s3_uri=f"s3://{BUCKET}/out", run_id=run_id,
        task="byo", pipeline="tests", trainer="custom",
        entry_point=["python", "-c", SCRIPT, "--epochs", "3"],
        hyperparameters={"epochs": 3, "dropout": 0.1}, metric_definitions=METRICS)
    return replace(cfg, **changes)


def test_custom_job_runs_on_the_local_backend_and_its_metrics_fill_the_series(
        backend, tmp_path, monkeypatch):
    # endpoint_url is what reaches the backend: the environment's endpoint is gone.
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    lines: list[str] = []
    result = launcher.launch(custom("byo-1", endpoint_url=backend.endpoint_url),
                             instance_hour_prices=PRICES, poll_interval_s=0.2,
                             out=lines.append)
    assert result.status == "Completed", result.failure_reason
    assert CUSTOM_SKIPPED in lines
    job = backend.client("sagemaker").describe_training_job(TrainingJobName=result.job_name)
    spec = job["AlgorithmSpecification"]
    assert spec["MetricDefinitions"] == METRICS
    assert spec["ContainerEntrypoint"][-2:] == ["--epochs", "3"]
    # free hyperparameters, none of the in-repo trainer's
    assert job["HyperParameters"] == {"epochs": "3", "dropout": "0.1"}
    assert any("epoch=3 loss=0.7" in line for line in lines)  # the job's log, streamed

    parsed, _ = parse_training_job(result.job_name, logs=backend.client("logs"),
                                   sagemaker=backend.client("sagemaker"), precision="bf16")
    out = write_outputs(parsed, requested_precision="bf16", run=result.job_name,
                        series_path=tmp_path / "series.csv")
    assert out.report["status"] == "completed" and not out.report["failed"]
    assert out.rows == 3
    series = read_series(tmp_path / "series.csv")
    assert series.columns["step"] == [1, 2, 3]
    assert series.columns["loss"] == pytest.approx([0.9, 0.8, 0.7])
    assert series.columns["tokens_per_s"] == pytest.approx([100.0, 200.0, 300.0])
    assert all(math.isnan(v) for v in series.columns["lr"])
    assert any("accuracy" in w and "left out" in w for w in out.report["warnings"])

    # a retried task re-attaches to the job by its derived name instead of launching again
    again = launcher.launch(custom("byo-1", endpoint_url=backend.endpoint_url),
                            instance_hour_prices=PRICES, poll_interval_s=0.2,
                            out=lambda line: None)
    assert (again.job_name, again.created) == (result.job_name, False)


def test_the_in_repo_trainer_still_refuses_unknown_hyperparameters_and_custom_fields():
    base = custom("byo-2", trainer="in-repo", entry_point=[], metric_definitions=[],
                  model_preset="tiny", batch_size=1, seq_length=32)
    with pytest.raises(UserError) as exc:
        resolve(base, region="us-west-2")
    assert exc.value.field == "hyperparameters"
    with pytest.raises(UserError) as exc:
        resolve(replace(base, hyperparameters={}, metric_definitions=METRICS),
                region="us-west-2")
    assert exc.value.field == "metric_definitions"


@pytest.mark.parametrize(("changes", "field"), [
    ({"trainer": "mine"}, "trainer"),
    ({"metric_definitions": [{"Name": "loss"}]}, "metric_definitions[0]"),
    ({"metric_definitions": [{"Name": "loss", "Regex": "("}]}, "metric_definitions[0]"),
    ({"metric_definitions": [{"Name": "", "Regex": "x"}]}, "metric_definitions[0]"),
    ({"metric_definitions": [{"Name": f"m{i}", "Regex": "x"} for i in range(41)]},
     "metric_definitions"),
    ({"entry_point": ["python", "-c", "x" * 257]}, "entry_point"),
    ({"entry_point": ["python", "-c", "a\nb"]}, "entry_point"),  # SageMaker's .* is one line
    ({"endpoint_url": "localhost:1"}, "endpoint_url"),
    ({"memory_plan": "{}"}, "memory_plan"),
    ({"tags": {"k": "v" * 257}}, "tags"),
    ({"use_spot": True}, "checkpoint_s3_uri"),
    ({"precision": "nvfp4", "instance_type": "ml.p5.48xlarge"}, "precision"),
])
def test_custom_fields_are_checked_against_botocores_limits_before_any_call(changes, field):
    with pytest.raises(UserError) as exc:
        resolve(custom("byo-3", **changes), region="us-west-2")
    assert exc.value.field == field


def test_metric_names_map_to_series_columns():
    assert metric_defs.column_of("train:loss") == metric_defs.column_of("loss") == "loss"
    assert metric_defs.column_of("train/loss") == "loss"
    assert metric_defs.column_of("Epoch") == "step"
    assert metric_defs.column_of("validation:loss") is None
    scan = metric_defs.MetricScanner([{"Name": "loss", "Regex": r"loss=(\S+)"}])
    scan.feed(["loss=2.5", "noise", "loss=2.0", "loss=abc"])  # no step metric: lines number rows
    assert scan.rows == {1: {"loss": 2.5}, 2: {"loss": 2.0}}
    assert scan.unreadable == 1


def test_the_cost_limit_still_refuses_a_custom_job_before_it_is_created(backend):
    sagemaker = backend.client("sagemaker")
    before = len(sagemaker.list_training_jobs(MaxResults=100)["TrainingJobSummaries"])
    with pytest.raises(UserError) as exc:
        launcher.launch(custom("byo-4", max_cost_usd=10.0), instance_hour_prices=PRICES,
                        out=lambda line: None)
    assert exc.value.field == "max_cost_usd"
    assert len(sagemaker.list_training_jobs(MaxResults=100)["TrainingJobSummaries"]) == before
