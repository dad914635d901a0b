"""The one remote-job runner (common/remote_job.py), through each of its users.

Each user (the training runner, CodeBuild's wait, cleanup's stop-and-wait) must ride
out a transient failure in the middle of its polling and stop its job on SIGTERM.
SageMaker is stubbed with botocore's Stubber here (the local backend's training jobs
run a real trainer, slower than these checks need; tests/test_launch_faults.py runs
them there); CodeBuild's wait runs against the local backend in
tests/test_build_image_flow.py (it makes its own clients), and its generic part is
checked here with a stubbed CodeBuild client.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import socket
import threading
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import EndpointConnectionError
from botocore.stub import Stubber

from kfp_sagemaker_blackwell.common import aws
from kfp_sagemaker_blackwell.common.build_marks import CodeBuildBuild
from kfp_sagemaker_blackwell.common.execution_context import ExecutionContext, Terminated
from kfp_sagemaker_blackwell.common.remote_job import RemoteJobRunner
from kfp_sagemaker_blackwell.common.training_job import TrainingJob
from kfp_sagemaker_blackwell.components.cleanup import launcher as cleanup_run
from kfp_sagemaker_blackwell.components.cleanup.plan import Action, Plan
from kfp_sagemaker_blackwell.components.sagemaker_training.runner import TrainingJobRunner

pytestmark = pytest.mark.timeout(60)

REGION = "us-west-2"
NAME = "run-1-train-bf16"
ARN = f"arn:aws:sagemaker:{REGION}:123456789012:training-job/{NAME}"
BUILD_ID = "kfp-sagemaker-build:0c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f"
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def client(service: str) -> Any:
    return boto3.client(service, region_name=REGION, aws_access_key_id="testing",
                        aws_secret_access_key="testing")


def described(status: str, secondary: str = "Training", transitions: int = 0) -> dict[str, Any]:
    return {
        "TrainingJobName": NAME, "TrainingJobArn": ARN, "TrainingJobStatus": status,
        "SecondaryStatus": secondary, "ModelArtifacts": {"S3ModelArtifacts": "s3://b/m"},
        "AlgorithmSpecification": {"TrainingInputMode": "File"},
        "ResourceConfig": {"InstanceCount": 1, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600}, "CreationTime": NOW,
        "SecondaryStatusTransitions": [
            {"Status": f"Step{i}", "StartTime": NOW, "StatusMessage": f"message {i}"}
            for i in range(transitions)],
    }


REQUEST = {
    "TrainingJobName": NAME, "RoleArn": "arn:aws:iam::123456789012:role/r",
    "AlgorithmSpecification": {"TrainingInputMode": "File", "TrainingImage": "img:1"},
    "OutputDataConfig": {"S3OutputPath": "s3://b/out"},
    "ResourceConfig": {"InstanceCount": 1, "InstanceType": "ml.m5.large", "VolumeSizeInGB": 30},
    "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
}
ONE_JOB = {"TrainingJobName": NAME}
NOT_FOUND = {"service_error_code": "ValidationException",
             "service_message": "Requested resource not found.", "http_status_code": 400}
UNAVAILABLE = {"service_error_code": "ServiceUnavailable",
               "service_message": "Service is unavailable", "http_status_code": 503}


@pytest.fixture
def sagemaker() -> Iterator[tuple[Any, Stubber]]:
    sm = client("sagemaker")
    with Stubber(sm) as stub:
        yield sm, stub
        stub.assert_no_pending_responses()


def sigterm_on(needle: str) -> Any:
    """An ``out`` that records lines and sends SIGTERM to this process at ``needle``."""
    lines: list[str] = []

    def out(line: str) -> None:
        lines.append(line)
        if needle in line:
            os.kill(os.getpid(), signal.SIGTERM)

    out.lines = lines  # type: ignore[attr-defined]
    return out


# ---------------------------------------------------------------- the training runner
def test_training_runner_rides_out_a_transient_error_between_two_polls(sagemaker):
    sm, stub = sagemaker
    stub.add_client_error("describe_training_job", expected_params=ONE_JOB, **NOT_FOUND)
    stub.add_response("create_training_job", {"TrainingJobArn": ARN}, REQUEST)
    stub.add_response("describe_training_job", described("InProgress", transitions=1), ONE_JOB)
    stub.add_client_error("describe_training_job", expected_params=ONE_JOB, **UNAVAILABLE)
    stub.add_response("describe_training_job", described("InProgress", transitions=2), ONE_JOB)
    stub.add_response("describe_training_job", described("Completed", "Completed", 2), ONE_JOB)
    lines: list[str] = []
    with ExecutionContext("test") as ctx:
        runner = TrainingJobRunner(sm, None, REGION, poll_interval_s=0.01, out=lines.append,
                                   ctx=ctx)
        job = runner.run(dict(REQUEST), run_id="run-1")
    assert job["TrainingJobStatus"] == "Completed" and runner.created
    assert f"(DescribeTrainingJob {NAME} failed: " in "\n".join(lines), lines
    assert any(line.startswith(f"(DescribeTrainingJob {NAME} succeeded again after")
               for line in lines), lines
    # progress: each secondary-status transition once, across the outage
    assert [line for line in lines if line.startswith(f"[{NAME}]")] == [
        f"[{NAME}] Step0: message 0", f"[{NAME}] Step1: message 1"]


def test_training_runner_stops_its_job_on_sigterm_and_says_the_stop_was_accepted(sagemaker):
    sm, stub = sagemaker
    # the job exists already (a retried step): re-attach, SIGTERM right after
    stub.add_response("describe_training_job", described("InProgress"), ONE_JOB)
    stub.add_response("list_tags", {"Tags": [{"Key": "kfp-sagemaker:run-id", "Value": "run-1"}]},
                      {"ResourceArn": ARN})
    stub.add_response("describe_training_job", described("InProgress"), ONE_JOB)  # stop path
    stub.add_response("stop_training_job", {}, ONE_JOB)
    stub.add_response("describe_training_job", described("Stopping", "Stopping"), ONE_JOB)
    out = sigterm_on("re-attached")
    with ExecutionContext("test") as ctx, pytest.raises(Terminated) as err:
        TrainingJobRunner(sm, None, REGION, poll_interval_s=0.01, out=out, ctx=ctx).run(
            dict(REQUEST), run_id="run-1")
    assert f"the stop of training job {NAME} was accepted: it is Stopping" in str(err.value)
    assert str(err.value).startswith("terminated (SIGTERM)")


# ---------------------------------------------------------------- the runner, CodeBuild adapter
def build(status: str, phase: str) -> dict[str, Any]:
    return {"id": BUILD_ID, "buildStatus": status, "currentPhase": phase}


def test_codebuild_adapter_rides_out_a_transient_error_and_reports_each_phase_once():
    cb = client("codebuild")
    with Stubber(cb) as stub:
        stub.add_response("batch_get_builds", {"builds": [build("IN_PROGRESS", "BUILD")]})
        stub.add_client_error("batch_get_builds", **UNAVAILABLE)
        stub.add_response("batch_get_builds", {"builds": [build("IN_PROGRESS", "BUILD")]})
        stub.add_response("batch_get_builds", {"builds": [build("SUCCEEDED", "COMPLETED")]})
        lines: list[str] = []
        with ExecutionContext("test") as ctx:
            runner = RemoteJobRunner(cb, cb, ctx=ctx, out=lines.append, poll_interval_s=0.01,
                                     prefix="[build_image] ")
            final = runner.run_to_end(CodeBuildBuild(BUILD_ID, "p", REGION),
                                      build("IN_PROGRESS", "SUBMITTED"))
        stub.assert_no_pending_responses()
    assert final["buildStatus"] == "SUCCEEDED"
    assert [line for line in lines if "phase" in line] == [
        "[build_image] CodeBuild phase: SUBMITTED", "[build_image] CodeBuild phase: BUILD",
        "[build_image] CodeBuild phase: COMPLETED"]
    assert any(line.startswith(f"(BatchGetBuilds {BUILD_ID} failed: ") for line in lines), lines


def test_codebuild_adapter_stops_the_build_on_sigterm_with_the_stop_answer():
    cb = client("codebuild")
    with Stubber(cb) as stub:
        stub.add_response("batch_get_builds", {"builds": [build("IN_PROGRESS", "BUILD")]})
        stub.add_response("stop_build", {"build": build("IN_PROGRESS", "BUILD")},
                          {"id": BUILD_ID})
        out = sigterm_on("CodeBuild phase: BUILD")
        with ExecutionContext("test") as ctx, pytest.raises(Terminated) as err:
            RemoteJobRunner(cb, cb, ctx=ctx, out=out, poll_interval_s=0.01,
                            wait_after_stop=False).run_to_end(
                CodeBuildBuild(BUILD_ID, "p", REGION), build("IN_PROGRESS", "BUILD"))
        stub.assert_no_pending_responses()
    assert (f"the stop of CodeBuild build {BUILD_ID} was accepted: StopBuild answered "
            "IN_PROGRESS") in str(err.value)


def test_a_stop_that_cannot_be_delivered_gives_the_exact_command():
    cb = client("codebuild")
    with Stubber(cb) as stub:
        for _ in range(10):  # retried within the budget, then given up
            stub.add_client_error("batch_get_builds", **UNAVAILABLE)
        sentence = RemoteJobRunner(cb, cb, stop_timeout_s=0.5).stop(
            CodeBuildBuild(BUILD_ID, "p", REGION))
    assert f"the stop of CodeBuild build {BUILD_ID} was NOT accepted within 0.5 s" in sentence
    assert f"aws codebuild stop-build --id {BUILD_ID} --region {REGION}" in sentence


# ---------------------------------------------------------------- cleanup's stop-and-wait
@pytest.fixture
def cleanup_clients(monkeypatch) -> Iterator[dict[str, Stubber]]:
    """cleanup's clients: one stubbed client per service, whatever the mode."""
    made = {service: client(service) for service in ("sagemaker", "s3")}
    stubs = {service: Stubber(c) for service, c in made.items()}
    monkeypatch.setattr(cleanup_run, "client", lambda service, region, **config: made[service])
    for stub in stubs.values():
        stub.activate()
    yield stubs
    for stub in stubs.values():
        stub.assert_no_pending_responses()
        stub.deactivate()


