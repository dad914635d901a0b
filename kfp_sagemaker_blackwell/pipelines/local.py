"""Run a pipeline built from these components on this machine: ``run_pipeline``.

    from kfp_sagemaker_blackwell.pipelines.local import run_pipeline

    result = run_pipeline(my_pipeline, {"model_preset": "tiny", "max_steps": 10})
    print(result.state, result.run_dir)          # SUCCEEDED runs/<stamp>/<pipeline>-<time>
    print(result.parameters("sagemaker-training")["job_name"])

``run_pipeline`` works for any ``@dsl.pipeline`` made of this library's
components (imported from ``components.*.component`` or loaded from
``compiled/components/*.yaml``). It

1. starts the local backend (``kfp_sagemaker_blackwell.local_backend.LocalBackend``: S3, ECR, CloudWatch
   Logs, IAM, CodeBuild and SageMaker training jobs on 127.0.0.1, jobs run by a local
   executor on this machine's CPU or GPU) and points every boto3 client of this
   process and of the task subprocesses at it (``AWS_ENDPOINT_URL``, fake credentials);
2. creates the bucket ``kfp-sagemaker-local`` and, when the pipeline has ``role_arn``
   or ``bucket`` parameters you did not pass, passes a local role ARN and that bucket;
3. runs the pipeline with ``kfp.local.SubprocessRunner(use_venv=False)`` (tasks run
   with this Python, so this package is importable in them), with the project's
   fixes to kfp.local applied (``pipelines/_kfp_local_fixes.py``);
4. stops the backend and returns a ``LocalRun``: the state, where the outputs are
   (``<runs_dir>/<stamp>/<pipeline>-<time>/<task>/<output>``), the training jobs the
   backend ran, each task's output parameters.

A task failure never raises: ``state`` is FAILED and ``error`` names the failed
task chain (the exit handler still ran). Output goes to ``log_file`` when given
(``progress`` then receives one line per training job update), else to stdout.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from kfp_sagemaker_blackwell.pipelines import _kfp_local_fixes

LOCAL_BUCKET = "kfp-sagemaker-local"
# The local executor never assumes the role; a well-formed ARN keeps validation identical to AWS.
LOCAL_ROLE_ARN = "arn:aws:iam::123456789012:role/kfp-sagemaker-local-execution"


@dataclass
class LocalRun:
    state: str  # SUCCEEDED | FAILED (any task failed; the exit handler still ran)
    root: Path  # this run's pipeline_root directory
    run_dir: Path | None  # <root>/<pipeline>-<timestamp> (None when nothing ran)
    seconds: float
    error: str = ""  # kfp.local's message naming the failed task chain (plain text)
    jobs: list[dict[str, Any]] = field(default_factory=list)  # DescribeTrainingJob, oldest first
    # failed task -> the last lines of its log that say why (``failure_causes``)
    causes: dict[str, list[str]] = field(default_factory=dict)

    def task_dirs(self, task: str) -> list[Path]:
        """All directories of a task (ParallelFor iterations included), sorted."""
        if self.run_dir is None:
            return []
        return sorted(p for p in self.run_dir.rglob(task) if p.is_dir())

    def output(self, task: str, name: str) -> Path | None:
        for d in self.task_dirs(task):
            path = d / name
            if path.exists():
                return path
        return None

    def parameters(self, task: str) -> dict[str, Any]:
        """The task's output parameters (from executor_output.json)."""
        for d in self.task_dirs(task):
            path = d / "executor_output.json"
            if path.exists():
                data = json.loads(path.read_text())
                return dict(data.get("parameterValues", {}))
        return {}


ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
# The lines of a failed task's log that say why: the exception ending a traceback
# (``kfp_sagemaker_blackwell.common.errors.UserError: field: problem Fix: ...`` included), a CLI's
# ``error: ...`` line.
CAUSE_RE = re.compile(r"^(error: |[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b:?)")


def plain(text: str) -> str:
    """``text`` without ANSI colour codes (kfp.local colours task names)."""
    return ANSI_RE.sub("", text)


