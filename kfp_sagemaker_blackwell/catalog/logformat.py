"""The trainer's log line format: the one contract between the trainer and parse_logs.

Every line the trainer prints for machines starts with the tag ``[trainer]`` (it
may be preceded by anything: torchrun's ``[default0]:`` prefix, a CloudWatch
timestamp...) followed by a kind word and fields:

    [trainer] step step=10 loss=2.301000 lr=3.000e-04 grad_norm=0.9812 tokens_per_s=12345.6 tokens_per_s_per_gpu=6172.8 tflops_per_gpu=1.23 mfu=0.0041 mem_alloc_gib=1.234 mem_reserved_gib=2.000 precision=fp8 emulated=1 step_s=0.2654 step_s_median=0.2650 step_s_p90=0.2671 mfu_bf16_peak=0.0041 gc_s=0.0000
    [trainer] recipe precision=fp8 recipe=DelayedScaling backend=te emulated=0 | Using FP8 recipe: DelayedScaling
    [trainer] config {"json": ...}
    [trainer] summary {"json": ...}

Step lines have a fixed field order so that one regular expression reads them
(parse_logs reads millions of lines per second). Unknown numbers are ``nan``. The
fields after ``emulated`` (``StepTiming``: step time mean, median and p90, MFU against
the bf16 peak, garbage-collection seconds) came later: ``parse_step`` reads a line up to
``emulated`` as before, ``parse_timing`` the rest; a line may end with ``skipped=1``.
``emulated=1`` marks numerics emulated on the PyTorch backend: such numbers are
never a speed measurement. Torch-free.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, fields
from typing import Any

TAG = "[trainer]"


@dataclass(frozen=True)
class StepRecord:
    step: int
    loss: float
    lr: float
    grad_norm: float
    tokens_per_s: float  # global, all ranks
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    mfu: float  # fraction of the GPU's dense peak for the precision (nan on CPU / emulated);
    # the bf16-peak figure, the one published tables quote for every precision, is
    # StepTiming.mfu_bf16_peak
    mem_alloc_gib: float  # peak torch.cuda.max_memory_allocated since the last step line
    mem_reserved_gib: float
    precision: str
    emulated: bool


STEP_FIELDS = tuple(f.name for f in fields(StepRecord))

_NUM = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))"
STEP_RE = re.compile(
    r"\[trainer\] step step=(\d{1,18}) loss=" + _NUM + r" lr=" + _NUM + r" grad_norm=" + _NUM
    + r" tokens_per_s=" + _NUM + r" tokens_per_s_per_gpu=" + _NUM + r" tflops_per_gpu=" + _NUM
    + r" mfu=" + _NUM + r" mem_alloc_gib=" + _NUM + r" mem_reserved_gib=" + _NUM
    + r" precision=([\w-]+) emulated=([01])"
)
RECIPE_RE = re.compile(
    r"\[trainer\] recipe precision=([\w-]+) recipe=(\w+) backend=(\w+) emulated=([01])"
)
JSON_RE = re.compile(r"\[trainer\] (config|summary|data|model|world|checkpoint|event) (\{.*\})\s*$")


def _f(x: float, spec: str) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "nan" if x is None or math.isnan(x) else ("inf" if x > 0 else "-inf")
    return format(x, spec)


def format_step(r: StepRecord, timing: StepTiming | None = None) -> str:
    return (
        f"{TAG} step step={r.step} loss={_f(r.loss, '.6f')} lr={_f(r.lr, '.4e')} "
        f"grad_norm={_f(r.grad_norm, '.4f')} tokens_per_s={_f(r.tokens_per_s, '.1f')} "
        f"tokens_per_s_per_gpu={_f(r.tokens_per_s_per_gpu, '.1f')} "
        f"tflops_per_gpu={_f(r.tflops_per_gpu, '.3f')} mfu={_f(r.mfu, '.4f')} "
        f"mem_alloc_gib={_f(r.mem_alloc_gib, '.3f')} "
        f"mem_reserved_gib={_f(r.mem_reserved_gib, '.3f')} "
        f"precision={r.precision} emulated={int(r.emulated)}"
    ) + (format_timing(timing) if timing is not None else "")


@dataclass(frozen=True)
class StepTiming:
    """Fields a step line carries after ``emulated`` (added in issue 26; older lines have none,
    and a reader that stops at ``emulated`` reads newer lines as before). The times are of the
    steps since the previous step line (one step with ``--log-every 1``)."""

    step_s: float  # mean step time
    step_s_median: float
    step_s_p90: float
    mfu_bf16_peak: float  # model FLOPs against the GPU's dense bf16 peak, whatever the precision
    gc_s: float  # seconds Python's garbage collector ran in these steps


TIMING_FIELDS = tuple(f.name for f in fields(StepTiming))
TIMING_RE = re.compile("".join(f" {name}=" + _NUM for name in TIMING_FIELDS))  # after STEP_RE


def format_timing(t: StepTiming) -> str:
    return (f" step_s={_f(t.step_s, '.4f')} step_s_median={_f(t.step_s_median, '.4f')} "
            f"step_s_p90={_f(t.step_s_p90, '.4f')} mfu_bf16_peak={_f(t.mfu_bf16_peak, '.4f')} "
            f"gc_s={_f(t.gc_s, '.4f')}")


def parse_timing(line: str) -> StepTiming | None:
    """The timing fields of a step line, or None (an older line, or not a step line)."""
    step = STEP_RE.search(line)
    m = TIMING_RE.match(line, step.end()) if step else None
    if not m:
        return None
    return StepTiming(*(float(x) for x in m.groups()))


def parse_step(line: str) -> StepRecord | None:
    m = STEP_RE.search(line)
    if not m:
        return None
    g = m.groups()
    f = [float(x) for x in g[1:10]]
    return StepRecord(
        int(g[0]), f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], g[10], g[11] == "1"
    )


# Human phrases that confirm the recipe, in the words TE's users know.
def recipe_phrase(precision: str, recipe: str, emulated: bool) -> str:
    if precision == "mxfp8":
        text = f"MXFP8 enabled: {recipe}"
    elif precision == "nvfp4":
        text = f"NVFP4 enabled: {recipe}"
    elif precision.startswith("fp8"):
        text = f"Using FP8 recipe: {recipe}"
    else:
        text = f"Using {precision.upper()} (no FP8 recipe)"
    if emulated:
        text += " [EMULATED numerics on the PyTorch backend; not a speed measurement]"
    return text


@dataclass(frozen=True)
class RecipeRecord:
    precision: str
    recipe: str  # TE recipe class, or "none" for fp32/bf16/fp16
    backend: str  # te | torch
    emulated: bool


def format_recipe(r: RecipeRecord) -> str:
    return (
        f"{TAG} recipe precision={r.precision} recipe={r.recipe} backend={r.backend} "
        f"emulated={int(r.emulated)} | {recipe_phrase(r.precision, r.recipe, r.emulated)}"
    )


def parse_recipe(line: str) -> RecipeRecord | None:
    m = RECIPE_RE.search(line)
    if not m:
        return None
    return RecipeRecord(m.group(1), m.group(2), m.group(3), m.group(4) == "1")


# JSON lines: config (all settings), model (param counts, flops/token), world
# (world size, nodes, GPU, device), data (source, entropy_floor), checkpoint
# ({"action": "saved"|"resumed", "step", "path"}), event ({"kind": ..., ...}),
# summary (final, machine-readable; see the trainer's docs for keys).
def format_json(kind: str, payload: dict[str, Any]) -> str:
    return f"{TAG} {kind} {json.dumps(payload, sort_keys=True, separators=(',', ':'), default=str)}"


def parse_json(line: str) -> tuple[str, dict[str, Any]] | None:
    m = JSON_RE.search(line)
    if not m:
        return None
    try:
        payload = json.loads(m.group(2))
    except ValueError:
        return None
    return (m.group(1), payload) if isinstance(payload, dict) else None
