"""The IAM policies in iam, the offline evaluator, and the API-call recorder."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from kfp_sagemaker_blackwell.common import aws
from kfp_sagemaker_blackwell.common.aws import ApiCall
from kfp_sagemaker_blackwell.iam import policy as iam_policy
from kfp_sagemaker_blackwell.iam.policy import Authorization, evaluate

ACCOUNT = "123456789012"
POD = iam_policy.pod_policy(bucket="my-bucket", s3_prefix="kfp/", region="us-west-2",
                            account_id=ACCOUNT)


def call(service: str, operation: str, **params) -> ApiCall:
    return ApiCall(service, operation, "us-west-2", params)


def allowed(c: ApiCall, policy=POD) -> bool:
    return iam_policy.check_calls(policy, [c], ACCOUNT) == []


@pytest.mark.parametrize("name", sorted(iam_policy.POLICIES))
def test_every_policy_is_valid_json_with_all_placeholders_filled(name):
    raw = (iam_policy.POLICY_DIR / iam_policy.POLICIES[name]).read_text()
    placeholders = set(re.findall(r"\$\{([A-Z_]+)\}", raw))
    assert placeholders <= set(iam_policy.DEFAULTS), placeholders
    rendered = iam_policy.load_policy(name, bucket="b", account_id=ACCOUNT, region="us-west-2")
    assert "${" not in json.dumps(rendered)
    assert rendered["Version"] == "2012-10-17"
    for st in rendered["Statement"]:
        assert st["Effect"] in ("Allow", "Deny")
        if "trust" not in name:
            assert st.get("Sid"), st  # every permission says why it is there


def test_no_permission_policy_grants_a_service_wide_wildcard_action():
    for name in ("pod", "sagemaker-execution", "codebuild-service"):
        for st in iam_policy.load_policy(name)["Statement"]:
            for action in iam_policy._as_list(st["Action"]):
                assert not action.endswith(":*") and action != "*", (name, action)


def test_wildcards_in_actions_ignore_case_and_in_resources_cross_separators():
    policy = {"Statement": [{"Effect": "Allow", "Action": "s3:Get*",
                             "Resource": "arn:aws:s3:::b/p*"}]}
    assert evaluate(policy, Authorization("S3:GETOBJECT", "arn:aws:s3:::b/p/x/y:z")).allowed
    assert not evaluate(policy, Authorization("s3:PutObject", "arn:aws:s3:::b/p/x")).allowed
    assert not evaluate(policy, Authorization("s3:GetObject", "arn:aws:s3:::B/p/x")).allowed
    # "[" is literal in IAM (unlike fnmatch)
    literal = {"Statement": [{"Effect": "Allow", "Action": "s3:GetObject",
                              "Resource": "arn:aws:s3:::b/[ab]"}]}
    assert not evaluate(literal, Authorization("s3:GetObject", "arn:aws:s3:::b/a")).allowed
    assert evaluate(literal, Authorization("s3:GetObject", "arn:aws:s3:::b/[ab]")).allowed


def test_explicit_deny_wins_over_allow():
    policy = {"Statement": [
        {"Sid": "All", "Effect": "Allow", "Action": "logs:*", "Resource": "*"},
        {"Sid": "NoGroups", "Effect": "Deny", "Action": "logs:DeleteLogGroup", "Resource": "*"}]}
    decision = evaluate(policy, Authorization("logs:DeleteLogGroup", "arn:aws:logs:r:a:log-group:g"))
    assert not decision.allowed and decision.statement == "NoGroups"


def test_conditions_from_the_request_are_evaluated_and_resource_tags_are_listed_as_assumed():
    policy = {"Statement": [{"Sid": "Tagged", "Effect": "Allow", "Action": "x:Create",
                             "Resource": "*",
                             "Condition": {"Null": {"aws:RequestTag/team": "false"},
                                           "StringLike": {"aws:RequestTag/team": "llm-*"}}},
                            {"Sid": "Own", "Effect": "Allow", "Action": "x:Delete",
                             "Resource": "*",
                             "Condition": {"StringEquals": {"aws:ResourceTag/team": "llm"}}}]}
    ok = Authorization("x:Create", "r", {"aws:RequestTag/team": ["llm-a"]})
    assert evaluate(policy, ok).allowed
    assert not evaluate(policy, Authorization("x:Create", "r")).allowed
    assert not evaluate(policy, Authorization("x:Create", "r",
                                              {"aws:RequestTag/team": ["web"]})).allowed
    assumed = evaluate(policy, Authorization("x:Delete", "r"))
    assert assumed.allowed and assumed.assumed == ("aws:ResourceTag/team",)


def test_unsupported_condition_operator_is_an_error_not_a_silent_allow():
    policy = {"Statement": [{"Effect": "Allow", "Action": "x:Y", "Resource": "*",
                             "Condition": {"DateGreaterThan": {"aws:CurrentTime": "2020"}}}]}
    with pytest.raises(ValueError, match="DateGreaterThan"):
        evaluate(policy, Authorization("x:Y", "r"))


def test_pod_policy_allows_the_projects_calls_and_refuses_the_rest():
    job = "bf16-train-run-1-abcdef12"
    run_tag = [{"Key": "kfp-sagemaker:run-id", "Value": "run-1"}]
    role = f"arn:aws:iam::{ACCOUNT}:role/kfp-sagemaker-execution"
    create = dict(TrainingJobName=job, RoleArn=role, Tags=run_tag)
    assert allowed(call("sagemaker", "CreateTrainingJob", **create))
    # A job without the run's tag could never be found by cleanup: refused.
    assert not allowed(call("sagemaker", "CreateTrainingJob", **{**create, "Tags": []}))
    # Passing a role that is not the project's, or to another service: refused.
    assert not allowed(call("sagemaker", "CreateTrainingJob",
                            **{**create, "RoleArn": f"arn:aws:iam::{ACCOUNT}:role/Admin"}))
    assert allowed(call("codebuild", "StartBuild", projectName="kfp-sagemaker-blackwell-image-build",
                        serviceRoleOverride=f"arn:aws:iam::{ACCOUNT}:role/kfp-sagemaker-codebuild"))
    assert not allowed(call("codebuild", "StartBuild", projectName="someone-elses-project"))
    # S3: only under the pipeline prefix of the pipeline bucket; listing needs the prefix.
    assert allowed(call("s3", "DeleteObject", Bucket="my-bucket", Key="kfp/run/x"))
    assert not allowed(call("s3", "DeleteObject", Bucket="my-bucket", Key="other/x"))
    assert not allowed(call("s3", "DeleteObject", Bucket="other-bucket", Key="kfp/x"))
    assert allowed(call("s3", "ListObjectsV2", Bucket="my-bucket", Prefix="kfp/jobs/"))
    assert not allowed(call("s3", "ListObjectsV2", Bucket="my-bucket"))
    # Logs: read and delete streams of the training-job group, never delete a group.
    group = "/aws/sagemaker/TrainingJobs"
    assert allowed(call("logs", "GetLogEvents", logGroupName=group, logStreamName=f"{job}/algo-1-1"))
    assert allowed(call("logs", "DeleteLogStream", logGroupName=group,
                        logStreamName=f"{job}/algo-1-1"))
    assert not allowed(call("logs", "DeleteLogGroup", logGroupName=group))
    assert not allowed(call("logs", "GetLogEvents", logGroupName="/aws/lambda/x",
                            logStreamName="s"))
    # ECR: delete only in the project's repositories.
    assert allowed(call("ecr", "BatchDeleteImage", repositoryName="kfp-sagemaker-blackwell/trainer",
                        imageIds=[]))
    assert not allowed(call("ecr", "BatchDeleteImage", repositoryName="other-team/app",
                            imageIds=[]))
    # IAM: delete only roles named for the project.
    assert not allowed(call("iam", "DeleteRole", RoleName="Admin"))
    assert allowed(call("sts", "GetCallerIdentity"))


def test_an_unmapped_call_is_a_finding():
    (finding,) = iam_policy.check_calls(POD, [call("ec2", "RunInstances")], ACCOUNT)
    assert "no IAM mapping" in finding.problem and "ec2:RunInstances" in str(finding)


def test_codebuild_role_may_pull_the_dlc_and_push_only_to_the_projects_repositories():
    role = iam_policy.load_policy("codebuild-service", bucket="my-bucket", account_id=ACCOUNT,
                                  region="us-west-2")
    dlc = "arn:aws:ecr:us-west-2:763104351884:repository/pytorch-training"
    ours = f"arn:aws:ecr:us-west-2:{ACCOUNT}:repository/kfp-sagemaker-blackwell/trainer"
    assert evaluate(role, Authorization("ecr:BatchGetImage", dlc)).allowed
    assert not evaluate(role, Authorization("ecr:PutImage", dlc)).allowed
    assert evaluate(role, Authorization("ecr:PutImage", ours)).allowed
    assert evaluate(role, Authorization("ecr:GetAuthorizationToken", "*")).allowed
    assert evaluate(role, Authorization(
        "s3:GetObject", "arn:aws:s3:::my-bucket/build-contexts/ctx-1.zip")).allowed


def test_recorder_captures_calls_here_and_in_child_processes_only_inside_the_block(
        tmp_path, monkeypatch):
    from kfp_sagemaker_blackwell.local_backend import LocalBackend

    with LocalBackend() as backend:
        for key, value in backend.env().items():
            monkeypatch.setenv(key, value)
        s3 = aws.client("s3")
        s3.create_bucket(Bucket="before",
                         CreateBucketConfiguration={"LocationConstraint": backend.region})
        with aws.record_calls(str(tmp_path / "calls.jsonl")) as recording:
            s3.list_objects_v2(Bucket="before", Prefix="x/")
            child = "from kfp_sagemaker_blackwell.common import aws; aws.client('s3').head_bucket(Bucket='before')"
            subprocess.run([sys.executable, "-c", child], check=True,
                           cwd=iam_policy.POLICY_DIR.parent.parent)
        s3.list_objects_v2(Bucket="before")  # after the block: not recorded
    calls = recording.calls()
    assert [(c.service, c.operation) for c in calls] == [("s3", "ListObjectsV2"),
                                                         ("s3", "HeadBucket")]
    assert {k: calls[0].params[k] for k in ("Bucket", "Prefix")} == {"Bucket": "before", "Prefix": "x/"}
    assert calls[0].region == backend.region
    assert aws.RECORD_CALLS_ENV not in os.environ


def test_the_iam_lint_passes_and_would_catch_a_bad_policy():
    import json
    import subprocess
    import sys
    import warnings
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, str(root / "iam" / "lint.py")],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "3 policies, 0 finding(s)" in out.stdout, out.stdout
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from parliament import analyze_policy_string
    bad = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:GetObjectt", "Resource": "*"}]}
    assert analyze_policy_string(json.dumps(bad)).findings  # a misspelled action is found
def test_an_unmapped_call_is_a_finding_but_a_mappers_own_bug_is_not_hidden(monkeypatch):
    unmapped = iam_policy.check_calls(POD, [call("s3", "NoSuchOperation")])
    assert len(unmapped) == 1 and "no IAM mapping" in unmapped[0].problem

    def broken(params, region, account):
        return [Authorization("s3:GetObject", params["Missing"])]  # a bug: KeyError

    monkeypatch.setitem(iam_policy._OPERATIONS, ("s3", "GetObject"), broken)
    with pytest.raises(KeyError, match="Missing"):
        iam_policy.check_calls(POD, [call("s3", "GetObject", Bucket="b", Key="k")])
