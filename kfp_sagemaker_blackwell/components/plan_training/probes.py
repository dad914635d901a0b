"""Probes: short training jobs of the best candidates, read back from their step series.

The plan_and_train pipeline trains each of the planner's ``top_candidates`` for tens of
steps (sagemaker_training, then parse_logs with the candidate's ``label`` as the run
label), and hands the series back to the planner, which re-ranks those candidates on
their measured speed. A series says where it ran (``gpu``, ``world_size``), how
(precision, micro-batch, checkpointing) and how fast (steady-state tokens/s per GPU,
after warm-up; parse_logs' ``mean_tokens_per_s_per_gpu``). A probe corrects a
candidate only when it ran on the candidate's GPU: a run on a CPU (the local backend on
a machine without a GPU) or on another GPU is reported beside the prediction, not used.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from typing import Any

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.common.step_series import SeriesFormatError, read_series
from kfp_sagemaker_blackwell.planning.probe import Probe

LABEL_PREFIX = "probe"


def label(instance_type: str, count: int, precision: str, batch: int, ac: bool) -> str:
    """A candidate's run label: what a probe's series says it probed."""
    return f"{LABEL_PREFIX}:{instance_type}:{count}:{precision}:{batch}:{'on' if ac else 'off'}"


def parse_label(text: str) -> tuple[str, int, str, int, bool] | None:
    parts = str(text).split(":")
    if len(parts) != 6 or parts[0] != LABEL_PREFIX or parts[5] not in ("on", "off"):
        return None
    try:
        return parts[1], int(parts[2]), parts[3], int(parts[4]), parts[5] == "on"
    except ValueError:
        return None


@dataclass(frozen=True)
class ProbeRun:
    """One probe's series: the candidate it probed and what it measured."""

    candidate: tuple[str, int, str, int, bool]
    status: str
    gpu: str  # the GPU's name, "" on a CPU
    world_size: int
    tokens_per_s_per_gpu: float | None
    peak_memory_bytes: int
    used: bool
    why_not: str = ""  # why it does not correct the prediction

    def probe(self) -> Probe | None:
        if not self.used or self.tokens_per_s_per_gpu is None:
            return None
        it, _, precision, batch, ac = self.candidate
        return Probe(precision, batch, ac, self.tokens_per_s_per_gpu, instance_type=it,
                     gpu=self.gpu, world_size=self.world_size,
                     peak_memory_bytes=self.peak_memory_bytes,
                     source=f"probe job {label(*self.candidate)}")


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) \
        and math.isfinite(float(x)) and x > 0 else None


def read(paths: list[str]) -> list[ProbeRun]:
    """The probes' series (a file that is not a probe's series is a UserError naming it)."""
    out = []
    for path in paths:
        try:
            s = read_series(path)
        except (OSError, SeriesFormatError, UnicodeError, csv.Error) as exc:
            raise UserError("probe_series", f"{path} could not be read as a step series "
                            f"({exc}).", "pass the parse_logs series of the probe jobs.") from None
        meta = s.meta
        candidate = parse_label(meta.get("run") or "")
        if candidate is None:
            raise UserError("probe_series", f"{path}: its run label {meta.get('run')!r} does "
                            "not name a candidate.", "run parse_logs with run_label = the "
                            "candidate's label (top_candidates' label).")
        out.append(_run(candidate, meta))
    return out


def _run(candidate: tuple[str, int, str, int, bool], meta: dict[str, Any]) -> ProbeRun:
    metrics = meta.get("metrics") or {}
    status = str(meta.get("status") or "unknown")
    tps = _num(metrics.get("mean_tokens_per_s_per_gpu"))
    peak = _num(metrics.get("peak_reserved_gib")) or _num(metrics.get("peak_memory_gib"))
    world = meta.get("world_size") if isinstance(meta.get("world_size"), int) else 1
    try:
        gpu = hardware.gpu(str(meta.get("gpu"))).name if meta.get("gpu") else ""
    except ValueError:
        gpu = ""
    want = hardware.INSTANCE_TYPES[candidate[0]].gpu if candidate[0] in \
        hardware.INSTANCE_TYPES else ""
    why = ""
    if status != "completed":
        why = f"the probe did not complete ({status}: {meta.get('failure_reason') or 'no reason'})"
    elif tps is None:
        why = "the probe logged no steady-state tokens/s"
    elif meta.get("emulated"):
        why = "emulated numerics: its speed is not the precision's"
    elif not gpu:
        why = f"ran on a CPU ({meta.get('gpu') or 'no GPU'}): its speed says nothing about {want}"
    elif gpu != want:
        why = f"ran on {gpu}, not the candidate's {want}"
    return ProbeRun(candidate, status, gpu, world or 1, tps,
                    int(peak * 2**30) if peak and gpu else 0, used=not why, why_not=why)
