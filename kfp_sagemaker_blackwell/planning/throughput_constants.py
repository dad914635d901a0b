"""The throughput model's constants, read from its versioned calibration data.

``Constants`` (one file of ``planning/calibration/`` per model version and GPU), the
held-out accuracy of the predictions per GPU and the source sentence each prediction
carries. ``throughput.py`` predicts with them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.planning import measured_parts

MODEL_NAME = "throughput model v5 (planning/throughput.py)"
# The fitted, published and datasheet constants live in versioned calibration data, one file per
# model version and GPU, each value with its kind and source (issue 36 item 3): a refit is a
# data change. throughput_v5_h200.json holds every value of Constants (the H200's, and every
# GPU's without a file of its own); a GPU's own file ("base": the file it amends) holds the
# values fitted on it and its held-out accuracy.
CALIBRATION = Path(__file__).with_name("calibration")
CALIBRATION_FILES = {"H200": "throughput_v5_h200.json", "H100": "throughput_v5_h100.json"}
CALIBRATION_KINDS = ("fitted", "measured", "published", "datasheet", "derived", "assumed")


def load_calibration(name: str) -> dict[str, Any]:
    """A calibration file of planning/calibration/ (its JSON as written)."""
    return json.loads((CALIBRATION / name).read_text())


def calibration_values(doc: dict[str, Any]) -> dict[str, Any]:
    """A calibration file's values by Constants field (JSON lists back to tuples: the
    attention efficiencies are (forward, backward) pairs)."""
    def value(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: value(x) for k, x in v.items()}
        return tuple(v) if isinstance(v, list) else v
    return {k: value(v["value"]) for k, v in doc["values"].items()}


_BASE = calibration_values(load_calibration(CALIBRATION_FILES["H200"]))


def _cal(name: str) -> Any:
    """The base calibration's value of a Constants field (a fresh copy: dataclass defaults must not share)."""
    return copy.deepcopy(_BASE[name])


def _calf(name: str) -> Callable[[], Any]:
    return lambda: _cal(name)


# The model's accuracy on configuration families left out of its fit, per GPU with measured
# parts (each GPU's prediction uses its own parts and residuals, constants_for):
# - H200 (v5, refitted in session v13): every measured H200 trainer run predicted by a fit that
#   never saw its family (benchmarks/throughput/model_accuracy.py --union-lofo ->
#   lofo_all_h200.json; its README). Every run predicted with the cross-entropy it ran (session
#   v22: measure.py ran some eager, benchmarks/throughput/loss_kernels.py; the folds re-predicted,
#   their constants kept). Median |error| 3.0% (TE, 252 runs / 56 families, three sessions:
#   2026-12-01, 12-02 and 12-07, the last one today's trainer; 4.7% as recorded before, every
#   run predicted eager); worst too fast +24.9% (3b L4 bf16 b1 s8192, 2026-12-02: predicted
#   86,869 tokens/s, measured 69,568), i.e. that run took 1.249x its predicted time (torch
#   backend: worst 18.4%). Refitted with the labels: 2.6%, +28.1% (not shipped: the worst sets
#   the margin). Session v12's fit, over the 111 runs of 12-01/02: 3.9%, +27.7%; v4: 4.2%, +26.4%.
# - H100 (session v6, 2026-12-06; refitted in session v22 with every run predicted with the
#   loss it ran): the residuals fitted on the session's grid (51 runs, 19 families) predicting
#   its held-out runs (51 runs in 24 families none of which is in the grid: model_accuracy.py
#   --session -> heldout_eval_h100_v6.json). Median |error| 2.6%; worst too fast +19.4% (3b L4
#   bf16 b1 s8192). Before the relabelling 4.2%, +15.0%; v4: 5.1%, +31.2%.
# tests/test_throughput_accuracy.py checks each against its file.
RUNTIME_SAFETY_ALLOWANCE = 0.10


