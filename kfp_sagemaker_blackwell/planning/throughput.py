"""Predicted step time, tokens/s per GPU, MFU and cost of a training step (torch-free, ~1 ms).

The estimator beside this module says whether a configuration fits; this one says how
fast it runs and what it costs. A step of this project's trainer (FSDP2 over
``world_size`` GPUs, TransformerEngine layers, fp32 master weights, fused AdamW, the
full-vocabulary cross-entropy, a bf16 LM head) is taken apart into the work the GPU
does, each part timed at the rate that bounds it:

- **GEMMs** (the blocks' linear layers: forward, data gradient and weight gradient, and
  the forward again under activation checkpointing) at a shape-dependent efficiency of
  the precision's dense tensor-core peak, or at HBM bandwidth when they are too thin to
  be compute-bound; the LM head always in bf16 (the trainer's high-precision LM head);
- **quantisation** of the GEMM inputs of each low-precision recipe (amax, scaling, casts,
  transposes; delayed vs current vs block scaling vs MXFP8 vs NVFP4 differ) as
  memory-bound work;
- **attention** (flash / cuDNN fused, causal) by sequence length and head size, in bf16
  for every recipe (TE keeps dot-product attention in high precision);
- **elementwise** work (norms, residual adds, rotary, the MLP activation, layout copies)
  and the **cross-entropy** over the full vocabulary at HBM bandwidth;
- the **optimizer step** (AdamW, gradient clipping) and FSDP2's copy-in / copy-out, at
  HBM bandwidth;
- FSDP's **all-gather / reduce-scatter** over NVLink (the instance network across
  instances), overlapped with compute except where it is longer than the compute it
  hides behind, plus a measured multi-GPU cost;
- a **CPU floor**: eager PyTorch + TE launch kernels from Python; a step cannot be
  faster than the host can issue it.

Every constant is a field of :class:`Constants`, its value and source in the versioned
calibration data of ``planning/calibration/`` (one file per model version and GPU); GPU spec figures live in
``kfp_sagemaker_blackwell.catalog.hardware.GPUS`` (datasheets); efficiencies are calibrated on the trainer's
H200 runs (``benchmarks/throughput/``, ``benchmarks/trainer/``) or, for Blackwell, come
from published GEMM measurements and are labelled "predicted, not measured".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.planning import measured_parts, pricing
from kfp_sagemaker_blackwell.planning.throughput_constants import (
    ACCURACY,  # noqa: F401 (read from here)
    BLACKWELL_SOURCE,
    CALIBRATION,  # noqa: F401 (read from here)
    CALIBRATION_FILES,  # noqa: F401 (read from here)
    CALIBRATION_KINDS,  # noqa: F401 (read from here)
    DEFAULT,
    H100_SOURCE,  # noqa: F401 (read from here)
    HELD_OUT_MEDIAN_ERROR,  # noqa: F401 (read from here)
    HELD_OUT_WORST_TOO_FAST,  # noqa: F401 (read from here)
    HOPPER_SOURCE,
    MEASURED_SOURCES,
    MODEL_NAME,  # noqa: F401 (read from here)
    OTHER_SOURCE,
    RUNTIME_MARGIN,  # noqa: F401 (read from here)
    RUNTIME_SAFETY_ALLOWANCE,  # noqa: F401 (read from here)
    Constants,
    accuracy_for,  # noqa: F401 (read from here)
    calibration_values,  # noqa: F401 (read from here)
    constants_for,
    load_calibration,  # noqa: F401 (read from here)
)
from kfp_sagemaker_blackwell.planning.training_setup import DTYPE_BYTES, TrainingSetup

# The part names of a prediction, in the order a reader goes through a step.
PARTS = (
    "gemm", "lm_head", "attention", "quantization", "elementwise", "loss", "optimizer",
    "fsdp_copies", "communication_exposed", "multi_gpu", "cpu_bound_wait", "step_fixed",
)


def _arch(gpu: hardware.GPU) -> str:
    cc = gpu.compute_capability
    if cc >= (10, 0):
        return "blackwell"
    if cc >= (9, 0):
        return "hopper"
    return "other"


@dataclass(frozen=True)
class Prediction:
    """Predicted time of one optimizer step per GPU and what follows from it."""

    step_seconds: float
    tokens_per_s_per_gpu: float
    mfu: float  # trainer's convention: flops_per_token x tokens/s / the precision's peak
    parts: dict[str, float]  # seconds per part; they add up to step_seconds
    gpu: str
    precision: str
    world_size: int
    tokens_per_step_per_gpu: int
    source: str
    bound: str  # what limits the step: "compute", "host (CPU launch)" or "communication"
    cost_usd_per_billion_tokens: float | None = None
    instance_type: str = ""
    instance_count: int = 0
    price_usd_per_instance_hour: float | None = None
    price_source: str = ""  # where the price comes from (kfp_sagemaker_blackwell.planning.pricing)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def speedup_over(self, other: Prediction) -> float:
        return self.tokens_per_s_per_gpu / other.tokens_per_s_per_gpu

    def run_seconds(self, steps: int) -> float:
        return self.step_seconds * steps

    def run_cost_usd(self, steps: int) -> float | None:
        """Cost of ``steps`` optimizer steps on the instances (None without a price)."""
        if self.price_usd_per_instance_hour is None or not self.instance_count:
            return None
        price = pricing.Price(self.price_usd_per_instance_hour, self.price_source)
        return pricing.cost(price, self.instance_count, self.run_seconds(steps)).amount


# ---------------------------------------------------------------------------
# The parts of a step
# ---------------------------------------------------------------------------


def _gemm_kind(precision: str) -> str:
    """The GEMM a precision runs: current scaling runs the same FP8 GEMM as delayed."""
    return {"fp32": "tf32", "bf16": "bf16", "fp16": "bf16", "fp8-current": "fp8"}.get(
        precision, precision)


def _sat(d: float, half: float) -> float:
    return d / (d + half)


def gemm_seconds(m: int, n: int, k: int, precision: str, gpu: hardware.GPU,
                 c: Constants = DEFAULT) -> float:
    """One GEMM (m x k) @ (k x n): compute-bound at the shape's efficiency of the
    precision's peak, or memory-bound on its operands, whichever is longer."""
    kind = _gemm_kind(precision)
    peak = gpu.peak_for(precision) or gpu.peak_for("bf16") or 1.0
    arch = _arch(gpu)
    eff = c.efficiency(arch, kind) * _sat(m, c.gemm_half_dim) * _sat(n, c.gemm_half_dim) * \
        _sat(k, c.gemm_half_dim)
    flops = 2.0 * m * n * k
    in_bytes = {"tf32": 4.0, "bf16": 2.0, "nvfp4": 0.5625}.get(kind, 1.0)
    moved = (m * k + k * n) * in_bytes + m * n * 2.0
    return max(flops / (peak * 1e12 * eff), moved / _hbm(gpu, c), c.kernel_floor_s)


