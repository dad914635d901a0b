"""Per-GPU peak memory of one training step, from first principles (torch-free, ~0.1 ms).

The model walks through a training step of an FSDP-sharded decoder LM the way the
caching allocator sees it and takes the largest total:

- forward and the loss: sharded states, every block's saved activations (or
  inputs, with checkpointing), the last block's gathered parameters, the
  full-vocabulary logits and the cross-entropy's float32 work tensors;
- the LM head's backward: the root unit's gathered parameters, the logits'
  gradient and the head's gradient;
- backward, block by block from the last: saved activations shrinking, sharded
  gradients growing, the block's gathered parameters and unsharded gradients,
  reduce-scatter buffers and the block's backward work tensors; with activation
  checkpointing, one block's activations are recomputed at a time;
- the end of backward: the root unit's (embedding / LM head) unsharded gradients
  and their reduce-scatter buffer, every block's sharded gradient;
- the optimizer step: parameters, gradients, moments (and temporaries of a
  foreach implementation).

Every constant is written next to its source: a cited formula (Korthikanti et al.
2022, arXiv 2205.05198 for activations; Rajbhandari et al. 2020, arXiv 1910.02054
for the 16-18 bytes/parameter of mixed-precision Adam), the layout of a tensor
format (TransformerEngine's FP8/MXFP8/NVFP4 tensors), the source code of the
trainer (``trainer/model.py``, ``trainer/te_backend.py``) and of PyTorch's FSDP2,
or measurements on H200s in ``benchmarks/memory/`` (the probe, the trainer spot
checks and the calibration grid; see its README: median error 0.4%, worst 2.3% over
the grid's 50 runs; the 70 trainer runs of benchmarks/throughput/h200_grid.json: median
0.1%, worst 1.4%). TE's own examples/pytorch/fsdp/fsdp.py (FSDP1) is modelled too
(``fsdp_version=1``, ``dropout``): on its H200 grid (benchmarks/memory/fsdp1_h200_grid.json)
median 0.3%, worst 2.0% over 16 validation points outside the 40 it was calibrated on.

What the numbers mean: ``peak_allocated_bytes`` predicts
``torch.cuda.max_memory_allocated()`` after a few steps; ``peak_bytes`` adds what
the process holds outside live tensors (CUDA context and NCCL buffers, the caching
allocator's reserve), i.e. what must fit in the GPU; ``peak_reserved_bytes`` (allocated plus
the reserve) predicts ``torch.cuda.max_memory_reserved()``, the fit decision's boundary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.planning.estimator_terms import (
    GiB,
    _block_linear_weights,  # noqa: F401 (read from here)
    _block_saved_bytes_per_token,  # noqa: F401 (read from here)
    _emulated_linears,
    _loss_bytes,  # noqa: F401 (read from here)
    _Terms,
)
from kfp_sagemaker_blackwell.planning.training_setup import (
    TrainingSetup,
)

# The order of the breakdown (what a user reads top to bottom).
ALLOCATED_PARTS = (
    "parameters",
    "master_weights",
    "gradients",
    "optimizer_states",
    "fsdp_buffers",
    "quantized_weights",
    "activations",
    "logits_and_loss",
    "workspaces",
)
OVERHEAD_PARTS = ("cuda_context", "allocator_reserve")
PARTS = ALLOCATED_PARTS + OVERHEAD_PARTS

# Memory a CUDA process holds outside the caching allocator: the CUDA context,
# loaded cuBLAS / flash-attention kernels and NCCL's communicator buffers.
# Measured on H200s (torch 2.11, CUDA 13; benchmarks/memory/probe_h200.json,
# "context"): 802 MB after cuBLAS and flash-attention ran; 1387 MB once a 1-rank
# NCCL group ran all-reduce / all-gather / reduce-scatter, 1685 MB per rank with 2
# ranks. The trainer always creates an NCCL group on GPU (FSDP2 all-gathers even at
# world size 1). NCCL's ring / tree buffers are per neighbour, so the 2-rank figure
# is taken for any larger group (unmeasured beyond 2 GPUs here).
CUDA_CONTEXT_BYTES = 801_964_032
NCCL_BUFFER_BYTES = {1: 1_387_069_440 - 801_964_032, 2: 1_684_930_560 - 801_964_032}

# The caching allocator's reserve: the cached free memory a step needs on top of its live
# tensors. It is added to the allocated bytes at the phases where large tensors are allocated
# afresh (everything but the LM head's backward, whose additions -- the head's input gradient,
# the root's gathered weights and gradient, each under ~1 GiB -- are served from cached free
# blocks); ``peak_reserved_bytes`` = max(that, the allocated peak). Modelled, in bytes, as
#   fixed + fsdp2 x [FSDP2] + of_loss x (the eager loss's fp32 logits copy)
#   + of_fsdp x (one block's gathered weights + unsharded gradient + reduce-scatter input)
#   + of_moments x (the Adam moments)
#   + of_logits_grad x (the compiled loss's 16-bit logits gradient, without checkpointing)
#   + of_spill x (with checkpointing: min(logits gradient, the first step's persistent tensors
#     beyond one block's recompute working set), see ``_reserve_features``),
# fitted by ``python benchmarks/memory/compare.py --fit-reserve``: least absolute error over
# the 190 runs with memory to spare (peak reserved >= 3 GiB below the GPU) of h200_grid.json,
# spot_checks_h200.json, fsdp1_h200_grid.json, benchmarks/throughput/h200_grid.json and
# boundary_h200.json, subject to what the out-of-memory boundaries measured: the six of
# boundary_h200.json (the batch one below the largest that ran fits, the first that ran out
# of memory does not, by >= 0.5 GiB) and the spot checks' two (torch backend, eager loss);
# every other run that ran fits and every run that ran out of memory does not. Held out by
# configuration family (leave-one-family-out) see the README ("The fit decision at the
# boundary"). What each term stands for (the caching allocator rounds blocks > 1 MiB to
# 2 MiB and splits cached segments best-fit; a tensor that finds no free block large enough
# is a new segment, and at the limit only segments with no live block are given back):
#  - fixed 1.25 GiB: small-block pools (2 MiB / 20 MiB segments), workspaces' segments;
#    fsdp2 0 (fitted): FSDP2's extra over FSDP1 is carried by the moments and FSDP terms;
#  - of_loss 0.70: the eager cross-entropy's fp32 copy, log-softmax output and gradient
#    (three tensors of 4 bytes per logit freed and re-made in another order; 1b torch
#    b16/b17 at 2048: 12.7 / 14.0 GiB above allocated);
#  - of_fsdp 1.28: FSDP2's all-gather / reduce-scatter buffers are allocated on their own
#    streams, whose cached blocks the compute stream does not reuse;
#  - of_moments 0.386: AdamW creates its moments lazily in the first optimizer step, inside the
#    free blocks the first step's activations left, so the next forward's activations no
#    longer fit the holes they came from (3b/8b at equal tokens hold 5-9 GiB more than 1b);
#  - of_logits_grad 0.454 (no checkpointing): the next forward's saved activations that the
#    moments displaced land in the cached logits segments, splitting them, so the logits
#    gradient (one block of 2 bytes per logit) needs a new segment while the split one stays
#    pinned (1b s2048 compiled: 12.5 GiB above the loss backward at b32; at b35 the 17.1 GiB
#    logits gradient failed with 8.6 GiB free beyond it);
#  - of_spill 0.294 (checkpointing): with checkpointing the cache beside the loss segments is
#    one block's recompute, so the gradients and moments of the first step that do not fit
#    there split the logits gradient's segment (3b s4096 b32: 35.9 GiB of gradients and moments
#    beside a 14.5 GiB working set: the 31.3 GiB logits gradient failed with 17.2 GiB free
#    beyond it; 1b s4096 b53: 13.8 GiB beside 20.3 GiB: ran with 5.9 GiB, 4.5 GiB reserve).
# The compiled logits gradient itself is one segment of its own: no term in it with
# checkpointing (1b s4096 b53: a 51.9 GiB gradient, 4.5 GiB above allocated). The previous
# reserve (0.67 x that gradient) answered 2-13 batches below the measured boundaries.
ALLOCATOR_RESERVE_FIXED = int(1.250 * GiB)
ALLOCATOR_RESERVE_FSDP2 = int(0.000 * GiB)
ALLOCATOR_RESERVE_OF_LOSS = 0.702
ALLOCATOR_RESERVE_OF_FSDP = 1.276
ALLOCATOR_RESERVE_OF_MOMENTS = 0.386
ALLOCATOR_RESERVE_OF_LOGITS_GRAD = 0.454
ALLOCATOR_RESERVE_OF_SPILL = 0.294
# The fitted coefficients in the order of ``reserve_features`` (constant first).
RESERVE_COEFFICIENTS = (ALLOCATOR_RESERVE_FIXED, ALLOCATOR_RESERVE_FSDP2, ALLOCATOR_RESERVE_OF_LOSS,
                        ALLOCATOR_RESERVE_OF_FSDP, ALLOCATOR_RESERVE_OF_MOMENTS,
                        ALLOCATOR_RESERVE_OF_LOGITS_GRAD, ALLOCATOR_RESERVE_OF_SPILL)

# Under expandable segments (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, the trainer's
# default since issue 41; ``TrainingSetup.expandable_segments``) the allocator grows one mapped
# segment per stream instead of caching fixed-size ones, so a large tensor never waits for a
# free block of its own size: fragmentation does not block an allocation, and at the limit the
# allocator unmaps its cached pages and retries. The fit decision is then the allocated peak +
# CUDA context + a small constant. Fitted by ``python benchmarks/memory/compare.py
# --fit-expandable`` on the TE boundary searches of one H100 (boundary_h100_te.json, 2026-12-06:
# 3b L8 s2048 fp8 largest 27, 8b L6 s4096 ckpt largest 21): the largest constant with which
# every run that ran fits (the room left at 8b b21: 1.11 GiB), above the room of every run that
# ran out of memory (-0.66 GiB at 3b b28); checked on the torch backend's boundaries
# (boundary_h100_torch.json), never fitted on (benchmarks/memory/README.md).
ALLOCATOR_RESERVE_EXPANDABLE = int(1.10 * GiB)
# What the allocator keeps cached above the allocated peak under expandable segments when it
# has memory to spare (median 4.4 GiB, 1.5-13.5 GiB over the H100 throughput runs). A step
# whose allocated peak + context + this cache does not fit the GPU still runs (the reserve
# above is what it needs), but the allocator gives pages back and maps them again every step:
# near the limit the boundary runs were 8-29% slower per token (benchmarks/memory/README.md).
# Same features as the default allocator's reserve (``reserve_features``), least absolute
# error over the 100-odd throughput runs of benchmarks/throughput/raw/session_v6_h100/ whose
# allocated peak the estimate predicts (``compare.py --fit-expandable``).
EXPANDABLE_CACHE_COEFFICIENTS: tuple[float, ...] = (int(0.394 * GiB), 0.0, 0.0, 0.0, 0.389, 0.188, 0.105)
# The phase whose additions over the loss backward come out of cached free blocks.
_SERVED_FROM_CACHE = "LM head backward"

# ---------------------------------------------------------------------------
# The estimate
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    setup: TrainingSetup
    gpu: str
    gpu_memory_bytes: int
    peak_allocated_bytes: int  # predicts torch.cuda.max_memory_allocated()
    peak_bytes: int  # device memory needed at the peak (reserved + CUDA context)
    phase: str  # where the peak happens
    breakdown: dict[str, int] = field(default_factory=dict)  # sums to peak_bytes
    parameters: int = 0
    # Device memory at which the step runs at full speed: the allocated peak, the CUDA context
    # and what the allocator keeps cached with memory to spare (under expandable segments more
    # than ``peak_bytes``: past it the allocator unmaps and remaps pages every step).
    full_speed_bytes: int = 0

    @property
    def peak_reserved_bytes(self) -> int:
        """Predicts ``torch.cuda.max_memory_reserved()``: allocated plus the allocator's reserve."""
        return self.peak_allocated_bytes + self.breakdown.get("allocator_reserve", 0)

    def to_dict(self) -> dict[str, Any]:
        s = self.setup
        return {
            "peak_bytes": self.peak_bytes,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "peak_phase": self.phase,
            "full_speed_bytes": self.full_speed_bytes,
            "breakdown": dict(self.breakdown),
            "gpu": self.gpu,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "parameters": self.parameters,
            "precision": s.precision,
            "batch_size": s.batch_size,
            "seq_length": s.seq_length,
            "activation_checkpointing": s.activation_checkpointing,
            "world_size": s.world_size,
            **s.optimizer_settings(),
            "model": asdict(s.model),
        }


