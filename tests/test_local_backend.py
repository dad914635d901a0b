"""The local backend's own contract: one loopback endpoint, SageMaker's job API and errors.

The jobs here run tiny shell entry points (``AlgorithmSpecification.ContainerEntrypoint``)
so the protocol is tested in well under a second per job; the real trainer runs in
tests/test_sagemaker_training.py.
"""

from __future__ import annotations

import ast
import json
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from conftest import entrypoint, job_ended, local_backend_with_bucket, serve, wait_for

from kfp_sagemaker_blackwell.catalog import logformat
from kfp_sagemaker_blackwell.common import aws
from kfp_sagemaker_blackwell.local_backend import auth

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "local-backend-test"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/trainer:test"
ROLE = "arn:aws:iam::123456789012:role/SageMakerTraining"


SHAPE_ERRORS: list[str] = []
CHECKED: dict[str, int] = {}


@pytest.fixture(scope="module")
def backend():
    """The backend every test here shares; every SageMaker response its client gets is checked
    against botocore's output shape (or SageMaker's error format) as it arrives."""
    for b in local_backend_with_bucket(BUCKET, stop_grace_s=1.0):
        sm = b.client("sagemaker")
        sm.meta.events.register("before-parse.sagemaker", check_every_response)
        yield b
        sm.meta.events.unregister("before-parse.sagemaker", check_every_response)


def check_every_response(operation_model: Any, response_dict: dict[str, Any], **_: Any) -> None:
    name = operation_model.name
    body = json.loads(response_dict["body"] or b"{}")
    if response_dict["status_code"] >= 300:
        if set(body) != {"__type", "message"}:
            SHAPE_ERRORS.append(f"{name}: error body {body}")
    elif operation_model.output_shape is not None:
        SHAPE_ERRORS.extend(f"{name}{e}" for e in shape_errors(body, operation_model.output_shape))
    CHECKED[name] = CHECKED.get(name, 0) + 1


def request(name: str, script: str, **changes: Any) -> dict[str, Any]:
    req: dict[str, Any] = {
        "TrainingJobName": name,
        "RoleArn": ROLE,
        "AlgorithmSpecification": {"TrainingImage": IMAGE,
                                   "TrainingInputMode": "File",
                                   "ContainerEntrypoint": entrypoint("bash", script)},
        "HyperParameters": {"precision": "bf16", "batch-size": "4"},
        "OutputDataConfig": {"S3OutputPath": f"s3://{BUCKET}/out"},
        "ResourceConfig": {"InstanceType": "ml.p6-b200.48xlarge", "InstanceCount": 1,
                           "VolumeSizeInGB": 50},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
        "Tags": [{"Key": "team", "Value": "llm"}],
    }
    req.update(changes)
    return req


def raw_json(client: Any, operation: str, **kwargs: Any) -> dict[str, Any]:
    """Calls ``operation`` and returns the response body exactly as the backend sent it
    (botocore's parser drops members its model does not know, so check the raw body)."""
    seen: list[bytes] = []

    def grab(response_dict: dict[str, Any], **_: Any) -> None:
        seen.append(response_dict["body"])

    event = f"before-parse.sagemaker.{operation}"
    client.meta.events.register(event, grab)
    try:
        getattr(client, xform(operation))(**kwargs)
    finally:
        client.meta.events.unregister(event, grab)
    return json.loads(seen[-1])


def xform(operation: str) -> str:
    from botocore import xform_name

    return xform_name(operation)


def shape_errors(value: Any, shape: Any, path: str = "") -> list[str]:
    """Where ``value`` (raw JSON) breaks botocore's ``shape``: unknown or missing members,
    wrong types, values outside an enum."""
    kind = shape.type_name
    if kind == "structure":
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, not an object"]
        errors = [f"{path}.{k}: not in {shape.name}" for k in value if k not in shape.members]
        errors += [f"{path}.{k}: required, missing" for k in shape.required_members
                   if k not in value]
        for k, v in value.items():
            if k in shape.members:
                errors += shape_errors(v, shape.members[k], f"{path}.{k}")
        return errors
    if kind == "list":
        if not isinstance(value, list):
            return [f"{path}: not a list"]
        return [e for i, v in enumerate(value) for e in shape_errors(v, shape.member,
                                                                       f"{path}[{i}]")]
    if kind == "map":
        if not isinstance(value, dict):
            return [f"{path}: not a map"]
        return [e for k, v in value.items() for e in shape_errors(v, shape.value, f"{path}.{k}")]
    expected = {"string": str, "boolean": bool, "integer": int, "long": int,
                "timestamp": (int, float), "double": (int, float), "float": (int, float)}
    if kind in expected and (not isinstance(value, expected[kind]) or
                             (kind != "boolean" and isinstance(value, bool))):
        return [f"{path}: {value!r} is not a {kind}"]
    if kind == "string" and shape.enum and value not in shape.enum:
        return [f"{path}: {value!r} not in {shape.name}'s enum"]
    return []


