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
and, past that, by ``LogTail``'s own back-off, request by request, so that a
throttled request never costs the pages already read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kfp_sagemaker_blackwell.common.aws import error_code, is_throttling

TRAINING_JOBS_LOG_GROUP = "/aws/sagemaker/TrainingJobs"
PAGE_LIMIT = 10_000


@dataclass(frozen=True)
class LogEvent:
    stream: str
    timestamp: int  # milliseconds since the epoch
    message: str


@dataclass
class LogTail:
    """Incremental reader of all streams of a log group under a prefix.

    Each request that is throttled is retried on its own after a back-off
    (1 s, doubling, up to ``max_backoff_s``), so a throttled poll neither loses
    nor repeats the events already read. ``page_limit`` is the GetLogEvents page
    size (the API's maximum by default).
    """

    logs: Any  # a boto3 CloudWatch Logs client
    group: str
    prefix: str
    requests: int = 0
    page_limit: int = PAGE_LIMIT
    max_backoff_s: float = 30.0
    sleep: Callable[[float], None] = time.sleep
    throttled: int = 0  # requests that were throttled and retried
    _tokens: dict[str, str | None] = field(default_factory=dict)

    def _call(self, request: Callable[..., Any], **kwargs: Any) -> dict[str, Any]:
        delay = 1.0
        while True:
            try:
                page = request(**kwargs)
            except Exception as exc:
                if not is_throttling(exc) or delay > self.max_backoff_s:
                    raise
                self.throttled += 1
                self.sleep(delay)
                delay *= 2
                continue
            self.requests += 1
            return dict(page)

    def streams(self) -> list[str]:
        names: list[str] = []
        kwargs: dict[str, Any] = {"logGroupName": self.group, "logStreamNamePrefix": self.prefix}
        while True:
            try:
                page = self._call(self.logs.describe_log_streams, **kwargs)
            except Exception as exc:  # a job that has not logged yet has no group/stream
                if error_code(exc) == "ResourceNotFoundException":
                    return sorted(names)
                raise
            names.extend(s["logStreamName"] for s in page.get("logStreams", []))
            token = page.get("nextToken")
            if not token or token == kwargs.get("nextToken"):
                break
            kwargs["nextToken"] = token
        return sorted(names)

    def _read_stream(self, stream: str) -> Iterator[list[LogEvent]]:
        """New events of one stream, a page at a time; the stream's position advances
        once the consumer has taken the page."""
        token = self._tokens.get(stream)
        while True:
            kwargs: dict[str, Any] = {
                "logGroupName": self.group,
                "logStreamName": stream,
                "startFromHead": True,
                "limit": self.page_limit,
            }
            if token:
                kwargs["nextToken"] = token
            page = self._call(self.logs.get_log_events, **kwargs)
            events = [
                LogEvent(stream, int(event.get("timestamp", 0)), event.get("message", ""))
                for event in page.get("events", [])
            ]
            if events:
                yield events
            new_token = page.get("nextForwardToken")
            self._tokens[stream] = new_token
            if not new_token or new_token == token:
                return
            token = new_token

    def pages(self, streams: Iterable[str] | None = None) -> Iterator[tuple[str, list[LogEvent]]]:
        """Everything new since the last read, as (stream, events) pages, stream by stream
        (by default every stream under the prefix, new ones included; or the streams
        given, in that order). Memory stays one page."""
        for stream in self.streams() if streams is None else streams:
            for events in self._read_stream(stream):
                yield stream, events

    def poll(self) -> list[LogEvent]:
        """Everything new since the last poll, across all streams (new ones included)."""
        events: list[LogEvent] = []
        for _, page in self.pages():
            events.extend(page)
        return events

    def read_all(self) -> list[LogEvent]:
        return self.poll()


def training_job_log_prefix(job_name: str) -> str:
    """The stream prefix of a training job's log: streams are ``{job}/algo-{n}-{epoch}``."""
    return f"{job_name}/"


def training_job_tail(logs: Any, job_name: str, **settings: Any) -> LogTail:
    """The tail of every stream of a training job (``settings``: LogTail's, e.g. ``sleep``)."""
    return LogTail(logs, TRAINING_JOBS_LOG_GROUP, training_job_log_prefix(job_name), **settings)