def estimate(setup: TrainingSetup, gpu: hardware.GPU | str) -> Estimate:
    """Predicted peak memory per GPU of ``setup`` on ``gpu`` (a steady-state step); a bad
    setup is a UserError naming its field."""
    return estimate_checked(setup.validate(), hardware.gpu(gpu) if isinstance(gpu, str) else gpu)


def estimate_checked(s: TrainingSetup, g: hardware.GPU) -> Estimate:
    """:func:`estimate` of a setup already checked (``TrainingSetup.validate``), as the
    planner's are: its search estimates hundreds of setups of one checked request."""
    terms = _Terms(s, g)
    phase, parts = max(terms.phases(), key=lambda item: sum(item[1].values()))
    allocated = int(round(sum(parts.values())))
    breakdown = {k: int(round(parts.get(k, 0.0))) for k in ALLOCATED_PARTS}
    breakdown["cuda_context"] = CUDA_CONTEXT_BYTES + NCCL_BUFFER_BYTES[min(s.world_size, 2)]
    # Rounding each part can move the sum by a byte or two: make the parts add up.
    allocated = sum(breakdown[k] for k in ALLOCATED_PARTS)
    features = _reserve_features(terms)
    if s.expandable_segments:
        breakdown["allocator_reserve"] = ALLOCATOR_RESERVE_EXPANDABLE
        cache = max(ALLOCATOR_RESERVE_EXPANDABLE,
                    int(round(allocator_reserve(features, EXPANDABLE_CACHE_COEFFICIENTS))))
    else:
        reserve = allocator_reserve(features)
        breakdown["allocator_reserve"] = max(0, int(round(_binding_allocated(terms) + reserve))
                                             - allocated)
        cache = breakdown["allocator_reserve"]
    return Estimate(
        setup=s,
        gpu=g.name,
        gpu_memory_bytes=g.memory_bytes,
        peak_allocated_bytes=allocated,
        peak_bytes=allocated + breakdown["cuda_context"] + breakdown["allocator_reserve"],
        phase=phase,
        breakdown=breakdown,
        parameters=s.model.total_params(),
        full_speed_bytes=allocated + breakdown["cuda_context"] + cache,
    )


