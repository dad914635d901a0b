"""What cleanup would do for a run: find the run's resources by its tag, decide per policy.

Only resources that carry the run's tag ``kfp-sagemaker:run-id = <run id>`` are
ever acted on, and things derived from them:

- training jobs tagged with the run (ListTrainingJobs + ListTags): stopped when
  still running; their output prefix ``{S3OutputPath}/{job}/`` (SageMaker's
  layout), their checkpoint prefix when it is unique to the job (the job name is
  one of its path segments), and their log streams ``{job}/...`` in
  /aws/sagemaker/TrainingJobs (the group itself never);
- CodeBuild builds of the run (builds cannot be tagged: build_image marks them
  with the environment variable KFP_SAGEMAKER_RUN_ID) in the project's projects
  (named ``kfp-sagemaker-*`` and tagged by any run, plus the ones named): stopped
  when still running, their log streams;
- S3 objects under the given prefixes whose object tags name the run (the build
  contexts build_image uploads, and whatever other components tag);
- ECR images carrying the run's marker tag (``run-<hash of run id>-...``, pushed
  by build_image next to the content tag), in repositories of the project (tagged
  by any run) or named; an image whose digest another run still references (its
  marker tag, a hand-set tag, or a job of another run training from it) is only
  untagged (this run's marker), never deleted; a repository only when this run created it
  (``kfp-sagemaker:created-by-run``) and nothing else is left in it;
- CodeBuild projects and IAM roles (names containing ``kfp-sagemaker-``) only when
  this run created them.

No S3 delete (a job's prefix or a tagged object) takes a key that overlaps the
output or checkpoint prefix of a job of another run or of no run (one lies under
the other): another run may have written its model under this run's job prefix,
or resumed from this run's checkpoints (``OtherRuns.overlap``).

Everything is decided here, before anything is changed, so a dry run lists
exactly the actions a real run takes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kfp_sagemaker_blackwell.common import build_marks, cli, tags
from kfp_sagemaker_blackwell.common.aws import client, error_code
from kfp_sagemaker_blackwell.common.cloudwatch import TRAINING_JOBS_LOG_GROUP
from kfp_sagemaker_blackwell.common.errors import UserError, check_count
from kfp_sagemaker_blackwell.common.s3 import split_s3_uri

if TYPE_CHECKING:
    from mypy_boto3_codebuild.type_defs import ProjectTypeDef
    from mypy_boto3_ecr.type_defs import ImageDetailTypeDef, RepositoryTypeDef
    from mypy_boto3_sagemaker.type_defs import (
        DescribeTrainingJobResponseTypeDef,
        TrainingJobSummaryTypeDef,
    )

# Policy per resource kind: allowed verbs and the safe default (stop what costs money,
# delete what is scratch, keep what someone may want).
POLICY_CHOICES: dict[str, tuple[str, ...]] = {
    "training_jobs": ("stop", "keep"),
    "codebuild_builds": ("stop", "keep"),
    "build_contexts": ("delete", "keep"),
    "artifacts": ("delete", "keep"),
    "checkpoints": ("delete", "keep"),
    "logs": ("delete", "keep"),
    "images": ("delete", "keep"),
    "repositories": ("delete", "keep"),
    "codebuild_projects": ("delete", "keep"),
    "iam_roles": ("delete", "keep"),
}
DEFAULT_POLICY: dict[str, str] = {
    "training_jobs": "stop",
    "codebuild_builds": "stop",
    "build_contexts": "delete",  # zips only the build needed
    "artifacts": "keep",  # model artifacts and outputs
    "checkpoints": "keep",
    "logs": "keep",
    "images": "keep",  # content-addressed: the next run reuses them
    "repositories": "delete",  # only when the run created it and it is empty
    "codebuild_projects": "keep",  # shared by later runs
    "iam_roles": "keep",
}
KIND_ORDER = list(POLICY_CHOICES)
VERB_ORDER = {"stop": 0, "delete": 1, "keep": 2, "skip": 3}
ROLE_NAME_MARK = "kfp-sagemaker-"  # roles cleanup may delete (and the pod policy allows)
PROJECT_NAME_MARK = "kfp-sagemaker-"  # CodeBuild projects cleanup looks into
# The cleanup component's declared defaults, read from its signature (the one declaration;
# ``source_defaults`` reads it with ast, since the component's module imports kfp.dsl,
# which KFP's executor leaves out): what plan and execute take when not given.
DECLARED: dict[str, Any] = cli.source_defaults(
    "kfp_sagemaker_blackwell.components.cleanup.component", "cleanup")
DEFAULT_MAX_OBJECTS: int = DECLARED["max_objects"]  # objects whose tags one run reads, per prefix


def resolve_policy(overrides: dict[str, str] | None) -> dict[str, str]:
    policy = dict(DEFAULT_POLICY)
    for kind, verb in (overrides or {}).items():
        if kind not in POLICY_CHOICES:
            raise UserError("policy", f"unknown resource kind {kind!r}.",
                            f"use one of {', '.join(KIND_ORDER)}.")
        if verb not in POLICY_CHOICES[kind]:
            raise UserError("policy", f"{kind}={verb!r} is not allowed.",
                            f"{kind} takes {' or '.join(POLICY_CHOICES[kind])}.")
        policy[kind] = verb
    return policy


@dataclass(frozen=True)
class Action:
    """One thing cleanup does (or reports keeping) to one resource.

    Identity (for "the dry run equals the real run") is kind, verb and resource;
    ``detail`` says why and how big; ``op`` is what the executor needs.
    """

    kind: str
    verb: str  # stop | delete | keep | skip
    resource: str  # ARN, s3:// URI, repo@digest, group:stream ...
    detail: str = ""
    op: tuple[Any, ...] = field(default=(), compare=False)
    after_jobs: tuple[str, ...] = field(default=(), compare=False)  # wait for these to stop

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kind, self.verb, self.resource)


@dataclass
class Plan:
    run_id: str
    region: str
    policy: dict[str, str]
    actions: list[Action]
    notes: list[str] = field(default_factory=list)  # scan limits and the like

    def sort(self) -> None:
        self.actions.sort(key=lambda a: (VERB_ORDER.get(a.verb, 9), KIND_ORDER.index(a.kind),
                                         a.resource))


def _s3_uri(bucket: str, key: str) -> str:
    return f"s3://{bucket}/{key}"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


class OtherRuns:
    """What the jobs of other runs (or of no run) still reference: S3 prefixes and images.

    The planner lists these jobs while it looks for the run's own (``jobs``); they are
    described once, and only when a delete of S3 data or of an image asks.
    """

    def __init__(self, region: str) -> None:
        self.region = region
        self.jobs: list[tuple[str, str]] = []  # (job name, run id) of jobs not this run's
        self._described: list[tuple[str, DescribeTrainingJobResponseTypeDef]] | None = None
        self._prefixes: list[tuple[str, str, str]] | None = None

    def described(self) -> list[tuple[str, DescribeTrainingJobResponseTypeDef]]:
        """(run id, DescribeTrainingJob) of every job not this run's, read once, when needed.

        Needed only to delete S3 data or images: another run's job may write under
        this run's prefixes (its output path lies under them), have resumed from this
        run's checkpoint prefix (or this run's from its), or train from this run's
        image, and then that run still needs them.
        """
        if self._described is None:
            sm = client("sagemaker", self.region)
            self._described = [
                (run_id, sm.describe_training_job(TrainingJobName=name))
                for name, run_id in self.jobs]
        return self._described

    @staticmethod
    def _owner(run_id: str) -> str:
        return f"run {run_id}" if run_id else "no run (untagged)"

    def prefixes(self) -> list[tuple[str, str, str]]:
        """(bucket, prefix, whose) of every output and checkpoint prefix of jobs not this run's.

        A job's output prefix is ``{S3OutputPath}/{job}/`` (where SageMaker writes its
        model and output), its checkpoint prefix ``CheckpointConfig.S3Uri``. Read once,
        when a delete needs it.
        """
        if self._prefixes is None:
            found: list[tuple[str, str, str]] = []
            for run_id, job in self.described():
                name = job["TrainingJobName"]
                whose = f"job {name} of {self._owner(run_id)}"
                out = job.get("OutputDataConfig", {}).get("S3OutputPath", "")
                if out:
                    bucket, prefix = split_s3_uri(out, "s3_uris")
                    found.append((bucket, f"{prefix.rstrip('/')}/{name}/".lstrip("/"),
                                  f"the output prefix of {whose}"))
                ckpt = job.get("CheckpointConfig", {}).get("S3Uri", "")
                if ckpt:
                    bucket, prefix = split_s3_uri(ckpt, "s3_uris")
                    found.append((bucket, prefix.rstrip("/") + "/",
                                  f"the checkpoint prefix of {whose}"))
            self._prefixes = found
        return self._prefixes

    def overlap(self, bucket: str, key_or_prefix: str) -> str:
        """Why ``key_or_prefix`` must stay (it overlaps another job's output or checkpoint
        prefix: one lies under the other), or "".

        Every delete of S3 data asks this, so a prefix of this run that holds another
        run's model (that run's S3OutputPath lies under this run's job prefix), or
        checkpoints another run resumed from, is never deleted by this run's cleanup.
        """
        for other_bucket, other, whose in self.prefixes():
            if other_bucket == bucket and (other.startswith(key_or_prefix)
                                           or key_or_prefix.startswith(other)):
                return (f"overlaps {whose} (s3://{other_bucket}/{other}; one lies under the "
                        "other, or one job resumed from the other's checkpoints): never "
                        "deleted by this run's cleanup")
        return ""

    def image_users(self, repository_uri: str, digest: str, image_tags: list[str]) -> list[str]:
        """Other runs' (or untagged) jobs whose training image is this one."""
        refs = {f"{repository_uri}@{digest}"} | {f"{repository_uri}:{t}" for t in image_tags}
        return [f"job {job['TrainingJobName']} of {self._owner(run_id)}"
                for run_id, job in self.described()
                if job.get("AlgorithmSpecification", {}).get("TrainingImage") in refs]