def stop_plan() -> Plan:
    job = Action("training-job", "stop", ARN, op=("sagemaker_stop", NAME))
    outputs = Action("s3-prefix", "delete", "s3://b/out/", op=("s3_delete_prefix", "b", "out/"),
                     after_jobs=(NAME,))
    return Plan("run-1", REGION, {"artifacts": "delete"}, [job, outputs])


def test_cleanup_wait_rides_out_a_transient_error_in_the_middle_of_polling(cleanup_clients):
    sm = cleanup_clients["sagemaker"]
    # the stop action is the runner's stop: a Describe, then the stop of a running job
    sm.add_response("describe_training_job", described("InProgress"), ONE_JOB)
    sm.add_response("stop_training_job", {}, ONE_JOB)
    sm.add_response("describe_training_job", described("Stopping", "Stopping"), ONE_JOB)
    sm.add_client_error("describe_training_job", expected_params=ONE_JOB, **UNAVAILABLE)
    sm.add_response("describe_training_job", described("Stopped", "Stopped"), ONE_JOB)
    cleanup_clients["s3"].add_response("list_objects_v2", {"Contents": []},
                                       {"Bucket": "b", "Prefix": "out/"})
    lines: list[str] = []
    outcomes = cleanup_run.execute(stop_plan(), dry_run=False, log=lines.append, poll_s=0.01,
                                   stop_wait_s=30)
    assert [o.status for o in outcomes] == ["done", "done"], (outcomes, lines)
    assert f"(DescribeTrainingJob {NAME} failed: " in "\n".join(lines), lines
    assert any("succeeded again" in line for line in lines), lines


