#!/usr/bin/env python3
"""PID 1 of the trainer image: the DLC's entry point, made to deliver SageMaker's SIGTERM.

SageMaker starts the container with the argument ``train``; StopTrainingJob and a spot
interruption send SIGTERM to PID 1, then SIGKILL after 120 s. The DLC's PID 1 is bash
(``bash -m start_with_right_hostname.sh train``), which runs the toolkit's ``train`` as a
child and has no trap: the kernel drops a SIGTERM that PID 1 does not handle, so nothing
below it ever learns of the stop, and when PID 1 is SIGKILLed the kernel kills every process
of the container. The toolkit installs no SIGTERM handler either (sagemaker-training 5.1.4:
only SIGALRM, in timeout.py), and runs the program through ``/bin/sh -c ./train.sh ...``.

This init keeps what the DLC's script does for ``train`` and adds what it lacks:

1. CUDA forward compatibility: runs the DLC's /usr/local/bin/start_cuda_compat.sh when it
   is there and a driver is loaded (the DLC runs it when torch sees CUDA).
2. The multi-node hostname workaround: the DLC builds an LD_PRELOAD library whose
   gethostname() returns resourceconfig.json's ``current_host``; the toolkit ships the same
   override compiled (its ``gethostname`` extension, which it preloads itself for MPI and
   smdataparallel). When the hostname is not ``current_host`` already, ``train`` runs with
   that library preloaded.
3. ``train`` runs as a child, as in the DLC (so the toolkit's exit status is the container's).
4. On SIGTERM (or SIGINT) it forwards the signal to every process of the container that would
   not merely die of it while it waits for children: a process whose SIGTERM action is the
   default and that has children (the toolkit's ``train``, ``sh -c``) is left alone, since
   killing it would orphan the trainer and lose the exit status it reports; everything else
   (train.sh, whose trap asks the workers to checkpoint; torchrun; the workers) gets it.
5. It then waits for every process to exit, reaping orphans (it is their subreaper too when it
   is not PID 1), so that the checkpoint is complete before PID 1 exits and the kernel kills
   what is left. Without a stop it exits as soon as ``train`` does, as the DLC's bash would.

Any other argument list is executed as given (the DLC's script evaluates it). Standard library
only: it runs with the image's Python, before anything else.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

CUDA_COMPAT = Path("/usr/local/bin/start_cuda_compat.sh")
# The toolkit's gethostname override reads this fixed path (src/sagemaker_training/c/gethostname.c).
FIXED_RESOURCE_CONFIG = Path("/opt/ml/input/config/resourceconfig.json")
PR_SET_CHILD_SUBREAPER = 36


def log(message: str) -> None:
    print(f"[entrypoint] {message}", file=sys.stderr, flush=True)


def resource_config() -> dict:
    base = Path(os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml"))
    try:
        return json.loads((base / "input" / "config" / "resourceconfig.json").read_text())
    except (OSError, ValueError):
        return {}


def hostname_preload(current_host: str, hostname: str) -> str:
    """The library to preload so gethostname() answers ``current_host``; '' when not needed
    or not possible (said on stderr)."""
    if not current_host or hostname == current_host:
        return ""
    spec = importlib.util.find_spec("gethostname")
    if spec is None or not spec.origin or not FIXED_RESOURCE_CONFIG.is_file():
        log(f"hostname is {hostname!r}, not {current_host!r}, and the toolkit's gethostname "
            f"override (or {FIXED_RESOURCE_CONFIG}) is missing: multi-node rendezvous by "
            "hostname may fail")
        return ""
    return spec.origin


def cuda_compat() -> None:
    if CUDA_COMPAT.is_file() and Path("/proc/driver/nvidia/version").exists():
        subprocess.run(["bash", str(CUDA_COMPAT)], check=False)


def _processes() -> dict[int, int]:
    """pid -> parent pid of every process visible here."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            table[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    return table


def _sigterm_default(pid: int) -> bool:
    """Whether ``pid``'s SIGTERM action is the default one (neither caught nor ignored)."""
    masks = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("SigCgt", "SigIgn"):
                masks[key] = int(value.strip(), 16)
    except (OSError, ValueError):
        return False
    bit = 1 << (signal.SIGTERM - 1)
    return not (masks.get("SigCgt", 0) & bit or masks.get("SigIgn", 0) & bit)


def forward_targets(me: int) -> list[int]:
    """The processes below ``me`` that should get the stop signal (module docstring, 4)."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, ppid in table.items():
        children.setdefault(ppid, []).append(pid)
    below, todo = [], list(children.get(me, []))
    while todo:
        pid = todo.pop()
        below.append(pid)
        todo.extend(children.get(pid, []))
    return sorted(p for p in below if not (children.get(p) and _sigterm_default(p)))


class Init:
    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.command = command
        self.env = env
        self.stopping = False
        self.child: subprocess.Popen[bytes] | None = None

    def forward(self, signum: int, _frame: object) -> None:
        self.stopping = True
        targets = forward_targets(os.getpid())
        for pid in targets:
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass
        log(f"{signal.Signals(signum).name}: forwarded to {len(targets)} process(es) "
            f"{targets}; waiting for them to exit")

    def run(self) -> int:
        if os.getpid() != 1:  # orphans come to us, as they would to PID 1
            try:
                ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            except (OSError, AttributeError):
                pass
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.forward)
        self.child = subprocess.Popen(self.command, env=self.env)
        code: int | None = None
        while True:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            if pid == self.child.pid:
                code = os.waitstatus_to_exitcode(status)
                code = 128 - code if code < 0 else code
                self.child.returncode = code
                if not self.stopping:
                    break
        log(f"train exited with {code}")
        return code if code is not None else 1


def main(argv: list[str]) -> int:
    if argv[:1] != ["train"]:
        args = argv or ["bash"]
        os.execvp(args[0], args)
    cuda_compat()
    env = dict(os.environ)
    preload = hostname_preload(str(resource_config().get("current_host", "")),
                               socket.gethostname())
    if preload:
        env["LD_PRELOAD"] = " ".join(filter(None, [preload, env.get("LD_PRELOAD", "")]))
    return Init(["train"], env).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
