"""Capacity controls (issue 24 item 4): fallback instance types (InstancePreferences), the
pending time-out (MaxPendingTimeInSeconds) and warm pools (KeepAlivePeriodInSeconds), in the
training component's configuration, its cost and the local backend's semantics."""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import replace
from typing import Any

import pytest
from botocore.exceptions import ClientError
from conftest import STEP_SCRIPT, entrypoint, local_backend_with_bucket

from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.components.sagemaker_training import launcher
from kfp_sagemaker_blackwell.components.sagemaker_training.request import Budget, TrainingJobConfig
from kfp_sagemaker_blackwell.planning import pricing

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/kfp-sagemaker-trainer:test"
ROLE = "arn:aws:iam::123456789012:role/SageMakerTraining"
P6, P5 = "ml.p6-b200.48xlarge", "ml.p5.48xlarge"
BUCKET = "capacity-test"
SCALE = 0.001  # local seconds per SageMaker second: 1,800 s of pending time is 1.8 s


def cfg(**changes: Any) -> TrainingJobConfig:
    base = TrainingJobConfig(image_uri=IMAGE, role_arn=ROLE, output_s3_uri="s3://my-bucket/out",
                             run_id="capacity", task="train", model_preset="tiny", batch_size=2,
                             seq_length=32, max_steps=10)
    return replace(base, **changes)


def book(**overrides: float) -> pricing.PriceBook:
    return pricing.PriceBook("us-west-2", overrides, lookup=False)


# ---------------------------------------------------------------- the request
def test_fallbacks_become_instance_preferences_first_choice_first_without_instance_type():
    _, req = launcher.prepare(cfg(fallback_instances=[{"InstanceType": P5, "InstanceCount": 2}],
                                  max_pending_seconds=3600, keep_alive_seconds=600))
    rc = req["ResourceConfig"]
    assert rc["InstancePreferences"] == [{"InstanceType": P6, "InstanceCount": 1},
                                         {"InstanceType": P5, "InstanceCount": 2}]
    assert "InstanceType" not in rc and "InstanceCount" not in rc  # mutually exclusive
    assert rc["KeepAlivePeriodInSeconds"] == 600
    assert req["StoppingCondition"]["MaxPendingTimeInSeconds"] == 3600
    _, plain = launcher.prepare(cfg())
    assert "InstancePreferences" not in plain["ResourceConfig"]
    assert "MaxPendingTimeInSeconds" not in plain["StoppingCondition"]


def test_kfp_float_counts_are_accepted_and_the_count_defaults_to_instance_count():
    # kfp.local hands numbers inside lists of dicts over as floats: the component boundary
    # (TrainingJobConfig.from_values, common/kfp_values.integral) makes them ints again
    values = {**dataclasses.asdict(cfg(instance_count=2)), "fallback_instances": [
        {"InstanceType": P5, "InstanceCount": 4.0}, {"InstanceType": "ml.p5en.48xlarge"}]}
    _, req = launcher.prepare(TrainingJobConfig.from_values(values))
    assert [p["InstanceCount"] for p in req["ResourceConfig"]["InstancePreferences"]] == [2, 4, 2]


@pytest.mark.parametrize("changes, field, words", [
    (dict(max_pending_seconds=600), "max_pending_seconds", "1800"),
    (dict(max_pending_seconds=2419201), "max_pending_seconds", "2419200"),
    (dict(keep_alive_seconds=21601), "keep_alive_seconds", "21600"),
    (dict(fallback_instances=[{"InstanceType": P5}] * 5), "fallback_instances", "at most 5"),
    (dict(fallback_instances=[{"InstanceType": P5}], use_spot=True, max_wait_seconds=90000,
          checkpoint_s3_uri="s3://my-bucket/ckpt"), "fallback_instances", "use_spot"),
    (dict(keep_alive_seconds=60, use_spot=True, max_wait_seconds=90000,
          checkpoint_s3_uri="s3://my-bucket/ckpt"), "keep_alive_seconds", "spot"),
    (dict(fallback_instances=[{"InstanceType": "ml.nope.1xlarge"}]), "fallback_instances[0]",
     "not a known GPU instance type"),
    (dict(fallback_instances=[{"InstanceType": P5, "Count": 1}]), "fallback_instances[0]",
     "InstanceType, InstanceCount"),
    (dict(fallback_instances=[{"InstanceType": P6}]), "fallback_instances[0]", "already"),
    (dict(precision="mxfp8", fallback_instances=[{"InstanceType": P5}]),
     "fallback_instances[0]", "mxfp8"),
])
def test_capacity_controls_are_refused_before_aws_naming_the_field(changes, field, words):
    with pytest.raises(UserError) as err:
        launcher.prepare(cfg(**changes))
    assert err.value.field == field and words in str(err.value), str(err.value)