def test_cleanup_stops_what_it_has_not_stopped_yet_on_sigterm(cleanup_clients):
    sm = cleanup_clients["sagemaker"]
    sm.add_response("describe_training_job", described("InProgress"), ONE_JOB)
    sm.add_response("stop_training_job", {}, ONE_JOB)
    with ExecutionContext("cleanup") as ctx:
        os.kill(os.getpid(), signal.SIGTERM)  # before the first action: nothing was sent
        with pytest.raises(Terminated) as err:
            cleanup_run.execute(stop_plan(), dry_run=False, log=lambda _: None, ctx=ctx)
    text = str(err.value)
    assert f"the stop of training job {NAME} was accepted: StopTrainingJob accepted" in text
    assert "1 deletion(s) not done: run cleanup again" in text


def test_a_job_that_already_ended_is_not_stopped_and_the_sentence_says_so(sagemaker):
    sm, stub = sagemaker
    stub.add_response("describe_training_job", described("Completed", "Completed"), ONE_JOB)
    sentence = RemoteJobRunner(sm, sm).stop(TrainingJob(NAME, REGION))
    assert sentence == (f"the stop of training job {NAME} was accepted: "
                        "it had already ended Completed")


@pytest.mark.parametrize("config", [aws.FOLLOW_CLIENT, aws.bounded_client_config(5)],
                         ids=["follow", "stop"])