def _hbm(gpu: hardware.GPU, c: Constants) -> float:
    eff = c.hbm_efficiency if _table(gpu, c) is not None else c.hbm_efficiency_other
    return (gpu.hbm_tb_s or 1.0) * 1e12 * eff


def _linears(s: TrainingSetup) -> list[tuple[int, int]]:
    """(fan_in, fan_out) of one block's linear layers (fused QKV, proj, fc1, fc2)."""
    m = s.model
    h, kv, f = m.hidden_size, m.kv_dim, m.ffn_hidden_size
    fc1 = 2 * f if m.mlp == "swiglu" else f
    return [(h, h + 2 * kv), (h, h), (h, fc1), (f, h)]


def _table(gpu: hardware.GPU, c: Constants) -> measured_parts.PartsTable | None:
    return c.parts_tables.get(gpu.name)


def _measured_recipe(s: TrainingSetup, gpu: hardware.GPU, c: Constants) -> tuple[str, bool] | None:
    """The table's recipe and kind (plain matmul or te.Linear) that times this setup's
    block linears, None where the GPU's table has no such measurement."""
    table = _table(gpu, c)
    if table is None or s.precision == "fp32":
        return None
    if s.backend == "torch":  # nn.Linear in bf16: the same cuBLAS GEMMs as te.Linear's
        return ("bf16", False) if "bf16" in table.recipes() and not s.low_precision else None
    recipe = "bf16" if s.precision == "fp16" else s.precision
    return (recipe, False) if recipe in table.recipes() else None


