"""build_image's CodeBuild flow against the local backend (moto's CodeBuild, S3, ECR, Logs).

moto 5.2.5 stores CodeBuild projects and builds but runs nothing: StartBuild keeps
only projectName/sourceVersion/artifactsOverride (every other override is
dropped), BatchGetBuilds reports every build SUCCEEDED on its first call (and
appends another nine phases on each call), no log is written, nothing is pushed to
ECR, and idempotencyToken is ignored. ``CodeBuildWorker`` plays the build
container on top of it: it reads the StartBuild request the component sent,
fetches the source zip from S3, checks the buildspec and that the Dockerfile it
names is in the zip, writes CodeBuild-style log lines to /aws/codebuild/<project>,
and does what the buildspec's ``docker push`` lines do to ECR's API (a manifest
under each pushed tag). It does not run ``docker build``: no Docker daemon here.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import threading
import time
import zipfile
from pathlib import Path

import pytest
import yaml
from botocore.exceptions import EndpointConnectionError
from conftest import wait_for

from kfp_sagemaker_blackwell.common import aws, build_marks, cli, resources, tags
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.components.build_image import codebuild as cb
from kfp_sagemaker_blackwell.components.build_image import ecr as ecr_mod
from kfp_sagemaker_blackwell.components.build_image import launcher as b
from kfp_sagemaker_blackwell.components.build_image.component import build_image
from kfp_sagemaker_blackwell.iam import policy as iam_policy

pytestmark = pytest.mark.timeout(120)

RUN = "run-build-1"
ROLE = "arn:aws:iam::123456789012:role/kfp-sagemaker-codebuild"
BUCKET = "kfp-test-bucket"
DECLARED = cli.defaults(build_image)
BASE = "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:" + DECLARED["base_image_tag"]


class CodeBuildWorker:
    """What CodeBuild's build container would do, for builds moto has accepted."""

    def __init__(self, backend, monkeypatch, *, fail_phase: str = "", hold: bool = False):
        from moto.codebuild.models import CodeBuildBackend
        from moto.codebuild.responses import CodeBuildResponse

        self.backend = backend
        self.fail_phase = fail_phase
        self.release = threading.Event()
        if not hold:
            self.release.set()
        self.started: list[dict] = []  # StartBuild requests as moto received them
        self.on_first_log = None  # called by the worker thread after the first log line
        self._threads: list[threading.Thread] = []
        worker = self
        original_start = CodeBuildResponse.start_build

        def start_build(resp):
            result = original_start(resp)
            project = resp._get_param("projectName")
            build = resp.codebuild_backend.build_metadata_history[project][-1]
            request = {k: resp._get_param(k) for k in (
                "projectName", "sourceLocationOverride", "sourceTypeOverride",
                "buildspecOverride", "environmentVariablesOverride", "privilegedModeOverride",
                "serviceRoleOverride", "imageOverride", "idempotencyToken")}
            # Real CodeBuild reports the overrides in the build; moto drops them.
            build["environment"]["environmentVariables"] = request[
                "environmentVariablesOverride"] or []
            build["environment"]["privilegedMode"] = bool(request["privilegedModeOverride"])
            worker.started.append(request)
            thread = threading.Thread(target=worker._run_safely, args=(build, request),
                                      daemon=True)
            worker._threads.append(thread)
            thread.start()
            return result

        def batch_get_builds(self_backend, ids):  # report the state the worker left
            return [build for history in self_backend.build_metadata_history.values()
                    for build in history if build["id"] in ids]

        monkeypatch.setattr(CodeBuildResponse, "start_build", start_build)
        monkeypatch.setattr(CodeBuildBackend, "batch_get_builds", batch_get_builds)

    def join(self) -> None:
        for thread in self._threads:
            thread.join(timeout=10)

    def _finish(self, build: dict, status: str, phase: str = "", message: str = "") -> None:
        with self.backend.moto_lock:
            if build["buildStatus"] != "IN_PROGRESS":  # StopBuild got there first
                return
            build["buildStatus"] = status
            build["currentPhase"] = "COMPLETED"
            if phase:
                build["phases"].append({"phaseType": phase, "phaseStatus": status,
                                        "contexts": [{"statusCode": "COMMAND_EXECUTION_ERROR",
                                                      "message": message}]})

    def _run_safely(self, build: dict, request: dict) -> None:
        try:
            self._run(build, request)
        except Exception as exc:  # a build that never ends would hang the component
            self._finish(build, "FAULT", "BUILD", f"test worker error: {exc!r}")
            raise

    def _run(self, build: dict, request: dict) -> None:
        s3 = self.backend.client("s3")
        logs = self.backend.client("logs")
        ecr = self.backend.client("ecr")
        group = f"/aws/codebuild/{request['projectName']}"
        stream = build["id"].split(":", 1)[1]
        try:
            logs.create_log_group(logGroupName=group)
        except logs.exceptions.ResourceAlreadyExistsException:
            pass
        logs.create_log_stream(logGroupName=group, logStreamName=stream)

        def say(*lines: str) -> None:
            now = int(time.time() * 1000)
            logs.put_log_events(logGroupName=group, logStreamName=stream,
                                logEvents=[{"timestamp": now, "message": m} for m in lines])

        bucket, key = request["sourceLocationOverride"].split("/", 1)
        archive = zipfile.ZipFile(io.BytesIO(s3.get_object(Bucket=bucket, Key=key)["Body"].read()))
        spec = yaml.safe_load(request["buildspecOverride"])
        say("[Container] Waiting for agent ping", "[Container] Phase is DOWNLOAD_SOURCE",
            f"[Container] source: {len(archive.namelist())} files from s3://{bucket}/{key}")
        if self.on_first_log:
            self.on_first_log()
        self.release.wait(timeout=30)
        for phase in ("pre_build", "build"):
            if build["buildStatus"] != "IN_PROGRESS":
                return  # StopBuild: CodeBuild ends the container
            say(f"[Container] Entering phase {phase.upper()}")
            if self.fail_phase == phase.upper():
                say("[Container] Command did not exit successfully: exit status 1")
                self._finish(build, "FAILED", phase.upper(), "Error while executing command: "
                             "docker build. Reason: exit status 1")
                return
            for command in spec["phases"][phase]["commands"]:
                say(f"[Container] Running command {command}")
                words = command.split()
                if words[:2] == ["docker", "build"]:
                    dockerfile = words[words.index("--file") + 1].strip("'")
                    assert dockerfile in archive.namelist(), (dockerfile, archive.namelist())
                if words[:2] == ["docker", "push"]:
                    image = words[2].strip("'")
                    repo_uri, tag = image.rsplit(":", 1)
                    layer = hashlib.sha256(key.encode()).hexdigest()
                    manifest = {"schemaVersion": 2, "mediaType":
                                "application/vnd.docker.distribution.manifest.v2+json",
                                "config": {"digest": f"sha256:{layer}", "size": 1,
                                           "mediaType": "application/vnd.docker.container.image.v1+json"},
                                "layers": [{"digest": f"sha256:{layer}", "size": 1,
                                            "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip"}]}
                    try:  # a registry accepts the same image pushed again; moto refuses
                        ecr.put_image(repositoryName=repo_uri.split("/", 1)[1],
                                      imageManifest=json.dumps(manifest), imageTag=tag)
                    except ecr.exceptions.ImageAlreadyExistsException:
                        pass
        say("[Container] Phase complete: BUILD State: SUCCEEDED")
        self._finish(build, "SUCCEEDED")