def assert_matches_model(client: Any, operation: str, **kwargs: Any) -> dict[str, Any]:
    body = raw_json(client, operation, **kwargs)
    shape = client.meta.service_model.operation_model(operation).output_shape
    assert shape_errors(body, shape) == []
    return body


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


def test_job_runs_under_the_container_contract_and_uploads_model_and_output(backend, monkeypatch):
    # A backend started under OMP_NUM_THREADS gives its jobs (at most) that many threads.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    sm = backend.client("sagemaker")
    backend.client("s3").put_object(Bucket=BUCKET, Key="data/train/tokens.bin", Body=b"abc")
    script = (
        'set -e; test "$SM_CURRENT_HOST" = algo-1; test "$SM_HOSTS" = \'["algo-1"]\'; '
        'test "$SM_HP_PRECISION" = bf16; test "$SM_HP_BATCH_SIZE" = 4; test "$OMP_NUM_THREADS" = 1; '
        'test "$(cat $SM_CHANNEL_TRAIN/tokens.bin)" = abc; '
        'grep -q \'"current_host": "algo-1"\' "$SM_INPUT_CONFIG_DIR/resourceconfig.json"; '
        'grep -q \'"batch-size": "4"\' "$SM_INPUT_CONFIG_DIR/hyperparameters.json"; '
        'echo weights > "$SM_MODEL_DIR/model.bin"; echo metrics > "$SM_OUTPUT_DATA_DIR/m.txt"; '
        'echo "hello from $SM_CURRENT_HOST"')
    channel = [{"ChannelName": "train", "DataSource": {"S3DataSource": {
        "S3DataType": "S3Prefix", "S3Uri": f"s3://{BUCKET}/data/train"}}}]
    sm.create_training_job(**request("contract", script, InputDataConfig=channel))
    job = job_ended(sm, "contract")
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
    assert job_ended(sm, "dupe")["TrainingJobStatus"] == "Completed"
    code, message = error_of(sm.stop_training_job, TrainingJobName="dupe")
    assert code == "ValidationException" and "Completed" in message
    assert error_of(sm.create_training_job, **request("bad_name", "exit 0"))[0] == (
        "ValidationException")


def test_failure_file_becomes_the_failure_reason(backend):
    sm = backend.client("sagemaker")
    script = 'printf "CUDA out of memory. %.0s" $(seq 200) > "$SM_OUTPUT_DIR/failure"; exit 1'
    sm.create_training_job(**request("fails", script))
    job = job_ended(sm, "fails")
    assert job["TrainingJobStatus"] == job["SecondaryStatus"] == "Failed"
    assert job["FailureReason"].startswith("CUDA out of memory.")
    assert len(job["FailureReason"]) == 1024  # SageMaker's limit; the file was longer


def test_stop_sigterms_the_process_group_and_kills_it_after_the_grace_period(backend):
    sm = backend.client("sagemaker")
    sm.create_training_job(**request("stubborn", "trap '' TERM; echo started; sleep 300 & wait"))
    wait_for(lambda: sm.describe_training_job(TrainingJobName="stubborn")["SecondaryStatus"]
             == "Training", 30, "the stubborn job training")
    start = time.monotonic()
    sm.stop_training_job(TrainingJobName="stubborn")
    assert sm.describe_training_job(TrainingJobName="stubborn")["TrainingJobStatus"] == "Stopping"
    job = job_ended(sm, "stubborn")
    assert job["TrainingJobStatus"] == "Stopped"
    assert time.monotonic() - start < 10  # grace 1 s here (SageMaker: 120 s), then SIGKILL
    assert [t["Status"] for t in job["SecondaryStatusTransitions"]][-3:] == [
        "Stopping", "Uploading", "Stopped"]