def _block_gemms(s: TrainingSetup, gpu: hardware.GPU, c: Constants) -> tuple[float, float]:
    """Seconds of one block's GEMMs per micro-batch: (forward, data + weight gradients).
    Measured linear layers (forward + backward, interpolated at the step's shapes) split
    by FLOPs: the forward does a third."""
    t = s.batch_size * s.seq_length
    fwd = bwd = 0.0
    measured = _measured_recipe(s, gpu, c)
    table = _table(gpu, c)
    if measured is not None and table is not None:
        for fan_in, fan_out in _linears(s):
            both = (table.linear_seconds(t, fan_out, fan_in, measured[0], measured[1]) or 0.0) \
                * c.parts_linear_scale
            fwd += both / 3.0
            bwd += both * 2.0 / 3.0
        return fwd, bwd
    for fan_in, fan_out in _linears(s):
        fwd += gemm_seconds(t, fan_out, fan_in, s.precision, gpu, c)
        bwd += gemm_seconds(t, fan_in, fan_out, s.precision, gpu, c)  # dgrad
        bwd += gemm_seconds(fan_in, fan_out, t, s.precision, gpu, c)  # wgrad
    return fwd, bwd


def _lm_head(s: TrainingSetup, gpu: hardware.GPU, c: Constants) -> float:
    m = s.model
    if not m.vocab_size:
        return 0.0
    t = s.batch_size * s.seq_length
    p = "fp32" if s.precision == "fp32" else "bf16"  # the trainer's high-precision LM head
    h, v = m.hidden_size, m.vocab_size
    table = _table(gpu, c)
    if table is not None and p == "bf16":  # the trainer's Linear: plain bf16 matmuls
        measured = table.linear_seconds(t, v, h, "bf16")
        if measured:
            return measured * c.parts_linear_scale
    return (gemm_seconds(t, v, h, p, gpu, c) + gemm_seconds(t, h, v, p, gpu, c)
            + gemm_seconds(h, v, t, p, gpu, c))


def _attention(s: TrainingSetup, gpu: hardware.GPU, c: Constants) -> tuple[float, float]:
    """One block's causal attention per micro-batch: (forward, backward) seconds."""
    m = s.model
    seq, d = s.seq_length, m.head_dim
    table = _table(gpu, c)
    key = s.backend + ("-gqa" if s.backend == "torch" and m.num_kv_heads != m.num_heads else "")
    factor = c.attention_backend_factor.get(key, 1.0)
    measured = table.attention_seconds(s.batch_size, seq, m.num_heads, d) if table else None
    if measured is not None and s.precision != "fp32":
        return measured[0] * factor, measured[1] * factor
    # QK^T and PV: 2 x 2 x seq^2 x head_dim per head and sequence, half of it causal.
    fwd_flops = 2.0 * s.batch_size * seq * seq * m.hidden_size
    peak = (gpu.peak_for("fp32" if s.precision == "fp32" else "bf16") or 1.0) * 1e12
    shape = _sat(seq, c.attention_half_seq_other) * _sat(d, c.attention_half_head_dim_other)
    e_fwd, e_bwd = c.attention_efficiency[_arch(gpu)]
    fwd = fwd_flops / (peak * e_fwd * shape)
    bwd = fwd_flops * c.attention_bwd_flops_ratio / (peak * e_bwd * shape)
    return max(fwd * factor, c.kernel_floor_s), max(bwd * factor, 2 * c.kernel_floor_s)


def _elementwise_bytes(s: TrainingSetup) -> tuple[float, float, int]:
    """One block's memory-bound elementwise traffic per token: (forward, backward) bytes,
    and the number of such kernels per micro-batch (forward + backward)."""
    m = s.model
    h, kv, f = m.hidden_size, m.kv_dim, m.ffn_hidden_size
    b = DTYPE_BYTES[s.compute_dtype]
    # Two norms (read x, write y; backward reads x and dy, writes dx), two residual adds
    # (read 2, write 1, both directions), the attention layout copies of q, k, v.
    fwd = 2 * 2 * h * b + 2 * 3 * h * b + 2 * (h + 2 * kv) * b
    bwd = 2 * 3 * h * b + 2 * 3 * h * b + 2 * (h + 2 * kv) * b
    if m.rotary:  # q and k rotated (read + write) in both directions
        fwd += 2 * (h + kv) * b
        bwd += 2 * (h + kv) * b
    if m.mlp == "swiglu":  # silu(gate) * up: read 2f, write f; backward reads 3f, writes 2f
        fwd += 3 * f * b
        bwd += 5 * f * b
    else:  # bias + GELU: read f, write f; backward reads 2f, writes f
        fwd += 2 * f * b
        bwd += 3 * f * b
    kernels = 12 + (4 if m.rotary else 0)
    return fwd, bwd, kernels


