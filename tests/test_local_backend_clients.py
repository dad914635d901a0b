"""Real clients nobody here wrote, against ``python -m kfp_sagemaker_blackwell.local_backend serve``.

- the AWS CLI (``aws`` on PATH): create / describe / list with filters and pages / stop /
  ``wait training-job-completed-or-stopped`` / logs;
- sagemaker-core (the project's ``sagemaker`` extra): ``TrainingJob.get`` and ``wait``;
- the SageMaker Python SDK v2, the article's ``Estimator(...).fit()`` with and without spot
  and ``Estimator.attach``: SDK v2 needs sagemaker-core 1.x and cannot share this venv
  (the project needs 2.x), so it runs in its own interpreter, named by
  ``LOCAL_BACKEND_SDK2_PYTHON`` (``python -m venv /tmp/sdk2 && /tmp/sdk2/bin/pip install
  'sagemaker>=2.200,<3'``).

Each test skips, saying which client is missing, only when that client is not installed.
The backend's environment opts the SDKs out of telemetry; the SDK v2 run also refuses every
connection that is not to 127.0.0.1 and reports any attempt.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import entrypoint, job_ended, serve

from kfp_sagemaker_blackwell.common import aws

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "clients-bucket"
ROLE = "arn:aws:iam::123456789012:role/clients-role"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/clients-trainer:v1"
GROUP = "/aws/sagemaker/TrainingJobs"


@pytest.fixture(scope="module")
def served():
    """``serve`` (strict: role, image and bucket must exist), and its environment (also this
    process's while the module runs: its credentials are new at every start)."""
    proc, url, env = serve("--stop-grace", "1")
    mp = pytest.MonkeyPatch()
    try:
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            mp.setenv(key, env[key])
        aws.client("s3", endpoint_url=url).create_bucket(
            Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        aws.client("iam", endpoint_url=url).create_role(RoleName="clients-role",
                                                        AssumeRolePolicyDocument="{}")
        ecr = aws.client("ecr", endpoint_url=url)
        ecr.create_repository(repositoryName="clients-trainer")
        ecr.put_image(repositoryName="clients-trainer", imageTag="v1", imageManifest=json.dumps(
            {"schemaVersion": 2, "config": {"digest": "sha256:" + "b" * 64},
             "mediaType": "application/vnd.docker.distribution.manifest.v2+json"}))
        yield url, env
    finally:
        mp.undo()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def job_request(name: str, script: str) -> dict[str, Any]:
    return {
        "TrainingJobName": name, "RoleArn": ROLE,
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File",
                                   "ContainerEntrypoint": entrypoint("bash", script)},
        "OutputDataConfig": {"S3OutputPath": f"s3://{BUCKET}/out"},
        "ResourceConfig": {"InstanceType": "ml.p6-b200.48xlarge", "InstanceCount": 1,
                           "VolumeSizeInGB": 50},
        "StoppingCondition": {"MaxRuntimeInSeconds": 600},
    }


def wait_terminal(url: str, name: str, timeout: float = 60) -> str:
    sm = aws.client("sagemaker", endpoint_url=url)
    return str(job_ended(sm, name, timeout)["TrainingJobStatus"])


# ---------------------------------------------------------------- the AWS CLI
def test_aws_cli_creates_describes_lists_pages_stops_waits_and_reads_logs(served, tmp_path):
    if shutil.which("aws") is None:
        pytest.skip("the AWS CLI is not installed (not on PATH): pip install awscli, or "
                    "AWS CLI v2 from AWS")
    url, env = served

    def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(["aws", *args], env=env, capture_output=True, text=True,
                             timeout=120)
        assert not check or out.returncode == 0, out.stderr
        return out

    for name, script in (("cli-a", "echo hello from cli-a"), ("cli-b", "echo hello from cli-b"),
                         ("cli-fails", "exit 3"), ("cli-long", "sleep 60")):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(job_request(name, script)))
        cli("sagemaker", "create-training-job", "--cli-input-json", f"file://{path}")
    for name in ("cli-a", "cli-b", "cli-fails"):
        wait_terminal(url, name)
    described = json.loads(cli("sagemaker", "describe-training-job",
                               "--training-job-name", "cli-a").stdout)
    assert described["TrainingJobStatus"] == "Completed"
    assert described["OutputDataConfig"]["KmsKeyId"] == ""
    # list with filters, one item per page: the CLI follows NextToken itself ...
    listed = json.loads(cli("sagemaker", "list-training-jobs", "--name-contains", "cli-",
                            "--status-equals", "Completed", "--page-size", "1").stdout)
    assert sorted(s["TrainingJobName"] for s in listed["TrainingJobSummaries"]) == [
        "cli-a", "cli-b"]
    # ... or hands its token back for the next page
    first = json.loads(cli("sagemaker", "list-training-jobs", "--name-contains", "cli-",
                           "--status-equals", "Completed", "--max-items", "1").stdout)
    second = json.loads(cli("sagemaker", "list-training-jobs", "--name-contains", "cli-",
                            "--status-equals", "Completed", "--max-items", "1",
                            "--starting-token", first["NextToken"]).stdout)
    assert [s["TrainingJobName"] for s in first["TrainingJobSummaries"] +
            second["TrainingJobSummaries"]] == ["cli-b", "cli-a"]
    bogus = cli("sagemaker", "list-training-jobs", "--status-equals", "Bogus", check=False)
    assert bogus.returncode != 0 and "ValidationException" in bogus.stderr
    cli("sagemaker", "stop-training-job", "--training-job-name", "cli-long")
    assert wait_terminal(url, "cli-long") == "Stopped"
    for name in ("cli-a", "cli-long"):  # the waiter's acceptors: Completed and Stopped succeed
        cli("sagemaker", "wait", "training-job-completed-or-stopped", "--training-job-name", name)
    failed = cli("sagemaker", "wait", "training-job-completed-or-stopped",
                 "--training-job-name", "cli-fails", check=False)
    assert failed.returncode != 0 and "Waiter" in failed.stderr  # Failed is a failure state
    events = json.loads(cli("logs", "filter-log-events", "--log-group-name", GROUP,
                            "--log-stream-name-prefix", "cli-a/").stdout)["events"]
    assert [e["message"] for e in events] == ["hello from cli-a"]
    streams = json.loads(cli("logs", "describe-log-streams", "--log-group-name", GROUP,
                             "--log-stream-name-prefix", "cli-b/").stdout)["logStreams"]
    assert len(streams) == 1
    unsupported = cli("sagemaker", "update-training-job", "--training-job-name", "cli-a",
                      check=False)
    assert "UnknownOperationException" in unsupported.stderr and "local backend" in (
        unsupported.stderr)