@dataclass(frozen=True)
class HeldOutAccuracy:
    """A GPU's held-out accuracy: median |error| and worst too-fast miss (max(predicted /
    measured) - 1) on families left out of the fit, and the max_runtime margin that follows:
    a job past MaxRuntime is stopped (SIGTERM) before its last step, so the margin covers the
    worst held-out miss plus RUNTIME_SAFETY_ALLOWANCE (10 points) for a family further from
    the fit than any measured one (the measured families are a sample, not the bound)."""

    gpu: str
    median_error: float
    worst_too_fast: float
    record: str  # the file the figures come from (benchmarks/throughput/)
    # the held-out fp8/bf16 speed-up error (median): two rows on this GPU share its absolute
    # miss, so this is the band between them (planning/uncertainty.py)
    speedup_median_error: float

    @property
    def runtime_margin(self) -> float:
        return round(self.worst_too_fast + RUNTIME_SAFETY_ALLOWANCE, 3)


def _accuracy(gpu: str) -> HeldOutAccuracy:
    held = load_calibration(CALIBRATION_FILES[gpu])["held_out"]
    return HeldOutAccuracy(gpu, held["median_error"], held["worst_too_fast"], held["record"],
                           held["speedup_median_error"])


ACCURACY = {gpu: _accuracy(gpu) for gpu in CALIBRATION_FILES}
# The H200's: what H200 rows are priced with, and what the datasheet-only (Blackwell) band
# compounds (planning/uncertainty.py): H100 evidence alone does not move them.
HELD_OUT_MEDIAN_ERROR = ACCURACY["H200"].median_error
HELD_OUT_WORST_TOO_FAST = ACCURACY["H200"].worst_too_fast
# plan_training's runtime_margin default for H200 rows (H100 rows: ACCURACY["H100"]'s).
RUNTIME_MARGIN = ACCURACY["H200"].runtime_margin
HOPPER_SOURCE = (f"predicted by the {MODEL_NAME}: built from measured H200 parts (linear "
                 "layers, attention, per-layer host time, optimizer, the gradients' copy-in; one "
                 "H200, 2026-12-07), residuals calibrated on H200 trainer runs of 2026-12-01, "
                 "12-02 and 12-07; on configuration families left out of the "
                 f"fit, median error {HELD_OUT_MEDIAN_ERROR:.1%}, worst "
                 f"{HELD_OUT_WORST_TOO_FAST:.0%} (benchmarks/throughput/lofo_all_h200.json)")
H100_SOURCE = (f"predicted by the {MODEL_NAME}: built from measured H100 parts (linear layers, "
               "attention, per-layer host time, optimizer; one H100 80GB HBM3, 2026-12-06), "
               "residuals fitted on H100 trainer runs of the same session; on configuration "
               f"families left out of the fit, median error {ACCURACY['H100'].median_error:.1%}, "
               f"worst {ACCURACY['H100'].worst_too_fast:.0%} (benchmarks/throughput/"
               f"{ACCURACY['H100'].record})")
# The source of a prediction for a GPU whose parts were measured (Constants.parts_tables).
MEASURED_SOURCES = {"H200": HOPPER_SOURCE, "H100": H100_SOURCE}
BLACKWELL_SOURCE = (
    f"predicted, not measured: the {MODEL_NAME} with Blackwell's datasheet figures and "
    "published GEMM rates (no Blackwell GPU was available to this project)"
)
OTHER_SOURCE = f"predicted by the {MODEL_NAME} from datasheet figures (not calibrated on this GPU)"


