"""The local backend is driven by its own user only, refuses what SageMaker refuses, and never
writes a job's S3 objects outside the job's tree (issue 28, items 1, 2 and 11).

A training job's entry point runs on this host, so every route must refuse unsigned,
wrongly-signed, cross-origin and DNS-rebinding requests; these tests send them as a browser
page or another local process would: raw HTTP (http.client), not boto3.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import http.client
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials as BotoCredentials
from botocore.exceptions import ClientError
from conftest import job_ended, local_backend_with_bucket

BUCKET = "local-security-test"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/trainer:test"
ROLE = "arn:aws:iam::123456789012:role/SageMakerTraining"
TARGET = "SageMaker.CreateTrainingJob"


@pytest.fixture(scope="module")
def backend():
    yield from local_backend_with_bucket(BUCKET, stop_grace_s=1.0)


def job(name: str, script: str, **changes: Any) -> dict[str, Any]:
    req: dict[str, Any] = {
        "TrainingJobName": name, "RoleArn": ROLE,
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File",
                                   "ContainerEntrypoint": ["bash", "-c", script]},
        "OutputDataConfig": {"S3OutputPath": f"s3://{BUCKET}/out"},
        "ResourceConfig": {"InstanceType": "ml.p6-b200.48xlarge", "InstanceCount": 1,
                           "VolumeSizeInGB": 50},
        "StoppingCondition": {"MaxRuntimeInSeconds": 60},
    }
    req.update(changes)
    return req


def send(backend: Any, method: str, path: str, body: bytes = b"",
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One raw HTTP request; (status, headers with lower-case names, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", backend.port, timeout=10)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        sent = {"Host": f"127.0.0.1:{backend.port}", **(headers or {})}
        for key, value in sent.items():
            conn.putheader(key, value)
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        response = conn.getresponse()
        return (response.status, {k.lower(): v for k, v in response.getheaders()},
                response.read())
    finally:
        conn.close()


def signed(backend: Any, method: str, path: str, body: bytes = b"", *,
           headers: dict[str, str] | None = None, service: str = "sagemaker",
           secret: str | None = None, host: str | None = None) -> dict[str, str]:
    """Headers signing the request with botocore (the backend's key; ``secret`` overrides
    its secret; ``host`` is the Host the signature covers and that is sent)."""
    creds = backend.credentials
    host = host or f"127.0.0.1:{backend.port}"
    request = AWSRequest(method=method, url=f"http://{host}{path}", data=body,
                         headers={"Host": host, **(headers or {})})
    SigV4Auth(BotoCredentials(creds.access_key, secret or creds.secret_key), service,
              backend.region).add_auth(request)
    return dict(request.headers.items())


def sagemaker_headers(operation: str) -> dict[str, str]:
    return {"X-Amz-Target": f"SageMaker.{operation}",
            "Content-Type": "application/x-amz-json-1.1"}


def shared_models_session() -> Any:
    """A fresh botocore session reading botocore's JSON models through the process's one
    loader (common.aws's): each test's own client without parsing the models again."""
    import botocore.session

    from kfp_sagemaker_blackwell.common import aws

    core = botocore.session.get_session()
    core.register_component("data_loader", aws._shared_loader())
    return core


def job_names(backend: Any) -> list[str]:
    return [j["TrainingJobName"] for j in
            backend.client("sagemaker").list_training_jobs()["TrainingJobSummaries"]]


def error(call: Any, **kwargs: Any) -> tuple[str, int, str]:
    with pytest.raises(ClientError) as caught:
        call(**kwargs)
    err = caught.value.response
    return (err["Error"]["Code"], err["ResponseMetadata"]["HTTPStatusCode"],
            err["Error"].get("Message", ""))


def no_cors(headers: dict[str, str]) -> bool:
    return not any(k.startswith("access-control-") for k in headers)


# ---------------------------------------------------------------- item 1: who may drive it
def test_the_printed_credentials_drive_every_served_service(backend):
    env = backend.env()
    assert env["AWS_ACCESS_KEY_ID"] == backend.credentials.access_key != "testing"
    assert len(env["AWS_SECRET_ACCESS_KEY"]) >= 40
    assert backend.client("s3").head_bucket(Bucket=BUCKET)
    backend.client("iam").list_roles()
    backend.client("logs").describe_log_groups()
    backend.client("ecr").describe_repositories()
    backend.client("sts").get_caller_identity()
    backend.client("sagemaker").list_training_jobs()


def test_unsigned_requests_are_refused_on_every_route(backend, tmp_path):
    marker = tmp_path / "ran"
    drive_by = json.dumps(job("drive-by", f"touch {marker}")).encode()
    for method, path, body, headers, code in [
        ("POST", "/", drive_by, sagemaker_headers("CreateTrainingJob"),
         b"MissingAuthenticationTokenException"),
        ("GET", "/", b"", {}, b"<Code>AccessDenied</Code>"),
        ("GET", f"/{BUCKET}", b"", {}, b"<Code>AccessDenied</Code>"),
        ("PUT", f"/{BUCKET}/planted", b"x", {}, b"<Code>AccessDenied</Code>"),
        ("DELETE", f"/{BUCKET}", b"", {}, b"<Code>AccessDenied</Code>"),
        ("GET", "/_local/settings", b"", {}, b"AccessDenied"),
        ("PUT", "/_local/quotas", b"{}", {}, b"AccessDenied"),
        ("GET", "/moto-api/data.json", b"", {}, b"AccessDenied"),
        ("POST", "/moto-api/reset", b"", {}, b"AccessDenied"),
        ("POST", "/", b"Action=CreateRole&RoleName=r&AssumeRolePolicyDocument=%7B%7D&"
         b"Version=2010-05-08", {"Content-Type": "application/x-www-form-urlencoded"},
         b"<Code>MissingAuthenticationToken</Code>"),
    ]:
        status, answer_headers, answer = send(backend, method, path, body, headers)
        assert status == 403 and code in answer, (method, path, status, answer)
        assert no_cors(answer_headers)
    # nothing happened: no job (CreateTrainingJob is synchronous: a job it made would be listed
    # now, no need to wait for one to run), no object, the bucket and moto's state are still there
    assert "drive-by" not in job_names(backend) and not marker.exists()
    s3 = backend.client("s3")
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix="planted")
    s3.head_bucket(Bucket=BUCKET)


@pytest.mark.parametrize("service,call,wrong_secret,wrong_key", [
    ("s3", lambda c: c.list_buckets(), "SignatureDoesNotMatch", "InvalidAccessKeyId"),
    ("sagemaker", lambda c: c.list_training_jobs(), "InvalidSignatureException",
     "UnrecognizedClientException"),
    ("iam", lambda c: c.list_roles(), "SignatureDoesNotMatch", "InvalidClientTokenId"),
    ("logs", lambda c: c.describe_log_groups(), "InvalidSignatureException",
     "UnrecognizedClientException"),
])
def test_wrong_credentials_get_the_error_each_client_knows(backend, service, call,
                                                           wrong_secret, wrong_key):
    import boto3

    for key, secret, code in [(backend.credentials.access_key, "not-the-secret", wrong_secret),
                              ("testing", "testing", wrong_key)]:
        client = boto3.session.Session(
            aws_access_key_id=key, aws_secret_access_key=secret, region_name=backend.region,
            botocore_session=shared_models_session(),
        ).client(service, endpoint_url=backend.endpoint_url,
                 config=Config(retries={"max_attempts": 1}))
        with pytest.raises(ClientError) as caught:
            call(client)
        err = caught.value.response
        assert err["Error"]["Code"] == code, (service, err)
        assert err["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_a_tampered_body_or_a_stale_date_is_refused(backend, monkeypatch):
    body = json.dumps({"TrainingJobName": "x"}).encode()
    headers = signed(backend, "POST", "/", body, headers=sagemaker_headers("DescribeTrainingJob"))
    status, _, answer = send(backend, "POST", "/", body.replace(b"x", b"y"), headers)
    assert status == 403 and b"InvalidSignatureException" in answer
    status, _, answer = send(backend, "POST", "/", body, headers)
    assert status == 400 and b"ValidationException" in answer  # the intact one goes through

    import botocore.auth

    stale = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - dt.timedelta(minutes=20)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: stale)
    headers = signed(backend, "POST", "/", body, headers=sagemaker_headers("DescribeTrainingJob"))
    status, _, answer = send(backend, "POST", "/", body, headers)
    assert status == 403 and b"Signature expired" in answer


def test_cross_origin_requests_and_preflights_are_refused_without_cors_headers(backend):
    headers = signed(backend, "GET", "/", service="s3")
    status, answer_headers, _ = send(backend, "GET", "/", headers=headers)
    assert status == 200 and no_cors(answer_headers)  # signed: served
    status, answer_headers, answer = send(backend, "GET", "/", headers={
        **headers, "Origin": "http://evil.example"})
    assert status == 403 and b"Cross-origin" in answer and no_cors(answer_headers)
    status, answer_headers, answer = send(backend, "OPTIONS", "/", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "x-amz-target,content-type"})
    assert status == 403 and no_cors(answer_headers)


def test_a_rebound_host_name_is_refused_even_when_signed_for_it(backend):
    for host in ("evil.example", f"evil.example:{backend.port}", f"localhost:{backend.port}"):
        headers = signed(backend, "GET", "/", service="s3", host=host)
        status, _, answer = send(backend, "GET", "/", headers=headers)
        assert status == 403 and b"DNS-rebinding" in answer, host


def test_motos_admin_routes_are_not_served_even_signed(backend):
    s3 = backend.client("s3")
    s3.put_object(Bucket=BUCKET, Key="survives-reset", Body=b"1")
    for method, path in [("GET", "/moto-api/data.json"), ("POST", "/moto-api/reset"),
                         ("GET", "/moto-api/")]:
        status, _, answer = send(backend, method, path,
                                 headers=signed(backend, method, path, service="s3"))
        assert status == 404 and b"not served" in answer, (path, answer)
    assert s3.get_object(Bucket=BUCKET, Key="survives-reset")["Body"].read() == b"1"


# ---------------------------------------------------------------- item 11: what it refuses
@pytest.mark.parametrize("service,call", [
    ("ec2", lambda c: c.describe_instances()),
    ("ec2", lambda c: c.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1)),
    ("dynamodb", lambda c: c.list_tables()),
    ("sqs", lambda c: c.list_queues()),
])
def test_services_not_emulated_answer_an_error_naming_them(backend, service, call):
    with pytest.raises(ClientError) as caught:
        call(backend.client(service))
    err = caught.value.response
    assert err["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert f"does not emulate the service '{service}'" in err["Error"]["Message"], err


@pytest.mark.parametrize("body", [b"{not json", b'{"TrainingJobName": ', b"[]", b'"x"'])
def test_a_body_that_is_not_a_json_object_is_a_serialization_exception(backend, body):
    for operation in ("CreateTrainingJob", "DescribeTrainingJob", "ListTags"):
        headers = signed(backend, "POST", "/", body, headers=sagemaker_headers(operation))
        status, _, answer = send(backend, "POST", "/", body, headers)
        assert status == 400, (operation, status, answer)
        assert json.loads(answer)["__type"] == "SerializationException", answer


@pytest.mark.parametrize("change,field", [
    (lambda r: r.update(HyperParameters={"big": "x" * (8 << 20)}), "hyperParameters.big"),
    (lambda r: r["StoppingCondition"].update(MaxRuntimeInSeconds="abc"),
     "StoppingCondition.MaxRuntimeInSeconds"),
    (lambda r: r.update(TrainingJobName="n" * 64), "trainingJobName"),
    (lambda r: r.update(TrainingJobName="under_score"), "trainingJobName"),
    (lambda r: r["ResourceConfig"].update(InstanceType="ml.p9.huge"),
     "resourceConfig.instanceType"),
    (lambda r: r["AlgorithmSpecification"].update(TrainingInputMode="Stream"),
     "algorithmSpecification.trainingInputMode"),
    (lambda r: r.update(RoleArn="arn:aws:iam::123:user/x"), "roleArn"),
    (lambda r: r.update(Environment={"BAD-KEY": "1"}), "environment.BAD-KEY"),
    (lambda r: r.update(HyperParameters={f"k{i}": "1" for i in range(101)}), "hyperParameters"),
    (lambda r: r["StoppingCondition"].update(MaxRuntimeInSeconds=0),
     "StoppingCondition.MaxRuntimeInSeconds"),
    # botocore's ParamValidator's wording, as a botocore client gets it client-side
    (lambda r: r["StoppingCondition"].update(MaxRuntimeInSeconds="abc"),
     "Invalid type for parameter StoppingCondition.MaxRuntimeInSeconds, value: abc, type: "
     "<class 'str'>, valid types: <class 'int'>"),
    (lambda r: r["StoppingCondition"].update(MaxRuntimeInSeconds=True),  # JSON true: not 1 s
     "Invalid type for parameter StoppingCondition.MaxRuntimeInSeconds, value: True, type: "
     "<class 'bool'>, valid types: <class 'int'>"),
    (lambda r: r.update(Tags=[{"Key": "a\tb", "Value": "v"}]), "tags.1.key"),
])
def test_create_refuses_values_outside_botocores_model(backend, change, field):
    import boto3  # a client that sends what it is given (no client-side validation)

    creds = backend.credentials
    unchecked = boto3.session.Session(
        aws_access_key_id=creds.access_key, aws_secret_access_key=creds.secret_key,
        region_name=backend.region, botocore_session=shared_models_session(),
    ).client("sagemaker", endpoint_url=backend.endpoint_url,
             config=Config(parameter_validation=False, retries={"max_attempts": 1}))
    name = f"limits-{uuid.uuid4().hex[:8]}"
    req = job(name, "exit 0")
    change(req)
    code, status, message = error(unchecked.create_training_job, **req)
    assert (code, status) == ("ValidationException", 400), message
    assert field in message and len(message) < 8000, message  # never the 8 MiB back
    assert name not in job_names(backend)


def test_the_walker_understands_every_pattern_of_the_served_operations():
    from kfp_sagemaker_blackwell.local_backend.backend import INTERCEPTED
    from kfp_sagemaker_blackwell.local_backend.validation import model_pattern, service_model

    seen: dict[str, Any] = {}

    def walk(shape: Any) -> None:
        if shape.name in seen:
            return
        seen[shape.name] = shape
        for child in ([*shape.members.values()] if shape.type_name == "structure" else
                      [shape.member] if shape.type_name == "list" else
                      [shape.key, shape.value] if shape.type_name == "map" else []):
            walk(child)

    for operation in INTERCEPTED:
        walk(service_model().operation_model(operation).input_shape)
    patterns = {s.metadata["pattern"] for s in seen.values() if "pattern" in s.metadata}
    assert len(patterns) > 20
    for pattern in patterns:
        model_pattern(pattern)  # compiles (Java's \p{..} classes translated)
    tag = model_pattern(seen["TagKey"].metadata["pattern"])
    assert tag.fullmatch("Équipe 1:a/b=c+d-e@f_g.h") and not tag.fullmatch("a\tb")


# ---------------------------------------------------------------- item 2: paths stay inside
def hostile_keys(tmp_path: Path, prefix: str) -> dict[str, Path]:
    """S3 keys under ``prefix`` that name a path outside any job tree -> where it would be."""
    escape = f"escape-{uuid.uuid4().hex[:8]}.txt"
    return {
        f"{prefix}/" + "../" * 12 + f"{tmp_path.relative_to('/')}/{escape}": tmp_path / escape,
        f"{prefix}/{tmp_path}/abs-{escape}": tmp_path / f"abs-{escape}",
    }


@pytest.mark.parametrize("kind", ["channel", "checkpoint"])
def test_hostile_s3_keys_fail_the_job_and_write_nothing_outside_its_tree(backend, tmp_path,
                                                                         kind):
    s3 = backend.client("s3")
    for key, where in hostile_keys(tmp_path, f"hostile-{kind}/data").items():
        name = f"hostile-{kind}-{uuid.uuid4().hex[:8]}"
        s3.put_object(Bucket=BUCKET, Key=f"hostile-{kind}/data/ok.txt", Body=b"fine")
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"planted")
        uri = f"s3://{BUCKET}/hostile-{kind}/data"
        extra = ({"InputDataConfig": [{"ChannelName": "train", "DataSource": {"S3DataSource": {
            "S3DataType": "S3Prefix", "S3Uri": uri,
            "S3DataDistributionType": "FullyReplicated"}}}]} if kind == "channel" else
            {"CheckpointConfig": {"S3Uri": uri}})
        backend.client("sagemaker").create_training_job(**job(name, "exit 0", **extra))
        desc = job_ended(backend.client("sagemaker"), name)
        assert desc["TrainingJobStatus"] == "Failed", desc.get("FailureReason")
        assert key in desc["FailureReason"] and "outside" in desc["FailureReason"]
        assert not where.exists(), where
        s3.delete_object(Bucket=BUCKET, Key=key)
    assert not list(Path(backend.work_dir).rglob("escape-*"))


def test_a_key_named_like_the_prefix_with_dots_is_refused(backend, tmp_path):
    from kfp_sagemaker_blackwell.local_backend import storage

    s3 = backend.client("s3")
    s3.put_object(Bucket=BUCKET, Key="dots/..", Body=b"x")
    dest = tmp_path / "channel"
    with pytest.raises(ValueError, match=r"s3://local-security-test/dots/\.\."):
        storage.download_prefix(s3, f"s3://{BUCKET}/dots/..", dest)
    assert list(tmp_path.iterdir()) == [dest] and not list(dest.iterdir())


# ---------------------------------------------------------------- channels are directories
@pytest.mark.parametrize("channel", [".", ".."])
def test_a_channel_that_is_not_one_directory_under_data_is_refused_before_create(
        backend, channel):
    name = f"dots-{uuid.uuid4().hex[:8]}"
    s3 = backend.client("s3")
    s3.put_object(Bucket=BUCKET, Key="dots-channel/x.txt", Body=b"x")
    req = job(name, "exit 0", InputDataConfig=[{"ChannelName": channel, "DataSource": {
        "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": f"s3://{BUCKET}/dots-channel",
                         "S3DataDistributionType": "FullyReplicated"}}}])
    code, status, message = error(backend.client("sagemaker").create_training_job, **req)
    assert (code, status) == ("ValidationException", 400), message
    assert "inputDataConfig.1.channelName" in message and "/opt/ml/input/data" in message
    assert name not in job_names(backend)


def test_the_executor_refuses_a_dot_channel_directory_too(tmp_path):
    from kfp_sagemaker_blackwell.local_backend.container import HostLayout

    layout = HostLayout("algo-1", tmp_path)
    assert layout.channel_dir("train.v2") == tmp_path / "input" / "data" / "train.v2"
    for bad in (".", "..", "a/../..", ""):
        with pytest.raises(ValueError, match="not one directory under /opt/ml/input/data"):
            layout.channel_dir(bad)


# ---------------------------------------------------------------- links are never followed out
@pytest.fixture
def short_tmp():
    """A host folder with a short path: the job's script names it, and SageMaker caps each
    ContainerEntrypoint item at 256 characters (pytest's tmp_path under xdist is long)."""
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="lk", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_link_in_the_checkpoint_dir_is_refused_by_name_and_its_target_never_uploaded(
        backend, short_tmp):
    tmp_path = short_tmp
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "inner.txt").write_text("host secret too")
    name = f"link-ckpt-{uuid.uuid4().hex[:8]}"
    prefix = f"links/{name}"
    script = (f'echo mine > "$SM_CHECKPOINT_DIR/fine.txt" && '
              f'ln -s {secret} "$SM_CHECKPOINT_DIR/leak" && '
              f'ln -s {tmp_path / "tree"} "$SM_CHECKPOINT_DIR/tree"')
    sm = backend.client("sagemaker")
    sm.create_training_job(**job(name, script, CheckpointConfig={
        "S3Uri": f"s3://{BUCKET}/{prefix}"}))
    desc = job_ended(sm, name)
    assert desc["TrainingJobStatus"] == "Failed", desc
    reason = desc["FailureReason"]
    assert "/opt/ml/checkpoints/leak" in reason and str(secret) in reason, reason
    assert "/opt/ml/checkpoints/tree" in reason, reason
    s3 = backend.client("s3")
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get(
        "Contents", [])}
    assert keys == {f"{prefix}/fine.txt"}  # the job's own file is kept, nothing else