def _quantised_elements(s: TrainingSetup) -> tuple[float, float, int]:
    """One block's elements quantised per micro-batch: (forward inputs incl. weights,
    backward output-gradients), and the number of tensors quantised."""
    t = s.batch_size * s.seq_length
    lin = _linears(s)
    weights = sum(i * o for i, o in lin)
    fwd = t * sum(i for i, _ in lin) + weights
    bwd = t * sum(o for _, o in lin)
    return float(fwd), float(bwd), 3 * len(lin)


def _block_parts(s: TrainingSetup, gpu: hardware.GPU, c: Constants) -> dict[str, float]:
    """Seconds per micro-batch of all blocks: GEMMs, attention, quantisation, elementwise
    (recomputation under activation checkpointing included)."""
    t = s.batch_size * s.seq_length
    layers = s.model.num_layers
    rec = 1.0 if s.activation_checkpointing else 0.0
    hbm = _hbm(gpu, c)
    g_fwd, g_bwd = _block_gemms(s, gpu, c)
    a_fwd, a_bwd = _attention(s, gpu, c)
    e_fwd, e_bwd, e_kernels = _elementwise_bytes(s)
    elementwise = (t * (e_fwd * (1 + rec) + e_bwd) / hbm
                   + e_kernels * (1 + rec / 2) * c.kernel_floor_s)
    quant = 0.0
    if s.low_precision and s.backend == "te":
        arch = _arch(gpu)
        per = c.quant_bytes_per_element[arch].get(s.precision, 4.0)
        q_fwd, q_bwd, tensors = _quantised_elements(s)
        quant = (per * (q_fwd * (1 + rec) + q_bwd) / hbm
                 + tensors * c.quant_kernels.get(s.precision, 1.0) * c.kernel_floor_s)
    gemm = g_fwd * (1 + rec) + g_bwd
    if quant and _measured_recipe(s, gpu, c) is not None:
        # te.Linear's measured time includes its quantisation: shown as its own part,
        # taken out of the GEMMs' (at most half of the measured time)
        quant = min(quant, 0.5 * gemm)
        gemm -= quant
    fixed = c.block_fixed_s.get(s.backend, 0.0) * (2 + rec) if _table(gpu, c) else 0.0
    return {
        "gemm": layers * gemm,
        "attention": layers * (a_fwd * (1 + rec) + a_bwd),
        "quantization": layers * quant,
        "elementwise": layers * (elementwise + fixed),
    }


def _loss(s: TrainingSetup, gpu: hardware.GPU, c: Constants) -> float:
    m = s.model
    if not m.vocab_size:
        return 0.0
    t = s.batch_size * s.seq_length
    b = DTYPE_BYTES[s.compute_dtype]
    # Cross-entropy over every logit, the final norm, the embedding's gather and its
    # gradient (a V x h scatter into zeros).
    per_logit = c.loss_bytes_per_logit if s.loss_kernel == "eager" else c.loss_bytes_per_logit_compiled
    moved = t * m.vocab_size * per_logit + t * m.hidden_size * b * 6 + \
        m.vocab_size * m.hidden_size * b * 2
    return moved / _hbm(gpu, c) + 8 * c.kernel_floor_s


def _param_tensors(s: TrainingSetup) -> int:
    m = s.model
    per_block = 4 + 2 * (2 if m.norm == "layernorm" else 1) + (4 if m.bias else 0)
    return m.num_layers * per_block + (2 if m.vocab_size else 0) + 1