class Planner:
    """Finds the run's resources and decides an action for each (``plan``)."""

    def __init__(self, run_id: str, region: str, policy: dict[str, str], *,
                 s3_uris: list[str], ecr_repositories: list[str], codebuild_projects: list[str],
                 created_after: dt.datetime | None, max_objects: int,
                 log: Callable[[str], None]) -> None:
        self.run_id = run_id
        self.region = region
        self.policy = policy
        self.s3_uris = s3_uris
        self.ecr_repositories = ecr_repositories
        self.codebuild_projects = codebuild_projects
        self.created_after = created_after
        self.max_objects = max_objects
        self.log = log
        self.actions: list[Action] = []
        self.notes: list[str] = []
        self.claimed_prefixes: list[tuple[str, str]] = []  # (bucket, prefix) already planned
        self.others = OtherRuns(region)  # what other runs' jobs still reference

    def add(self, kind: str, wanted: str, resource: str, detail: str = "",
            op: tuple[Any, ...] = (), after_jobs: tuple[str, ...] = ()) -> None:
        verb = self.policy[kind] if wanted == "policy" else wanted
        self.actions.append(Action(kind, verb, resource, detail, op if verb in ("stop", "delete")
                                   else (), after_jobs))

    def mine(self, resource_tags: dict[str, str]) -> bool:
        return tags.belongs_to_run(resource_tags, self.run_id)

    def created_by_me(self, resource_tags: dict[str, str]) -> bool:
        return self.mine(resource_tags) and resource_tags.get(tags.CREATED_KEY) == tags.clean_value(
            self.run_id)

    # ---- SageMaker training jobs, and what hangs off them ----
    def training_jobs(self) -> None:
        sm = client("sagemaker", self.region)
        kwargs: dict[str, Any] = {"MaxResults": 100, "SortBy": "CreationTime",
                                  "SortOrder": "Descending"}
        if self.created_after:
            kwargs["CreationTimeAfter"] = self.created_after
        jobs: list[TrainingJobSummaryTypeDef] = []
        while True:
            page = sm.list_training_jobs(**kwargs)
            for summary in page.get("TrainingJobSummaries", []):
                job_tags = tags.from_key_value(
                    sm.list_tags(ResourceArn=summary["TrainingJobArn"]).get("Tags"))
                if self.mine(job_tags):
                    jobs.append(summary)
                else:
                    self.others.jobs.append((summary["TrainingJobName"],
                                             job_tags.get(tags.RUN_ID_KEY, "")))
            token = page.get("NextToken")
            if not token:
                break
            kwargs["NextToken"] = token
        logs = client("logs", self.region)
        for summary in sorted(jobs, key=lambda j: j["TrainingJobName"]):
            self.training_job(sm, logs, summary["TrainingJobName"])

    def training_job(self, sm: Any, logs: Any, name: str) -> None:
        """Plans one of the run's jobs: stop it, and its outputs, checkpoints and logs."""
        job = sm.describe_training_job(TrainingJobName=name)
        status = job["TrainingJobStatus"]
        running = status in ("InProgress", "Stopping")
        will_stop = status == "InProgress" and self.policy["training_jobs"] == "stop"
        if status == "InProgress":
            self.add("training_jobs", "policy", job["TrainingJobArn"],
                     f"{name}: {status} ({job.get('SecondaryStatus', '')})",
                     ("sagemaker_stop", name))
        # A job still running (and not being stopped here) keeps what it writes.
        after = (name,) if running else ()
        blocked = running and not will_stop and status != "Stopping"
        out = job.get("OutputDataConfig", {}).get("S3OutputPath", "")
        if out:
            bucket, prefix = split_s3_uri(out, "s3_uris")
            self.prefix("artifacts", bucket, f"{prefix.rstrip('/')}/{name}/".lstrip("/"),
                        f"output of {name}", after, blocked)
        ckpt = job.get("CheckpointConfig", {}).get("S3Uri", "")
        if ckpt:
            bucket, prefix = split_s3_uri(ckpt, "s3_uris")
            prefix = prefix.rstrip("/") + "/"
            if name in prefix.strip("/").split("/"):
                self.prefix("checkpoints", bucket, prefix, f"checkpoints of {name}", after,
                            blocked)
            else:
                self.claimed_prefixes.append((bucket, prefix))
                self.add("checkpoints", "skip", ckpt,
                         f"checkpoint prefix of {name} is not unique to the job (its name "
                         "is not a path segment): never deleted by cleanup")
        self.log_streams(logs, TRAINING_JOBS_LOG_GROUP, f"{name}/", f"log of {name}",
                         after, blocked)

    def prefix(self, kind: str, bucket: str, prefix: str, what: str,
               after: tuple[str, ...], blocked: bool) -> None:
        s3 = client("s3", self.region)
        count, size = 0, 0
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                count += 1
                size += int(obj.get("Size", 0))
        self.claimed_prefixes.append((bucket, prefix))
        if not count and not after:
            return  # a job still running may still write here: planned even when empty
        detail = f"{what}: {count} objects, {_size(size)}" + (
            " so far (the job is still running)" if after else "")
        shared = self.others.overlap(bucket, prefix) if self.policy[kind] == "delete" else ""
        if shared:
            self.add(kind, "skip", _s3_uri(bucket, prefix), f"{detail}; {shared}")
            return
        if blocked:
            self.add(kind, "skip", _s3_uri(bucket, prefix), detail + "; the job is still "
                     "running (training_jobs=keep)")
            return
        self.add(kind, "policy", _s3_uri(bucket, prefix), detail,
                 ("s3_delete_prefix", bucket, prefix), after)

    def log_streams(self, logs: Any, group: str, prefix: str, what: str,
                    after: tuple[str, ...], blocked: bool) -> None:
        try:
            pages = logs.get_paginator("describe_log_streams").paginate(
                logGroupName=group, logStreamNamePrefix=prefix)
            streams = [s["logStreamName"] for page in pages for s in page.get("logStreams", [])]
        except Exception as exc:
            if error_code(exc) == "ResourceNotFoundException":
                return
            raise
        for stream in sorted(streams):
            resource = f"{group}:{stream}"
            if blocked:
                self.add("logs", "skip", resource, f"{what}; still being written")
            else:
                self.add("logs", "policy", resource, what, ("logs_delete_stream", group, stream),
                         after)

    # ---- CodeBuild ----
    def codebuild(self) -> None:
        codebuild = client("codebuild", self.region)
        names: list[str] = []
        kwargs: dict[str, Any] = {}
        while True:
            page = codebuild.list_projects(**kwargs)
            names.extend(page.get("projects", []))
            if not page.get("nextToken"):
                break
            kwargs["nextToken"] = page["nextToken"]
        # Only the project's projects (what the pod policy lets it read) and the named ones.
        names = sorted(n for n in names
                       if n.startswith(PROJECT_NAME_MARK) or n in self.codebuild_projects)
        projects: list[ProjectTypeDef] = []
        for i in range(0, len(names), 100):
            projects.extend(codebuild.batch_get_projects(names=names[i:i + 100]).get(
                "projects", []))
        logs = client("logs", self.region)
        for project in sorted(projects, key=lambda p: p["name"]):
            project_tags = tags.from_key_value(project.get("tags"))
            ours = tags.RUN_ID_KEY in project_tags or project["name"] in self.codebuild_projects
            if not ours:
                continue
            self.builds(codebuild, logs, project["name"])
            if self.created_by_me(project_tags):
                self.add("codebuild_projects", "policy", project["arn"],
                         f"{project['name']}: created by this run",
                         ("codebuild_delete_project", project["name"]))

    def builds(self, codebuild: Any, logs: Any, project: str) -> None:
        ids = codebuild.list_builds_for_project(projectName=project, sortOrder="DESCENDING").get(
            "ids", [])[:100]
        if not ids:
            return
        for build in sorted(codebuild.batch_get_builds(ids=ids).get("builds", []),
                            key=lambda b: str(b["id"])):
            variables = {v.get("name"): v.get("value") for v in
                         build.get("environment", {}).get("environmentVariables", [])}
            if variables.get(build_marks.RUN_ID_VARIABLE) != self.run_id:
                continue
            status = build.get("buildStatus")
            if status == "IN_PROGRESS":
                self.add("codebuild_builds", "policy", str(build.get("arn", build["id"])),
                         f"{build['id']}: {status}", ("codebuild_stop", str(build["id"])))
            group, stream = build_marks.build_log_location(build, project)
            running = status == "IN_PROGRESS"
            blocked = running and self.policy["codebuild_builds"] == "keep"
            self.log_streams(logs, group, stream, f"log of build {build['id']}", (), blocked)

    # ---- S3 objects tagged with the run ----
    def tagged_objects(self) -> None:
        s3 = client("s3", self.region)
        for uri in self.s3_uris:
            bucket, prefix = split_s3_uri(uri, "s3_uris")
            scanned = 0
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                      Prefix=prefix):
                for obj in page.get("Contents", []):
                    key = obj["Key"]
                    if any(b == bucket and key.startswith(p) for b, p in self.claimed_prefixes):
                        continue  # already planned as part of a job's prefix
                    if scanned >= self.max_objects:
                        self.notes.append(
                            f"s3://{bucket}/{prefix}: stopped reading object tags after "
                            f"{self.max_objects} objects; objects past that were not checked "
                            "(raise max_objects, or pass a narrower prefix)")
                        break
                    scanned += 1
                    object_tags = tags.from_key_value(
                        s3.get_object_tagging(Bucket=bucket, Key=key).get("TagSet"))
                    if not self.mine(object_tags):
                        continue
                    kind = ("build_contexts" if object_tags.get(tags.COMPONENT_KEY) ==
                            "build_image" else "artifacts")
                    shared = self.others.overlap(bucket, key) if self.policy[kind] == "delete" else ""
                    if shared:
                        self.add(kind, "skip", _s3_uri(bucket, key),
                                 f"tagged by this run, but it {shared}")
                        continue
                    self.add(kind, "policy", _s3_uri(bucket, key),
                             f"tagged by {object_tags.get(tags.COMPONENT_KEY, '?')}, "
                             f"{_size(int(obj.get('Size', 0)))}",
                             ("s3_delete_object", bucket, key))
                else:
                    continue
                break

    # ---- ECR ----
    def ecr(self) -> None:
        ImagePlanner(self).plan()

    # ---- IAM ----
    def iam_roles(self) -> None:
        iam = client("iam", self.region)
        for page in iam.get_paginator("list_roles").paginate():
            for role in page.get("Roles", []):
                if ROLE_NAME_MARK not in role["RoleName"]:
                    continue
                role_tags = tags.from_key_value(
                    iam.list_role_tags(RoleName=role["RoleName"]).get("Tags"))
                if self.created_by_me(role_tags):
                    self.add("iam_roles", "policy", role["Arn"], "created by this run",
                             ("iam_delete_role", role["RoleName"]))