@dataclass(frozen=True)
class Constants:
    """The model's constants. The values are read from planning/calibration/
    throughput_v5_h200.json (each with its kind and source there); the comments below say
    what each one means and how it was chosen."""

    # ---- GEMMs ----
    # Fraction of the dense peak a large GEMM reaches, by architecture and GEMM kind.
    # Hopper: fitted (with the other "calibrated" constants below) on the calibration split
    # of benchmarks/throughput/h200_grid.json by benchmarks/throughput/model_accuracy.py
    # --fit; they are effective values of this decomposition (the fp8 figure absorbs what
    # the model does not itemise), not kernel benchmarks. For scale, XLA's measured matmul
    # table (openxla/xla xla/service/gpu/model/matmul_interpolator_data.h, sm_90) has
    # 783 TFLOP/s for a 4096^3 bf16 GEMM = 0.79 of 989.
    # Blackwell: the same table's sm_100 entries: 4096^3 bf16 1417 TFLOP/s (0.63 of 2250),
    # fp8 2765 TFLOP/s (0.61 of 4500): Blackwell's GEMMs reach a smaller fraction of
    # their (doubled) peak; an fp8 GEMM is 1.95x a bf16 one. MXFP8 is taken at 0.95x the
    # fp8 fraction (the scale-factor loads; torchao's mx_formats README reports mxfp8
    # cuBLAS GEMMs somewhat below tensorwise fp8), fp8-block runs as MXFP8-class block
    # GEMMs, NVFP4 at 0.50 of the 9 PFLOP/s peak (1.6x fp8 at the GEMM: an assumption
    # checked against NVIDIA's end-to-end Llama-3-8B figures, see benchmarks/throughput).
    gemm_efficiency: dict[str, dict[str, float]] = field(default_factory=_calf("gemm_efficiency"))
    # Measured parts per GPU type (planning/measured/<gpu>_parts.json, read by
    # planning/measured_parts.py) replace the formulas wherever they have the part (v3):
    # H200: benchmarks/throughput/h200_parts.json (benchmarks/throughput/parts.py, one H200,
    # TE 2.20.2, 2026-12-07: session v13, measured in the same session as its grid and held-out
    # runs, raw/session_v13_h200/; the 2026-12-02 table before it is in git history; copied to
    # planning/measured/):
    # - GEMMs: "linear" (te.Linear forward + backward at every (K, N) of the presets, M = 2k..64k
    #   tokens, per recipe), interpolated at the step's (M, N, K) from the GPU-bound
    #   measurements (PartsTable.linear_seconds); the LM head from its bf16 shapes;
    # - attention: "attention" (TE fused attention by sequence, heads, head size);
    # - the host's time per block and per step: "layer" (stacks of 1 / 4 / 16 tiny blocks of
    #   the trainer's TECausalLM: slope and intercept over depth, PartsTable.layer_host_s);
    # - the optimizer step: "optimizer" (fused AdamW and clip_grad_norm_ per element and per
    #   tensor); FSDP2's copies at the streaming rate of the measured fp32 -> bf16 copy.
    # Not used (v5 study, benchmarks/throughput/README.md): the table's "quantisation" section
    # (te.Linear at M=128 per recipe minus bf16) is host-bound: 1.3-1.7 ms per low-precision
    # call for 4M to 201M weight elements alike, so its per-element slope (fp8 8e-13 s) is not
    # a GPU cost; and the te.Linear timings' own per-call intercept (line over M through a
    # shape's three smallest GPU-bound timings) is 0.30 ms fp8 vs 0.25 ms bf16 (medians over
    # 13 / 22 shapes; single shapes -1.5 to +1.2 ms): no FP8 per-call GPU cost beyond what the
    # interpolated timings already hold is measurable there.
    # A low-precision te.Linear below its smallest GPU-bound M scaled as bf16's time scales
    # (v5b, code at commit 23d51f4): union leave-one-family-out TE worst 26.4% -> 27.2%.
    # H100: benchmarks/throughput/h100_parts.json (the same parts.py, one H100 80GB HBM3, TE
    # 2.20.2, driver 580.159.04, 2026-12-06: session v6, benchmarks/throughput/session_v6.sh),
    # measured in the same session as the H100 trainer runs of raw/session_v6_h100/.
    parts_tables: dict[str, measured_parts.PartsTable | None] = field(
        default_factory=lambda: {"H200": measured_parts.shipped("H200"),
                                 "H100": measured_parts.shipped("H100")})
    # The trainer's linear-layer time over the parts table's (v4 residual, a scale factor per
    # table, fitted on the union of the H200 trainer runs): the table and the trainer runs
    # were timed in different sessions on lent machines (the same te.Linear shapes measured
    # 5-19% faster on 2026-12-02 than on 2026-12-01), and te.Linear alone runs without the
    # trainer's FSDP2 hooks and autocast. 1.0 reads the table as it is.
    # Considered for v4, not shipped (1.0): fitted on the union it came out at 1.044 (the
    # trainer's linear layers 4% slower than the table's on average), and the families left
    # out were predicted worse with it than without (TE worst 26.4% -> 32.6%,
    # raw/lofo_all_h200_v4c.json): the session drift is not one table-wide factor.
    parts_linear_scale: float = _cal("parts_linear_scale")
    # The residuals of the measured model (GPUs with a table), by backend, v5: fitted on every
    # measured H200 trainer run (TE: h200_grid.json 2026-12-01 + h200_heldout.json 2026-12-02,
    # 111 runs; torch: h200_torch_grid.json's 16 runs, 2026-12-02) by
    # benchmarks/throughput/model_accuracy.py --fit-union; their accuracy is measured by
    # leave-one-family-out over that union (lofo_all_h200.json):
    # - the trainer's host time per block over the tiny stack's ("layer": same TE modules
    #   without FSDP2's per-block hooks, the trainer's autocast and loss plumbing);
    cpu_layer_scale: dict[str, float] = field(default_factory=_calf("cpu_layer_scale"))
    # - the share of a block's host time that its forward takes (paid again when
    #   checkpointing recomputes it): v1's fitted 0.968 / (0.968 + 1.28) ms.
    cpu_forward_share: float = _cal("cpu_forward_share")
    # - the share of the itemised FSDP2 copy bytes a step really moves at the measured copy
    #   rate (at world size 1 some of the all-gather / reduce-scatter copies are views);
    fsdp_copy_scale: float = _cal("fsdp_copy_scale")
    # A GEMM dimension d reaches d / (d + gemm_half_dim) of the large-shape rate (tile and
    # wave quantisation; XLA's table: 1024 x 2048 x 2048 bf16 on sm_90 runs at 0.53 of
    # peak, 4096^3 at 0.79).
    gemm_half_dim: float = _cal("gemm_half_dim")
    # Fraction of HBM bandwidth the blocks' elementwise kernels and the loss reach on a GPU
    # with a measured table (a residual fitted on the union of the H200 trainer runs: v5 0.71;
    # v4's ran into its bound 0.95, as in 43 of v3's 44 union folds; read it as a scale on the
    # itemised elementwise bytes, not a bandwidth: TE fuses norms and casts into its layers).
    # Taken instead from the measured fp32 -> bf16 copy (2.89 TB/s = 0.601) the v4
    # leave-one-family-out error over the union grew (TE median 4.2% -> 4.9%, worst 26% ->
    # 34%: raw/lofo_all_h200_v4a.json), so it stays fitted. The
    # optimizer and FSDP2's copies are timed from their measurements directly.
    hbm_efficiency: float = _cal("hbm_efficiency")
    # GPUs without a measured table (Blackwell, others): the v1 fit's H200 value
    # (0.635), from before the linear layers were measured: it covered TE's small
    # quantisation kernels, which a GPU timed by the formulas still pays.
    hbm_efficiency_other: float = _cal("hbm_efficiency_other")
    # GPU time per kernel that cannot be shorter (launch, ramp-up, tail): ~4 us.
    kernel_floor_s: float = _cal("kernel_floor_s")

    # ---- attention (flash / cuDNN fused, causal) ----
    # Fraction of the bf16 peak the forward and backward kernels reach at long sequences
    # and head dim 128, (forward, backward). Hopper: FlashAttention-3 (Shah et al. 2024,
    # arXiv 2407.08608) reports ~600-740 TFLOP/s forward and ~450-550 backward on H100
    # for causal head-dim-128, cuDNN's fused attention (TE's) is in the same range;
    # calibrated on the trainer's H200 runs. Blackwell: FlashAttention-4 (Zadouri, Dao et
    # al. 2026) reaches up to 1613 TFLOP/s (0.71 of 2250) and is "up to 1.3x faster than
    # cuDNN 9.13": cuDNN forward ~0.55; the backward, bound by shared-memory traffic on
    # Blackwell, taken at the Hopper backward/forward ratio: 0.40.
    attention_efficiency: dict[str, tuple[float, float]] = field(default_factory=_calf("attention_efficiency"))
    # Sequence length and head dim at which half the rate is reached (v1 fit on the H200
    # grid; the attention of GPUs with a measured table comes from the table).
    attention_half_seq_other: float = _cal("attention_half_seq_other")
    attention_half_head_dim_other: float = _cal("attention_half_head_dim_other")
    # The backward does 2.5x the forward's FLOPs (5 GEMMs of the 2 forward's size;
    # Dao 2023, FlashAttention-2, arXiv 2307.08691).
    attention_bwd_flops_ratio: float = _cal("attention_bwd_flops_ratio")

    # ---- quantisation: HBM bytes moved per element quantised (read + writes) ----
    # From the kernels TE 2.x runs (transformer_engine/common/...):
    # - fp8 DelayedScaling: one fused cast(+transpose) kernel that also records amax for
    #   the next step: read 2 B, write 1 B (+1 B transposed copy on Hopper, whose FP8
    #   GEMMs are TN-only) = 4 (Hopper) / 3 (Blackwell);
    # - fp8 Float8CurrentScaling: an amax pass before the cast: + 2 B read = 6 / 5;
    # - fp8 block scaling (1x128 / 128x128 tiles): one kernel writing row- and
    #   column-wise copies with fp32 scales: 2 + 2 + 1/32 ~ 4.03;
    # - MXFP8: E8M0 scale per 32 values, row- and column-wise: 2 + 2 x (1 + 1/32) = 4.06;
    # - NVFP4: E2M1 + E4M3 scale per 16, row- and column-wise (2 + 2 x 0.5625 = 3.125),
    #   plus the random Hadamard transform of the weight-gradient GEMM's inputs (a
    #   second read of those: +2) and stochastic rounding of gradients (NVIDIA, "Pretraining
    #   LLMs with NVFP4", arXiv 2509.25149) = ~5.1.
    quant_bytes_per_element: dict[str, dict[str, float]] = field(default_factory=_calf("quant_bytes_per_element"))
    # Kernels per quantised tensor (each pays kernel_floor_s): amax + cast for current
    # scaling, one fused kernel otherwise (NVFP4: cast + Hadamard).
    quant_kernels: dict[str, float] = field(default_factory=_calf("quant_kernels"))

    # ---- loss: bytes per logit element (forward + backward) ----
    # The trainer upcasts the bf16 logits to fp32 and runs F.cross_entropy over the whole
    # vocabulary: forward reads 2 B and writes the fp32 copy (4), log_softmax reads 4 and
    # writes 4; backward writes nll's gradient (4), log_softmax's backward reads 8 and
    # writes 4, the cast back reads 4 and writes 2: 36 B (the same tensors the memory
    # estimator's probe measured, benchmarks/memory/probe_h200.json "loss").
    loss_bytes_per_logit: float = _cal("loss_bytes_per_logit")
    # The compiled cross-entropy (trainer/loss.py, the default on a GPU): forward reads the
    # 16-bit logits for the max and the sum of exponentials (2 + 2), backward reads them once
    # more and writes the 16-bit gradient (2 + 2): 8 B.
    loss_bytes_per_logit_compiled: float = _cal("loss_bytes_per_logit_compiled")

    # ---- optimizer and FSDP copies ----
    # Fused AdamW reads parameter, gradient and both moments and writes parameter and
    # moments; clip_grad_norm_ reads the gradients for the norm and scales them in place.
    # (Bytes per sharded parameter follow from the setup's dtypes.)
    # Kernels the optimizer step and clipping launch per parameter tensor (foreach /
    # fused kernels batch tensors; ~1 launch per 8 tensors each).
    optimizer_kernels_per_tensor: float = _cal("optimizer_kernels_per_tensor")

    # ---- communication ----
    # NCCL all-gather / reduce-scatter bus bandwidth as a fraction of NVLink's per-direction
    # bandwidth: nccl-tests on 8x H100 SXM reach ~360-380 GB/s of 450 (0.8).
    nvlink_efficiency: float = _cal("nvlink_efficiency")
    # Between instances: EFA reaches ~75% of the line rate in nccl-tests on p5 (AWS).
    network_efficiency: float = _cal("network_efficiency")
    # GPUs without NVLink exchange over PCIe 4 x16 / the host: ~20 GB/s per direction.
    pcie_gb_s: float = _cal("pcie_gb_s")
    # Extra step time when more than one GPU trains, as a fraction of the compute:
    # measured with the trainer on 2 H200s (benchmarks/trainer/README.md, FSDP scaling:
    # 95.8% bf16 and 95.6% fp8 of the 1-GPU per-GPU tokens/s) while the bytes moved take
    # under 1% of the step at NVLink bandwidth: NCCL kernels sharing SMs and HBM with the
    # compute, stream synchronisation. Taken to hold for larger groups (unmeasured).
    multi_gpu_fraction: float = _cal("multi_gpu_fraction")

    # ---- the host (CPU floor): see host_reference_gpu and the residuals below ----
    # Attention time multiplier by backend: the torch backend's
    # F.scaled_dot_product_attention(enable_gqa=True) with grouped K/V heads runs slower than
    # cuDNN's fused attention (its runs with GQA at sequence 8192, 1b and 3b, measured
    # TE's measured fused attention); v4 residual, fitted on every torch run of
    # benchmarks/throughput/h200_torch_grid.json (v3: 2.55 on its 6 calibration-torch runs).
    attention_backend_factor: dict[str, float] = field(default_factory=_calf("attention_backend_factor"))
    # (v4: refitted on every torch run, sequence 16k included, it went from 2.55 to 1.475:
    # diagnosis (c). A cost per token and query head beside it was tried, code at commit
    # 6493196, and predicted the families left out worse: torch median 5.7% -> 6.9%,
    # benchmarks/throughput/raw/lofo_all_h200_v4b.json.)
    # GPU time per block and micro-batch that no itemised part covers (the kernels between
    # the measured linear layers: TE's layer plumbing, FSDP2's per-block hooks), per pass
    # (forward, recomputed forward, backward), by backend; v5 residuals fitted on the union of the H200
    # trainer runs (v3: 0.40 ms TE, 0.61 ms torch, on the grid and the calibration-torch rows).
    block_fixed_s: dict[str, float] = field(default_factory=_calf("block_fixed_s"))
    # Host time per optimizer step outside the blocks (v5 residual, fitted on the union of the
    # H200 trainer runs: 13.5 ms; v4 44.7 ms, when one overlap over the whole step made it stand
    # in for per-parameter costs; v3 55.6 ms on the grid): the host time of the root unit's
    # work beside the root's copy-in (v5: throughput._phases), the loss's compiled-graph
    # dispatch, the step's Python.
    cpu_step_measured_s: float = _cal("cpu_step_measured_s")
    # A synchronisation per step (the trainer's timer) exposes the launch latency of the
    # step's first kernels.
    step_fixed_s: float = _cal("step_fixed_s")
    # Host and GPU overlap (kernels are queued asynchronously) but not perfectly: each
    # overlapped span (v5: every block, the root unit's work)
    # takes (gpu^k + host^k)^(1/k), a smooth maximum. The v2 fit on the H200 grid drives k
    # past 300 (a hard maximum); 40 is shipped (at most 1.7% above the maximum, where host
    # and GPU balance; the grid's in-sample median moves 1.1% -> 1.2%).
    host_overlap_exponent: float = _cal("host_overlap_exponent")
    # FSDP2's reduce-scatter copy-in on the host (torch._chunk_cat builds one int64 of
    # metadata per 2 KiB of the unsharded gradients on the CPU before its one kernel), seconds
    # per parameter, once per optimizer step (the trainer syncs gradients on the last
    # micro-batch): "block" per parameter of the blocks (host time of each block's backward),
    # "root" per parameter of the root unit (embedding, LM head, final norm: the backward's
    # last host work). Measured by benchmarks/throughput/parts.py --sections copy_in.
    cpu_reduce_copy_s_per_param: dict[str, float] = field(
        default_factory=_calf("cpu_reduce_copy_s_per_param"))
    # A GPU without measured parts takes the host time of this GPU's (its tiny-block stacks,
    # through the residuals above, and the copy-in): the host's work per block is the CPU's
    # and the software's, not the GPU's. Recipes that GPU cannot run take an alias's host time.
    # Until session v14 such a GPU had the v1 formula (a fitted host time per block, x4.28 for
    # fp8): it priced the 1b preset's fp8 step on B200 at 0.52x bf16's, and predicted as if
    # without parts of their own, Hopper runs came out up to 2.6x too fast (the study:
    # benchmarks/throughput/host_reference_study.json, code at commit 9ea1cc2).
    host_reference_gpu: str = _cal("host_reference_gpu")
    host_recipe_alias: dict[str, str] = field(default_factory=_calf("host_recipe_alias"))
    # (Session v14's study, not shipped: every recipe's host per block from bf16's stack, the
    # per-step intercept each recipe's own: union leave-one-family-out TE worst +24.9% -> +27.0%,
    # speed-up worst 0.195 -> 0.228; raw/lofo_all_h200_v14_bf16host.json, code at commit 6674402.
    # Nor the trainer's extra host per block added from bf16's stack, not scaling each recipe's:
    # median 4.7% -> 4.6%, worst +24.9% -> +26.1%, speed-up worst 0.195 -> 0.209;
    # raw/lofo_all_h200_v14_addhost.json, code at commit 4ecf7e3.)
    # The step's structure (throughput._phases, model v5): the split at the trainer's sync
    # before optimizer.step() alone was the 2026-12-02 v5a study (code at commit 23d51f4,
    # raw/lofo_all_h200_v5a.json: TE median 4.2% -> 4.0%, worst 26.4% -> 27.1%); with one
    # overlap per block and the copy-in on the host (session v12) the worst fell (README).

    def efficiency(self, arch: str, kind: str) -> float:
        table = self.gemm_efficiency[arch]
        return table.get(kind, table.get("fp8", table["bf16"]))


