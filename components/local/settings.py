"""What the training-job executor is given: its settings and a way to make AWS clients.

The executor never sees the ``LocalBackend`` object: the backend builds an
``ExecutorSettings`` and a ``ClientFactory`` (boto3 clients pointed at its own
endpoint) and hands both over, so the dependency runs one way, backend -> executor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# (service, region) -> a boto3 client talking to the local backend.
ClientFactory = Callable[[str, str], Any]


@dataclass(frozen=True)
class ExecutorSettings:
    """How local training jobs run (see ``LocalBackend`` for each setting's meaning).

    ``endpoint_env`` is the environment that points a job's boto3 at the backend
    (``AWS_ENDPOINT_URL``, fake credentials, region).
    """

    region: str
    repo_root: Path
    work_dir: Path
    endpoint_env: dict[str, str]
    max_concurrent_jobs: int = 2
    stop_grace_s: float = 120.0
    log_flush_s: float = 0.5
    command: list[str] | None = field(default=None)