def test_local_jobs_are_listed_and_visible_to_moto_tag_and_search_apis(backend):
    sm = backend.client("sagemaker")
    sm.create_training_job(**request("tagged", "exit 0"))
    job_ended(sm, "tagged")
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


def test_serve_prints_the_endpoint_and_runs_until_sigterm(monkeypatch):
    proc, url, env = serve()
    try:
        assert url.startswith("http://127.0.0.1:")
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(key, env[key])
        s3 = aws.client("s3", endpoint_url=url)
        s3.create_bucket(Bucket="served", CreateBucketConfiguration={
            "LocationConstraint": "us-west-2"})
        assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["served"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


LOCAL_PACKAGE = ROOT / "local_backend"


def test_executor_gets_settings_and_a_client_factory_not_the_backend():
    importers = set()
    for path in sorted(LOCAL_PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if any(n == "kfp_sagemaker_blackwell.local_backend.backend" for n in names):
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


# ---------------------------------------------------------------- SageMaker fidelity (issue 14)
def test_describe_returns_what_sagemaker_returns_with_defaults_filled_in(backend):
    sm = backend.client("sagemaker")
    profiler = {"S3OutputPath": f"s3://{BUCKET}/profiler", "ProfilingIntervalInMilliseconds": 500}
    sm.create_training_job(**request(
        "described", "exit 0", ProfilerConfig=profiler, EnableNetworkIsolation=True,
        EnableInterContainerTrafficEncryption=True,
        ResourceConfig={"InstanceType": "ml.m5.xlarge", "InstanceCount": 1,
                        "VolumeSizeInGB": 50, "VolumeKmsKeyId": "alias/training-volume"}))
    job_ended(sm, "described")
    job = assert_matches_model(sm, "DescribeTrainingJob", TrainingJobName="described")
    assert job["OutputDataConfig"] == {"S3OutputPath": f"s3://{BUCKET}/out", "KmsKeyId": "",
                                       "CompressionType": "GZIP"}  # the SDK's attach reads both
    assert job["ProfilerConfig"] == profiler and job["ProfilingStatus"] == "Enabled"
    assert job["ResourceConfig"]["VolumeKmsKeyId"] == "alias/training-volume"
    assert job["EnableNetworkIsolation"] is job["EnableInterContainerTrafficEncryption"] is True
    assert job["AlgorithmSpecification"]["TrainingInputMode"] == "File"
    for operation, kwargs in (("ListTrainingJobs", {"NameContains": "described"}),
                              ("ListTrainingPlans", {})):
        assert_matches_model(sm, operation, **kwargs)


def test_enterprise_kms_key_is_echoed_and_volume_key_refused_on_local_nvme_instances(backend):
    sm = backend.client("sagemaker")
    key = "arn:aws:kms:us-west-2:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    sm.create_training_job(**request("kms-out", "exit 0", OutputDataConfig={
        "S3OutputPath": f"s3://{BUCKET}/out", "KmsKeyId": key}))
    assert sm.describe_training_job(TrainingJobName="kms-out")["OutputDataConfig"][
        "KmsKeyId"] == key
    code, message = error_of(sm.create_training_job, **request(
        "kms-nvme", "exit 0", ResourceConfig={"InstanceType": "ml.p6-b200.48xlarge",
                                              "InstanceCount": 1, "VolumeSizeInGB": 50,
                                              "VolumeKmsKeyId": key}))
    assert code == "ValidationException" and "VolumeKmsKeyId" in message and "NVMe" in message


def test_create_validates_instance_type_bucket_and_required_members_like_sagemaker(backend):
    sm = backend.client("sagemaker")
    code, message = error_of(sm.create_training_job, **request("bad-type", "exit 0", ResourceConfig={
        "InstanceType": "ml.p9-bogus.48xlarge", "InstanceCount": 1, "VolumeSizeInGB": 50}))
    assert code == "ValidationException" and "'resourceConfig.instanceType'" in message
    assert "ml.p6-b200.48xlarge" in message  # botocore's enum, not a copied list
    code, message = error_of(sm.create_training_job, **request(
        "no-bucket", "exit 0", OutputDataConfig={"S3OutputPath": "s3://no-such-bucket/out"}))
    assert code == "ValidationException" and "no-such-bucket" in message
    for member in ("ResourceConfig", "AlgorithmSpecification"):
        req = request(f"no-{member.lower()}", "exit 0")
        del req[member]
        code, message = error_of(sm.create_training_job, **req)
        assert code == "ValidationException" and "Member must not be null" in message
    assert sm.list_training_jobs(NameContains="no-")["TrainingJobSummaries"] == []


