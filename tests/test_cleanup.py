"""cleanup against the local backend: the run's resources go, everything else stays.

The scenario has run A (cleaned up), run B (another run) and untagged resources of
every kind: training jobs that really run (local executor), a CodeBuild build held
in progress (the test worker of test_build_image_flow), S3 objects, ECR
repositories and images, log streams, CodeBuild projects and IAM roles.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.parse

import pytest
from test_build_image_flow import CodeBuildWorker, write_checkout

from kfp_sagemaker_blackwell.common import aws, build_marks, cli, tags
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.common.shipped import CHECKOUT
from kfp_sagemaker_blackwell.components.build_image import launcher as b
from kfp_sagemaker_blackwell.components.build_image.component import build_image
from kfp_sagemaker_blackwell.components.cleanup import plan as plan_mod
from kfp_sagemaker_blackwell.components.cleanup.launcher import cleanup
from kfp_sagemaker_blackwell.iam import policy as iam_policy

pytestmark = pytest.mark.timeout(180)

RUN_A, RUN_B = "run-a-5f0c", "run-b-77aa"
BUCKET = "kfp-cleanup-bucket"
PREFIX = "pipelines"
REPO, SCRATCH_REPO, FOREIGN_REPO = ("kfp-sagemaker-blackwell/trainer",
                                    "kfp-sagemaker-blackwell/scratch", "other-team/app")
ROLE = "arn:aws:iam::123456789012:role/kfp-sagemaker-codebuild"
ALL_DELETE = {kind: choices[0] for kind, choices in plan_mod.POLICY_CHOICES.items()}
# A running job that ends on SIGTERM, as the trainer does (PID 1 of the job's PID namespace
# has no default SIGTERM action: without a handler every stop waits out the grace period).
RUNNING = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
           "print('step 1 loss 2.0', flush=True)\ntime.sleep(600)\n")
FINISHING = ("import os, pathlib\nprint('done', flush=True)\n"
             "pathlib.Path(os.environ.get('SM_MODEL_DIR', '.'), 'model.bin').write_text('w')\n")


def run_tags(run_id: str, component: str, created: bool = False) -> dict[str, str]:
    t = tags.run_tags(run_id, "precision-sweep", component)
    if created:
        t[tags.CREATED_KEY] = run_id
    return t


def manifest(seed: str) -> str:
    import hashlib
    import json

    digest = "sha256:" + hashlib.sha256(seed.encode()).hexdigest()
    return json.dumps({"schemaVersion": 2, "mediaType":
                       "application/vnd.docker.distribution.manifest.v2+json",
                       "config": {"digest": digest, "size": 1, "mediaType":
                                  "application/vnd.docker.container.image.v1+json"},
                       "layers": [{"digest": digest, "size": 1, "mediaType":
                                   "application/vnd.docker.image.rootfs.diff.tar.gzip"}]})


def start_job(sm, name: str, code: str, run_id: str | None, checkpoint: str = "",
              image: str = "local", output: str = f"s3://{BUCKET}/{PREFIX}/jobs") -> None:
    request = dict(
        TrainingJobName=name, RoleArn="arn:aws:iam::123456789012:role/kfp-sagemaker-exec",
        AlgorithmSpecification={"TrainingImage": image, "TrainingInputMode": "File",
                                "ContainerEntrypoint": [sys.executable, "-c", code]},
        OutputDataConfig={"S3OutputPath": output},
        ResourceConfig={"InstanceType": "ml.p6-b200.48xlarge", "InstanceCount": 1,
                        "VolumeSizeInGB": 100},
        StoppingCondition={"MaxRuntimeInSeconds": 3600})
    if run_id:
        request["Tags"] = tags.as_key_value(run_tags(run_id, "sagemaker_training"))
    if checkpoint:
        request["CheckpointConfig"] = {"S3Uri": checkpoint}
    sm.create_training_job(**request)


def wait_for(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def world(monkeypatch, tmp_path):
    """Run A's and run B's resources plus untagged ones, with jobs running."""
    from kfp_sagemaker_blackwell.local_backend import LocalBackend

    with LocalBackend(max_concurrent_jobs=6, stop_grace_s=2, log_flush_s=0.1) as backend:
        for key, value in backend.env().items():
            monkeypatch.setenv(key, value)
        s3, sm, ecr = backend.client("s3"), backend.client("sagemaker"), backend.client("ecr")
        iam, codebuild = backend.client("iam"), backend.client("codebuild")
        s3.create_bucket(Bucket=BUCKET,
                         CreateBucketConfiguration={"LocationConstraint": backend.region})

        # Run A's image build: build_image creates the repository and the CodeBuild project
        # (both "created by run A"), uploads the tagged context and starts a build, held.
        worker = CodeBuildWorker(backend, monkeypatch, hold=True)
        write_checkout(tmp_path / "checkout")
        build_errors: list[BaseException] = []

        def build() -> None:
            try:
                b.build_image(b.BuildRequest.from_parameters(cli.declared(
                    build_image, run_id=RUN_A, s3_uri=f"s3://{BUCKET}/{PREFIX}",
                    context_dir=str(tmp_path / "checkout"), base_image="example.com/base:1",
                    builder="codebuild", codebuild_role_arn=ROLE, poll_interval_seconds=0.1)),
                    log=lambda _: None)
            except BaseException as exc:  # stopped by cleanup
                build_errors.append(exc)

        builder = threading.Thread(target=build, daemon=True)
        builder.start()
        wait_for(lambda: worker.started, "run A's build to start")

        # S3 objects: tagged by run A, by run B, untagged.
        for key, run_id in (("outputs/metrics-a.json", RUN_A), ("outputs/metrics-b.json", RUN_B),
                            ("outputs/untagged.json", None)):
            extra = {"Tagging": urllib.parse.urlencode(run_tags(run_id, "parse_logs"))} \
                if run_id else {}
            s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{key}", Body=b"{}", **extra)

        # Training jobs: run A running + completed, run B running, untagged running.
        jobs = {"a-running": RUN_A, "a-done": RUN_A, "b-running": RUN_B, "untagged": None}
        ckpt = {name: f"s3://{BUCKET}/{PREFIX}/checkpoints/{name}" for name in jobs}
        ckpt["a-done"] = f"s3://{BUCKET}/{PREFIX}/shared-checkpoints"  # not unique to the job
        for name, run_id in jobs.items():
            path = urllib.parse.urlparse(ckpt[name]).path.lstrip("/")
            s3.put_object(Bucket=BUCKET, Key=f"{path}/step-1.pt", Body=b"c")
            start_job(sm, name, FINISHING if name == "a-done" else RUNNING, run_id, ckpt[name])

        # ECR: run B pushed into run A's repository; a scratch repository holding only
        # run A's image; another team's repository (not the project's) is never scanned.
        ecr.put_image(repositoryName=REPO, imageManifest=manifest("a"),
                      imageTag=build_marks.run_marker(RUN_A, "ctx-aaaaaaaaaaaa"))
        ecr.put_image(repositoryName=REPO, imageManifest=manifest("b"),
                      imageTag=build_marks.run_marker(RUN_B, "ctx-bbbbbbbbbbbb"))
        ecr.create_repository(repositoryName=SCRATCH_REPO,
                              tags=tags.as_key_value(run_tags(RUN_A, "build_image", True)))
        ecr.put_image(repositoryName=SCRATCH_REPO, imageManifest=manifest("s"),
                      imageTag=build_marks.run_marker(RUN_A, "ctx-ssssssssssss"))
        ecr.create_repository(repositoryName=FOREIGN_REPO)
        ecr.put_image(repositoryName=FOREIGN_REPO, imageManifest=manifest("f"),
                      imageTag=build_marks.run_marker(RUN_A, "ctx-ffffffffffff"))

        # IAM roles and another CodeBuild project.
        trust = '{"Version":"2012-10-17","Statement":[]}'
        document = ('{"Version":"2012-10-17","Statement":[{"Effect":"Allow",'
                    '"Action":"s3:GetObject","Resource":"*"}]}')
        managed = iam.create_policy(PolicyName="kfp-sagemaker-read", PolicyDocument=document)[
            "Policy"]["Arn"]
        for name, run_id in (("kfp-sagemaker-exec-a", RUN_A), ("kfp-sagemaker-exec-b", RUN_B),
                             ("unrelated-role", None)):
            extra = {"Tags": tags.as_key_value(run_tags(run_id, "setup", True))} if run_id else {}
            iam.create_role(RoleName=name, AssumeRolePolicyDocument=trust, **extra)
            iam.attach_role_policy(RoleName=name, PolicyArn=managed)
            iam.put_role_policy(RoleName=name, PolicyName="inline", PolicyDocument=document)
        codebuild.create_project(
            name="other-project", source={"type": "S3", "location": f"{BUCKET}/x.zip"},
            artifacts={"type": "NO_ARTIFACTS"}, serviceRole=ROLE,
            environment={"type": "LINUX_CONTAINER", "image": "aws/codebuild/standard:7.0",
                         "computeType": "BUILD_GENERAL1_SMALL"})

        def status(name: str) -> str:
            return sm.describe_training_job(TrainingJobName=name)["TrainingJobStatus"]

        def logged(name: str) -> bool:
            streams = backend.client("logs").describe_log_streams(
                logGroupName="/aws/sagemaker/TrainingJobs", logStreamNamePrefix=f"{name}/")
            return bool(streams["logStreams"])

        wait_for(lambda: status("a-done") == "Completed", "the finishing job")
        for name in jobs:
            wait_for(lambda n=name: logged(n), f"{name}'s log stream")
        yield backend
        worker.release.set()
        for name in jobs:
            if status(name) == "InProgress":
                sm.stop_training_job(TrainingJobName=name)


def snapshot(backend) -> dict:
    s3, sm, ecr = backend.client("s3"), backend.client("sagemaker"), backend.client("ecr")
    logs, iam, codebuild = backend.client("logs"), backend.client("iam"), backend.client("codebuild")
    listed = s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])
    build_ids = codebuild.list_builds()["ids"]
    return {
        "jobs": {j["TrainingJobName"]: j["TrainingJobStatus"]
                 for j in sm.list_training_jobs(MaxResults=100)["TrainingJobSummaries"]},
        "objects": sorted(o["Key"] for o in listed),
        "images": {r["repositoryName"]: sorted(
            t for i in ecr.describe_images(repositoryName=r["repositoryName"])["imageDetails"]
            for t in i.get("imageTags", []))
            for r in ecr.describe_repositories()["repositories"]},
        "streams": sorted(s["logStreamName"] for g in ("/aws/sagemaker/TrainingJobs",
                                                        "/aws/codebuild/" + cli.defaults(build_image)["codebuild_project"])
                          for s in logs.describe_log_streams(logGroupName=g)["logStreams"]),
        "groups": sorted(g["logGroupName"] for g in logs.describe_log_groups()["logGroups"]),
        "roles": sorted(r["RoleName"] for r in iam.list_roles()["Roles"]),
        "projects": sorted(codebuild.list_projects()["projects"]),
        "builds": [x["buildStatus"] for x in codebuild.batch_get_builds(ids=build_ids)["builds"]]
        if build_ids else [],
    }


def run_cleanup(dry_run: bool = False, policy: dict | None = None, **kwargs):
    return cleanup(RUN_A, "us-west-2", dry_run=dry_run, policy=policy,
                   s3_uris=[f"s3://{BUCKET}/{PREFIX}"], stop_wait_s=60, poll_s=0.2,
                   log=lambda _: None, **kwargs)


def test_everything_of_the_run_goes_and_nothing_else(world, tmp_path):
    before = snapshot(world)
    with aws.record_calls(str(tmp_path / "calls.jsonl")) as recording:
        result = run_cleanup(policy=ALL_DELETE)
    after = snapshot(world)
    assert result.failures == []

    assert after["jobs"] == {**before["jobs"], "a-running": "Stopped"}
    assert before["jobs"]["b-running"] == before["jobs"]["untagged"] == "InProgress"
    gone = sorted(set(before["objects"]) - set(after["objects"]))
    assert all(k.startswith((f"{PREFIX}/jobs/a-", f"{PREFIX}/checkpoints/a-running/",
                             f"{PREFIX}/build-contexts/", f"{PREFIX}/outputs/metrics-a"))
               for k in gone), gone
    assert f"{PREFIX}/outputs/metrics-a.json" in gone
    assert f"{PREFIX}/checkpoints/a-running/step-1.pt" in gone
    assert any(k.startswith(f"{PREFIX}/jobs/a-done/output/") for k in gone)
    assert not any(k.startswith(f"{PREFIX}/jobs/a-") for k in after["objects"])  # nothing left
    for kept in ("outputs/metrics-b.json", "outputs/untagged.json",
                 "checkpoints/b-running/step-1.pt", "checkpoints/untagged/step-1.pt",
                 "shared-checkpoints/step-1.pt"):
        assert f"{PREFIX}/{kept}" in after["objects"], kept

    assert after["images"] == {
        REPO: [build_marks.run_marker(RUN_B, "ctx-bbbbbbbbbbbb")],  # run B's image, so it stays
        FOREIGN_REPO: before["images"][FOREIGN_REPO],  # not the project's: never scanned
    }
    assert [s for s in after["streams"] if s.startswith(("a-running/", "a-done/"))] == []
    assert any(s.startswith("b-running/") for s in after["streams"])
    assert any(s.startswith("untagged/") for s in after["streams"])
    assert after["groups"] == before["groups"]  # streams only, never a group
    assert after["roles"] == sorted(set(before["roles"]) - {"kfp-sagemaker-exec-a"})
    assert after["projects"] == ["other-project"]  # run A created the image-build project
    assert after["builds"] == ["STOPPED"]

    findings = iam_policy.check_calls(iam_policy.pod_policy(bucket=BUCKET), recording.calls())
    assert findings == [], "\n".join(map(str, findings))
    skipped = {o.action.resource: o.action.detail for o in result.outcomes
               if o.status == "skipped"}
    assert any("not unique to the job" in d for d in skipped.values())
    assert any("1 image(s) stay" in d for d in skipped.values())


def test_default_policy_stops_and_deletes_scratch_only(world):
    before = snapshot(world)
    result = run_cleanup()
    sm = world.client("sagemaker")
    wait_for(lambda: sm.describe_training_job(TrainingJobName="a-running")[
        "TrainingJobStatus"] == "Stopped", "the stopped job to end")  # nothing waited for it
    after = snapshot(world)
    assert result.failures == []
    assert after["jobs"] == {**before["jobs"], "a-running": "Stopped"}
    assert after["builds"] == ["STOPPED"]
    gone = set(before["objects"]) - set(after["objects"])
    assert gone and all(k.startswith(f"{PREFIX}/build-contexts/") for k in gone)
    assert after["images"] == before["images"] and after["streams"] == before["streams"]
    assert after["roles"] == before["roles"] and after["projects"] == before["projects"]
    kept = {o.action.kind for o in result.outcomes if o.status == "kept"}
    assert {"artifacts", "checkpoints", "logs", "images", "codebuild_projects",
            "iam_roles"} <= kept
    assert "## Kept (policy)" in result.markdown and "## Stopped" in result.markdown


def test_dry_run_changes_nothing_and_lists_exactly_what_the_real_run_does(world):
    before = snapshot(world)
    dry = run_cleanup(dry_run=True, policy=ALL_DELETE)
    assert snapshot(world) == before
    capped = run_cleanup(dry_run=True, policy=ALL_DELETE, max_objects=1)
    assert "stopped reading object tags after 1 objects" in capped.markdown  # said, not hidden
    real = run_cleanup(policy=ALL_DELETE)
    assert [o.action.key for o in dry.outcomes] == [o.action.key for o in real.outcomes]
    assert {o.status for o in dry.outcomes if o.action.verb in ("stop", "delete")} == {"planned"}
    assert dry.count("stop") == real.count("stop") == 2  # the job and the build
    assert dry.count("delete") == real.count("delete") > 10
    assert dry.markdown.startswith(f"# Cleanup plan (dry run) for run `{RUN_A}`")
    assert "## Would stop" in dry.markdown and "## Would delete" in dry.markdown


def test_running_it_twice_is_harmless(world):
    first = run_cleanup(policy=ALL_DELETE)
    state = snapshot(world)
    second = run_cleanup(policy=ALL_DELETE)
    assert first.failures == [] and second.failures == []
    assert second.count("stop") == 0
    assert [o.action.resource for o in second.outcomes if o.action.verb == "delete"] == []
    assert snapshot(world) == state


def test_a_failure_is_reported_and_the_rest_continues(world, monkeypatch):
    # IAM refuses to delete a role still in an instance profile; moto cannot attach one
    # without EC2, so its DeleteRole is made to answer as IAM does for this one role.
    from moto.iam.exceptions import DeleteConflictException
    from moto.iam.models import IAMBackend

    original = IAMBackend.delete_role

    def refuse(self, role_name):
        if role_name == "kfp-sagemaker-exec-a":
            raise DeleteConflictException("Cannot delete entity, must remove roles from "
                                          "instance profile first.")
        return original(self, role_name)

    monkeypatch.setattr(IAMBackend, "delete_role", refuse)
    result = run_cleanup(policy=ALL_DELETE)
    (failed,) = result.failures
    assert failed.action.kind == "iam_roles" and "DeleteConflict" in failed.message
    assert result.count("delete") > 10 and snapshot(world)["jobs"]["a-running"] == "Stopped"
    assert "## Failed" in result.markdown and "kfp-sagemaker-exec-a" in result.markdown


@pytest.mark.parametrize("bad", ["", " ", "*", "run-*", "run?", "a b", "x" * 200, "%"])
def test_empty_wildcard_or_malformed_run_ids_are_refused_before_any_call(bad, tmp_path,
                                                                         monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    with aws.record_calls(str(tmp_path / "calls.jsonl")) as recording:
        with pytest.raises(UserError, match="run_id"):
            cleanup(bad, "us-west-2", dry_run=True, log=lambda _: None)
    assert recording.calls() == []


def test_bad_policy_is_refused_before_any_call(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    with aws.record_calls(str(tmp_path / "calls.jsonl")) as recording:
        for policy in ({"training_jobs": "delete"}, {"everything": "delete"}):
            with pytest.raises(UserError, match="policy"):
                cleanup(RUN_A, "us-west-2", policy=policy, log=lambda _: None)
    assert recording.calls() == []


def test_cli_refuses_a_wildcard_run_id_with_exit_code_2():
    out = subprocess.run([sys.executable, "-m", "kfp_sagemaker_blackwell.components.cleanup", "--run-id", "*",
                          "--region", "us-west-2", "--dry-run"], capture_output=True, text=True,
                         cwd=CHECKOUT, env={"PATH": "/usr/bin:/bin",
                                                  "AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    assert out.returncode == 2 and "run_id" in out.stderr


@pytest.fixture
def shared_world(monkeypatch):
    """Run A's job and image, and run B's job that resumed from A's checkpoints and whose
    image has the same digest as A's (both pushed the same content)."""
    from kfp_sagemaker_blackwell.local_backend import LocalBackend

    with LocalBackend(max_concurrent_jobs=2, stop_grace_s=2, log_flush_s=0.1) as backend:
        for key, value in backend.env().items():
            monkeypatch.setenv(key, value)
        s3, sm, ecr = backend.client("s3"), backend.client("sagemaker"), backend.client("ecr")
        s3.create_bucket(Bucket=BUCKET,
                         CreateBucketConfiguration={"LocationConstraint": backend.region})
        ckpt = f"s3://{BUCKET}/{PREFIX}/checkpoints/a-job"
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/checkpoints/a-job/step-1.pt", Body=b"a")
        start_job(sm, "a-job", FINISHING, RUN_A, ckpt)
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/checkpoints/a-job/step-2.pt", Body=b"b")
        start_job(sm, "b-job", FINISHING, RUN_B, ckpt)  # run B resumed from run A's prefix
        ecr.create_repository(repositoryName=REPO,
                              tags=tags.as_key_value(run_tags(RUN_A, "build_image", True)))
        for tag in ("ctx-aaaaaaaaaaaa", build_marks.run_marker(RUN_A, "ctx-aaaaaaaaaaaa"),
                    build_marks.run_marker(RUN_B, "ctx-aaaaaaaaaaaa")):
            ecr.put_image(repositoryName=REPO, imageManifest=manifest("shared"), imageTag=tag)
        ecr.put_image(repositoryName=REPO, imageManifest=manifest("a-only"),
                      imageTag=build_marks.run_marker(RUN_A, "ctx-cccccccccccc"))
        for name in ("a-job", "b-job"):
            wait_for(lambda n=name: sm.describe_training_job(TrainingJobName=n)[
                "TrainingJobStatus"] == "Completed", f"{name} to complete")
        yield backend


