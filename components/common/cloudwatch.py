"""Reading CloudWatch Logs: the one implementation used by every component.

SageMaker writes a training job's logs to ``/aws/sagemaker/TrainingJobs``, one
stream per host and start (``{job}/algo-{n}-{epoch}``); a spot restart adds new
streams. CodeBuild writes ``/aws/codebuild/{project}``. ``LogTail`` reads every
stream under a prefix, remembers where each stream ended, and picks up new
streams on the next ``poll()``: the training component calls it while it waits,
``parse_logs`` calls it once to read everything.

GetLogEvents has reached the end of a stream when it returns the token that was
sent (``nextForwardToken`` unchanged); a page holds up to 10,000 events / 1 MB,
and ``startFromHead=True`` with ``limit=10000`` asks for full pages so that a
long log costs few requests. Throttling is retried by botocore's adaptive mode
and, past that, by ``poll``'s own back-off.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from components.common.aws import error_code, is_throttling

TRAINING_JOBS_LOG_GROUP = "/aws/sagemaker/TrainingJobs"
PAGE_LIMIT = 10_000


@dataclass(frozen=True)
class LogEvent:
    stream: str
    timestamp: int  # milliseconds since the epoch
    message: str


@dataclass
class LogTail:
    """Incremental reader of all streams of a log group under a prefix."""

    logs: Any  # a boto3 CloudWatch Logs client
    group: str
    prefix: str
    requests: int = 0
    _tokens: dict[str, str | None] = field(default_factory=dict)

    def streams(self) -> list[str]:
        names: list[str] = []
        kwargs: dict[str, Any] = {"logGroupName": self.group, "logStreamNamePrefix": self.prefix}
        while True:
            try:
                page = self.logs.describe_log_streams(**kwargs)
            except Exception as exc:  # a job that has not logged yet has no group/stream
                if error_code(exc) == "ResourceNotFoundException":
                    return names
                raise
            self.requests += 1
            names.extend(s["logStreamName"] for s in page.get("logStreams", []))
            token = page.get("nextToken")
            if not token or token == kwargs.get("nextToken"):
                break
            kwargs["nextToken"] = token
        return sorted(names)

    def _read_stream(self, stream: str) -> Iterator[LogEvent]:
        token = self._tokens.get(stream)
        while True:
            kwargs: dict[str, Any] = {
                "logGroupName": self.group,
                "logStreamName": stream,
                "startFromHead": True,
                "limit": PAGE_LIMIT,
            }
            if token:
                kwargs["nextToken"] = token
            page = self.logs.get_log_events(**kwargs)
            self.requests += 1
            for event in page.get("events", []):
                yield LogEvent(stream, int(event.get("timestamp", 0)), event.get("message", ""))
            new_token = page.get("nextForwardToken")
            self._tokens[stream] = new_token
            if not new_token or new_token == token:
                return
            token = new_token

    def poll(self, *, max_backoff_s: float = 30.0,
             sleep: Callable[[float], None] = time.sleep) -> list[LogEvent]:
        """Everything new since the last poll, across all streams (new ones included)."""
        delay = 1.0
        while True:
            try:
                events: list[LogEvent] = []
                for stream in self.streams():
                    events.extend(self._read_stream(stream))
                return events
            except Exception as exc:
                if not is_throttling(exc) or delay > max_backoff_s:
                    raise
                sleep(delay)
                delay *= 2

    def read_all(self) -> list[LogEvent]:
        return self.poll()


def training_job_tail(logs: Any, job_name: str) -> LogTail:
    return LogTail(logs, TRAINING_JOBS_LOG_GROUP, f"{job_name}/")
