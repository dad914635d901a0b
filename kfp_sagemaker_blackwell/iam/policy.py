"""The project's IAM policies (``iam/*.json``) and an offline check of API calls against them.

``check_calls(pod_policy(bucket=...), recording.calls())`` takes the calls that
``kfp_sagemaker_blackwell.common.aws.record_calls()`` recorded during a local run and returns
the ones the pod's policy would not allow: each call is mapped to the IAM
actions it needs (a call can need several: CreateTrainingJob also needs
iam:PassRole on its role and sagemaker:AddTags for its tags) and the resource
ARNs they are authorised against, then evaluated against the policy.

Why a small evaluator of our own: no maintained library evaluates IAM policies
offline (AWS's IAM policy simulator is an online API, and the Python packages
that parse policies do not evaluate them). This one implements what our policies
use: Allow/Deny statements (an explicit Deny wins), Action/NotAction with
``*``/``?`` wildcards (case-insensitive), Resource/NotResource with wildcards
(case-sensitive; ``*`` crosses ``/`` and ``:`` as in IAM), and the condition
operators StringEquals/StringNotEquals/StringLike/StringNotLike/Null, with
ForAnyValue:/ForAllValues: prefixes. Condition keys are taken from the request
(``aws:RequestTag/*``, ``aws:TagKeys``, ``iam:PassedToService``, ``s3:prefix``);
keys that depend on the resource's state (``aws:ResourceTag/*``) cannot be known
offline: a statement conditioned on one counts as matching and the key is listed
in ``Decision.assumed``. A call with no mapping is a finding too, so a new API
call cannot slip through unchecked: add it to ``_OPERATIONS``.
"""

from __future__ import annotations

import json
import re
import string
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kfp_sagemaker_blackwell.common import shipped
from kfp_sagemaker_blackwell.common.aws import ApiCall

# Beside this module, in a checkout and in the wheel (package data).
POLICY_DIR = Path(__file__).resolve().parent
POLICIES = {
    "pod": "pod-policy.json",
    "sagemaker-execution": "sagemaker-execution-policy.json",
    "sagemaker-execution-trust": "sagemaker-execution-trust.json",
    "codebuild-service": "codebuild-service-policy.json",
    "codebuild-service-trust": "codebuild-service-trust.json",
}
DEFAULTS = {
    "ACCOUNT_ID": "123456789012",  # the local backend's (moto's) account
    "REGION": "*",
    "BUCKET": "*",
    "S3_PREFIX": "",
    "ECR_REPOSITORY_PREFIX": "kfp-sagemaker-blackwell/",
}
ALWAYS_ALLOWED = {("sts", "GetCallerIdentity")}  # needs no permission


# ---- loading ----

def render(text: str, **values: str) -> str:
    """Fills ``${ACCOUNT_ID}``, ``${REGION}``, ``${BUCKET}``, ``${S3_PREFIX}``,
    ``${ECR_REPOSITORY_PREFIX}`` (defaults in ``DEFAULTS``); IAM's own ``${aws:...}``
    variables are left alone."""
    merged = {**DEFAULTS, **{k.upper(): v for k, v in values.items()}}
    return string.Template(text).safe_substitute(merged)


def load_policy(name: str, **values: str) -> dict[str, Any]:
    """One of ``POLICIES`` (e.g. "pod"), rendered with ``values`` (account_id=..., bucket=...)."""
    path = POLICY_DIR / POLICIES.get(name, name)
    if not path.is_file():
        path = shipped.path(f"iam/{POLICIES.get(name, name)}")  # names where it looked
    text = path.read_text(encoding="utf-8")
    policy: dict[str, Any] = json.loads(render(text, **values))
    return policy


def pod_policy(**values: str) -> dict[str, Any]:
    return load_policy("pod", **values)


# ---- evaluation ----

@dataclass(frozen=True)
class Authorization:
    """One action on one resource that a call needs, with the request's condition keys."""

    action: str
    resource: str
    context: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    statement: str = ""  # Sid of the statement that decided
    assumed: tuple[str, ...] = ()  # condition keys that could not be checked offline


def _wildcard(pattern: str, *, ignore_case: bool) -> re.Pattern[str]:
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(f"^{body}$", re.IGNORECASE if ignore_case else 0)


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _matches_any(patterns: list[str], value: str, *, ignore_case: bool) -> bool:
    return any(_wildcard(p, ignore_case=ignore_case).match(value) for p in patterns)


