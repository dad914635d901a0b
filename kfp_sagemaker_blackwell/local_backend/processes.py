"""A training job's hosts as local processes: start, signal, read output, reap, explain.

Each host is one process group (``start_new_session``) running the job's entry
point under its ``HostLayout``, as PID 1 of its own PID namespace where the machine
allows (``container.container_command``); its merged stdout/stderr goes line by line
to a ``LogShipper``, into a short tail kept for the FailureReason and, for the trainer's
own ``[trainer]`` lines, into a ``TrainerReport`` (the model size and GPU memory the
trainer measured and printed: the backend never works them out from hyperparameters).

The jobs die with the backend: the process the executor starts gets SIGKILL when the
backend's job thread (and so the backend, killed -9 or not) goes away
(PR_SET_PDEATHSIG, set between fork and exec); in a namespace that process is
``unshare --kill-child``, whose death kills the namespace's PID 1 and so, by the
kernel, every process of the container. Without a namespace only the entry point
itself is killed that way: its descendants outlive a backend killed -9.
"""

from __future__ import annotations

import collections
import ctypes
import math
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kfp_sagemaker_blackwell.catalog import logformat  # torch-free: the trainer's log line format
from kfp_sagemaker_blackwell.common.training_job import MAX_FAILURE_REASON
from kfp_sagemaker_blackwell.local_backend.container import HostLayout
from kfp_sagemaker_blackwell.local_backend.logship import LogShipper

TAIL_LINES = 30
TAIL_CHARS = 700


@dataclass
class TrainerReport:
    """What the trainer on a host printed about itself: its ``[trainer] model`` line (the
    parameter count it built) and its last step line's GPU memory (torch's own peak
    allocated / reserved since the step before). Empty for an entry point that is not this
    project's trainer."""

    params: int = 0
    preset: str = ""
    mem_alloc_gib: float = math.nan
    mem_reserved_gib: float = math.nan

    def read(self, line: str) -> None:
        if logformat.TAG not in line:
            return
        step = logformat.parse_step(line)
        if step is not None:
            self.mem_alloc_gib, self.mem_reserved_gib = step.mem_alloc_gib, step.mem_reserved_gib
            return
        parsed = logformat.parse_json(line)
        if parsed is not None and parsed[0] == "model":
            try:
                self.params = int(parsed[1].get("params") or 0)
            except (TypeError, ValueError):
                return
            self.preset = str(parsed[1].get("preset") or "")

    def describe(self) -> str:
        """One sentence for the FailureReason; '' when the trainer reported nothing."""
        said = []
        if self.params:
            preset = f" (preset {self.preset})" if self.preset else ""
            said.append(f"its model{preset} has {self.params / 1e9:.2f} B parameters")
        if math.isfinite(self.mem_alloc_gib) and math.isfinite(self.mem_reserved_gib):
            said.append(f"its last step peaked at {self.mem_alloc_gib:.1f} GiB allocated, "
                        f"{self.mem_reserved_gib:.1f} GiB reserved per GPU")
        return f"The trainer reported: {'; '.join(said)}." if said else ""


