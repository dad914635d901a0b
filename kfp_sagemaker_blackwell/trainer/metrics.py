"""Throughput, FLOPs, MFU and memory: one place that turns timings into the step line.

Two MFUs, both labelled: ``mfu_bf16_peak`` divides the model FLOP/s by the GPU's dense bf16
peak whatever the precision (as torchtitan and published tables do: an FP8 run that is 1.26x
faster then shows 1.26x the MFU), ``mfu`` (also ``mfu_precision_peak`` in the summary) by the
dense peak of the precision's own GEMM dtype (FP8's is twice bf16's on Hopper and Blackwell).

The steady-state figures leave out the first ``timing_warmup_steps`` steps; beside their mean,
the summary carries the median and p90 step time and the throughput at the median step
(``tokens_per_s_per_gpu_median``): one slow step (a stall, a collection) moves the median by
one place in the sorted times, i.e. by no more than the spread of the steady steps around it,
where it moves a 6-step mean by a sixth of its excess.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import torch

from kfp_sagemaker_blackwell.catalog import logformat
from kfp_sagemaker_blackwell.catalog.spec import ModelSpec


def graph_pool_bytes() -> dict[str, int]:
    """The CUDA graphs' private memory pools (``--cuda-graphs``), from the caching allocator's
    segments (``torch.cuda.memory_snapshot``; the default pool's id is (0, 0)):
    ``graph_pool_bytes`` reserved by them, ``graph_pool_free_bytes`` of it not held by a live
    tensor. The free part is where each replay writes the blocks' activations: the allocator
    counts it as reserved, not allocated, so ``torch.cuda.max_memory_allocated()`` leaves it out
    and the memory a graphed step needs is the allocated peak plus this free part."""
    total = free = 0
    for seg in torch.cuda.memory_snapshot():
        if tuple(seg.get("segment_pool_id", (0, 0))) != (0, 0):
            total += int(seg["total_size"])
            free += int(seg["total_size"]) - int(seg["allocated_size"])
    return {"graph_pool_bytes": total, "graph_pool_free_bytes": free}


def block_flops_per_token(spec: ModelSpec, seq_length: int) -> float:
    """Training FLOPs per token of the transformer blocks alone (no embedding, no LM head)."""
    return 6.0 * spec.num_layers * spec.block_params() + 12.0 * spec.num_layers * spec.hidden_size * seq_length


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of values, linear between order statistics; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


@dataclass
class Meter:
    spec: ModelSpec
    seq_length: int
    tokens_per_step: int  # global
    world_size: int
    peak_tflops: float | None  # per GPU for the precision; None on CPU / emulated
    timing_warmup_steps: int
    device_is_cuda: bool
    bf16_peak_tflops: float | None = None  # per GPU, dense bf16; None on CPU / emulated
    steady_time: float = 0.0
    steady_steps: int = 0
    window_time: float = 0.0
    window_steps: int = 0
    peak_alloc: int = 0
    peak_reserved: int = 0
    step_times: list[float] = field(default_factory=list)
    steady_times: list[float] = field(default_factory=list)
    window_times: list[float] = field(default_factory=list)

    @property
    def flops_per_token(self) -> float:
        return self.spec.flops_per_token(self.seq_length, include_lm_head=True)

    def record(self, step_in_run: int, seconds: float) -> None:
        """step_in_run counts the steps this process has run (1 = its first)."""
        self.window_time += seconds
        self.window_steps += 1
        self.step_times.append(seconds)
        self.window_times.append(seconds)
        if step_in_run > self.timing_warmup_steps:
            self.steady_time += seconds
            self.steady_steps += 1
            self.steady_times.append(seconds)

    def _memory(self) -> tuple[float, float]:
        if not self.device_is_cuda:
            return math.nan, math.nan
        a, r = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
        self.peak_alloc, self.peak_reserved = max(self.peak_alloc, a), max(self.peak_reserved, r)
        torch.cuda.reset_peak_memory_stats()
        return a / 2**30, r / 2**30

    def rates(self, seconds: float, steps: int) -> tuple[float, float, float, float]:
        if steps == 0 or seconds <= 0:
            return math.nan, math.nan, math.nan, math.nan
        tps = self.tokens_per_step * steps / seconds
        per_gpu = tps / self.world_size
        tflops = self.flops_per_token * per_gpu / 1e12
        mfu = tflops / self.peak_tflops if self.peak_tflops else math.nan
        return tps, per_gpu, tflops, mfu

    def mfu_bf16(self, tflops: float, emulated: bool) -> float:
        if emulated or not self.bf16_peak_tflops or not math.isfinite(tflops):
            return math.nan
        return tflops / self.bf16_peak_tflops

    def step_record(self, step: int, loss: float, lr: float, grad_norm: float, precision: str,
                    emulated: bool, gc_s: float = math.nan
                    ) -> tuple[logformat.StepRecord, logformat.StepTiming]:
        """The step line's record and timing fields, for the steps since the previous line."""
        tps, per_gpu, tflops, mfu = self.rates(self.window_time, self.window_steps)
        alloc, reserved = self._memory()
        times = self.window_times
        timing = logformat.StepTiming(
            self.window_time / self.window_steps if self.window_steps else math.nan,
            _median(times), percentile(times, 0.9), self.mfu_bf16(tflops, emulated), gc_s)
        self.window_time, self.window_steps, self.window_times = 0.0, 0, []
        record = logformat.StepRecord(step, loss, lr, grad_norm, tps, per_gpu, tflops,
                                      math.nan if emulated else mfu, alloc, reserved, precision,
                                      emulated)
        return record, timing

    def summary(self, emulated: bool) -> dict:
        self._memory()
        tps, per_gpu, tflops, mfu = self.rates(self.steady_time, self.steady_steps)
        block_tflops = block_flops_per_token(self.spec, self.seq_length) * per_gpu / 1e12

        def num(x: float, digits: int) -> float | None:
            return None if not math.isfinite(x) else round(x, digits)

        times = self.steady_times
        median_s = _median(times)
        m_tps, m_per_gpu, m_tflops, _ = self.rates(median_s, 1) if times else (math.nan,) * 4
        return {
            "tokens_per_s": num(tps, 1),
            "tokens_per_s_per_gpu": num(per_gpu, 1),
            "tflops_per_gpu": num(tflops, 3),
            "tflops_per_gpu_blocks": num(block_tflops, 3),
            "mfu": None if emulated else num(mfu, 4),
            "mfu_precision_peak": None if emulated else num(mfu, 4),
            "mfu_bf16_peak": num(self.mfu_bf16(tflops, emulated), 4),
            "mfu_blocks": None if emulated or not self.peak_tflops else num(block_tflops / self.peak_tflops, 4),
            # The robust figures: the throughput of the median steady-state step.
            "tokens_per_s_median": num(m_tps, 1),
            "tokens_per_s_per_gpu_median": num(m_per_gpu, 1),
            "mfu_bf16_peak_median": num(self.mfu_bf16(m_tflops, emulated), 4),
            "steady_state_steps": self.steady_steps,
            "steady_state_step_s": num(self.steady_time / self.steady_steps, 4) if self.steady_steps else None,
            "steady_state_step_s_median": num(median_s, 4),
            "steady_state_step_s_p90": num(percentile(times, 0.9), 4),
            "steady_state_step_s_min": num(min(times), 4) if times else None,
            "steady_state_step_s_max": num(max(times), 4) if times else None,
            "flops_per_token": self.flops_per_token,
            "flops_per_token_blocks": block_flops_per_token(self.spec, self.seq_length),
            "peak_allocated_bytes": self.peak_alloc if self.device_is_cuda else None,
            "peak_reserved_bytes": self.peak_reserved if self.device_is_cuda else None,
        }