_OFFLINE_UNKNOWN = ("aws:ResourceTag/", "iam:ResourceTag/")


def _condition_holds(
    operator: str, key: str, expected: list[str], context: dict[str, list[str]],
    assumed: list[str],
) -> bool:
    if key.startswith(_OFFLINE_UNKNOWN):
        assumed.append(key)
        return True
    present = key in context
    values = context.get(key, [])
    if operator == "Null":  # "true": the key must be absent; "false": present
        return (not present) == (expected[0].lower() == "true")
    qualifier, _, op = operator.rpartition(":")
    if op.endswith("IfExists"):
        if not present:
            return True
        op = op[: -len("IfExists")]
    negated = op in ("StringNotEquals", "StringNotLike")
    if op in ("StringEquals", "StringNotEquals"):
        def one(v: str) -> bool:
            return v in expected
    elif op in ("StringLike", "StringNotLike"):
        def one(v: str) -> bool:
            return _matches_any(expected, v, ignore_case=False)
    else:
        raise ValueError(f"condition operator {operator} is not supported by this evaluator")
    if qualifier == "ForAllValues":
        result = all(one(v) for v in values)
    else:  # single-valued keys and ForAnyValue
        result = any(one(v) for v in values)
    return (not result) if negated else result


def _statement_matches(st: dict[str, Any], auth: Authorization, assumed: list[str]) -> bool:
    if "Action" in st and not _matches_any(_as_list(st["Action"]), auth.action, ignore_case=True):
        return False
    if "NotAction" in st and _matches_any(_as_list(st["NotAction"]), auth.action,
                                          ignore_case=True):
        return False
    if "Resource" in st and not _matches_any(_as_list(st["Resource"]), auth.resource,
                                             ignore_case=False):
        return False
    if "NotResource" in st and _matches_any(_as_list(st["NotResource"]), auth.resource,
                                            ignore_case=False):
        return False
    local: list[str] = []
    for operator, keys in (st.get("Condition") or {}).items():
        for key, expected in keys.items():
            if not _condition_holds(operator, key, _as_list(expected), auth.context, local):
                return False
    assumed.extend(local)
    return True


def evaluate(policy: dict[str, Any], auth: Authorization) -> Decision:
    """IAM's order: an explicit Deny wins, then any Allow, else the implicit deny."""
    statements = _as_list_of_dicts(policy.get("Statement"))
    for st in statements:
        if st.get("Effect") == "Deny" and _statement_matches(st, auth, []):
            return Decision(False, st.get("Sid", "Deny"))
    for st in statements:
        assumed: list[str] = []
        if st.get("Effect") == "Allow" and _statement_matches(st, auth, assumed):
            return Decision(True, st.get("Sid", ""), tuple(assumed))
    return Decision(False, "")


def _as_list_of_dicts(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, dict):
        return [value]
    return list(value or [])


# ---- from API calls to authorizations ----

def _tags_context(params: dict[str, Any], key: str = "Tags") -> dict[str, list[str]]:
    raw = params.get(key)
    pairs: dict[str, str] = {}
    if isinstance(raw, dict):  # CloudWatch Logs: {"k": "v"}
        pairs = {str(k): str(v) for k, v in raw.items()}
    elif isinstance(raw, list):  # [{"Key"/"key": ..., "Value"/"value": ...}]
        for item in raw:
            k = item.get("Key", item.get("key"))
            if k is not None:
                pairs[str(k)] = str(item.get("Value", item.get("value", "")))
    elif isinstance(raw, str):  # S3 Tagging: "k=v&k2=v2"
        pairs = dict(urllib.parse.parse_qsl(raw, keep_blank_values=True))
    context = {f"aws:RequestTag/{k}": [v] for k, v in pairs.items()}
    if pairs:
        context["aws:TagKeys"] = list(pairs)
    return context


def _s3(bucket: str, key: str | None = None) -> str:
    return f"arn:aws:s3:::{bucket}" + (f"/{key}" if key is not None else "")


def _pass_role(role_arn: str | None, service: str) -> list[Authorization]:
    if not role_arn:
        return []
    return [Authorization("iam:PassRole", role_arn,
                          {"iam:PassedToService": [f"{service}.amazonaws.com"]})]