class ImagePlanner:
    """The run's ECR images and the repositories it created (``Planner.ecr``)."""

    def __init__(self, planner: Planner) -> None:
        self.planner = planner

    def plan(self) -> None:
        ecr = client("ecr", self.planner.region)
        marker = build_marks.run_marker_prefix(self.planner.run_id)
        repos: list[RepositoryTypeDef] = []
        for page in ecr.get_paginator("describe_repositories").paginate():
            repos.extend(page.get("repositories", []))
        for repo in sorted(repos, key=lambda r: r["repositoryName"]):
            name = repo["repositoryName"]
            repo_tags = tags.from_key_value(
                ecr.list_tags_for_resource(resourceArn=repo["repositoryArn"]).get("tags"))
            if tags.RUN_ID_KEY not in repo_tags and name not in self.planner.ecr_repositories:
                continue
            images: list[ImageDetailTypeDef] = []
            for image_page in ecr.get_paginator("describe_images").paginate(repositoryName=name):
                images.extend(image_page.get("imageDetails", []))
            mine = [i for i in images if any(t.startswith(marker) for t in i.get("imageTags", []))]
            deleted = 0
            for image in sorted(mine, key=lambda i: i["imageDigest"]):
                deleted += self.image(repo, image, marker)
            if not self.planner.created_by_me(repo_tags):
                continue
            others = len(images) - (deleted if self.planner.policy["images"] == "delete" else 0)
            if others:
                self.planner.add("repositories", "skip", repo["repositoryArn"],
                         f"{name}: created by this run but {others} image(s) stay in it")
            else:
                self.planner.add("repositories", "policy", repo["repositoryArn"],
                         f"{name}: created by this run, empty after cleanup",
                         ("ecr_delete_repository", name))

    def image(self, repo: RepositoryTypeDef, image: ImageDetailTypeDef, marker: str) -> int:
        """Plans one image of the run; 1 when it is deleted, 0 when only untagged.

        A digest that also carries tags of another run (its marker) or a tag someone
        set by hand is still referenced: only this run's marker tags are removed.
        The content tag (``ctx-<hash>``) names the content, not a run, and goes with it.
        """
        name, digest = repo["repositoryName"], image["imageDigest"]
        image_tags = sorted(image.get("imageTags", []))
        own = [t for t in image_tags if t.startswith(marker)]
        shared = [t for t in image_tags
                  if t not in own and not t.startswith(build_marks.CONTENT_TAG_PREFIX)]
        users = (self.planner.others.image_users(repo["repositoryUri"], digest, image_tags)
                 if self.planner.policy["images"] == "delete" else [])
        resource = f"{repo['repositoryUri']}@{digest}"
        if shared or users:
            why = (f"also tagged {', '.join(shared)} (another run's or a hand-set tag)" if shared
                   else f"used by {', '.join(users)}")
            self.planner.add("images", "policy", resource,
                     f"untag {', '.join(own)} only: the digest is {why}, so the image stays",
                     ("ecr_untag_image", name, tuple(own)))
            return 0
        self.planner.add("images", "policy", resource, f"tags {', '.join(image_tags)}",
                 ("ecr_delete_image", name, digest))
        return 1


