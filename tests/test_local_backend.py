"""The local backend's own contract: one loopback endpoint, SageMaker's job API and errors.

The jobs here run tiny shell entry points (``AlgorithmSpecification.ContainerEntrypoint``)
so the protocol is tested in well under a second per job; the real trainer runs in
tests/test_sagemaker_training.py.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from conftest import local_backend_with_bucket

from components.common import aws

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "local-backend-test"


@pytest.fixture(scope="module")
def backend():
    yield from local_backend_with_bucket(BUCKET, stop_grace_s=1.0)


def request(name: str, script: str, **changes: Any) -> dict[str, Any]:
    req: dict[str, Any] = {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::123456789012:role/SageMakerTraining",
        "AlgorithmSpecification": {"TrainingImage": "local/trainer:test",
                                   "TrainingInputMode": "File",
                                   "ContainerEntrypoint": ["bash", "-c", script]},
        "HyperParameters": {"precision": "bf16", "batch-size": "4"},
        "OutputDataConfig": {"S3OutputPath": f"s3://{BUCKET}/out"},
        "ResourceConfig": {"InstanceType": "ml.p6-b200.48xlarge", "InstanceCount": 1,
                           "VolumeSizeInGB": 50},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
        "Tags": [{"Key": "team", "Value": "llm"}],
    }
    req.update(changes)
    return req


def wait_status(sm: Any, name: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = sm.describe_training_job(TrainingJobName=name)
        if job["TrainingJobStatus"] in ("Completed", "Failed", "Stopped"):
            return job
        time.sleep(0.1)
    raise AssertionError(f"{name} still {job['TrainingJobStatus']} after {timeout} s")


def error_of(call, **kwargs) -> tuple[str, str]:
    with pytest.raises(ClientError) as err:
        call(**kwargs)
    return err.value.response["Error"]["Code"], err.value.response["Error"]["Message"]


def test_one_loopback_endpoint_serves_every_aws_client_from_the_environment(backend):
    assert backend.endpoint_url.startswith("http://127.0.0.1:")
    env = backend.env()
    assert env["AWS_ENDPOINT_URL"] == backend.endpoint_url and env["AWS_REGION"] == backend.region
    s3 = aws.client("s3")  # the project's factory, configured only by the environment
    s3.put_object(Bucket=BUCKET, Key="hello.txt", Body=b"hi")
    assert s3.get_object(Bucket=BUCKET, Key="hello.txt")["Body"].read() == b"hi"
    logs = aws.client("logs")
    logs.create_log_group(logGroupName="/test/group")
    assert [g["logGroupName"] for g in logs.describe_log_groups(
        logGroupNamePrefix="/test")["logGroups"]] == ["/test/group"]
    assert aws.client("sts").get_caller_identity()["Account"] == "123456789012"
    assert aws.client("ecr").create_repository(repositoryName="trainer")["repository"][
        "repositoryUri"].startswith("123456789012.dkr.ecr.")


def test_job_runs_under_the_container_contract_and_uploads_model_and_output(backend):
    sm = backend.client("sagemaker")
    backend.client("s3").put_object(Bucket=BUCKET, Key="data/train/tokens.bin", Body=b"abc")
    script = (
        'set -e; test "$SM_CURRENT_HOST" = algo-1; test "$SM_HOSTS" = \'["algo-1"]\'; '
        'test "$SM_HP_PRECISION" = bf16; test "$SM_HP_BATCH_SIZE" = 4; '
        'test "$(cat $SM_CHANNEL_TRAIN/tokens.bin)" = abc; '
        'grep -q \'"current_host": "algo-1"\' "$SM_INPUT_CONFIG_DIR/resourceconfig.json"; '
        'grep -q \'"batch-size": "4"\' "$SM_INPUT_CONFIG_DIR/hyperparameters.json"; '
        'echo weights > "$SM_MODEL_DIR/model.bin"; echo metrics > "$SM_OUTPUT_DATA_DIR/m.txt"; '
        'echo "hello from $SM_CURRENT_HOST"')
    channel = [{"ChannelName": "train", "DataSource": {"S3DataSource": {
        "S3DataType": "S3Prefix", "S3Uri": f"s3://{BUCKET}/data/train"}}}]
    sm.create_training_job(**request("contract", script, InputDataConfig=channel))
    job = wait_status(sm, "contract")
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    keys = {o["Key"] for o in backend.client("s3").list_objects_v2(
        Bucket=BUCKET, Prefix="out/contract/")["Contents"]}
    assert keys == {"out/contract/output/model.tar.gz", "out/contract/output/output.tar.gz"}
    assert job["ModelArtifacts"]["S3ModelArtifacts"] == (
        f"s3://{BUCKET}/out/contract/output/model.tar.gz")
    assert job["BillableTimeInSeconds"] >= 1 and job["TrainingEndTime"] >= job[
        "TrainingStartTime"]
    logs = backend.client("logs")
    [stream] = logs.describe_log_streams(logGroupName="/aws/sagemaker/TrainingJobs",
                                         logStreamNamePrefix="contract/")["logStreams"]
    events = logs.get_log_events(logGroupName="/aws/sagemaker/TrainingJobs",
                                 logStreamName=stream["logStreamName"], startFromHead=True)
    assert [e["message"] for e in events["events"]] == ["hello from algo-1"]


def test_duplicate_and_missing_jobs_answer_with_sagemakers_error_codes(backend):
    sm = backend.client("sagemaker")
    sm.create_training_job(**request("dupe", "exit 0"))
    code, message = error_of(sm.create_training_job, **request("dupe", "exit 0"))
    assert code == "ResourceInUse" and "already exists" in message
    assert error_of(sm.describe_training_job, TrainingJobName="no-such-job") == (
        "ValidationException", "Requested resource not found.")
    assert wait_status(sm, "dupe")["TrainingJobStatus"] == "Completed"
    code, message = error_of(sm.stop_training_job, TrainingJobName="dupe")
    assert code == "ValidationException" and "Completed" in message
    assert error_of(sm.create_training_job, **request("bad_name", "exit 0"))[0] == (
        "ValidationException")


def test_failure_file_becomes_the_failure_reason(backend):
    sm = backend.client("sagemaker")
    script = 'printf "CUDA out of memory. %.0s" $(seq 200) > "$SM_OUTPUT_DIR/failure"; exit 1'
    sm.create_training_job(**request("fails", script))
    job = wait_status(sm, "fails")
    assert job["TrainingJobStatus"] == job["SecondaryStatus"] == "Failed"
    assert job["FailureReason"].startswith("CUDA out of memory.")
    assert len(job["FailureReason"]) == 1024  # SageMaker's limit; the file was longer


def test_stop_sigterms_the_process_group_and_kills_it_after_the_grace_period(backend):
    sm = backend.client("sagemaker")
    sm.create_training_job(**request("stubborn", "trap '' TERM; echo started; sleep 300 & wait"))
    deadline = time.monotonic() + 30
    while sm.describe_training_job(TrainingJobName="stubborn")["SecondaryStatus"] != "Training":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    start = time.monotonic()
    sm.stop_training_job(TrainingJobName="stubborn")
    assert sm.describe_training_job(TrainingJobName="stubborn")["TrainingJobStatus"] == "Stopping"
    job = wait_status(sm, "stubborn")
    assert job["TrainingJobStatus"] == "Stopped"
    assert time.monotonic() - start < 10  # grace 1 s here (SageMaker: 120 s), then SIGKILL
    assert [t["Status"] for t in job["SecondaryStatusTransitions"]][-3:] == [
        "Stopping", "Uploading", "Stopped"]


def test_local_jobs_are_listed_and_visible_to_moto_tag_and_search_apis(backend):
    sm = backend.client("sagemaker")
    sm.create_training_job(**request("tagged", "exit 0"))
    wait_status(sm, "tagged")
    arn = sm.describe_training_job(TrainingJobName="tagged")["TrainingJobArn"]
    sm.add_tags(ResourceArn=arn, Tags=[{"Key": "owner", "Value": "me"}])
    assert {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=arn)["Tags"]} == {
        "team": "llm", "owner": "me"}
    found = sm.search(Resource="TrainingJob", SearchExpression={"Filters": [
        {"Name": "Tags.owner", "Operator": "Equals", "Value": "me"}]})["Results"]
    assert [r["TrainingJob"]["TrainingJobName"] for r in found] == ["tagged"]
    listed = sm.list_training_jobs(NameContains="tagg", StatusEquals="Completed")
    assert [s["TrainingJobName"] for s in listed["TrainingJobSummaries"]] == ["tagged"]
    sm.delete_training_job(TrainingJobName="tagged")
    assert sm.list_training_jobs(NameContains="tagg")["TrainingJobSummaries"] == []
    assert error_of(sm.describe_training_job, TrainingJobName="tagged")[0] == (
        "ValidationException")


def test_registered_training_plans_are_described_and_listed(backend):
    sm = backend.client("sagemaker")
    arn = backend.register_training_plan("p6-plan", instance_count=2, status="Scheduled")
    plan = sm.describe_training_plan(TrainingPlanName="p6-plan")
    assert plan["TrainingPlanArn"] == arn and plan["Status"] == "Scheduled"
    assert plan["ReservedCapacitySummaries"][0]["InstanceType"] == "ml.p6-b200.48xlarge"
    assert plan["TotalInstanceCount"] == 2 and plan["AvailableInstanceCount"] == 2
    assert arn in [p["TrainingPlanArn"] for p in sm.list_training_plans()[
        "TrainingPlanSummaries"]]
    assert error_of(sm.describe_training_plan, TrainingPlanName="nope")[0] == "ResourceNotFound"


def test_serve_prints_the_endpoint_and_runs_until_sigterm():
    proc = subprocess.Popen([sys.executable, "-m", "components.local", "serve"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ))
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        s3 = aws.client("s3", endpoint_url=url)
        s3.create_bucket(Bucket="served", CreateBucketConfiguration={
            "LocationConstraint": "us-west-2"})
        assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["served"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


LOCAL_PACKAGE = ROOT / "components" / "local"


def test_executor_gets_settings_and_a_client_factory_not_the_backend():
    importers = set()
    for path in sorted(LOCAL_PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if any(n == "components.local.backend" for n in names):
                importers.add(path.name)
    assert importers == {"__init__.py", "__main__.py"}  # nothing the backend imports


def test_private_moto_apis_are_used_in_one_file_and_no_function_is_over_80_lines():
    private = {}
    for path in sorted(LOCAL_PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("moto."):
                if not node.module.startswith("moto.moto_server."):  # the WSGI app is public
                    private.setdefault(path.name, set()).add(node.module)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.end_lineno - node.body[0].lineno + 1
                assert body <= 80, f"{path.name}:{node.lineno} {node.name} is {body} lines"
    assert set(private) == {"moto_state.py"}, private