def test_delete_policies_leave_what_another_run_still_references(shared_world, tmp_path):
    ecr = shared_world.client("ecr")
    with aws.record_calls(str(tmp_path / "calls.jsonl")) as recording:
        result = run_cleanup(policy={"checkpoints": "delete", "images": "delete"})
    assert result.failures == []
    keys = [o["Key"] for o in shared_world.client("s3").list_objects_v2(
        Bucket=BUCKET, Prefix=f"{PREFIX}/checkpoints/").get("Contents", [])]
    assert sorted(keys) == [f"{PREFIX}/checkpoints/a-job/step-1.pt",
                            f"{PREFIX}/checkpoints/a-job/step-2.pt"]  # run B resumed from them
    skipped = [o.action.detail for o in result.outcomes if o.action.kind == "checkpoints"]
    assert any("b-job of run run-b-77aa" in d for d in skipped), skipped
    images = {t for i in ecr.describe_images(repositoryName=REPO)["imageDetails"]
              for t in i.get("imageTags", [])}
    # The shared digest lost run A's marker only; run A's own image is gone.
    assert images == {"ctx-aaaaaaaaaaaa", build_marks.run_marker(RUN_B, "ctx-aaaaaaaaaaaa")}
    assert any(o.message.startswith("untagged") for o in result.outcomes)
    findings = iam_policy.check_calls(iam_policy.pod_policy(bucket=BUCKET), recording.calls())
    assert findings == [], "\n".join(map(str, findings))


