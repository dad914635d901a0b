"""Running a pipeline on the embedded default: kfp.local + the local AWS backend.

``run_local`` starts the local backend (``components.local.LocalBackend``) on
127.0.0.1, points every boto3 client of this process and of the kfp.local task
subprocesses at it (``AWS_ENDPOINT_URL`` and fake credentials in the
environment), creates the bucket the pipeline writes to, runs the pipeline with
``kfp.local.SubprocessRunner(use_venv=False)`` (tasks run with this Python, so
this package is importable in them), and stops the backend at the end.
Outputs stay on disk under ``<runs_dir>/<pipeline>-<timestamp>/<task>/<output>``.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines import _kfp_local_fixes

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RUNS_DIR = ROOT / "runs"
LOCAL_BUCKET = "kfp-sagemaker-local"
# The local executor never assumes the role; a well-formed ARN keeps validation identical to AWS.
LOCAL_ROLE_ARN = "arn:aws:iam::123456789012:role/kfp-sagemaker-local-execution"


@dataclass
class LocalRun:
    state: str  # SUCCEEDED | FAILED (any task failed; the exit handler still ran)
    root: Path  # this run's pipeline_root directory
    run_dir: Path | None  # <root>/<pipeline>-<timestamp> (None when nothing ran)
    seconds: float
    error: str = ""  # kfp.local's message naming the failed task chain

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


@contextmanager
def local_aws(region: str = "us-west-2", *, buckets: tuple[str, ...] = (LOCAL_BUCKET,)
              ) -> Iterator[Any]:
    """Starts the local backend and exports its endpoint to this process's environment."""
    from components.local import LocalBackend

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


def run_local(pipeline: Callable[..., Any], arguments: dict[str, Any], *,
              runs_dir: Path = DEFAULT_RUNS_DIR) -> LocalRun:
    """Runs ``pipeline`` with kfp.local in a fresh pipeline root; never raises on task failure.

    The local backend must already be running (``local_aws``).
    """
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
        state, error = "FAILED", str(exc)
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
        lines.append(f"   {run.error}")
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