def failure_causes(log_text: str, limit: int = 4) -> dict[str, list[str]]:
    """Per task that finished with FAILURE, the last ``limit`` lines of its log that say why
    (the traceback's exception line, ``error:`` lines), else its last lines."""
    from kfp_sagemaker_blackwell.pipelines._progress import EXECUTING_RE, FINISHED_RE

    out: dict[str, list[str]] = {}
    task, lines = "", list[str]()
    for raw in plain(log_text).splitlines():
        if m := EXECUTING_RE.search(raw):
            task, lines = m.group(1), []
        elif m := FINISHED_RE.search(raw):
            if m.group(2) == "FAILURE":
                said = [ln.strip() for ln in lines if ln.strip()]
                causes = [ln for ln in said if CAUSE_RE.match(ln)]
                out[m.group(1)] = (causes or said)[-limit:]
            task, lines = "", []
        elif task:
            lines.append(raw)
    return out


@contextmanager
def local_aws(region: str = "us-west-2", *, buckets: tuple[str, ...] = (LOCAL_BUCKET,)
              ) -> Iterator[Any]:
    """Starts the local backend and exports its endpoint to this process's environment."""
    from kfp_sagemaker_blackwell.local_backend import LocalBackend

    saved = dict(os.environ)
    with LocalBackend(region=region) as backend:
        os.environ.update(backend.env())
        s3 = backend.client("s3")
        for bucket in buckets:
            kwargs: dict[str, Any] = {"Bucket": bucket}
            if region != "us-east-1":
                kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
            s3.create_bucket(**kwargs)
        try:
            yield backend
        finally:
            os.environ.clear()
            os.environ.update(saved)


def _parameter_names(pipeline: Any) -> set[str]:
    spec = getattr(pipeline, "component_spec", None)
    return set(getattr(spec, "inputs", None) or {})


class _Lines(io.TextIOBase):
    """A text stream that copies what is written to ``sinks`` and hands each line to ``on_line``."""

    def __init__(self, sinks: list[TextIO], on_line: Callable[[str], None] | None) -> None:
        self.sinks, self.on_line, self.pending = sinks, on_line, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        for sink in self.sinks:
            sink.write(text)
            sink.flush()
        if self.on_line is not None:
            self.pending += text
            *lines, self.pending = self.pending.split("\n")
            for line in lines:
                self.on_line(line)
        return len(text)


@contextmanager
def _output_to(log_file: Path | None, echo: bool,
               on_line: Callable[[str], None] | None) -> Iterator[None]:
    """Sends this process's output (kfp.local prints every task's log) to the log file."""
    if log_file is None and on_line is None:
        yield
        return
    log_file = log_file or Path(os.devnull)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("a", encoding="utf-8") as f:
        stream = _Lines([f, sys.__stdout__] if echo and sys.__stdout__ else [f], on_line)
        with redirect_stdout(stream), redirect_stderr(stream):
            yield


def run_pipeline(
    pipeline: Any,
    arguments: dict[str, Any] | None = None,
    *,
    runs_dir: str | Path | None = None,
    region: str = "us-west-2",
    log_file: str | Path | None = None,
    echo: bool = False,
    on_line: Callable[[str], None] | None = None,
) -> LocalRun:
    """Runs ``pipeline`` on the local backend; returns the run, never raises on task failure.

    Args:
        pipeline: a ``@dsl.pipeline`` built from this library's components.
        arguments: the pipeline's arguments; ``role_arn`` and ``bucket``, when the
            pipeline has them, default to a local role and the local bucket.
        runs_dir: where outputs are kept (default: ``./runs``).
        region: the region the local backend serves.
        log_file: write everything the tasks print here instead of to stdout.
        echo: with ``log_file``, also show it live on stdout.
        on_line: called with every line the tasks print (e.g. to show progress).
    """
    arguments = dict(arguments or {})
    names = _parameter_names(pipeline)
    with local_aws(region) as backend:
        for name, value in (("role_arn", LOCAL_ROLE_ARN), ("bucket", LOCAL_BUCKET),
                            ("region", backend.region)):
            if name in names:
                arguments.setdefault(name, value)
        with _output_to(Path(log_file) if log_file else None, echo, on_line):
            run = run_local(pipeline, arguments,
                            runs_dir=Path(runs_dir) if runs_dir else Path.cwd() / "runs")
        run.jobs = training_jobs(backend)
    if run.state == "FAILED" and log_file and Path(log_file).exists():
        run.causes = failure_causes(Path(log_file).read_text(encoding="utf-8", errors="replace"))
    return run