def test_memory_preflight_runs_for_every_fallback_and_names_the_one_that_does_not_fit():
    # 8b at batch 8 fits B200's 179 GiB but not H100's 80 GiB (memory_estimate's model)
    big = dict(model_preset="8b", batch_size=8, seq_length=2048)
    launcher.prepare(cfg(**big))
    with pytest.raises(UserError) as err:
        launcher.prepare(cfg(**big, fallback_instances=[
            {"InstanceType": "ml.p6-b300.48xlarge"}, {"InstanceType": P5, "InstanceCount": 2}]))
    assert err.value.field == "fallback_instances[1]"
    assert f"2 x {P5}" in err.value.problem and "H100" in err.value.problem
    resolved, _ = launcher.prepare(cfg(**dict(big, batch_size=4),
                                       fallback_instances=[{"InstanceType": P5}]))
    assert any(n.startswith(f"fallback 1 x {P5}: memory pre-flight") for n in resolved.notes)


# ---------------------------------------------------------------- the cost
def test_worst_case_is_the_costliest_preference_plus_the_warm_pools_keep_alive():
    lines: list[str] = []
    resolved, _ = launcher.prepare(cfg(max_runtime_seconds=3600, keep_alive_seconds=1800,
                                       fallback_instances=[{"InstanceType": P5,
                                                            "InstanceCount": 3}]))
    worst = launcher.cost_preview(resolved, book(**{P6: 100.0, P5: 50.0}), say=lines.append)
    # 1 x 1.5 h x 100 = 150 against 3 x 1.5 h x 50 = 225: the fallback is the worst case
    assert worst is not None and worst.amount == pytest.approx(225.0) and worst.instances == 3
    assert sum("if SageMaker selects preference" in ln for ln in lines) == 2
    assert any("max_runtime_seconds + keep_alive_seconds" in ln for ln in lines)
    with pytest.raises(UserError) as err:
        launcher.cost_preview(replace(resolved, budget=Budget(200.0)),
                              book(**{P6: 100.0, P5: 50.0}), say=lines.append)
    assert err.value.field == "max_cost_usd" and "$225.00" in err.value.problem


def test_a_budget_cannot_be_checked_when_a_fallback_has_no_price_and_says_which():
    resolved, _ = launcher.prepare(cfg(max_cost_usd=1000.0, fallback_instances=[
        {"InstanceType": "ml.p5e.48xlarge"}]))
    with pytest.raises(UserError) as err:
        launcher.cost_preview(resolved, book(), say=lambda _: None)
    assert "ml.p5e.48xlarge" in str(err.value)


def test_the_bill_is_the_selected_type_and_count_plus_the_warm_pools_retained_time():
    job = {"ResourceConfig": {"InstancePreferences": [], "SelectedInstanceType": P5,
                              "SelectedInstanceCount": 2},
           "BillableTimeInSeconds": 3600,
           "WarmPoolStatus": {"Status": "Terminated",
                              "ResourceRetainedBillableTimeInSeconds": 1800}}
    itype, count, seconds = pricing.billed(job)
    assert (itype, count, seconds) == (P5, 2, 5400)
    cost = pricing.cost(book(**{P5: 50.0}).price(P5), count, seconds)
    assert cost.amount == pytest.approx(2 * 1.5 * 50.0)
    assert pricing.billed({"ResourceConfig": {"InstanceType": P6, "InstanceCount": 1},
                           "BillableTimeInSeconds": 10}) == (P6, 1, 10)


# ---------------------------------------------------------------- the local backend
@pytest.fixture(scope="module")
def backend():
    # Jobs without their own entry point run conftest's STEP_SCRIPT, not the trainer: these
    # tests are about capacity and its cost (test_sagemaker_training trains on two hosts).
    yield from local_backend_with_bucket(BUCKET, stop_grace_s=1.0, latency="none",
                                         quotas={P6: 1, P5: 2}, capacity_time_scale=SCALE,
                                         command=[sys.executable, "-c", STEP_SCRIPT])


@pytest.fixture(autouse=True)
def no_job_left_holding_capacity(request: Any) -> Any:
    """A test that fails midway leaves its holding jobs running; stop them, so the next test
    does not fail on quota for this one's reason."""
    yield
    if "backend" not in request.fixturenames:
        return
    sm = request.getfixturevalue("backend").client("sagemaker")
    running = sm.list_training_jobs(StatusEquals="InProgress")["TrainingJobSummaries"]
    stop(sm, *(j["TrainingJobName"] for j in running))


