"""One progress line per training job, read from a local run's output (``--run-local``).

kfp.local prints every task's log; the training step streams its job's log into
it, so the trainer's own lines (``catalog/logformat.py``: the config with
``max_steps``, then one ``step`` line per logged step) say where each job is.
``Progress.feed`` reads those lines and prints, per job:

    [bf16] step 30/60  loss 1.862  362 tokens/s  elapsed 0:35  ETA 0:35

On a terminal the line is rewritten in place; elsewhere (CI, a pipe, a log) a
line is printed at the first step, at each quarter of ``max_steps`` and at the
last step (at most five lines a job, however slow the machine; every
``interval_s`` when the job's ``max_steps`` is unknown). The other tasks get one
line each when they finish (name, status, seconds).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kfp_sagemaker_blackwell.catalog import logformat

ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
EXECUTING_RE = re.compile(r"Executing task '([^']+)'")
FINISHED_RE = re.compile(r"Task '([^']+)' finished with status (\w+)")
JOB_RE = re.compile(r"(?:created|attached to) training job (\S+)")
RECENT_STEPS = 10  # tokens/s is the mean of the last steps (single steps are noisy on a CPU)


def clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    return (f"{hours}:" if hours else "") + f"{rest // 60:{'02' if hours else ''}}:{rest % 60:02}"


# How a configuration key reads in a progress label (``Progress(label_keys=...)``).
LABELS = {"batch_size": lambda v: f"batch {v}",
          "activation_checkpointing": lambda v: f"AC {'on' if v else 'off'}",
          "seq_length": lambda v: f"seq {v}"}


@dataclass
class JobProgress:
    label: str
    started: float
    setting: str = ""  # what tells this job from its siblings (batch tuning: batch, AC)
    max_steps: int = 0
    step: int = 0
    loss: float = float("nan")
    recent_tps: list[float] = field(default_factory=list)
    first_step_at: float = 0.0
    first_step: int = 0
    shown_quarter: int = -1  # the last quarter of max_steps a line was printed in (off a tty)

    def line(self, now: float) -> str:
        elapsed = now - self.started
        total = f"/{self.max_steps}" if self.max_steps else ""
        name = f"{self.label} {self.setting}" if self.setting else self.label
        parts = [f"[{name}] step {self.step}{total}"]
        if self.step:
            parts.append(f"loss {self.loss:.3f}")
        if self.recent_tps:
            parts.append(f"{sum(self.recent_tps) / len(self.recent_tps):,.0f} tokens/s")
        parts.append(f"elapsed {clock(elapsed)}")
        done = self.step - self.first_step
        if self.max_steps and done > 0 and self.step < self.max_steps:
            per_step = (now - self.first_step_at) / done
            parts.append(f"ETA {clock(per_step * (self.max_steps - self.step))}")
        elif self.max_steps and self.step >= self.max_steps:
            parts.append("done")
        return "  ".join(parts)


class Progress:
    """Turns a local run's output lines into short progress lines (see the module docstring)."""

    def __init__(self, write: Callable[[str], None], *, tty: bool, interval_s: float = 60.0,
                 now: Callable[[], float] = time.monotonic,
                 label_keys: tuple[str, ...] = ()) -> None:
        """``label_keys``: trainer configuration keys named in each job's label besides its
        precision (batch tuning's candidates differ by batch size and checkpointing)."""
        self.write, self.tty, self.interval_s, self.now = write, tty, interval_s, now
        self.label_keys = label_keys
        self.job: JobProgress | None = None
        self.task, self.task_started = "", 0.0
        self.last_print = 0.0
        self.pending_precision = ""

    def feed(self, raw: str) -> None:
        line = ANSI_RE.sub("", raw)
        now = self.now()
        if m := EXECUTING_RE.search(line):
            self.task, self.task_started = m.group(1), now
        elif m := FINISHED_RE.search(line):
            self._finish_task(m.group(1), m.group(2), now)
        elif m := JOB_RE.search(line):
            self.job = JobProgress(m.group(1).split("-", 1)[0], now)
        elif self.job is not None and logformat.TAG in line:
            self._trainer_line(line[line.index(logformat.TAG):], now)

    def _trainer_line(self, line: str, now: float) -> None:
        job = self.job
        assert job is not None
        parsed = logformat.parse_json(line)
        if parsed and parsed[0] == "config":
            job.max_steps = int(parsed[1].get("max_steps") or 0)
            job.setting = " ".join(LABELS.get(k, lambda v, k=k: f"{k} {v}")(parsed[1][k])
                                   for k in self.label_keys if k in parsed[1])
            if parsed[1].get("precision"):
                job.label = str(parsed[1]["precision"])
            return
        step = logformat.parse_step(line)
        if step is None:
            return
        if not job.first_step_at:
            job.first_step_at, job.first_step = now, step.step
        job.step, job.loss = step.step, step.loss
        if step.precision:
            job.label = step.precision
        job.recent_tps = (job.recent_tps + [step.tokens_per_s])[-RECENT_STEPS:]
        self._show(now, final=bool(job.max_steps) and step.step >= job.max_steps)

    def _show(self, now: float, *, final: bool = False) -> None:
        assert self.job is not None
        text = self.job.line(now)
        job = self.job
        if self.tty:
            self.write("\r\x1b[K" + text + ("\n" if final else ""))
        elif final or self._milestone(job) or (
                not job.max_steps and now - self.last_print >= self.interval_s):
            self.write(text + "\n")
            job.shown_quarter = self._quarter(job)
        else:
            return
        self.last_print = now

    @staticmethod
    def _quarter(job: JobProgress) -> int:
        return 4 * job.step // job.max_steps if job.max_steps else 0

    def _milestone(self, job: JobProgress) -> bool:
        """The job's first step, or its first step in a new quarter of max_steps."""
        if job.shown_quarter < 0:
            return True
        return bool(job.max_steps) and self._quarter(job) > job.shown_quarter

    def _finish_task(self, task: str, status: str, now: float) -> None:
        if self.job is not None and self.job.step and (
                not self.job.max_steps or self.job.step < self.job.max_steps):
            self._show(now, final=True)  # stopped early: show where it ended
        self.job = None
        seconds = now - self.task_started if task == self.task else 0.0
        self.write(f"  {task}: {status} ({seconds:.0f} s)\n")