def _optimizer(s: TrainingSetup, gpu: hardware.GPU, c: Constants) -> float:
    """AdamW and gradient clipping over this GPU's shard, once per optimizer step."""
    p = s.model.total_params() / s.world_size
    stored = DTYPE_BYTES[s.stored_param_dtype]
    master = 4 if (s.master_weights and stored != 4) else 0
    state = DTYPE_BYTES[s.optimizer_state_dtype]
    grad = stored
    # param r/w (+ master r/w), grad r, two moments r/w; clipping: grad r (norm), r/w (scale)
    per_param = 2 * stored + 2 * master + grad + 4 * state + 3 * grad
    kernels = _param_tensors(s) * c.optimizer_kernels_per_tensor * 3
    table = _table(gpu, c)
    ops = [table.optimizer_s(op) for op in ("adamw_fused_step", "clip_grad_norm")] \
        if table is not None and stored == 4 and state == 4 else []
    measured = [m for m in ops if m is not None]
    if measured and len(measured) == len(ops):  # fp32 parameters and states, as measured
        return sum(e * p + t * _param_tensors(s) for e, t in measured)
    return p * per_param / _hbm(gpu, c) + kernels * c.kernel_floor_s


def _fsdp_copies(s: TrainingSetup, gpu: hardware.GPU, c: Constants) -> float:
    """FSDP2's copies per micro-batch: casting the shard into the all-gather input and
    copying the gathered buffer out (forward and backward: reshard_after_forward), the
    unsharded gradients into the reduce-scatter input (cast to the reduce dtype), and the
    reduced shard into the sharded gradient."""
    p = s.model.total_params()
    w = s.world_size
    stored = DTYPE_BYTES[s.stored_param_dtype]
    b = DTYPE_BYTES[s.compute_dtype]
    r = DTYPE_BYTES[s.reduce_dtype] if s.precision != "fp32" else 4
    gather = p / w * (stored + b) + 2 * p * b
    reduce = p * (b + r) + p / w * (r + 2 * stored)
    scale = c.fsdp_copy_scale if _table(gpu, c) is not None else 1.0
    return scale * (2 * gather + reduce) / _stream(gpu, c)


def _stream(gpu: hardware.GPU, c: Constants) -> float:
    """Bytes/s of a streaming copy: the measured fp32 -> bf16 copy's (6 B per element) where
    the GPU has a table, else the HBM formula's."""
    table = _table(gpu, c)
    cast = table.optimizer_s("cast_fp32_to_bf16") if table is not None else None
    return 6.0 / cast[0] if cast and cast[0] else _hbm(gpu, c)


def _comm_bandwidth(gpu: hardware.GPU, world_size: int, instance: hardware.InstanceType | None,
                    c: Constants) -> float:
    """Bytes/s one GPU sends in an all-gather / reduce-scatter ring of ``world_size``."""
    per_node = instance.gpus_per_node if instance else world_size
    if instance and world_size > per_node:
        net = instance.network_gbps * 1e9 / 8 * c.network_efficiency
        return max(net / per_node, 1e6)
    if gpu.nvlink_gb_s:
        return gpu.nvlink_gb_s * 1e9 * c.nvlink_efficiency
    return c.pcie_gb_s * 1e9


def _communication(s: TrainingSetup, gpu: hardware.GPU,
                   instance: hardware.InstanceType | None, c: Constants) -> float:
    """Seconds of all-gather + reduce-scatter traffic per micro-batch (not yet overlapped)."""
    w = s.world_size
    if w == 1:
        return 0.0
    p = s.model.total_params()
    b = DTYPE_BYTES[s.compute_dtype]
    r = DTYPE_BYTES[s.reduce_dtype] if s.precision != "fp32" else 4
    frac = (w - 1) / w
    moved = p * b * frac * 2 + p * r * frac  # gathered twice (forward, backward), reduced once
    return moved / _comm_bandwidth(gpu, w, instance, c)


def _measured_host(s: TrainingSetup, gpu: hardware.GPU, c: Constants) -> tuple[float, float]:
    """(per micro-batch, per step) host seconds from the table's tiny-block stacks: the
    per-block time of the setup's recipe (the torch backend and the unquantised precisions:
    bf16's) and block kind (where the table timed it: ModelSpec.block_kind; else the Llama
    blocks') scaled by the backend's residual, the forward's share again under checkpointing;
    the stack's per-step intercept (delayed scaling's amax bookkeeping). A GPU without a table
    takes the host reference GPU's (Constants.host_reference_gpu; a recipe that GPU cannot
    run, its alias's)."""
    table = _table(gpu, c) or c.parts_tables.get(c.host_reference_gpu)
    recipe = "bf16" if s.backend == "torch" or not s.low_precision else s.precision
    layer = None
    if table is not None:
        if recipe not in table.recipes():
            recipe = c.host_recipe_alias.get(recipe, recipe)
        layer = table.layer_host_s(recipe, s.model.block_kind)
    if layer is None:
        raise ValueError(f"no measured host time for {recipe} on {gpu.name} nor on the host "
                         f"reference {c.host_reference_gpu!r}: its parts table lacks the "
                         "'layer' stacks (benchmarks/throughput/parts.py --sections layer)")
    rec = c.cpu_forward_share if s.activation_checkpointing else 0.0
    per_block = layer[0] * c.cpu_layer_scale.get(s.backend, 1.0) * (1.0 + rec)
    return s.model.num_layers * per_block, layer[1]


