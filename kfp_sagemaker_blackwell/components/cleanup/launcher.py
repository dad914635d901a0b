"""Carry out a cleanup plan and write its Markdown report.

Actions run in the plan's order (stops first, then deletions); each is tried on
its own, so one that fails is reported and the rest continue. Deleting a job's
outputs, checkpoints or logs waits until the job has actually stopped (SageMaker
still uploads while Stopping). A dry run executes nothing and reports the same
actions as "would ...". Running cleanup twice is harmless: a second run finds
nothing left to stop or delete (what is already gone counts as done).

SIGTERM/SIGINT (a KFP Terminate, Ctrl-C) are handled from the start
(``ExecutionContext``): the actions stop at the next safe point, the stops not
yet sent are tried within ``stop_timeout_s`` (``remote_job.RemoteJobRunner.stop``),
and ``Terminated`` says, per job and build, whether its stop was accepted or
gives the command that stops it, and that the deletions left must be run again.
The waits poll without botocore's retries and ride out an unreachable endpoint
until the wait's deadline (``RemoteJobRunner.poll``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kfp_sagemaker_blackwell.common.aws import (
    FOLLOW_CLIENT,
    bounded_client_config,
    client,
    error_code,
    resolve_region,
)
from kfp_sagemaker_blackwell.common.build_marks import CodeBuildBuild
from kfp_sagemaker_blackwell.common.execution_context import (
    DEFAULT_STOP_TIMEOUT_S,
    AwsUnreachable,
    ExecutionContext,
    Terminated,
    TerminationRequested,
)
from kfp_sagemaker_blackwell.common.remote_job import RemoteJobRunner
from kfp_sagemaker_blackwell.common.training_job import TERMINAL_STATUSES, TrainingJob
from kfp_sagemaker_blackwell.components.cleanup.plan import DECLARED, Action, Plan, plan

GONE = "gone"  # DescribeTrainingJob says the job does not exist (nothing left to wait for)
ENDED = TERMINAL_STATUSES | {GONE}
# The component's stop_wait_seconds: SageMaker gives a stopped job 120 s, then uploads.
DEFAULT_STOP_WAIT_S: float = DECLARED["stop_wait_seconds"]
# The actions' clients: few botocore attempts and short connects, so that a SIGTERM
# during a call under an outage is looked at within seconds (the rest is run again).
ACTION_CLIENT: dict[str, Any] = {"max_attempts": 3, "connect_timeout": 3, "read_timeout": 30}

PAST = {"stop": "stopped", "delete": "deleted", "keep": "kept", "skip": "left alone"}
FUTURE = {"stop": "would stop", "delete": "would delete", "keep": "would keep",
          "skip": "would leave alone"}


@dataclass(frozen=True)
class Outcome:
    action: Action
    status: str  # done | planned | failed | kept | skipped
    message: str = ""


@dataclass
class CleanupResult:
    plan: Plan
    outcomes: list[Outcome]
    dry_run: bool
    markdown: str = ""

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "failed"]

    def count(self, verb: str) -> int:
        done = "planned" if self.dry_run else "done"
        return sum(1 for o in self.outcomes if o.action.verb == verb and o.status == done)


class _Executor:
    def __init__(self, region: str, log: Callable[[str], None], stop_wait_s: float,
                 poll_s: float, ctx: ExecutionContext | None = None,
                 stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        self.region = region
        self.log = log
        self.stop_wait_s = stop_wait_s
        self.poll_s = poll_s
        self.ctx = ctx or ExecutionContext("cleanup")
        self.stop_timeout_s = stop_timeout_s
        self._clients: dict[tuple[str, str], Any] = {}
        self._runners: dict[str, RemoteJobRunner] = {}
        self.job_state: dict[str, str] = {}

    def client(self, service: str, mode: str = "action") -> Any:
        """``mode``: action (ACTION_CLIENT), follow (FOLLOW_CLIENT) or stop (bounded)."""
        if (service, mode) not in self._clients:
            config = {"action": ACTION_CLIENT, "follow": FOLLOW_CLIENT,
                      "stop": bounded_client_config(self.stop_timeout_s)}[mode]
            self._clients[service, mode] = client(service, self.region, **config)
        return self._clients[service, mode]

    def runner(self, service: str) -> RemoteJobRunner:
        """The remote-job runner of ``service``'s jobs (sagemaker, codebuild)."""
        if service not in self._runners:
            self._runners[service] = RemoteJobRunner(
                follow=self.client(service, "follow"), stopper=self.client(service, "stop"),
                ctx=self.ctx, out=self.log, poll_interval_s=self.poll_s,
                stop_timeout_s=self.stop_timeout_s)
        return self._runners[service]

    def wait_for_jobs(self, names: set[str]) -> None:
        """Waits (bounded) until the jobs have left InProgress/Stopping; raises
        ``TerminationRequested`` as soon as termination is asked for."""
        runner = self.runner("sagemaker")
        deadline = time.monotonic() + self.stop_wait_s
        pending = set(names)
        while pending:
            for name in sorted(pending):
                try:
                    job = runner.poll(TrainingJob(name, self.region),
                                      budget_s=max(1.0, deadline - time.monotonic()))
                except AwsUnreachable as exc:
                    self.log(f"[cleanup] {exc}: no longer waiting for the jobs to stop")
                    return
                self.job_state[name] = str(job["TrainingJobStatus"]) if job else GONE
                if self.job_state[name] in ENDED:
                    pending.discard(name)
            if not pending or time.monotonic() > deadline:
                return
            self.log(f"[cleanup] waiting for {', '.join(sorted(pending))} to stop")
            self.ctx.sleep(self.poll_s)
            if self.ctx.terminating:
                raise TerminationRequested()

    # ---- termination ----
    def terminated(self, the_plan: Plan, outcomes: list[Outcome]) -> str:
        """What became of every stop, the stops not sent yet tried within the budget."""
        why = f"terminated ({self.ctx.signal_name or 'requested'}) during cleanup"
        done = {o.action.key for o in outcomes if o.status == "done"}
        # counted from the termination request: an action in flight when it came has used
        # some of it already
        deadline = time.monotonic() + self.ctx.stop_budget(self.stop_timeout_s)
        parts = []
        for action in the_plan.actions:
            if action.verb != "stop":
                continue
            op, ident = action.op
            job: TrainingJob | CodeBuildBuild = (
                TrainingJob(ident, self.region) if op == "sagemaker_stop"
                else CodeBuildBuild(ident, "", self.region))
            if action.key in done:
                state = self.job_state.get(ident, "")
                parts.append(f"the stop of {job.what} was accepted"
                             + (f" (last seen {state})" if state else ""))
                continue
            # Each stop is sent, not waited for: the budget is shared by all of them.
            parts.append(self.runner("sagemaker" if op == "sagemaker_stop" else "codebuild")
                         .stop(job, wait=False, said_s=self.stop_timeout_s,
                               budget_s=max(0.5, deadline - time.monotonic())))
        undone = sum(1 for a in the_plan.actions if a.verb == "delete"
                     and a.key not in {o.action.key for o in outcomes})
        if undone:
            parts.append(f"{undone} deletion(s) not done: run cleanup again once the jobs "
                         "have stopped")
        return f"{why}; " + "; ".join(parts or ["nothing was left to stop"])

    def run(self, action: Action) -> str:
        """Executes one action; returns a message. Already-gone resources count as done."""
        waiting = [n for n in action.after_jobs if self.job_state.get(n) not in ENDED]
        if waiting:
            raise RuntimeError(f"{', '.join(waiting)} did not stop within {self.stop_wait_s:.0f} "
                               "s; its files may still change: run cleanup again later")
        op, *args = action.op
        return str(getattr(self, f"_{op}")(*args))

    # The stop actions are the runner's bounded stop (``RemoteJobRunner.stop_or_raise``):
    # within ``stop_timeout_s`` whatever the endpoint does, so that a termination meanwhile
    # is looked at within that, and what a stop that got no answer leaves is said.
    def _sagemaker_stop(self, name: str) -> str:
        return self.runner("sagemaker").stop_or_raise(TrainingJob(name, self.region))

    def _codebuild_stop(self, build_id: str) -> str:
        return self.runner("codebuild").stop_or_raise(CodeBuildBuild(build_id, "", self.region))

    def _s3_delete_prefix(self, bucket: str, prefix: str) -> str:
        s3 = self.client("s3")
        deleted = 0
        errors: list[str] = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if not keys:
                continue
            result = s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
            failed = result.get("Errors", [])
            deleted += len(keys) - len(failed)
            errors.extend(f"{e.get('Key')}: {e.get('Code')} {e.get('Message', '')}".strip()
                          for e in failed)
        if errors:
            raise RuntimeError(f"{len(errors)} object(s) not deleted ({deleted} deleted): "
                               + "; ".join(errors[:5]))
        return f"{deleted} objects deleted"

    def _s3_delete_object(self, bucket: str, key: str) -> str:
        self.client("s3").delete_object(Bucket=bucket, Key=key)
        return "deleted"

    def _logs_delete_stream(self, group: str, stream: str) -> str:
        try:
            self.client("logs").delete_log_stream(logGroupName=group, logStreamName=stream)
        except Exception as exc:
            if error_code(exc) == "ResourceNotFoundException":
                return "already gone"
            raise
        return "deleted"

    def _ecr_delete_image(self, repository: str, digest: str) -> str:
        result = self.client("ecr").batch_delete_image(
            repositoryName=repository, imageIds=[{"imageDigest": digest}])
        failures = [f for f in result.get("failures", [])
                    if f.get("failureCode") != "ImageNotFound"]
        if failures:
            raise RuntimeError("; ".join(f"{f.get('failureCode')}: {f.get('failureReason')}"
                                         for f in failures))
        return "deleted"

    def _ecr_untag_image(self, repository: str, image_tags: tuple[str, ...]) -> str:
        """Removes tags only: ECR deletes a digest's manifest only with its last tag."""
        result = self.client("ecr").batch_delete_image(
            repositoryName=repository, imageIds=[{"imageTag": t} for t in image_tags])
        failures = [f for f in result.get("failures", [])
                    if f.get("failureCode") != "ImageNotFound"]
        if failures:
            raise RuntimeError("; ".join(f"{f.get('failureCode')}: {f.get('failureReason')}"
                                         for f in failures))
        return f"untagged {', '.join(image_tags)}"

    def _ecr_delete_repository(self, repository: str) -> str:
        try:  # never force: a repository that is not empty stays
            self.client("ecr").delete_repository(repositoryName=repository)
        except Exception as exc:
            if error_code(exc) == "RepositoryNotFoundException":
                return "already gone"
            raise
        return "deleted"

    def _codebuild_delete_project(self, name: str) -> str:
        self.client("codebuild").delete_project(name=name)
        return "deleted"

    def _iam_delete_role(self, name: str) -> str:
        iam = self.client("iam")
        for page in iam.get_paginator("list_attached_role_policies").paginate(RoleName=name):
            for attached in page.get("AttachedPolicies", []):
                iam.detach_role_policy(RoleName=name, PolicyArn=attached["PolicyArn"])
        for page in iam.get_paginator("list_role_policies").paginate(RoleName=name):
            for policy_name in page.get("PolicyNames", []):
                iam.delete_role_policy(RoleName=name, PolicyName=policy_name)
        iam.delete_role(RoleName=name)
        return "deleted"