# ---------------------------------------------------------------- sagemaker-core
def test_sagemaker_core_training_job_get_and_wait(served):
    try:
        from sagemaker.core.resources import TrainingJob
    except ImportError:
        pytest.skip("sagemaker-core is not installed (the project's `sagemaker` extra: "
                    "pip install -e '.[sagemaker]')")
    url, env = served
    aws.client("sagemaker", endpoint_url=url).create_training_job(
        **job_request("core-job", "sleep 1; echo done"))
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            if key.startswith(("AWS_", "SAGEMAKER_")):
                mp.setenv(key, value)
        job = TrainingJob.get(training_job_name="core-job", region="us-west-2")
        assert job.training_job_status in ("InProgress", "Completed")
        job.wait(poll=1, timeout=60)
        job.refresh()
    assert job.training_job_status == "Completed"
    assert job.output_data_config.kms_key_id == ""
    assert job.model_artifacts.s3_model_artifacts.endswith("core-job/output/model.tar.gz")


# ---------------------------------------------------------------- SageMaker Python SDK v2
def test_sdk_v2_article_estimator_fit_spot_and_attach(served):
    python = os.environ.get("LOCAL_BACKEND_SDK2_PYTHON")
    if not python:
        pytest.skip("the SageMaker Python SDK v2 is not installed: set LOCAL_BACKEND_SDK2_PYTHON "
                    "to a Python with sagemaker>=2.200,<3 (it cannot share this venv)")
    url, env = served
    out = subprocess.run([python, str(ROOT / "tests" / "clients" / "sdk_v2_article.py"),
                          BUCKET, IMAGE, ROLE], env={**env, "SAGEMAKER_SUPPRESS_V2_WARNING": "1"},
                         capture_output=True, text=True, timeout=570)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["blocked"] == []  # telemetry opted out: no connection left 127.0.0.1
    for kind in ("on_demand", "spot"):
        run = result[kind]
        assert run["status"] == "Completed" and run["attached_instance_type"] == (
            "ml.p6-b200.48xlarge")
        assert run["model_data"].endswith(f"{run['job']}/output/model.tar.gz")
    assert "step 1 loss 2.0 precision=bf16" in out.stdout  # fit(logs=True) tailed CloudWatch
