"""A training job's hosts as local processes: start, signal, read output, reap, explain.

Each host is one process group (``start_new_session``) running the job's entry
point under its ``HostLayout``; its merged stdout/stderr goes line by line to a
``LogShipper`` and into a short tail kept for the FailureReason.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any

from components.local.container import HostLayout
from components.local.jobs import MAX_FAILURE_REASON
from components.local.logship import LogShipper

TAIL_LINES = 30
TAIL_CHARS = 700


@dataclass
class HostProcess:
    layout: HostLayout
    proc: subprocess.Popen[bytes]
    shipper: LogShipper
    tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    reader: threading.Thread | None = None

    def signal(self, sig: int) -> None:
        """Signals the whole process group (the SIGKILL that ends an instance)."""
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def terminate(self) -> None:
        """SIGTERM to the entry point only, as ``docker stop`` signals a container's PID 1;
        the entry point forwards it (train.sh asks its workers to checkpoint and stop)."""
        try:
            self.proc.send_signal(signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass

    def read_output(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.tail.append(line)
            self.shipper.add(line)


def start_hosts(job_name: str, command: list[str], layouts: list[HostLayout],
                envs: list[dict[str, str]], logs: Any, epoch: int,
                flush_s: float) -> list[HostProcess]:
    """Starts one process group per host; on a failure to start, kills those already started
    and raises ``OSError``."""
    procs: list[HostProcess] = []
    for lay, env in zip(layouts, envs, strict=True):
        shipper = LogShipper(logs, f"{job_name}/{lay.host}-{epoch}", flush_s)
        try:
            proc = subprocess.Popen(
                command, cwd=str(lay.root), env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            )
        except OSError:
            shipper.close()
            for p in procs:
                p.signal(signal.SIGKILL)
            raise
        host = HostProcess(lay, proc, shipper)
        host.reader = threading.Thread(target=host.read_output, daemon=True,
                                       name=f"out-{job_name}-{lay.host}")
        host.reader.start()
        procs.append(host)
    return procs


def reap(procs: list[HostProcess]) -> None:
    """Kills what is left of each host's group (a trainer's children) and flushes its logs."""
    for p in procs:
        p.signal(signal.SIGKILL)
        if p.reader is not None:
            p.reader.join(timeout=10)
        p.shipper.close()


def failure_reason(procs: list[HostProcess], failed_host: int) -> str:
    """The failed host's failure file, else the first one any host wrote, else what happened."""
    order = ([procs[failed_host]] if failed_host >= 0 else []) + procs
    for p in order:
        text = p.layout.failure_reason()
        if text:
            return text[:MAX_FAILURE_REASON]
    p = order[0]
    tail = "\n".join(line for line in p.tail if line.strip())[-TAIL_CHARS:]
    return (f"AlgorithmError: the training process on {p.layout.host} exited with code "
            f"{p.proc.returncode} and wrote no {p.layout.failure_file.name} file. "
            f"Last output:\n{tail}")[:MAX_FAILURE_REASON]