def test_an_image_another_runs_job_trains_from_is_only_untagged(shared_world):
    ecr, sm = shared_world.client("ecr"), shared_world.client("sagemaker")
    uri = ecr.describe_repositories(repositoryNames=[REPO])["repositories"][0]["repositoryUri"]
    ecr.batch_delete_image(repositoryName=REPO, imageIds=[
        {"imageTag": build_marks.run_marker(RUN_B, "ctx-aaaaaaaaaaaa")}])  # B reused: no marker
    start_job(sm, "b-job-2", FINISHING, RUN_B, image=f"{uri}:ctx-aaaaaaaaaaaa")
    wait_for(lambda: sm.describe_training_job(TrainingJobName="b-job-2")[
        "TrainingJobStatus"] == "Completed", "b-job-2 to complete")
    result = run_cleanup(policy={"images": "delete"})
    assert result.failures == []
    images = {t for i in ecr.describe_images(repositoryName=REPO)["imageDetails"]
              for t in i.get("imageTags", [])}
    assert images == {"ctx-aaaaaaaaaaaa"}  # still there for run B's job; run A's marker gone
    (untag,) = [o.action for o in result.outcomes if o.action.op[:1] == ("ecr_untag_image",)]
    assert "used by job b-job-2 of run run-b-77aa" in untag.detail