def request(name: str, script: str, **changes: Any) -> dict[str, Any]:
    req: dict[str, Any] = {
        "TrainingJobName": name, "RoleArn": ROLE,
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File",
                                   "ContainerEntrypoint": entrypoint("bash", script)},
        "OutputDataConfig": {"S3OutputPath": f"s3://{BUCKET}/out"},
        "ResourceConfig": {"InstancePreferences": [{"InstanceType": P6, "InstanceCount": 1},
                                                   {"InstanceType": P5, "InstanceCount": 2}],
                           "VolumeSizeInGB": 50},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
    }
    req.update(changes)
    return req


def wait_for(sm: Any, name: str, done: Any, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = sm.describe_training_job(TrainingJobName=name)
        if done(job):
            return job
        time.sleep(0.05)
    raise AssertionError(f"{name}: {job['TrainingJobStatus']} {job.get('WarmPoolStatus')}")


def ended(job: dict[str, Any]) -> bool:
    return job["TrainingJobStatus"] in ("Completed", "Failed", "Stopped")


def stop(sm: Any, *names: str) -> None:
    for name in names:
        try:
            sm.stop_training_job(TrainingJobName=name)
        except ClientError:
            pass
        wait_for(sm, name, ended)


def test_the_first_preference_within_quota_is_selected_and_reported(backend):
    sm = backend.client("sagemaker")
    sm.create_training_job(**request("pref-a", "sleep 30"))
    a = sm.describe_training_job(TrainingJobName="pref-a")["ResourceConfig"]
    assert (a["SelectedInstanceType"], a["SelectedInstanceCount"]) == (P6, 1)
    sm.create_training_job(**request("pref-b", "sleep 30"))  # P6's quota of 1 is taken
    b = sm.describe_training_job(TrainingJobName="pref-b")["ResourceConfig"]
    assert (b["SelectedInstanceType"], b["SelectedInstanceCount"]) == (P5, 2)
    with pytest.raises(ClientError) as err:  # no preference left and no pending allowed
        sm.create_training_job(**request("pref-c", "exit 0"))
    assert err.value.response["Error"]["Code"] == "ResourceLimitExceeded"
    stop(sm, "pref-a", "pref-b")


def test_the_backend_refuses_preferences_with_instance_type_or_spot(backend):
    sm = backend.client("sagemaker")
    both = request("pref-both", "exit 0")
    both["ResourceConfig"]["InstanceType"] = P6
    spot = request("pref-spot", "exit 0", EnableManagedSpotTraining=True,
                   StoppingCondition={"MaxRuntimeInSeconds": 600, "MaxWaitTimeInSeconds": 600})
    for req, words in ((both, "mutually exclusive"), (spot, "EnableManagedSpotTraining")):
        with pytest.raises(ClientError) as err:
            sm.create_training_job(**req)
        assert words in err.value.response["Error"]["Message"]


def test_a_pending_job_takes_the_capacity_freed_and_times_out_stopped_otherwise(backend):
    sm = backend.client("sagemaker")
    pending = {"MaxRuntimeInSeconds": 600, "MaxPendingTimeInSeconds": 1800}
    # The job that takes the freed capacity may wait 8 h (28.8 s here): stopping hold-b takes up
    # to its 1 s stop grace, and under load more, so 1,800 s (1.8 s here) raced it. botocore's
    # model allows 1,800 to 2,419,200 s for MaxPendingTimeInSeconds.
    patient = {"MaxRuntimeInSeconds": 600, "MaxPendingTimeInSeconds": 8 * 3600}
    sm.create_training_job(**request("hold-a", "sleep 30"))
    sm.create_training_job(**request("hold-b", "sleep 30"))
    sm.create_training_job(**request("wait-ok", "exit 0", StoppingCondition=patient))
    job = wait_for(sm, "wait-ok", lambda j: j["SecondaryStatus"] == "Pending")
    assert "SelectedInstanceType" not in job["ResourceConfig"]
    stop(sm, "hold-b")  # P5 x 2 frees: the pending job takes it
    job = wait_for(sm, "wait-ok", ended)
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    assert job["ResourceConfig"]["SelectedInstanceType"] == P5
    sm.create_training_job(**request("hold-b2", "sleep 30"))
    t0 = time.monotonic()
    sm.create_training_job(**request("wait-out", "exit 0", StoppingCondition=pending))
    job = wait_for(sm, "wait-out", ended)
    assert time.monotonic() - t0 >= 1800 * SCALE
    # botocore's model and AWS Batch's guide (local_backend/supervisor.py): Stopped, no reason
    assert (job["TrainingJobStatus"], job["SecondaryStatus"]) == ("Stopped", "Stopped")
    assert "FailureReason" not in job
    assert "MaxPendingTimeInSeconds" in job["SecondaryStatusTransitions"][-1]["StatusMessage"]
    assert "BillableTimeInSeconds" in job and "SelectedInstanceType" not in job["ResourceConfig"]
    stop(sm, "hold-a", "hold-b2")


def test_a_warm_pool_is_retained_billed_and_reused_by_the_next_matching_job(backend):
    sm = backend.client("sagemaker")
    one = {"InstanceType": P6, "InstanceCount": 1, "VolumeSizeInGB": 50,
           "KeepAlivePeriodInSeconds": 3000}
    sm.create_training_job(**request("warm-a", "exit 0", ResourceConfig=dict(one)))
    job = wait_for(sm, "warm-a", lambda j: ended(j) and j.get("WarmPoolStatus", {}).get(
        "Status") == "Available")
    assert "ResourceRetainedBillableTimeInSeconds" not in job["WarmPoolStatus"]
    time.sleep(0.5)  # 500 SageMaker seconds retained
    sm.create_training_job(**request("warm-b", "exit 0", ResourceConfig=dict(one)))
    a = wait_for(sm, "warm-a", lambda j: j["WarmPoolStatus"]["Status"] == "Reused")
    assert a["WarmPoolStatus"]["ReusedByJob"] == "warm-b"
    retained = a["WarmPoolStatus"]["ResourceRetainedBillableTimeInSeconds"]
    assert 500 <= retained < 3000
    itype, count, seconds = pricing.billed(a)
    assert (itype, count, seconds) == (P6, 1, a["BillableTimeInSeconds"] + retained)
    # nobody reuses warm-b's pool: it ends after its keep-alive, all 3,000 s billed
    b = wait_for(sm, "warm-b", lambda j: j.get("WarmPoolStatus", {}).get("Status")
                 == "Terminated")
    assert b["WarmPoolStatus"]["ResourceRetainedBillableTimeInSeconds"] == 3000


def test_launch_on_the_backend_reports_the_selected_type_and_costs_it(backend, capsys):
    sm = backend.client("sagemaker")
    sm.create_training_job(**request("hold-p6", "sleep 30"))
    try:
        result = launcher.launch(
            cfg(output_s3_uri=f"s3://{BUCKET}/out", override_memory_check=True,
                fallback_instances=[{"InstanceType": P5, "InstanceCount": 2}],
                hyperparameters={"log-every": "1", "checkpoint-every": "0"}, max_steps=2),
            instance_hour_prices={P6: 100.0, P5: 50.0}, poll_interval_s=0.2)
    finally:
        stop(sm, "hold-p6")
    assert (result.status, result.instance_type, result.instance_count) == ("Completed", P5, 2)
    assert result.estimated_cost_usd == pytest.approx(2 * result.billable_seconds / 3600 * 50.0,
                                                      abs=1e-3)
    assert f"on 2 x {P5} (selected from the preferences)" in capsys.readouterr().out


def test_a_parameter_declared_once_is_a_config_field_a_cli_flag_and_in_the_request(capsys,
                                                                                monkeypatch):
    """enable_infra_check was added as the signature's parameter and its use in the request
    (issue 27's "one declaration"): the config, the CLI and the dry run follow."""
    import json

    from botocore.session import get_session
    from botocore.validate import validate_parameters

    from kfp_sagemaker_blackwell.components.sagemaker_training.__main__ import main

    _, request = launcher.prepare(cfg(enable_infra_check=True), region="us-west-2")
    assert request["InfraCheckConfig"] == {"EnableInfraCheck": True}
    shape = get_session().get_service_model("sagemaker").operation_model(
        "CreateTrainingJob").input_shape
    validate_parameters(request, shape)  # botocore's own check of what is sent
    assert "InfraCheckConfig" not in launcher.prepare(cfg(), region="us-west-2")[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # a dry run calls nothing
    code = main(["--dry-run", "--run-id", "infra", "--image-uri", IMAGE, "--role-arn", ROLE,
                 "--output-s3-uri", "s3://my-bucket/out", "--region", "us-west-2",
                 "--model-preset", "tiny", "--batch-size", "2", "--seq-length", "32",
                 "--enable-infra-check"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert json.loads(out.out)["InfraCheckConfig"] == {"EnableInfraCheck": True}
