"""A training host's output, shipped to CloudWatch Logs as SageMaker does.

One stream ``{job}/algo-{n}-{epoch}`` per host and start in the group
``/aws/sagemaker/TrainingJobs``, written in batches within CloudWatch's limits.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
MAX_EVENT_BYTES = 256 * 1024 - 26
MAX_BATCH_BYTES = 1_048_576
MAX_BATCH_EVENTS = 10_000
EVENT_OVERHEAD_BYTES = 26  # CloudWatch counts each event's message plus 26 bytes


def ensure_log_group(logs: Any) -> None:
    """Creates SageMaker's training log group if it does not exist yet."""
    try:
        logs.create_log_group(logGroupName=LOG_GROUP)
    except logs.exceptions.ResourceAlreadyExistsException:
        pass


class LogShipper:
    """Buffers one host's output lines and writes them to its stream in batches."""

    def __init__(self, logs: Any, stream: str, flush_s: float) -> None:
        self.logs = logs
        self.stream = stream
        self.flush_s = flush_s
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        logs.create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
        self._thread = threading.Thread(target=self._loop, name=f"logs-{stream}", daemon=True)
        self._thread.start()

    def add(self, line: str) -> None:
        if not line.strip():
            return  # CloudWatch rejects empty messages
        data = line.encode("utf-8")
        if len(data) > MAX_EVENT_BYTES:
            line = data[:MAX_EVENT_BYTES].decode("utf-8", "ignore")
        with self._lock:
            self._events.append({"timestamp": int(time.time() * 1000), "message": line})

    def _loop(self) -> None:
        while not self._closed.wait(self.flush_s):
            self.flush()
        self.flush()

    def flush(self) -> None:
        with self._lock:
            events, self._events = self._events, []
        batch: list[dict[str, Any]] = []
        size = 0
        for event in events:
            n = len(event["message"].encode("utf-8")) + EVENT_OVERHEAD_BYTES
            if batch and (len(batch) >= MAX_BATCH_EVENTS or size + n > MAX_BATCH_BYTES):
                self._put(batch)
                batch, size = [], 0
            batch.append(event)
            size += n
        if batch:
            self._put(batch)

    def _put(self, batch: list[dict[str, Any]]) -> None:
        try:
            self.logs.put_log_events(
                logGroupName=LOG_GROUP, logStreamName=self.stream, logEvents=batch
            )
        except Exception as exc:  # losing log lines must not kill the job
            print(f"local backend: could not write logs to {self.stream}: {exc}", file=sys.stderr)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=30)
