"""Where logs come from: a training job's CloudWatch streams, a file, or stdin."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from components.common.cloudwatch import TRAINING_JOBS_LOG_GROUP, LogTail
from components.common.errors import UserError
from components.common.naming import is_valid_sagemaker_name
from components.parse_logs.parser import LogParser, ParsedLog, feed_blocks

READ_BLOCK = 4 << 20  # reads; the parser takes up to 8 MiB at a time


def _blocks(f: BinaryIO) -> Iterator[bytes]:
    while True:
        block = f.read(READ_BLOCK)
        if not block:
            return
        yield block


def parse_file(path: str | Path, *, spike_threshold: float = 0.5) -> ParsedLog:
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
    spike_threshold: float = 0.5,
    page_limit: int | None = None,
) -> tuple[ParsedLog, LogTail]:
    """Reads every ``{job}/...`` stream of the job (all hosts, restarts included).

    Streams are parsed in the order they started, page by page (memory stays one
    page of events plus the parsed series).
    Raises UserError when the job has no log stream at all.
    """
    job_name = check_job_name(job_name)
    if logs is None:
        from components.common.aws import client

        logs = client("logs", region or None)
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
            parser.feed_text((e.message.rstrip("\r\n") for e in events), stream,
                             first_timestamp=events[0].timestamp)
    return parser.result(), tail


def _start_order(stream: str) -> tuple[int, str]:
    m = re.search(r"-(\d{9,})$", stream)
    return (int(m.group(1)) if m else 0, stream)