def test_the_follow_and_stop_clients_make_one_call_and_leave_retries_to_the_runner(config):
    """botocore's max_attempts counts retries: a retry there would hide an outage from the
    runner (and double the stop's budget)."""
    sm = aws.client("sagemaker", REGION, endpoint_url="http://127.0.0.1:9", **config)
    sent: list[str] = []

    def refuse(request: Any = None, **kwargs: Any) -> None:
        sent.append(str(getattr(request, "url", "")))
        raise EndpointConnectionError(endpoint_url=sent[-1])

    sm.meta.events.register("before-send", refuse)
    with pytest.raises(EndpointConnectionError):
        sm.describe_training_job(TrainingJobName=NAME)
    assert len(sent) == 1


# ---------------------------------------------------------------- responses cut short
class CuttingServer:
    """A loopback HTTP server answering each request with the next canned response, sent
    as raw bytes and the connection closed: what a client sees when the endpoint dies
    in the middle of an answer."""

    def __init__(self, *responses: bytes) -> None:
        self.responses = list(responses)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while self.responses:
            conn, _ = self.sock.accept()
            with conn:
                self._read_request(conn)
                conn.sendall(self.responses.pop(0))

    @staticmethod
    def _read_request(conn: socket.socket) -> None:
        """Read one whole request (headers, then Content-Length bytes of body): the client
        may send them in separate segments, and closing with request bytes unread sends an
        RST that can reach the client before the canned answer, turning "cut short" into
        "connection reset" (a CI flake)."""
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        match = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        length = int(match.group(1)) if match else 0
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return
            body += chunk

    def close(self) -> None:
        self.sock.close()


def http_response(body: bytes, *, length: int | None = None, cut_at: int | None = None) -> bytes:
    head = ("HTTP/1.1 200 OK\r\nContent-Type: application/x-amz-json-1.1\r\n"
            "x-amzn-RequestId: 0000\r\nConnection: close\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n\r\n").encode()
    return (head + body)[:cut_at]


DESCRIBED_JSON = json.dumps({**described("Completed", "Completed"),
                             "CreationTime": NOW.timestamp()}).encode()
CUT_SHORT = {
    "inside the body": http_response(DESCRIBED_JSON, cut_at=len(http_response(b"")) + 20),
    "inside the headers": http_response(DESCRIBED_JSON, cut_at=40),
}


@pytest.mark.parametrize("raw", CUT_SHORT.values(), ids=CUT_SHORT.keys())
def test_a_response_cut_short_is_a_transient_connection_error_not_an_empty_answer(raw):
    """botocore leaves the Content-Length check of a non-streaming body to nobody
    (enforce_content_length=False): without the client's check, a DescribeTrainingJob cut
    short by a dying endpoint "succeeds" with no TrainingJobStatus in it."""
    server = CuttingServer(raw)
    try:
        sm = aws.client("sagemaker", REGION, endpoint_url=server.url, **aws.FOLLOW_CLIENT)
        with pytest.raises(Exception) as caught:
            sm.describe_training_job(TrainingJobName=NAME)
    finally:
        server.close()
    assert aws.is_transient(caught.value), caught.value
    assert "DescribeTrainingJob was cut short" in str(caught.value)


def test_whole_responses_and_head_requests_pass_the_length_check():
    """No false alarm: a complete answer parses; a HEAD's Content-Length is the object's,
    with no body."""
    head = (b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\nx-amz-request-id: 1\r\n"
            b"ETag: \"e\"\r\nConnection: close\r\n\r\n")
    server = CuttingServer(http_response(DESCRIBED_JSON), head)
    try:
        sm = aws.client("sagemaker", REGION, endpoint_url=server.url, **aws.FOLLOW_CLIENT)
        assert sm.describe_training_job(TrainingJobName=NAME)["TrainingJobStatus"] == "Completed"
        s3 = aws.client("s3", REGION, endpoint_url=server.url, **aws.FOLLOW_CLIENT)
        assert s3.head_object(Bucket="b", Key="k")["ContentLength"] == 1234
    finally:
        server.close()


def test_the_follower_rides_out_a_describe_cut_short_then_reads_the_job():
    """The killed-backend case of tests/test_terminate_unreachable.py, made deterministic:
    the poll that got half an answer is retried, and says so."""
    server = CuttingServer(CUT_SHORT["inside the body"], http_response(DESCRIBED_JSON))
    lines: list[str] = []
    try:
        sm = aws.client("sagemaker", REGION, endpoint_url=server.url, **aws.FOLLOW_CLIENT)
        job = RemoteJobRunner(sm, sm, out=lines.append, poll_interval_s=0.05).poll(
            TrainingJob(NAME, REGION))
    finally:
        server.close()
    assert job is not None and job["TrainingJobStatus"] == "Completed"
    assert any("cut short" in line and "retrying for up to" in line for line in lines), lines