DEFAULT = Constants()  # v5: the H200's calibration, and every GPU's without its own


def _calibrated(gpu: str) -> Constants:
    """DEFAULT amended by ``gpu``'s own calibration file (its values; the rest the base file's)."""
    doc = load_calibration(CALIBRATION_FILES[gpu])
    assert doc.get("base") == CALIBRATION_FILES["H200"], (gpu, doc.get("base"))
    return replace(DEFAULT, **calibration_values(doc))


# Per-GPU calibrations: a GPU named here is predicted with its own values. The H100's:
# throughput_v5_h100.json, v5's residuals refitted on the H100 session of 2026-12-06 (its TE
# residuals; the torch backend keeps the base file's, refitted on 6 runs they predicted worse).
CALIBRATIONS: dict[str, Constants] = {g: _calibrated(g) for g in CALIBRATION_FILES if g != "H200"}


def constants_for(gpu: hardware.GPU | str) -> Constants:
    """The constants that predict ``gpu``: its own calibration, else the base file's (DEFAULT)."""
    g = hardware.gpu(gpu) if isinstance(gpu, str) else gpu
    return CALIBRATIONS.get(g.name, DEFAULT)


def accuracy_for(gpu: hardware.GPU | str) -> HeldOutAccuracy | None:
    """The held-out accuracy of ``gpu``'s predictions, None for a GPU without measured parts."""
    g = hardware.gpu(gpu) if isinstance(gpu, str) else gpu
    return ACCURACY.get(g.name)