Mapper = Callable[[dict[str, Any], str, str], list[Authorization]]


def _s3_object(action: str) -> Mapper:
    return lambda p, r, a: [Authorization(action, _s3(p["Bucket"], p["Key"]))]


def _s3_put(p: dict[str, Any], r: str, a: str) -> list[Authorization]:
    out = [Authorization("s3:PutObject", _s3(p["Bucket"], p["Key"]))]
    if p.get("Tagging"):
        out.append(Authorization("s3:PutObjectTagging", _s3(p["Bucket"], p["Key"])))
    return out


def _s3_list(p: dict[str, Any], r: str, a: str) -> list[Authorization]:
    context = {"s3:prefix": [str(p["Prefix"])]} if "Prefix" in p else {}
    return [Authorization("s3:ListBucket", _s3(p["Bucket"]), context)]


def _s3_delete_many(p: dict[str, Any], r: str, a: str) -> list[Authorization]:
    return [Authorization("s3:DeleteObject", _s3(p["Bucket"], o["Key"]))
            for o in p.get("Delete", {}).get("Objects", [])]


def _ecr_repo(p: dict[str, Any], r: str, a: str, name: str) -> str:
    return f"arn:aws:ecr:{r}:{p.get('registryId') or a}:repository/{name}"


def _ecr(action: str) -> Mapper:
    return lambda p, r, a: [Authorization(action, _ecr_repo(p, r, a, p["repositoryName"]))]


def _ecr_describe_repositories(p: dict[str, Any], r: str, a: str) -> list[Authorization]:
    names = p.get("repositoryNames") or ["*"]
    return [Authorization("ecr:DescribeRepositories", _ecr_repo(p, r, a, n)) for n in names]


def _ecr_create(p: dict[str, Any], r: str, a: str) -> list[Authorization]:
    arn = _ecr_repo(p, r, a, p["repositoryName"])
    context = _tags_context(p, "tags")
    out = [Authorization("ecr:CreateRepository", arn, context)]
    if p.get("tags"):
        out.append(Authorization("ecr:TagResource", arn, context))
    return out


def _by_arn(action: str, key: str) -> Mapper:
    return lambda p, r, a: [Authorization(action, str(p[key]))]


def _sm_job(action: str) -> Mapper:
    return lambda p, r, a: [Authorization(
        action, f"arn:aws:sagemaker:{r}:{a}:training-job/{str(p['TrainingJobName']).lower()}")]


def _sm_create_job(p: dict[str, Any], r: str, a: str) -> list[Authorization]:
    arn = f"arn:aws:sagemaker:{r}:{a}:training-job/{str(p['TrainingJobName']).lower()}"
    context = _tags_context(p)
    out = [Authorization("sagemaker:CreateTrainingJob", arn, context)]
    if p.get("Tags"):
        out.append(Authorization("sagemaker:AddTags", arn, context))
    return out + _pass_role(p.get("RoleArn"), "sagemaker")


def _sm_plan(p: dict[str, Any], r: str, a: str) -> list[Authorization]:
    name = str(p["TrainingPlanName"])
    arn = name if name.startswith("arn:") else f"arn:aws:sagemaker:{r}:{a}:training-plan/{name}"
    return [Authorization("sagemaker:DescribeTrainingPlan", arn)]


def _cb_project_arn(r: str, a: str, name: str) -> str:
    return name if name.startswith("arn:") else f"arn:aws:codebuild:{r}:{a}:project/{name}"


def _cb_project(action: str, key: str) -> Mapper:
    return lambda p, r, a: [Authorization(action, _cb_project_arn(r, a, str(p[key])))]


def _cb_projects(p: dict[str, Any], r: str, a: str) -> list[Authorization]:
    return [Authorization("codebuild:BatchGetProjects", _cb_project_arn(r, a, n))
            for n in p["names"]]


def _cb_builds(action: str) -> Mapper:
    # CodeBuild authorises build actions against the build's project.
    def mapper(p: dict[str, Any], r: str, a: str) -> list[Authorization]:
        ids = p["ids"] if "ids" in p else [p["id"]]
        projects = sorted({str(i).split(":", 1)[0] if not str(i).startswith("arn:")
                           else str(i).split(":build/", 1)[1].split(":", 1)[0] for i in ids})
        return [Authorization(action, _cb_project_arn(r, a, n)) for n in projects]
    return mapper