def test_links_in_the_model_and_output_dirs_are_archived_as_links(backend, short_tmp):
    tmp_path = short_tmp
    import io
    import tarfile

    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    name = f"link-model-{uuid.uuid4().hex[:8]}"
    script = (f'echo w > "$SM_MODEL_DIR/weights.bin" && ln -s {secret} "$SM_MODEL_DIR/leak" && '
              f'ln -s {tmp_path} "$SM_OUTPUT_DATA_DIR/tree"')
    sm = backend.client("sagemaker")
    sm.create_training_job(**job(name, script))
    desc = job_ended(sm, name)
    assert desc["TrainingJobStatus"] == "Completed", desc.get("FailureReason")
    s3 = backend.client("s3")
    for key, link, target in ((f"out/{name}/output/model.tar.gz", "leak", secret),
                              (f"out/{name}/output/output.tar.gz", "tree", tmp_path)):
        body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        assert b"host secret" not in body
        with tarfile.open(fileobj=io.BytesIO(body)) as tar:
            member = tar.getmember(link)
            assert member.issym() and member.linkname == str(target)
            assert all(m.name == link or not m.name.startswith(link + "/")
                       for m in tar.getmembers())


def test_a_replaced_directory_is_refused_not_followed(tmp_path):
    from kfp_sagemaker_blackwell.local_backend import storage

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "f").write_text("x")
    (tmp_path / "model").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(storage.LinkRefused, match=r"/opt/ml/model: it is a symbolic link"):
        storage.tar_gz_bytes(tmp_path / "model", "/opt/ml/model")
    with pytest.raises(storage.LinkRefused, match=r"/opt/ml/checkpoints: it is a symbolic"):
        storage.upload_dir(None, tmp_path / "model", f"s3://{BUCKET}/x",
                           label="/opt/ml/checkpoints")