def write_checkout(root: Path) -> None:
    (root / "images" / "trainer").mkdir(parents=True)
    (root / "images" / "trainer" / "Dockerfile").write_text(
        "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nCOPY trainer/ /opt/ml/code/trainer/\n"
        "COPY trainer/train.sh /opt/ml/code/train.sh\n")
    (root / "trainer").mkdir()
    (root / "trainer" / "train.py").write_text("print('train')\n")
    (root / "trainer" / "train.sh").write_text("#!/bin/sh\nexec python train.py\n")
    os.chmod(root / "trainer" / "train.sh", 0o755)


@pytest.fixture
def backend(monkeypatch):
    from kfp_sagemaker_blackwell.local_backend import LocalBackend

    with LocalBackend() as local:
        for key, value in local.env().items():
            monkeypatch.setenv(key, value)
        local.client("s3").create_bucket(
            Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": local.region})
        yield local


@pytest.fixture
def checkout(tmp_path):
    write_checkout(tmp_path / "checkout")
    return tmp_path / "checkout"


def request(checkout: Path, **overrides) -> b.BuildRequest:
    values = dict(run_id=RUN, s3_uri=f"s3://{BUCKET}/pipelines", context_dir=str(checkout),
                  base_image=BASE, builder="codebuild", codebuild_role_arn=ROLE,
                  pipeline="precision-sweep", poll_interval_seconds=0.05)
    values.update(overrides)
    return b.BuildRequest.from_parameters(cli.declared(build_image, values))


def test_codebuild_flow_uploads_context_builds_pushes_and_streams_the_log(
        backend, checkout, monkeypatch, tmp_path):
    worker = CodeBuildWorker(backend, monkeypatch)
    lines: list[str] = []
    records: list[list[resources.AwsResource]] = []
    with aws.record_calls(str(tmp_path / "calls.jsonl")) as recording:
        result = b.build_image(request(checkout), log=lines.append, on_resources=records.append)
    worker.join()

    assert result.outcome == "built" and result.built
    ecr = backend.client("ecr")
    repo_uri = ecr.describe_repositories(repositoryNames=[DECLARED["repository"]])[
        "repositories"][0]["repositoryUri"]
    digest = ecr.describe_images(repositoryName=DECLARED["repository"], imageIds=[
        {"imageTag": result.context.tag}])["imageDetails"][0]["imageDigest"]
    assert result.image_uri == f"{repo_uri}@{digest}"
    assert result.tag_uri == f"{repo_uri}:{result.context.tag}"
    # The run marker tag (how cleanup finds the run's images) sits on the same image.
    marker = build_marks.run_marker(RUN, result.context.tag)
    assert ecr.describe_images(repositoryName=DECLARED["repository"], imageIds=[
        {"imageTag": marker}])["imageDetails"][0]["imageDigest"] == digest

    # One privileged build from the uploaded, tagged zip, with the run id on the build.
    (started,) = worker.started
    assert started["privilegedModeOverride"] is True
    assert started["serviceRoleOverride"] == ROLE
    env = {v["name"]: v["value"] for v in started["environmentVariablesOverride"]}
    assert env[build_marks.RUN_ID_VARIABLE] == RUN
    bucket, key = started["sourceLocationOverride"].split("/", 1)
    assert key == f"pipelines/build-contexts/{result.context.tag}.zip"
    s3 = backend.client("s3")
    obj_tags = tags.from_key_value(s3.get_object_tagging(Bucket=bucket, Key=key)["TagSet"])
    assert tags.belongs_to_run(obj_tags, RUN) and obj_tags[tags.COMPONENT_KEY] == "build_image"
    names = sorted(zipfile.ZipFile(io.BytesIO(
        s3.get_object(Bucket=bucket, Key=key)["Body"].read())).namelist())
    assert names == ["images/trainer/Dockerfile", "trainer/train.py", "trainer/train.sh"]
    # The buildspec logs in to the DLC registry and the target registry, then pushes both tags.
    spec = yaml.safe_load(started["buildspecOverride"])
    logins = " ".join(spec["phases"]["pre_build"]["commands"])
    assert "763104351884.dkr.ecr.us-west-2.amazonaws.com" in logins
    assert repo_uri.split("/")[0] in logins
    assert f"BASE_IMAGE={BASE}" in spec["phases"]["build"]["commands"][0]

    # Project created privileged and tagged as created by this run; repository too.
    project = backend.client("codebuild").batch_get_projects(names=[DECLARED["codebuild_project"]])[
        "projects"][0]
    assert project["environment"]["privilegedMode"] is True
    project_tags = tags.from_key_value(project["tags"])
    assert project_tags[tags.CREATED_KEY] == RUN and tags.belongs_to_run(project_tags, RUN)
    repo_tags = tags.from_key_value(ecr.list_tags_for_resource(resourceArn=ecr.describe_repositories(
        repositoryNames=[DECLARED["repository"]])["repositories"][0]["repositoryArn"])["tags"])
    assert repo_tags[tags.CREATED_KEY] == RUN

    # The build's log came through, and the resources were recorded as they appeared.
    assert any("Running command docker build" in line for line in lines)
    assert any("Phase complete: BUILD State: SUCCEEDED" in line for line in lines)
    kinds = [r.resourceType for r in records[-1]]
    assert kinds == [ecr_mod.ECR_REPOSITORY, resources.S3_PREFIX, cb.CODEBUILD_PROJECT,
                     resources.CODEBUILD_BUILD, resources.ECR_IMAGE]
    assert len(records[0]) == 1  # the repository was recorded before the build started

    # Every call the component made is allowed by the pod policy.
    assert iam_policy.check_calls(iam_policy.pod_policy(bucket=BUCKET), recording.calls()) == []


def test_existing_tag_is_reused_without_a_build(backend, checkout, monkeypatch):
    worker = CodeBuildWorker(backend, monkeypatch)
    first = b.build_image(request(checkout), log=lambda _: None)
    second = b.build_image(request(checkout, run_id="run-build-2"), log=lambda _: None)
    worker.join()
    assert (first.outcome, second.outcome) == ("built", "reused")
    assert second.image_uri == first.image_uri and not second.built
    assert len(worker.started) == 1
    assert second.resources == []  # the second run created nothing


def test_changed_source_builds_a_new_tag(backend, checkout, monkeypatch):
    worker = CodeBuildWorker(backend, monkeypatch)
    first = b.build_image(request(checkout), log=lambda _: None)
    (checkout / "trainer" / "train.py").write_text("print('train v2')\n")
    second = b.build_image(request(checkout), log=lambda _: None)
    worker.join()
    assert second.outcome == "built" and second.context.tag != first.context.tag
    assert len(worker.started) == 2


def test_failed_build_names_the_failed_phase(backend, checkout, monkeypatch):
    CodeBuildWorker(backend, monkeypatch, fail_phase="BUILD")
    with pytest.raises(RuntimeError, match=r"FAILED: BUILD: FAILED \(Error while executing "
                                           r"command: docker build"):
        b.build_image(request(checkout), log=lambda _: None)


def test_sigterm_stops_the_build(backend, checkout, monkeypatch):
    worker = CodeBuildWorker(backend, monkeypatch, hold=True)
    worker.on_first_log = lambda: os.kill(os.getpid(), signal.SIGTERM)
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(cb.BuildStopped):
        b.build_image(request(checkout), log=lambda _: None)
    worker.release.set()
    worker.join()
    assert signal.getsignal(signal.SIGTERM) is previous
    codebuild = backend.client("codebuild")
    ids = codebuild.list_builds_for_project(projectName=DECLARED["codebuild_project"])["ids"]
    assert [x["buildStatus"] for x in codebuild.batch_get_builds(ids=ids)["builds"]] == [
        "STOPPED"]


def test_a_transient_error_while_polling_the_build_is_ridden_out(backend, checkout, monkeypatch):
    worker = CodeBuildWorker(backend, monkeypatch, hold=True)
    failed: list[str] = []

    def fail_once(request=None, **kwargs):  # the endpoint drops one poll of a running build
        if worker.started and not failed:
            failed.append(str(getattr(request, "url", "")))
            worker.release.set()
            raise EndpointConnectionError(endpoint_url=failed[0])

    real = aws.client

    def client(service, region=None, **kwargs):
        made = real(service, region, **kwargs)
        made.meta.events.register("before-send.codebuild.BatchGetBuilds", fail_once)
        return made

    monkeypatch.setattr(aws, "client", client)
    monkeypatch.setattr(b, "client", client)
    lines: list[str] = []
    result = b.build_image(request(checkout), log=lines.append)
    worker.join()
    assert failed and result.outcome == "built"
    build_id = worker_build_id(backend)
    assert any(line.startswith(f"(BatchGetBuilds {build_id} failed: ") for line in lines), lines
    assert any(line.startswith(f"(BatchGetBuilds {build_id} succeeded again")
               for line in lines), lines


def worker_build_id(backend) -> str:
    codebuild = backend.client("codebuild")
    (build_id,) = codebuild.list_builds_for_project(projectName=DECLARED["codebuild_project"])["ids"]
    return str(build_id)


def test_retried_step_reattaches_to_the_running_build(backend, checkout, monkeypatch, tmp_path):
    worker = CodeBuildWorker(backend, monkeypatch, hold=True)
    req = request(checkout)
    first = threading.Thread(target=lambda: b.build_image(req, log=lambda _: None))
    first.start()
    wait_for(lambda: worker.started, 60, "the first attempt's build to start (held)")

    def log(line: str) -> None:  # the build may finish once the retry has attached
        if "re-attaching" in line:
            worker.release.set()

    with aws.record_calls(str(tmp_path / "calls.jsonl")) as recording:
        result = b.build_image(req, log=log)  # the retried step, while the build runs
    first.join(timeout=10)
    worker.join()
    assert result.outcome == "built"
    assert len(worker.started) == 1
    assert "StartBuild" not in [c.operation for c in recording.calls()]


def test_missing_project_without_role_names_codebuild_role_arn(backend, checkout, monkeypatch):
    CodeBuildWorker(backend, monkeypatch)
    with pytest.raises(UserError, match="codebuild_role_arn"):
        b.build_image(request(checkout, codebuild_role_arn=""), log=lambda _: None)


def test_local_backend_without_docker_returns_the_uri_and_says_not_built(
        backend, checkout, tmp_path):
    lines: list[str] = []
    with aws.record_calls(str(tmp_path / "calls.jsonl")) as recording:
        result = b.build_image(request(checkout, builder="auto"), log=lines.append,
                               docker_ok=lambda: False)
    assert result.outcome == "not-built" and not result.built
    assert result.image_uri.endswith(f"/{DECLARED['repository']}:{result.context.tag}")
    assert "NOT BUILT" in result.message and any("NOT BUILT" in line for line in lines)
    assert {c.service for c in recording.calls()} == {"ecr"}  # no S3 upload, no CodeBuild
    assert iam_policy.check_calls(iam_policy.pod_policy(bucket=BUCKET), recording.calls()) == []


def test_user_errors_fail_before_any_aws_call(backend, checkout, tmp_path):
    bad = [
        dict(run_id="run-*"), dict(repository="Bad_Repo"), dict(builder="kaniko"),
        dict(codebuild_role_arn="my-role"), dict(s3_uri="bucket/prefix"),
        dict(dockerfile="images/missing/Dockerfile"), dict(codebuild_compute_type="HUGE"),
        dict(build_args={"BAD-NAME": "x"}), dict(timeout_minutes=1),
    ]
    with aws.record_calls(str(tmp_path / "calls.jsonl")) as recording:
        for overrides in bad:
            with pytest.raises(UserError):
                b.build_image(request(checkout, **overrides), log=lambda _: None)
    assert recording.calls() == []


def test_local_docker_daemon_builds_from_the_hashed_files_and_records_the_tag(
        backend, checkout, tmp_path, monkeypatch):
    # No Docker daemon here: a stand-in `docker` CLI records what it is asked to do,
    # so this checks the commands and the local ECR record, not a real image build.
    calls = tmp_path / "docker-calls.txt"
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    fake.write_text(f"""#!/bin/sh
echo "$@" >> {calls}
case "$1" in
  info) echo 28.2.2 ;;
  build) find . -type f -perm -u+x | sort >> {calls} ;;
  image) echo sha256:{'ab' * 32} ;;
esac
""")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    result = b.build_image(request(checkout, builder="auto"), log=lambda _: None)
    assert result.outcome == "built"
    recorded = calls.read_text().splitlines()
    build_line = next(line for line in recorded if line.startswith("build "))
    assert f"--build-arg BASE_IMAGE={BASE}" in build_line
    assert f"--tag {result.tag_uri} ." in build_line
    assert "./trainer/train.sh" in recorded  # the executable bit survived the zip
    ecr = backend.client("ecr")
    for tag in (result.context.tag, build_marks.run_marker(RUN, result.context.tag)):
        assert ecr.describe_images(repositoryName=DECLARED["repository"],
                                   imageIds=[{"imageTag": tag}])["imageDetails"]
    again = b.build_image(request(checkout, builder="auto"), log=lambda _: None)
    assert again.outcome == "reused"