def _smax(a: float, b: float, k: float) -> float:
    """The soft maximum of two overlapping times, (a^k + b^k)^(1/k)."""
    top = max(a, b)  # scaled: the powers of seconds underflow at large k
    return top * ((a / top) ** k + (b / top) ** k) ** (1.0 / k) if top > 0 else 0.0


def _reduce_copy_host(s: TrainingSetup, c: Constants) -> tuple[float, float]:
    """(blocks, root) host seconds of FSDP2's reduce-scatter copy-in per optimizer step: the
    unsharded gradients of every block, and of the root unit (embedding, LM head, final norm)."""
    m = s.model
    blocks = m.num_layers * m.block_params()
    rate = c.cpu_reduce_copy_s_per_param
    return rate["block"] * blocks, rate["root"] * (m.total_params() - blocks)


def _phases(s: TrainingSetup, c: Constants, host: tuple[float, float], blocks: dict[str, float],
            fsdp_copies: float, gpu_time: float, optimizer: float) -> tuple[float, float]:
    """(host seconds, wall seconds) of one optimizer step on a GPU with measured host time.

    The trainer's step in the order it runs: each block's forward and backward, the host
    issuing one block while the GPU runs the one before (one smooth maximum per block of its
    GPU time, FSDP copies included, and its host time, its gradients' copy-in included);
    the root unit's work (LM head, loss, embedding, their FSDP copies, communication left
    exposed) against the per-step host time and the root's copy-in; then, after the
    trainer's sync (the loss and gradient norm read before ``optimizer.step()``), the
    optimizer on the GPU. Session v12 (benchmarks/throughput/README.md): one maximum over
    the whole step let a step's fixed host time hide behind GPU work the sync keeps apart."""
    k = c.host_overlap_exponent
    accum = s.gradient_accumulation_steps
    m = s.model
    layers = m.num_layers
    copy_blocks, copy_root = _reduce_copy_host(s, c)
    block_share = layers * m.block_params() / m.total_params()
    gpu_layer = (sum(blocks.values()) + fsdp_copies * block_share) * accum / layers
    host_layer = (host[0] * accum + copy_blocks) / layers
    gpu_root = gpu_time - optimizer - gpu_layer * layers
    host_root = host[1] + c.cpu_step_measured_s + copy_root
    wall = layers * _smax(gpu_layer, host_layer, k) + _smax(gpu_root, host_root, k) + optimizer
    return host_layer * layers + host_root, wall


# ---------------------------------------------------------------------------
# The prediction
# ---------------------------------------------------------------------------


def source_for(gpu: hardware.GPU) -> str:
    if gpu.name in MEASURED_SOURCES:
        return MEASURED_SOURCES[gpu.name]
    return {"hopper": HOPPER_SOURCE, "blackwell": BLACKWELL_SOURCE}.get(_arch(gpu), OTHER_SOURCE)


def predict(setup: TrainingSetup, gpu: hardware.GPU | str, *, instance_type: str = "",
            prices: dict[str, float] | pricing.PriceBook | None = None,
            constants: Constants | None = None) -> Prediction:
    """Predicted time of one optimizer step of ``setup`` on ``gpu`` (per GPU).

    ``instance_type`` gives the network between instances (a world size above its GPUs
    per node crosses it) and the price per instance-hour: a ``pricing.PriceBook``, or
    instance type -> USD overriding ``kfp_sagemaker_blackwell.planning.pricing``'s shipped table (no AWS
    call: the model stays pure). ``constants``: the GPU's own calibration by default
    (constants_for). A bad setup is a UserError naming its field."""
    return predict_checked(setup.validate(), hardware.gpu(gpu) if isinstance(gpu, str) else gpu,
                           instance_type=instance_type, prices=prices, constants=constants)