def plan(
    run_id: str,
    region: str,
    *,
    policy: dict[str, str] | None = None,
    s3_uris: list[str] | None = None,
    ecr_repositories: list[str] | None = None,
    codebuild_projects: list[str] | None = None,
    created_after: dt.datetime | None = None,
    max_objects: int = DEFAULT_MAX_OBJECTS,
    log: Callable[[str], None] = print,
) -> Plan:
    """Every action for the run, decided before anything changes (checks come first)."""
    try:
        tags.validate_run_id(run_id)
    except ValueError as exc:
        raise UserError("run_id", str(exc), "pass the exact KFP run id to clean up.") from exc
    check_count("max_objects", max_objects, fix="pass how many objects' tags to read per "
                f"S3 prefix (default {DEFAULT_MAX_OBJECTS}).")
    resolved = resolve_policy(policy)
    for uri in s3_uris or []:
        split_s3_uri(uri, "s3_uris")
    planner = Planner(run_id, region, resolved, s3_uris=list(s3_uris or []),
                      ecr_repositories=list(ecr_repositories or []),
                      codebuild_projects=list(codebuild_projects or []),
                      created_after=created_after, max_objects=max_objects, log=log)
    for step in (planner.training_jobs, planner.codebuild, planner.tagged_objects, planner.ecr,
                 planner.iam_roles):
        step()
    result = Plan(run_id, region, resolved, planner.actions, planner.notes)
    result.sort()
    return result