def test_stopping_condition_defaults_to_sagemakers_one_day(backend):
    sm = backend.client("sagemaker")
    req = request("no-stop", "exit 0")
    del req["StoppingCondition"]
    sm.create_training_job(**req)
    assert sm.describe_training_job(TrainingJobName="no-stop")["StoppingCondition"] == {
        "MaxRuntimeInSeconds": 86400}
    assert job_ended(sm, "no-stop")["TrainingJobStatus"] == "Completed"


@pytest.fixture(scope="module")
def strict():
    from kfp_sagemaker_blackwell.local_backend import LocalBackend

    with LocalBackend(strict_resources=True, quotas={"ml.p6-b200.48xlarge": 2},
                      stop_grace_s=1.0) as b:
        b.client("s3").create_bucket(Bucket="strict-bucket", CreateBucketConfiguration={
            "LocationConstraint": b.region})
        iam = b.client("iam")
        iam.create_role(RoleName="strict-role", AssumeRolePolicyDocument="{}")
        ecr = b.client("ecr")
        ecr.create_repository(repositoryName="strict-trainer")
        ecr.put_image(repositoryName="strict-trainer", imageTag="v1", imageManifest=json.dumps(
            {"schemaVersion": 2, "config": {"digest": "sha256:" + "a" * 64},
             "mediaType": "application/vnd.docker.distribution.manifest.v2+json"}))
        yield b


def strict_request(name: str, script: str, **changes: Any) -> dict[str, Any]:
    base = request(name, script, RoleArn="arn:aws:iam::123456789012:role/strict-role",
                   OutputDataConfig={"S3OutputPath": "s3://strict-bucket/out"})
    base["AlgorithmSpecification"]["TrainingImage"] = (
        "123456789012.dkr.ecr.us-west-2.amazonaws.com/strict-trainer:v1")
    base.update(changes)
    return base


def test_strict_backend_refuses_unknown_role_image_and_kms_key_at_create(strict):
    sm = strict.client("sagemaker")
    sm.create_training_job(**strict_request("strict-ok", "exit 0"))
    assert job_ended(sm, "strict-ok")["TrainingJobStatus"] == "Completed"
    cases = {
        "role": dict(RoleArn="arn:aws:iam::123456789012:role/nobody"),
        "docker-hub": dict(AlgorithmSpecification={"TrainingImage": "docker.io/library/foo:1",
                                                   "TrainingInputMode": "File"}),
        "unpushed": dict(AlgorithmSpecification={
            "TrainingImage": "123456789012.dkr.ecr.us-west-2.amazonaws.com/strict-trainer:v2",
            "TrainingInputMode": "File"}),
        "kms": dict(OutputDataConfig={"S3OutputPath": "s3://strict-bucket/out",
                                      "KmsKeyId": "alias/nope"}),
    }
    words = {"role": "Could not assume role", "docker-hub": "not an Amazon ECR image",
             "unpushed": "not found in ECR", "kms": "alias/nope"}
    for case, changes in cases.items():
        code, message = error_of(sm.create_training_job,
                                 **strict_request(f"strict-{case}", "exit 0", **changes))
        assert (code, words[case] in message) == ("ValidationException", True), message


def test_instance_quota_answers_resource_limit_exceeded(strict):
    sm = strict.client("sagemaker")
    sm.create_training_job(**strict_request("quota-a", "sleep 30", ResourceConfig={
        "InstanceType": "ml.p6-b200.48xlarge", "InstanceCount": 2, "VolumeSizeInGB": 50}))
    code, message = error_of(sm.create_training_job, **strict_request("quota-b", "exit 0"))
    assert code == "ResourceLimitExceeded"
    assert "'ml.p6-b200.48xlarge for training job usage' is 2 Instances" in message
    sm.stop_training_job(TrainingJobName="quota-a")
    job_ended(sm, "quota-a")
    sm.create_training_job(**strict_request("quota-b", "exit 0"))  # capacity is back