def predict_checked(s: TrainingSetup, g: hardware.GPU, *, instance_type: str = "",
                    prices: dict[str, float] | pricing.PriceBook | None = None,
                    constants: Constants | None = None) -> Prediction:
    """:func:`predict` of a setup already checked (``TrainingSetup.validate``), as the
    planners' are: they predict hundreds of setups of one checked request."""
    c = constants or constants_for(g)
    it = hardware.instance_type(instance_type) if instance_type else None
    accum = s.gradient_accumulation_steps
    blocks = _block_parts(s, g, c)
    micro = dict(blocks, lm_head=_lm_head(s, g, c), loss=_loss(s, g, c),
                 fsdp_copies=_fsdp_copies(s, g, c))
    parts = {k: v * accum for k, v in micro.items()}
    parts["optimizer"] = _optimizer(s, g, c)
    compute = sum(parts.values())
    # Communication hides behind the compute of the other units, except the first
    # all-gather and the last reduce-scatter (one unit's worth each) and whatever is
    # longer than the compute it overlaps.
    comm = _communication(s, g, it, c) * accum
    units = s.model.num_layers + 1
    exposed = comm / units + max(0.0, comm - compute) if comm else 0.0
    parts["communication_exposed"] = exposed
    parts["multi_gpu"] = c.multi_gpu_fraction * compute if s.world_size > 1 else 0.0
    gpu_time = sum(parts.values())
    cpu_time, wall = _phases(s, c, _measured_host(s, g, c), blocks, micro["fsdp_copies"],
                             gpu_time, parts["optimizer"])
    parts["cpu_bound_wait"] = wall - gpu_time
    parts["step_fixed"] = c.step_fixed_s
    step = sum(parts.values())
    if cpu_time > gpu_time:
        bound = "host (CPU launch)"
    elif exposed > 0.25 * step:
        bound = "communication"
    else:
        bound = "compute"
    tokens = s.batch_size * s.seq_length * accum
    tps = tokens / step
    peak = g.peak_for(s.precision)
    mfu = s.model.flops_per_token(s.seq_length) * tps / (peak * 1e12) if peak else math.nan
    out = Prediction(
        step_seconds=step, tokens_per_s_per_gpu=tps, mfu=mfu,
        parts={k: parts.get(k, 0.0) for k in PARTS}, gpu=g.name, precision=s.precision,
        world_size=s.world_size, tokens_per_step_per_gpu=tokens, source=source_for(g),
        bound=bound,
    )
    return _with_cost(out, s, it, prices)


def _with_cost(p: Prediction, s: TrainingSetup, it: hardware.InstanceType | None,
               prices: dict[str, float] | pricing.PriceBook | None) -> Prediction:
    if it is None:
        return p
    count = max(1, math.ceil(s.world_size / it.gpus_per_node))
    book = prices if isinstance(prices, pricing.PriceBook) else pricing.PriceBook(
        overrides=prices, lookup=False)
    price = book.price(it.name)
    per_billion = None
    if price is not None:
        seconds = 1e9 / (p.tokens_per_s_per_gpu * s.world_size)  # a billion tokens' time
        per_billion = pricing.cost(price, count, seconds).amount
    return replace(p, instance_type=it.name, instance_count=count,
                   price_usd_per_instance_hour=price.per_instance_hour if price else None,
                   price_source=price.source if price else "",
                   cost_usd_per_billion_tokens=per_billion)


def summary(p: Prediction, steps: int | None = None) -> dict[str, Any]:
    """The figures scripts read (the memory plan's and ``--json``'s keys)."""
    out: dict[str, Any] = {
        "tokens_per_s_per_gpu": round(p.tokens_per_s_per_gpu, 1),
        "step_seconds": round(p.step_seconds, 5),
        "mfu": round(p.mfu, 4) if math.isfinite(p.mfu) else None,
        "cost_usd_per_billion_tokens": (round(p.cost_usd_per_billion_tokens, 2)
                                        if p.cost_usd_per_billion_tokens is not None else None),
        "throughput_source": p.source,
        "throughput_bound": p.bound,
        "price_source": p.price_source,
    }
    if steps:
        out["run_hours"] = round(p.run_seconds(steps) / 3600.0, 4)
        cost = p.run_cost_usd(steps)
        out["run_cost_usd"] = round(cost, 2) if cost is not None else None
    return out