def test_a_delete_never_takes_another_runs_data_lying_under_this_runs_prefixes(monkeypatch):
    """Run B's output paths lie under run A's job prefixes (its output prefix and its
    checkpoint prefix), and an object run A tagged lies inside run B's output: cleanup
    of run A with every delete policy leaves all of run B's data, and says why."""
    from kfp_sagemaker_blackwell.local_backend import LocalBackend

    with LocalBackend(max_concurrent_jobs=4, stop_grace_s=2, log_flush_s=0.1) as backend:
        for key, value in backend.env().items():
            monkeypatch.setenv(key, value)
        s3, sm = backend.client("s3"), backend.client("sagemaker")
        s3.create_bucket(Bucket=BUCKET,
                         CreateBucketConfiguration={"LocationConstraint": backend.region})
        jobs = f"s3://{BUCKET}/{PREFIX}/jobs"
        start_job(sm, "a-job", FINISHING, RUN_A, f"{jobs}-ckpt/a-job")
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}/jobs-ckpt/a-job/step-1.pt", Body=b"a")
        start_job(sm, "b-job", FINISHING, RUN_B, output=f"{jobs}/a-job/nested")
        start_job(sm, "b-job-2", FINISHING, RUN_B, output=f"{jobs}-ckpt/a-job/b")
        start_job(sm, "b-job-3", FINISHING, RUN_B, output=f"s3://{BUCKET}/{PREFIX}/b-out")
        for name in ("a-job", "b-job", "b-job-2", "b-job-3"):
            wait_for(lambda n=name: sm.describe_training_job(TrainingJobName=n)[
                "TrainingJobStatus"] == "Completed", f"{name} to complete")
        tagged = f"{PREFIX}/b-out/b-job-3/output/metrics-a.json"
        s3.put_object(Bucket=BUCKET, Key=tagged, Body=b"{}",
                      Tagging=urllib.parse.urlencode(run_tags(RUN_A, "parse_logs")))
        before = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"])
        b_models = [f"{PREFIX}/jobs/a-job/nested/b-job/output/model.tar.gz",
                    f"{PREFIX}/jobs-ckpt/a-job/b/b-job-2/output/model.tar.gz"]
        assert set(b_models) <= set(before), before

        result = run_cleanup(policy=ALL_DELETE)

        after = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"])
        assert result.failures == []
        assert after == before  # everything under those prefixes is also run B's
        skipped = {o.action.resource: o.action.detail for o in result.outcomes
                   if o.status == "skipped"}
        assert "the output prefix of job b-job of run run-b-77aa" in skipped[
            f"s3://{BUCKET}/{PREFIX}/jobs/a-job/"]
        assert "the output prefix of job b-job-2 of run run-b-77aa" in skipped[
            f"s3://{BUCKET}/{PREFIX}/jobs-ckpt/a-job/"]
        assert "tagged by this run, but it overlaps" in skipped[f"s3://{BUCKET}/{tagged}"]