def _cb_create(p: dict[str, Any], r: str, a: str) -> list[Authorization]:
    arn = _cb_project_arn(r, a, p["name"])
    return [Authorization("codebuild:CreateProject", arn, _tags_context(p, "tags"))] + \
        _pass_role(p.get("serviceRole"), "codebuild")


def _cb_start(p: dict[str, Any], r: str, a: str) -> list[Authorization]:
    return [Authorization("codebuild:StartBuild", _cb_project_arn(r, a, p["projectName"]))] + \
        _pass_role(p.get("serviceRoleOverride"), "codebuild")


def _log_group(r: str, a: str, group: str) -> str:
    return f"arn:aws:logs:{r}:{a}:log-group:{group}"


def _logs_group(action: str) -> Mapper:
    return lambda p, r, a: [Authorization(action, _log_group(r, a, p["logGroupName"]))]


def _logs_stream(action: str) -> Mapper:
    return lambda p, r, a: [Authorization(
        action, f"{_log_group(r, a, p['logGroupName'])}:log-stream:{p['logStreamName']}")]


def _role(action: str) -> Mapper:
    # IAM authorises against the role's ARN, which includes its path; the call only
    # names the role, so the path is taken to be "/" (the policy's patterns allow any).
    return lambda p, r, a: [Authorization(action, f"arn:aws:iam::{a}:role/{p['RoleName']}")]


def _star(action: str) -> Mapper:
    return lambda p, r, a: [Authorization(action, "*")]


_OPERATIONS: dict[tuple[str, str], Mapper] = {
    # S3
    ("s3", "PutObject"): _s3_put,
    ("s3", "GetObject"): _s3_object("s3:GetObject"),
    ("s3", "HeadObject"): _s3_object("s3:GetObject"),
    ("s3", "DeleteObject"): _s3_object("s3:DeleteObject"),
    ("s3", "DeleteObjects"): _s3_delete_many,
    ("s3", "GetObjectTagging"): _s3_object("s3:GetObjectTagging"),
    ("s3", "PutObjectTagging"): _s3_object("s3:PutObjectTagging"),
    ("s3", "CreateMultipartUpload"): _s3_object("s3:PutObject"),
    ("s3", "UploadPart"): _s3_object("s3:PutObject"),
    ("s3", "CompleteMultipartUpload"): _s3_object("s3:PutObject"),
    ("s3", "AbortMultipartUpload"): _s3_object("s3:AbortMultipartUpload"),
    ("s3", "ListObjectsV2"): _s3_list,
    ("s3", "ListObjects"): _s3_list,
    ("s3", "HeadBucket"): _s3_list,
    ("s3", "GetBucketLocation"): lambda p, r, a: [
        Authorization("s3:GetBucketLocation", _s3(p["Bucket"]))],
    # ECR
    ("ecr", "DescribeRepositories"): _ecr_describe_repositories,
    ("ecr", "CreateRepository"): _ecr_create,
    ("ecr", "DescribeImages"): _ecr("ecr:DescribeImages"),
    ("ecr", "ListImages"): _ecr("ecr:ListImages"),
    ("ecr", "BatchDeleteImage"): _ecr("ecr:BatchDeleteImage"),
    ("ecr", "BatchGetImage"): _ecr("ecr:BatchGetImage"),
    ("ecr", "PutImage"): _ecr("ecr:PutImage"),
    ("ecr", "DeleteRepository"): _ecr("ecr:DeleteRepository"),
    ("ecr", "ListTagsForResource"): _by_arn("ecr:ListTagsForResource", "resourceArn"),
    ("ecr", "TagResource"): lambda p, r, a: [Authorization(
        "ecr:TagResource", str(p["resourceArn"]), _tags_context(p, "tags"))],
    ("ecr", "GetAuthorizationToken"): _star("ecr:GetAuthorizationToken"),
    # SageMaker
    ("sagemaker", "CreateTrainingJob"): _sm_create_job,
    ("sagemaker", "DescribeTrainingJob"): _sm_job("sagemaker:DescribeTrainingJob"),
    ("sagemaker", "StopTrainingJob"): _sm_job("sagemaker:StopTrainingJob"),
    ("sagemaker", "ListTrainingJobs"): _star("sagemaker:ListTrainingJobs"),
    ("sagemaker", "ListTags"): _by_arn("sagemaker:ListTags", "ResourceArn"),
    ("sagemaker", "AddTags"): lambda p, r, a: [Authorization(
        "sagemaker:AddTags", str(p["ResourceArn"]), _tags_context(p))],
    ("sagemaker", "DescribeTrainingPlan"): _sm_plan,
    ("sagemaker", "ListTrainingPlans"): _star("sagemaker:ListTrainingPlans"),
    ("sagemaker", "SearchTrainingPlanOfferings"): _star("sagemaker:SearchTrainingPlanOfferings"),
    # The Price List API (the launcher's prices; no resource-level permissions)
    ("pricing", "GetProducts"): _star("pricing:GetProducts"),
    # CodeBuild
    ("codebuild", "BatchGetProjects"): _cb_projects,
    ("codebuild", "CreateProject"): _cb_create,
    ("codebuild", "DeleteProject"): _cb_project("codebuild:DeleteProject", "name"),
    ("codebuild", "StartBuild"): _cb_start,
    ("codebuild", "StopBuild"): _cb_builds("codebuild:StopBuild"),
    ("codebuild", "BatchGetBuilds"): _cb_builds("codebuild:BatchGetBuilds"),
    ("codebuild", "ListBuildsForProject"): _cb_project("codebuild:ListBuildsForProject",
                                                       "projectName"),
    ("codebuild", "ListProjects"): _star("codebuild:ListProjects"),
    # CloudWatch Logs
    ("logs", "DescribeLogStreams"): _logs_group("logs:DescribeLogStreams"),
    ("logs", "FilterLogEvents"): _logs_group("logs:FilterLogEvents"),
    ("logs", "GetLogEvents"): _logs_stream("logs:GetLogEvents"),
    ("logs", "DeleteLogStream"): _logs_stream("logs:DeleteLogStream"),
    ("logs", "DeleteLogGroup"): _logs_group("logs:DeleteLogGroup"),
    # IAM
    ("iam", "ListRoles"): _star("iam:ListRoles"),
    ("iam", "ListRoleTags"): _role("iam:ListRoleTags"),
    ("iam", "GetRole"): _role("iam:GetRole"),
    ("iam", "ListAttachedRolePolicies"): _role("iam:ListAttachedRolePolicies"),
    ("iam", "ListRolePolicies"): _role("iam:ListRolePolicies"),
    ("iam", "DetachRolePolicy"): _role("iam:DetachRolePolicy"),
    ("iam", "DeleteRolePolicy"): _role("iam:DeleteRolePolicy"),
    ("iam", "DeleteRole"): _role("iam:DeleteRole"),
}