def run_local(pipeline: Callable[..., Any], arguments: dict[str, Any], *,
              runs_dir: Path) -> LocalRun:
    """Runs ``pipeline`` with kfp.local in a fresh pipeline root (the backend must be running:
    ``local_aws``); never raises on task failure. ``run_pipeline`` does all of it."""
    from kfp import local

    _kfp_local_fixes.apply()
    # kfp.local's notes that do not apply here: tasks run with this Python (the components
    # image's packages are this checkout's), and display names are a UI setting.
    warnings.filterwarnings("ignore", message=".*non-Python base image.*")
    warnings.filterwarnings("ignore", message=".*have no effect in the current local runner.*")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = runs_dir / f"{stamp}-{os.getpid()}"
    root.mkdir(parents=True, exist_ok=True)
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(root),
        raise_on_error=True,  # kfp.local raises only after the whole DAG, exit handler included
    )
    started = time.monotonic()
    state, error = "SUCCEEDED", ""
    try:
        pipeline(**arguments)
    except RuntimeError as exc:
        state, error = "FAILED", plain(str(exc))
    seconds = time.monotonic() - started
    run_dirs = sorted(p for p in root.iterdir() if p.is_dir())
    return LocalRun(state, root, run_dirs[-1] if run_dirs else None, seconds, error)


def training_jobs(backend: Any) -> list[dict[str, Any]]:
    """Every training job the local backend ran, described (newest last)."""
    sm = backend.client("sagemaker")
    names: list[str] = []
    for page in sm.get_paginator("list_training_jobs").paginate():
        names.extend(j["TrainingJobName"] for j in page.get("TrainingJobSummaries", []))
    jobs = [sm.describe_training_job(TrainingJobName=n) for n in names]
    return sorted(jobs, key=lambda j: str(j.get("CreationTime", "")))


@dataclass
class Summary:
    text: str
    report: Path | None
    recommended_precision: str
    failed_jobs: list[str]


def summarise(run: LocalRun, jobs: list[dict[str, Any]], *, report_task: str) -> Summary:
    lines = [f"\n== {run.state} in {run.seconds:.0f} s: outputs under {run.run_dir or run.root}"]
    if run.error:
        lines.append(f"   {plain(run.error)}")
    for task, causes in run.causes.items():
        lines.append(f"   {task} failed; its log ends:")
        lines += [f"     {line[:300]}" for line in causes]
    lines += ["", "| training job | precision | status | billable s | failure reason |",
              "|---|---|---|---:|---|"]
    failed: list[str] = []
    for job in jobs:
        hp = job.get("HyperParameters", {})
        reason = " ".join(str(job.get("FailureReason", "")).split())[:160]
        if job.get("TrainingJobStatus") == "Failed":
            failed.append(job["TrainingJobName"])
        lines.append(
            f"| {job['TrainingJobName']} | {hp.get('precision', '?')} | "
            f"{job.get('TrainingJobStatus')} | {job.get('BillableTimeInSeconds', 0)} | {reason} |"
        )
    if not jobs:
        lines.append("| (none) | | | | |")
    compare = run.parameters(report_task)
    recommended = str(compare.get("recommended_precision", ""))
    summary_md = run.output(report_task, "summary")
    if summary_md is not None:
        lines += ["", summary_md.read_text(encoding="utf-8").strip()]
    elif run.run_dir is not None:
        lines += ["", f"No convergence report: the {report_task} step did not run "
                  "(a step before it failed)."]
    cleanup_md = run.output("cleanup", "report")
    if cleanup_md is not None:
        first = [ln for ln in cleanup_md.read_text(encoding="utf-8").splitlines() if ln.strip()]
        lines += ["", "Cleanup ran: " + (first[0].lstrip("# ") if first else "(empty report)")]
    else:
        lines += ["", "Cleanup did NOT run."]
    if recommended:
        lines += ["", f"Recommended precision: {recommended}"]
    return Summary("\n".join(lines), run.output(report_task, "report"), recommended, failed)
