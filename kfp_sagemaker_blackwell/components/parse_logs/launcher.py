"""Where logs come from: a training job's CloudWatch streams, a file, or stdin."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from kfp_sagemaker_blackwell.common.cloudwatch import TRAINING_JOBS_LOG_GROUP, LogTail
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.common.naming import is_valid_sagemaker_name
from kfp_sagemaker_blackwell.components.parse_logs import metric_defs
from kfp_sagemaker_blackwell.components.parse_logs.metric_defs import MetricScanner
from kfp_sagemaker_blackwell.components.parse_logs.parser import (
    NUMERIC_STEP_FIELDS,
    SPIKE_THRESHOLD,
    LogParser,
    ParsedLog,
    feed_blocks,
)

READ_BLOCK = 4 << 20  # reads; the parser takes up to 8 MiB at a time


def _blocks(f: BinaryIO) -> Iterator[bytes]:
    while True:
        block = f.read(READ_BLOCK)
        if not block:
            return
        yield block


def parse_file(path: str | Path, *, spike_threshold: float = SPIKE_THRESHOLD) -> ParsedLog:
    """Parses a log file (``-`` reads standard input)."""
    parser = LogParser(spike_threshold=spike_threshold)
    if str(path) == "-":
        feed_blocks(parser, _blocks(sys.stdin.buffer), stream="stdin")
        return parser.result()
    p = Path(path)
    if not p.is_file():
        raise UserError("log_file", f"{p} does not exist or is not a file.",
                        "pass the path of a training log (or - for standard input).")
    with p.open("rb") as f:
        feed_blocks(parser, _blocks(f), stream=p.name)
    return parser.result()


def check_job_name(job_name: str) -> str:
    job_name = job_name.strip()
    if not job_name:
        raise UserError("job_name", "is empty and no log file was given: nothing to read.",
                        "pass the training job's name (and region), or a log file.")
    if not is_valid_sagemaker_name(job_name):
        raise UserError(
            "job_name",
            f"{job_name!r} is not a SageMaker training job name (1-63 characters, letters, "
            "digits and hyphens, starting and ending with a letter or digit).",
            "pass the TrainingJobName that sagemaker_training returned.",
        )
    return job_name


def parse_training_job(
    job_name: str,
    region: str | None = None,
    *,
    logs: Any = None,
    group: str = TRAINING_JOBS_LOG_GROUP,
    spike_threshold: float = SPIKE_THRESHOLD,
    page_limit: int | None = None,
    sagemaker: Any = None,
    precision: str = "",
) -> tuple[ParsedLog, LogTail]:
    """Reads every ``{job}/...`` stream of the job (all hosts, restarts included).

    Streams are parsed in the order they started, page by page (memory stays one
    page of events plus the parsed series).
    Raises UserError when the job has no log stream at all.

    A job with MetricDefinitions (DescribeTrainingJob's AlgorithmSpecification, a
    bring-your-own-image job) has its metrics searched in the same lines
    (``metric_defs``); ``precision`` (else the job's ``precision`` hyperparameter)
    labels those rows. ``sagemaker``: the client to describe the job with (made here
    when ``logs`` is too; with an injected ``logs`` and none, the job is not described).
    """
    job_name = check_job_name(job_name)
    if logs is None:
        from kfp_sagemaker_blackwell.common.aws import client

        logs = client("logs", region or None)
        sagemaker = sagemaker or client("sagemaker", region or None)
    job = _describe(sagemaker, job_name)
    definitions = (job.get("AlgorithmSpecification") or {}).get("MetricDefinitions") or []
    scanner = MetricScanner(definitions) if definitions else None
    tail = LogTail(logs, group, f"{job_name}/")
    if page_limit:
        tail.page_limit = page_limit
    streams = tail.streams()
    if not streams:
        raise UserError(
            "job_name",
            f"no CloudWatch log stream {group}/{job_name}/* in region "
            f"{getattr(getattr(logs, 'meta', None), 'region_name', region)}: the job has not "
            "started logging yet, or the job name or region is wrong.",
            "check the job name and region (aws sagemaker describe-training-job), or wait "
            "until the job is Training.",
        )
    parser = LogParser(spike_threshold=spike_threshold)
    # Streams in start order (SageMaker names them {job}/algo-N-{epoch seconds}), so that
    # after a spot restart the re-run steps of the newer stream replace the older ones.
    for stream in sorted(streams, key=_start_order):
        parser.stream(stream)
        for _, events in tail.pages([stream]):
            lines = [e.message.rstrip("\r\n") for e in events]
            parser.feed_text(lines, stream, first_timestamp=events[0].timestamp)
            if scanner is not None:
                scanner.feed(lines)
    parsed = parser.result()
    if scanner is not None:
        precision = precision or str((job.get("HyperParameters") or {}).get("precision") or "")
        parsed = metric_defs.apply(parsed, scanner, job, precision, NUMERIC_STEP_FIELDS)
    return parsed, tail


def _describe(sagemaker: Any, job_name: str) -> dict[str, Any]:
    """DescribeTrainingJob, or {} without a client or when the job is not found (its
    logs may outlive it)."""
    if sagemaker is None:
        return {}
    from kfp_sagemaker_blackwell.common import aws

    try:
        return dict(sagemaker.describe_training_job(TrainingJobName=job_name))
    except Exception as exc:
        if aws.error_code(exc) in ("ValidationException", "ResourceNotFound"):
            return {}
        raise


def _start_order(stream: str) -> tuple[int, str]:
    m = re.search(r"-(\d{9,})$", stream)
    return (int(m.group(1)) if m else 0, stream)