def test_unsupported_sagemaker_operations_answer_at_once_in_sagemakers_format(backend):
    sm = backend.client("sagemaker")
    with pytest.raises(ClientError) as err:
        sm.update_training_job(TrainingJobName="anything")
    response = err.value.response
    # At once: the first answer is final (no retry, which a 5xx or a timeout would cause).
    assert response["ResponseMetadata"]["RetryAttempts"] == 0, response["ResponseMetadata"]
    assert response["Error"]["Code"] == "UnknownOperationException"
    assert "local backend" in response["Error"]["Message"] and "UpdateTrainingJob" in response[
        "Error"]["Message"]
    assert response["ResponseMetadata"]["RetryAttempts"] == 0
    assert error_of(sm.list_training_jobs_for_hyper_parameter_tuning_job,
                    HyperParameterTuningJobName="hpo")[0] == "UnknownOperationException"
    assert "Results" in sm.search(Resource="TrainingJob")  # what moto serves still goes to moto


def test_list_training_jobs_validates_enums_and_bounds_like_sagemaker(backend):
    sm = backend.client("sagemaker")
    for kwargs, field in ((dict(StatusEquals="Bogus"), "statusEquals"),
                          (dict(SortBy="Bogus"), "sortBy"),
                          (dict(SortOrder="Sideways"), "sortOrder"),
                          (dict(MaxResults=1000), "maxResults")):
        code, message = error_of(sm.list_training_jobs, **kwargs)
        assert code == "ValidationException" and f"'{field}'" in message, message


def test_next_token_is_opaque_bound_to_its_filters_and_stable_under_creates(backend):
    sm = backend.client("sagemaker")
    for i in range(4):
        sm.create_training_job(**request(f"paged-{i}", "exit 0"))
        time.sleep(0.01)
    first = sm.list_training_jobs(NameContains="paged-", MaxResults=2)
    assert [s["TrainingJobName"] for s in first["TrainingJobSummaries"]] == ["paged-3", "paged-2"]
    token = first["NextToken"]
    assert not token.isdigit()
    sm.create_training_job(**request("paged-4", "exit 0"))  # newest: would shift an offset
    second = sm.list_training_jobs(NameContains="paged-", MaxResults=2, NextToken=token)
    assert [s["TrainingJobName"] for s in second["TrainingJobSummaries"]] == ["paged-1", "paged-0"]
    code, _ = error_of(sm.list_training_jobs, NameContains="other", NextToken=token)
    assert code == "ValidationException"
    names = [s["TrainingJobName"] for page in sm.get_paginator("list_training_jobs").paginate(
        NameContains="paged-", PaginationConfig={"PageSize": 2}) for s in page[
        "TrainingJobSummaries"]]
    assert names == ["paged-4", "paged-3", "paged-2", "paged-1", "paged-0"]


def test_secondary_statuses_last_a_while_and_spot_is_billed_below_training_time(backend):
    sm = backend.client("sagemaker")
    sm.create_training_job(**request(
        "spot-billed", "sleep 2", EnableManagedSpotTraining=True,
        StoppingCondition={"MaxRuntimeInSeconds": 600, "MaxWaitTimeInSeconds": 1200}))
    job = job_ended(sm, "spot-billed")
    transitions = job["SecondaryStatusTransitions"]
    assert [t["Status"] for t in transitions] == [
        "Starting", "Downloading", "Training", "Uploading", "Completed"]
    for t in transitions[:-1]:  # the short profile: every step observable, none instantaneous
        assert (t["EndTime"] - t["StartTime"]).total_seconds() >= 0.04, t
    assert job["TrainingTimeInSeconds"] >= 2
    assert job["BillableTimeInSeconds"] < job["TrainingTimeInSeconds"]  # the spot saving


def test_spot_restart_takes_over_a_second_so_new_streams_are_later(backend):
    sm = backend.client("sagemaker")
    script = 'echo "attempt $SM_CURRENT_HOST"; sleep 30'
    sm.create_training_job(**request(
        "spot-restart", script, EnableManagedSpotTraining=True,
        CheckpointConfig={"S3Uri": f"s3://{BUCKET}/ckpt/spot-restart"},
        StoppingCondition={"MaxRuntimeInSeconds": 600, "MaxWaitTimeInSeconds": 1200}))
    wait_secondary(sm, "spot-restart", "Training")
    backend.interrupt_spot("spot-restart")
    wait_secondary(sm, "spot-restart", "Training", after="Restarting")
    job = sm.describe_training_job(TrainingJobName="spot-restart")
    by_status = {t["Status"]: t for t in job["SecondaryStatusTransitions"]}
    starts = [t["Status"] for t in job["SecondaryStatusTransitions"]]
    interrupted = by_status["Interrupted"]["StartTime"]
    restarted = [t for t in job["SecondaryStatusTransitions"] if t["Status"] == "Starting"][-1]
    assert (restarted["StartTime"] - interrupted).total_seconds() >= 1.0, starts
    sm.stop_training_job(TrainingJobName="spot-restart")
    job_ended(sm, "spot-restart")