def execute(cleanup_plan: Plan, *, dry_run: bool, log: Callable[[str], None] = print,
            stop_wait_s: float = DEFAULT_STOP_WAIT_S, poll_s: float = 5.0,
            ctx: ExecutionContext | None = None,
            stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> list[Outcome]:
    """Carries out the plan; ``Terminated`` on SIGTERM/SIGINT (see the module's doc)."""
    with contextlib.ExitStack() as stack:
        ctx = ctx or stack.enter_context(ExecutionContext("cleanup"))
        executor = _Executor(cleanup_plan.region, log, stop_wait_s, poll_s, ctx, stop_timeout_s)
        outcomes: list[Outcome] = []
        try:
            _execute(cleanup_plan, executor, outcomes, dry_run=dry_run, log=log)
        except TerminationRequested:
            pass
        if ctx.terminating:
            if dry_run:
                raise Terminated(f"terminated ({ctx.signal_name}) during a dry run: nothing "
                                 "was changed")
            raise Terminated(executor.terminated(cleanup_plan, outcomes))
        return outcomes


def _execute(cleanup_plan: Plan, executor: _Executor, outcomes: list[Outcome], *,
             dry_run: bool, log: Callable[[str], None]) -> None:
    waited = False
    for action in cleanup_plan.actions:
        if executor.ctx.terminating:  # the safe point between two actions
            raise TerminationRequested()
        if action.verb in ("keep", "skip"):
            outcomes.append(Outcome(action, "kept" if action.verb == "keep" else "skipped"))
            continue
        if dry_run:
            outcomes.append(Outcome(action, "planned"))
            continue
        if action.verb == "delete" and not waited:
            waited = True
            jobs = {n for a in cleanup_plan.actions if a.verb == "delete" for n in a.after_jobs}
            if jobs:
                executor.wait_for_jobs(jobs)
        try:  # given up at once on a termination (the stops are then retried, bounded)
            message = executor.ctx.call(functools.partial(executor.run, action))
        except TerminationRequested:
            raise
        except Exception as exc:
            log(f"[cleanup] FAILED to {action.verb} {action.resource}: {exc}")
            outcomes.append(Outcome(action, "failed", str(exc)))
            continue
        log(f"[cleanup] {PAST[action.verb]} {action.resource} ({message})")
        outcomes.append(Outcome(action, "done", message))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def report(result: CleanupResult) -> str:
    p = result.plan
    words = FUTURE if result.dry_run else PAST
    title = "Cleanup plan (dry run)" if result.dry_run else "Cleanup report"
    lines = [
        f"# {title} for run `{p.run_id}`",
        "",
        f"Region `{p.region}`. Policy: "
        + ", ".join(f"{k}={v}" for k, v in p.policy.items()) + ".",
        "",
    ]
    counts = [(words["stop"], result.count("stop")), (words["delete"], result.count("delete")),
              ("kept", sum(1 for o in result.outcomes if o.status == "kept")),
              ("left alone", sum(1 for o in result.outcomes if o.status == "skipped")),
              ("failed", len(result.failures))]
    lines.append(" | ".join(f"**{n}** {w}" for w, n in counts))
    lines.append("")
    sections = [
        ("Failed", [o for o in result.outcomes if o.status == "failed"]),
        (words["stop"].capitalize(), [o for o in result.outcomes if o.action.verb == "stop"
                                      and o.status in ("done", "planned")]),
        (words["delete"].capitalize(), [o for o in result.outcomes if o.action.verb == "delete"
                                        and o.status in ("done", "planned")]),
        ("Kept (policy)", [o for o in result.outcomes if o.status == "kept"]),
        ("Left alone", [o for o in result.outcomes if o.status == "skipped"]),
    ]
    for heading, rows in sections:
        if not rows:
            continue
        lines += [f"## {heading}", "", "| kind | resource | detail |", "|---|---|---|"]
        for o in rows:
            detail = o.action.detail + (f" — {o.message}" if o.message else "")
            lines.append(f"| {o.action.kind} | `{_cell(o.action.resource)}` | {_cell(detail)} |")
        lines.append("")
    if not result.outcomes:
        lines += ["Nothing carries this run's tag: nothing to do.", ""]
    if p.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in p.notes] + [""]
    return "\n".join(lines)