def test_a_signed_chunked_upload_is_verified_against_its_whole_body(backend):
    body = b"chunked body " * 1000
    path = f"/{BUCKET}/chunked"
    headers = signed(backend, "PUT", path, body, service="s3",
                     headers={"X-Amz-Content-SHA256": hashlib.sha256(body).hexdigest()})
    conn = http.client.HTTPConnection("127.0.0.1", backend.port, timeout=10)
    try:
        conn.request("PUT", path, body=iter([body[:5000], body[5000:]]), headers=headers,
                     encode_chunked=True)
        response = conn.getresponse()
        assert response.status == 200, response.read()
    finally:
        conn.close()
    got = backend.client("s3").get_object(Bucket=BUCKET, Key="chunked")["Body"].read()
    assert got == body


def test_every_start_has_its_own_credentials_and_no_other_works(backend):
    from kfp_sagemaker_blackwell.local_backend import LocalBackend

    with LocalBackend() as other:
        assert other.credentials != backend.credentials
        assert other.env()["AWS_SECRET_ACCESS_KEY"] != backend.env()["AWS_SECRET_ACCESS_KEY"]
        other.client("s3").list_buckets()
        headers = signed(backend, "GET", "/", service="s3", host=f"127.0.0.1:{other.port}")
        conn = http.client.HTTPConnection("127.0.0.1", other.port, timeout=10)
        try:
            conn.request("GET", "/", headers=headers)
            response = conn.getresponse()
            assert response.status == 403 and b"InvalidAccessKeyId" in response.read()
        finally:
            conn.close()