def wait_secondary(sm: Any, name: str, status: str, after: str | None = None,
                   timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = sm.describe_training_job(TrainingJobName=name)
        seen = [t["Status"] for t in job["SecondaryStatusTransitions"]]
        if job["SecondaryStatus"] == status and (after is None or after in seen):
            return
        time.sleep(0.05)
    raise AssertionError(f"{name}: never {status} (after {after}); saw {seen}")


def test_filter_log_events_honours_the_stream_name_prefix(backend):
    sm = backend.client("sagemaker")
    for name in ("logs-a", "logs-b"):
        sm.create_training_job(**request(name, f"echo from {name}"))
    for name in ("logs-a", "logs-b"):
        job_ended(sm, name)
    logs = backend.client("logs")
    deadline = time.monotonic() + 10

    def messages(prefix: str) -> list[str]:
        return [e["message"] for e in logs.filter_log_events(
            logGroupName="/aws/sagemaker/TrainingJobs", logStreamNamePrefix=prefix)["events"]]

    while messages("logs-") != ["from logs-a", "from logs-b"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert messages("logs-a/") == ["from logs-a"]
    assert messages("no-such-job/") == []
    assert sorted(messages("logs-")) == ["from logs-a", "from logs-b"]


def test_every_sagemaker_response_so_far_matched_botocores_shapes(backend):
    """Runs after the tests above (pytest keeps file order): all of their responses."""
    assert SHAPE_ERRORS == []
    assert sum(CHECKED.values()) >= 100 and {"CreateTrainingJob", "DescribeTrainingJob",
                                             "ListTrainingJobs", "StopTrainingJob"} <= set(CHECKED)


# ---------------------------------------------------------------- cost and failures (issue 12)
def test_billable_time_is_per_instance_not_multiplied_by_the_instance_count(backend):
    sm = backend.client("sagemaker")
    sm.create_training_job(**request("two-hosts", "sleep 2", ResourceConfig={
        "InstanceType": "ml.m5.xlarge", "InstanceCount": 2, "VolumeSizeInGB": 50}))
    job = job_ended(sm, "two-hosts")
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    # botocore: "Multiply BillableTimeInSeconds by the number of instances ... to get the
    # total compute time SageMaker bills you"; one instance's time is ~2-3 s, not 2 x that.
    assert 2 <= job["BillableTimeInSeconds"] <= job["TrainingTimeInSeconds"] + 1


def test_a_host_killed_by_sigkill_is_reported_as_host_memory_with_what_the_trainer_reported(
        backend):
    sm = backend.client("sagemaker")
    # The trainer's own lines (its model and its last step's GPU memory), then the kernel's OOM
    # killer ends it, a process below the container's PID 1 (which cannot be SIGKILLed from
    # inside its own PID namespace).
    model = logformat.format_json("model", {"params": 8_030_261_248, "preset": "8b"})
    step = logformat.format_step(logformat.StepRecord(
        3, 2.5, 3e-4, 1.0, 100.0, 100.0, 1.0, 0.1, 61.25, 70.0, "bf16", False))
    script = (f"echo loading; echo {shlex.quote('[default0]:' + model)}; "
              f"echo {shlex.quote(step)}; sh -c 'kill -KILL $$'; exit $?")
    sm.create_training_job(**request("oom-killed", script))
    job = job_ended(sm, "oom-killed")
    reason = job["FailureReason"]
    assert job["TrainingJobStatus"] == "Failed"
    assert "SIGKILL" in reason and "out-of-memory" in reason and "GiB of memory" in reason
    assert "The trainer reported: its model (preset 8b) has 8.03 B parameters" in reason
    assert "61.2 GiB allocated, 70.0 GiB reserved per GPU" in reason
    assert "wrote no failure file" in reason and "exited with code 1" not in reason


def test_the_backend_does_not_work_out_a_models_memory_from_its_hyperparameters(backend):
    # Issue 27: the trainer runs and reports its size and memory; the emulator keeps no second
    # copy of the memory model, so hyperparameters naming a big model add nothing to the reason.
    sm = backend.client("sagemaker")
    sm.create_training_job(**request("oom-silent", "sh -c 'kill -KILL $$'; exit $?",
                                     HyperParameters={"model-preset": "8b", "num-layers": "40"}))
    reason = job_ended(sm, "oom-silent")["FailureReason"]
    assert "SIGKILL" in reason and "out-of-memory" in reason
    assert "B parameters" not in reason and "8b" not in reason and "trainer reported" not in reason


# ---------------------------------------------------------------- serve: plans, quotas, spot
def test_serve_answers_training_plans_quotas_and_spot_interruptions(tmp_path, monkeypatch):
    offerings = tmp_path / "offerings.json"
    offerings.write_text(json.dumps([{"instance_type": "ml.p6-b200.48xlarge",
                                      "max_instance_count": 2,
                                      "upfront_fee_per_instance_hour": 10.0}]))
    proc, url, env = serve("--no-strict-resources", "--quota", "ml.p6-b200.48xlarge=1",
                           "--training-plan-offerings", str(offerings), "--stop-grace", "1")
    try:
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(key, env[key])
        sm = aws.client("sagemaker", endpoint_url=url)
        s3 = aws.client("s3", endpoint_url=url)
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={
            "LocationConstraint": "us-west-2"})
        found = assert_matches_model(sm, "SearchTrainingPlanOfferings",
                                     InstanceType="ml.p6-b200.48xlarge", InstanceCount=2,
                                     DurationHours=24, TargetResources=["training-job"])
        [offer] = found["TrainingPlanOfferings"]
        assert offer["UpfrontFee"] == "480.00"  # 10 x 2 instances x 24 h, as configured
        assert sm.search_training_plan_offerings(
            InstanceType="ml.p6-b200.48xlarge", InstanceCount=3, DurationHours=24,
            TargetResources=["training-job"])["TrainingPlanOfferings"] == []
        arn = sm.create_training_plan(TrainingPlanName="served-plan", TrainingPlanOfferingId=offer[
            "TrainingPlanOfferingId"])["TrainingPlanArn"]
        plan = sm.describe_training_plan(TrainingPlanName="served-plan")
        assert plan["TrainingPlanArn"] == arn and plan["TotalInstanceCount"] == 2

        def admin(method: str, path: str, body: Any = None) -> dict[str, Any]:
            data = b"" if body is None else json.dumps(body).encode()
            headers = auth.signed_headers(method, url + path, data, "us-west-2")
            req = urllib.request.Request(url + path, data=data or None, method=method,
                                         headers=headers)
            with urllib.request.urlopen(req, timeout=10) as response:
                return json.loads(response.read())

        assert admin("GET", "/_local/settings")["quotas"] == {"ml.p6-b200.48xlarge": 1}
        spot = request("served-spot", "sleep 60", EnableManagedSpotTraining=True,
                       StoppingCondition={"MaxRuntimeInSeconds": 600,
                                          "MaxWaitTimeInSeconds": 1200})
        sm.create_training_job(**spot)
        code, _ = error_of(sm.create_training_job, **request("served-two", "exit 0"))
        assert code == "ResourceLimitExceeded"
        admin("PUT", "/_local/quotas", {"ml.p6-b200.48xlarge": 2})
        sm.create_training_job(**request("served-two", "exit 0"))
        wait_secondary(sm, "served-spot", "Training")
        out = subprocess.run([sys.executable, "-m", "kfp_sagemaker_blackwell.local_backend", "interrupt-spot",
                              "served-spot", "--endpoint-url", url], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        wait_secondary(sm, "served-spot", "Training", after="Restarting")
        sm.stop_training_job(TrainingJobName="served-spot")
        job_ended(sm, "served-spot")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_master_ports_are_free_below_the_ephemeral_range_and_not_handed_out_twice():
    # A released ephemeral port can become the local end of any outgoing connection before
    # torchrun binds it (EADDRINUSE, the job exits 1): master ports come from below the range.
    import socket

    from kfp_sagemaker_blackwell.local_backend import container

    low = container._ephemeral_low()
    ports = [container.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(container.MASTER_PORTS[0] <= p < low for p in ports), (low, ports)
    with socket.socket() as s:  # a port someone holds is never handed out
        s.bind(("127.0.0.1", ports[0]))
        container._given.clear()
        assert ports[0] not in {container.free_port() for _ in range(200)}