def cleanup(
    run_id: str,
    region: str,
    *,
    dry_run: bool = False,
    policy: dict[str, str] | None = None,
    s3_uris: list[str] | None = None,
    ecr_repositories: list[str] | None = None,
    codebuild_projects: list[str] | None = None,
    created_after: dt.datetime | None = None,
    max_objects: int | None = None,
    stop_wait_s: float = DEFAULT_STOP_WAIT_S,
    poll_s: float = 5.0,
    log: Callable[[str], None] = print,
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
) -> CleanupResult:
    """Plans, then (unless ``dry_run``) carries out, the cleanup of one run.

    SIGTERM/SIGINT are handled from the first line on: ``Terminated`` once the stops
    were tried (see the module's doc)."""
    with ExecutionContext("cleanup") as ctx:
        return _cleanup(run_id, region, dry_run=dry_run, policy=policy, s3_uris=s3_uris,
                        ecr_repositories=ecr_repositories,
                        codebuild_projects=codebuild_projects, created_after=created_after,
                        max_objects=max_objects, stop_wait_s=stop_wait_s, poll_s=poll_s,
                        log=log, stop_timeout_s=stop_timeout_s, ctx=ctx)


def _cleanup(run_id: str, region: str, *, dry_run: bool, policy: dict[str, str] | None,
             s3_uris: list[str] | None, ecr_repositories: list[str] | None,
             codebuild_projects: list[str] | None, created_after: dt.datetime | None,
             max_objects: int | None, stop_wait_s: float, poll_s: float,
             log: Callable[[str], None], stop_timeout_s: float,
             ctx: ExecutionContext) -> CleanupResult:
    region = resolve_region(region or None)
    kwargs: dict[str, Any] = {}
    if max_objects is not None:
        kwargs["max_objects"] = max_objects
    the_plan = plan(run_id, region, policy=policy, s3_uris=s3_uris,
                    ecr_repositories=ecr_repositories, codebuild_projects=codebuild_projects,
                    created_after=created_after, log=log, **kwargs)
    outcomes = execute(the_plan, dry_run=dry_run, log=log, stop_wait_s=stop_wait_s,
                       poll_s=poll_s, ctx=ctx, stop_timeout_s=stop_timeout_s)
    result = CleanupResult(the_plan, outcomes, dry_run)
    result.markdown = report(result)
    return result