@dataclass
class HostProcess:
    layout: HostLayout
    proc: subprocess.Popen[bytes]
    shipper: LogShipper
    tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    reader: threading.Thread | None = None
    peak_rss_bytes: int = 0  # the host's processes together, sampled by the supervisor
    report: TrainerReport = field(default_factory=TrainerReport)
    namespaced: bool = False  # proc is ``unshare``; the container's PID 1 is its child

    def sample_memory(self) -> None:
        self.peak_rss_bytes = max(self.peak_rss_bytes, session_rss_bytes(self.proc.pid))

    def signal(self, sig: int) -> None:
        """Signals the whole process group (the SIGKILL that ends an instance)."""
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def init_pid(self) -> int:
        """This machine's pid of the container's PID 1 (the entry point); 0 if it is gone."""
        if not self.namespaced:
            return self.proc.pid if self.proc.poll() is None else 0
        deadline = time.monotonic() + 5
        while self.proc.poll() is None:
            kids = child_pids(self.proc.pid)
            if kids:
                return kids[0]
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        return 0

    def terminate(self) -> None:
        """SIGTERM to the container's PID 1 only, as SageMaker (``docker stop``) sends it;
        whether anything below PID 1 learns of it is the entry point's business."""
        pid = self.init_pid()
        if pid:
            try:
                os.kill(pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass

    def read_output(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.tail.append(line)
            self.report.read(line)
            self.shipper.add(line)


def child_pids(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


PR_SET_PDEATHSIG = 1


def _die_with_parent(ignore_sigterm: bool) -> Any:
    """Between fork and exec: SIGKILL when the parent (thread) goes away; optionally the
    SIGTERM-ignoring disposition the kernel gives a PID 1 without a handler."""
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def setup() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody would kill us
            os._exit(137)
        if ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    return setup


def start_hosts(job_name: str, commands: list[tuple[list[str], bool, bool]],
                layouts: list[HostLayout], envs: list[dict[str, str]], logs: Any, epoch: int,
                flush_s: float, cwd: str = "") -> list[HostProcess]:
    """Starts one process group per host: ``commands[i]`` is (argv, namespaced,
    ignore_sigterm) for host i. On a failure to start, kills those already started and raises
    ``OSError``."""
    procs: list[HostProcess] = []
    for lay, env, (command, namespaced, ignore_sigterm) in zip(layouts, envs, commands,
                                                                strict=True):
        shipper = LogShipper(logs, f"{job_name}/{lay.host}-{epoch}", flush_s)
        try:
            proc = subprocess.Popen(
                command, cwd=str(lay.root / cwd), env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent(ignore_sigterm),  # noqa: PLW1509 (no threads run there)
            )
        except OSError:
            shipper.close()
            for p in procs:
                p.signal(signal.SIGKILL)
            raise
        host = HostProcess(lay, proc, shipper, namespaced=namespaced)
        host.reader = threading.Thread(target=host.read_output, daemon=True,
                                       name=f"out-{job_name}-{lay.host}")
        host.reader.start()
        procs.append(host)
    return procs


def reap(procs: list[HostProcess]) -> None:
    """Kills what is left of each host's group (a trainer's children) and flushes its logs."""
    for p in procs:
        p.signal(signal.SIGKILL)  # in a namespace, unshare --kill-child ends the rest
        if p.reader is not None:
            p.reader.join(timeout=10)
        p.shipper.close()


def failure_reason(procs: list[HostProcess], failed_host: int, *, oom_kills: int = 0) -> str:
    """The failed host's failure file, else the first one any host wrote, else what happened.

    ``oom_kills``: how many processes the kernel's OOM killer ended in this process's
    cgroup during the attempt (0 if unknown).
    """
    order = ([procs[failed_host]] if failed_host >= 0 else []) + procs
    for p in order:
        text = p.layout.failure_reason()
        if text:
            return text[:MAX_FAILURE_REASON]
    p = order[0]
    tail = "\n".join(line for line in p.tail if line.strip())[-TAIL_CHARS:]
    if oom_kills or killed_by_sigkill(p):
        return (host_memory_reason(p, oom_kills) + f" Last output:\n{tail}")[
            :MAX_FAILURE_REASON]
    return (f"AlgorithmError: the training process on {p.layout.host} exited with code "
            f"{p.proc.returncode} and wrote no {p.layout.failure_file.name} file. "
            f"Last output:\n{tail}")[:MAX_FAILURE_REASON]


# torchrun's report of a worker ended by a signal: "exitcode  : -9 (pid: 123)" and
# "Signal 9 (SIGKILL) received by PID 123"; bash reports a SIGKILLed child as 137.
_SIGKILL_RE = re.compile(r"exitcode\s*:\s*-9\b|Signal 9 \(SIGKILL\)")


def killed_by_sigkill(p: HostProcess) -> bool:
    """Whether the host (or a worker under it) died of a SIGKILL. The executor sends one only
    after it has decided to end the job (stop, limits, failed peer), and then asks for no
    FailureReason, so a SIGKILL seen here came from outside: on a training host, the kernel."""
    code = p.proc.returncode
    return code in (-signal.SIGKILL, 128 + signal.SIGKILL) or any(
        _SIGKILL_RE.search(line) for line in p.tail)


def host_memory_reason(p: HostProcess, oom_kills: int) -> str:
    total, available = host_memory_bytes()
    evidence = (f"the kernel's out-of-memory killer ended {oom_kills} process(es) of this "
                "backend's cgroup" if oom_kills else
                "nothing in the local backend sent it, so most likely the kernel's "
                "out-of-memory killer did")
    peak = (f" The host's processes peaked at {_gib(p.peak_rss_bytes)} resident (measured, "
            "sampled every second)." if p.peak_rss_bytes else "")
    reported = p.report.describe()
    return (f"AlgorithmError: the training process on {p.layout.host} was killed by SIGKILL "
            f"(exit code {p.proc.returncode}) and wrote no failure file: {evidence}. This "
            f"machine has {_gib(total)} of memory ({_gib(available)} available now), shared by "
            f"every local instance of the job.{peak}{' ' + reported if reported else ''} Fix: a "
            "smaller model (preset or num-layers/hidden-size), a smaller batch-size or "
            "seq-length, fewer instances (InstanceCount) on this machine, or a machine with "
            "more memory.")


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def host_memory_bytes() -> tuple[int, int]:
    """(MemTotal, MemAvailable) from /proc/meminfo; (0, 0) where there is none."""
    values: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0, 0
    return values.get("MemTotal", 0), values.get("MemAvailable", 0)


def session_rss_bytes(sid: int) -> int:
    """Resident memory of every process in session ``sid`` (a host's process group)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # after "pid (comm)": state ppid pgrp session ... rss is the 22nd field
        if len(fields) > 21 and fields[3] == str(sid):
            total += int(fields[21]) * page
    return total


def oom_kill_count() -> int:
    """The kernel's ``oom_kill`` counter of this process's memory cgroup (v2 memory.events or
    v1 memory.oom_control); 0 where unreadable."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return 0
    candidates = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            candidates.append(Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.events")
        elif "memory" in controllers.split(","):
            candidates.append(Path("/sys/fs/cgroup/memory") / path.lstrip("/") /
                              "memory.oom_control")
    for candidate in candidates:
        try:
            for row in candidate.read_text().splitlines():
                key, _, value = row.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return 0