class UnmappedCall(LookupError):
    """A call with no entry in ``_OPERATIONS``: which IAM actions it needs is unknown."""


def authorizations(call: ApiCall, account_id: str = DEFAULTS["ACCOUNT_ID"]) -> list[Authorization]:
    """The IAM actions and resources a call needs; UnmappedCall when the call is not mapped."""
    mapper = _OPERATIONS.get((call.service, call.operation))
    if mapper is None:
        raise UnmappedCall(f"{call.service}:{call.operation}")
    return mapper(call.params, call.region, account_id)


@dataclass(frozen=True)
class Finding:
    call: ApiCall
    action: str
    resource: str
    problem: str

    def __str__(self) -> str:
        return f"{self.call.service}.{self.call.operation}: {self.action} on {self.resource}: " \
               f"{self.problem}"


def check_calls(
    policy: dict[str, Any], calls: Iterable[ApiCall], account_id: str = DEFAULTS["ACCOUNT_ID"],
) -> list[Finding]:
    """The calls (or parts of calls) the policy does not allow; [] when all are allowed."""
    findings: list[Finding] = []
    for call in calls:
        if (call.service, call.operation) in ALWAYS_ALLOWED:
            continue
        try:
            needed = authorizations(call, account_id)
        except UnmappedCall:
            findings.append(Finding(call, f"{call.service}:{call.operation}", "?",
                                    "no IAM mapping for this call in kfp_sagemaker_blackwell.common."
                                    "iam_policy._OPERATIONS: add one"))
            continue
        for auth in needed:
            decision = evaluate(policy, auth)
            if not decision.allowed:
                findings.append(Finding(call, auth.action, auth.resource,
                                        f"denied ({'by ' + decision.statement if decision.statement else 'no statement allows it'})"))
    return findings