def reserve_features(setup: TrainingSetup, gpu: hardware.GPU | str) -> tuple[float, ...]:
    """What the allocator reserve is modelled from (``allocator_reserve``), in the order of
    ``RESERVE_COEFFICIENTS`` without the constant: (FSDP2 or not, the eager loss's fp32
    logits, one block's FSDP transients, the Adam moments, the compiled logits gradient
    without checkpointing, the checkpointed spill), in bytes."""
    g = hardware.gpu(gpu) if isinstance(gpu, str) else gpu
    return _reserve_features(_Terms(setup.validate(), g))


def binding_allocated(setup: TrainingSetup, gpu: hardware.GPU | str) -> float:
    """The allocated bytes the reserve is added to: the largest phase but the LM head's
    backward (whose additions are served from cached blocks, see the constants)."""
    g = hardware.gpu(gpu) if isinstance(gpu, str) else gpu
    return _binding_allocated(_Terms(setup.validate(), g))


def _binding_allocated(terms: _Terms) -> float:
    plain_head = not _emulated_linears(terms.s)  # an emulated head makes fp32 copies: large
    return max(sum(parts.values()) for name, parts in terms.phases()
               if not (plain_head and name == _SERVED_FROM_CACHE))


def _reserve_features(terms: _Terms) -> tuple[float, ...]:
    s = terms.s
    n = float(terms.tokens) * s.model.vocab_size
    compiled = s.loss_kernel == "compiled"
    logits_grad = n * terms.c if compiled else 0.0
    eager_fp32 = 0.0 if compiled else n * 4.0
    # The first step's persistent tensors (sharded gradients, Adam moments) beyond what one
    # checkpointed block's recompute leaves cached, bounded by the segment they split.
    spill = max(0.0, terms.states + terms.grads_full - terms.act_layer - terms.act_work)
    ac = s.activation_checkpointing
    return (float(s.fsdp_version == 2), eager_fp32,
            terms.block_gathered + terms.block_grad_unsharded + terms.block_rs_buffer,
            terms.states, 0.0 if ac else logits_grad, min(spill, logits_grad) if ac else 0.0)


def allocator_reserve(features: tuple[float, ...],
                      coefficients: tuple[float, ...] = RESERVE_COEFFICIENTS) -> float:
    """Bytes of cached free memory the step needs on top of its binding allocation."""
    return coefficients[0] + sum(c * f for c, f in zip(coefficients[1:], features, strict=True))


def phases(setup: TrainingSetup, gpu: hardware.GPU | str) -> list[tuple[str, dict[str, float]]]:
    """Allocated bytes by part at each point of the step the model considers."""
    g = hardware.gpu(gpu) if isinstance(gpu, str) else gpu
    return _Terms(setup.validate(), g).phases()
