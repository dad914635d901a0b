"""The memory estimator's byte counts of one setup and the tensor layouts they come from.

``_Terms`` counts them (TransformerEngine's quantised copies, the saved activations, the
loss's tensors, the backward's work); ``estimator.py`` lays them out over the step.
"""

from __future__ import annotations

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.catalog.spec import ModelSpec
from kfp_sagemaker_blackwell.planning.training_setup import (
    DTYPE_BYTES,
    TrainingSetup,
)

GiB = 2**30
MiB = 2**20


# ---------------------------------------------------------------------------
# Constants (each with its derivation)
# ---------------------------------------------------------------------------

# TransformerEngine quantised weight copies, bytes per parameter, made each forward
# from the 16-bit weight and saved for the backward GEMMs (dgrad needs the weight
# "column-wise"). Derived from the tensor layouts in TE 2.x:
# - FP8 per-tensor (DelayedScaling, Float8CurrentScaling): 1 byte data; on Hopper
#   and Ada the dgrad GEMM needs a transposed copy (FP8 GEMMs are TN-only there):
#   2 bytes. On Blackwell non-TN FP8 GEMMs exist, so TE keeps one copy: 1 byte.
# - FP8 block scaling: 1 byte data + fp32 scale per 128x128 tile (4/16384),
#   row- and column-wise copies: 2 x (1 + 4/16384).
# - MXFP8: E4M3 data + one E8M0 scale per 32 values, row- and column-wise
#   (the scales follow the direction): 2 x (1 + 1/32) = 2.0625.
# - NVFP4: E2M1 (0.5 byte) + one E4M3 scale per 16 values, row- and column-wise:
#   2 x (0.5 + 1/16) = 1.125; the fp32 global scale is per tensor.
_QUANT_WEIGHT_BYTES_PRE_BLACKWELL = {
    "fp8": 2.0,
    "fp8-current": 2.0,
    "fp8-block": 2.0 * (1 + 4 / 16384),
    "mxfp8": 2.0625,
    "nvfp4": 1.125,
}
_QUANT_WEIGHT_BYTES_BLACKWELL = dict(_QUANT_WEIGHT_BYTES_PRE_BLACKWELL, fp8=1.0)
_QUANT_WEIGHT_BYTES_BLACKWELL["fp8-current"] = 1.0

# Bytes per element of a GEMM input that TE saves quantised for the wgrad GEMM
# (only the column-wise usage is kept after the forward): FP8 1 byte (+ a
# per-tensor scale), FP8 block 1 + 4/128 (1x128 tiles for activations), MXFP8
# 1 + 1/32, NVFP4 0.5 + 1/16.
_QUANT_ACT_BYTES = {
    "fp8": 1.0,
    "fp8-current": 1.0,
    "fp8-block": 1.0 + 4 / 128,
    "mxfp8": 1.0 + 1 / 32,
    "nvfp4": 0.5 + 1 / 16,
}

# Measured on TE's examples/pytorch/fsdp/fsdp.py (benchmarks/memory/fsdp1_h200_grid.json,
# calibration split; TE 2.20, H200), per token and block, in units of the hidden size,
# from the slope of the allocated peak over tokens at 10 and 24 layers:
# - hidden dropout (0.1 there): the blocks save 2.7 x hidden bytes per token more than the
#   tensors listed in _block_saved_bytes_per_token, the same for bf16 and fp8 (62.9 vs
#   57.4 KB and 56.7 vs 51.3 KB per token per block at hidden 2048). TE's bias_dropout_add
#   (transformer_engine/pytorch/jit.py, after attention and after the MLP) keeps two
#   dropout masks, 1 byte per element each: 2 x hidden of it; the remaining 0.7 x hidden
#   is not attributed (a dropout-free fsdp.py grid was not measured).
_DROPOUT_SAVED_PER_HIDDEN = 2.0
# - Float8BlockScaling on Hopper saves 3.4 x hidden bytes per token per block more than
#   Delayed/current scaling (fsdp.py, 10 and 24 layers, 8k-33k tokens); consistent with
#   the FFN-wide fc2 input (FFN = 3 x hidden there) kept both row- and column-wise
#   (Hopper's block-scaled GEMMs are TN only). Also seen in the trainer: the 16-layer 1b
#   fp8-block row of benchmarks/throughput/h200_grid.json came out 3.6% low without it.
#   Expressed per FFN element: 3.4 / 3 = 1.13 bytes. The block backward (recomputed
#   with checkpointing) needs as much again as a transient: with checkpointing, fsdp.py
#   at 24 layers came out 6-8 KB per token low without it (the gradient's FFN-wide
#   quantised copy, likewise kept both ways).
_FP8_BLOCK_EXTRA_PER_FFN = 3.4 / 3

# - Float8CurrentScaling: the block backward peak is 12-15 KB per token above delayed
#   scaling's at 10 and 24 layers, with and without checkpointing (a transient, not a per-
#   block term): one more 16-bit tensor of the GEMM's output width (FFN 6144 x 2 bytes =
#   12.3 KB), the gradient held in high precision while its amax is taken before the cast
#   (current scaling needs the amax of the tensor it is casting; delayed scaling uses the
#   previous steps' amax and casts in one pass). Bytes per output element:
_CURRENT_SCALING_GRAD_COPY_BYTES = 2.0

# cuBLAS workspace PyTorch allocates through its caching allocator on Hopper and
# newer: CUBLAS_WORKSPACE_CONFIG default ":4096:8" = 8 x 4 MiB (torch/csrc/cuda/
# CUDABlas / CublasHandlePool.cpp); TE adds its own 32 MiB + 1 KiB GEMM workspace
# (transformer_engine/pytorch/module/base.py get_cublas_workspace_size_bytes).
_TORCH_CUBLAS_WORKSPACE = 32 * MiB
_TE_CUBLAS_WORKSPACE = 32 * MiB + 1024


class _Terms:
    """The byte counts of one setup; ``phases()`` lays them out over the step."""

    def __init__(self, s: TrainingSetup, gpu: hardware.GPU) -> None:
        self.s = s
        m = s.model
        self.tokens = s.batch_size * s.seq_length  # per GPU
        self.c = DTYPE_BYTES[s.compute_dtype]
        self.layers = m.num_layers
        self.p_block = m.block_params()
        self.p_root = m.total_params() - m.num_layers * self.p_block  # embedding, head, final norm
        self.p_total = m.total_params()
        blackwell = gpu.compute_capability >= (10, 0)
        qtable = _QUANT_WEIGHT_BYTES_BLACKWELL if blackwell else _QUANT_WEIGHT_BYTES_PRE_BLACKWELL
        self.te_low = s.backend == "te" and s.low_precision
        # Linear weights of one block (what TE quantises); norms and biases stay 16-bit.
        self.p_block_linear = _block_linear_weights(m)
        self.q_weight = qtable[s.precision] if self.te_low else 0.0
        self._sharded_states()
        self._gathered_buffers()
        self._activations_and_loss(blackwell)

    def _sharded_states(self) -> None:
        """Sharded, persistent states (divided by the world size)."""
        s, w = self.s, self.s.world_size
        stored = DTYPE_BYTES[s.stored_param_dtype]
        if s.quantized_model_init:
            # Linear weights kept only as TE quantised tensors (row-wise copy + the
            # column-wise copy TE derives), the rest in the 16-bit nominal dtype.
            lin = self.layers * self.p_block_linear
            self.params = (lin * self.q_weight + (self.p_total - lin) * stored) / w
            master = s.master_weights
        else:
            self.params = self.p_total * stored / w
            master = s.master_weights and stored != 4
        self.master = self.p_total * 4 / w if master else 0.0
        # FSDP casts the reduce-scattered gradient to the sharded parameter's dtype.
        self.grad_bytes = stored
        self.grads_full = self.p_total * self.grad_bytes / w
        self.grads_block = self.p_block * self.grad_bytes / w
        # AdamW: exp_avg and exp_avg_sq (Rajbhandari et al.: 16 B/param with fp32
        # master + fp32 moments + 16-bit param/grad; here the 16-bit param is the
        # gathered copy, counted in fsdp_buffers).
        self.states = 2 * self.p_total * DTYPE_BYTES[s.optimizer_state_dtype] / w
        self.optimizer_temp = (
            self.p_total * DTYPE_BYTES[s.optimizer_state_dtype] / w
            if s.optimizer == "adamw-foreach"
            else 0.0
        )

    def _gathered_buffers(self) -> None:
        """FSDP's gathered (unsharded) parameters and gradient buffers."""
        s, w = self.s, self.s.world_size
        stored = DTYPE_BYTES[s.stored_param_dtype]
        # Gathered weights are in the compute dtype (MixedPrecisionPolicy.param_dtype).
        # With quantized_model_init FSDP2 all-gathers the quantised tensors instead.
        if s.quantized_model_init:
            self.block_gathered = (
                self.p_block_linear * self.q_weight + (self.p_block - self.p_block_linear) * self.c
            )
        else:
            self.block_gathered = self.p_block * self.c
        self.root_gathered = self.p_root * self.c
        if s.fsdp_version == 1 and w == 1 and stored == self.c and not s.quantized_model_init:
            # FSDP1 at world size 1 switches to NO_SHARD (torch/distributed/fsdp/
            # _init_utils.py: "FSDP is switching to use NO_SHARD ... since the world size
            # is 1"): the FlatParameter is the parameters' own storage and, with
            # MixedPrecision.param_dtype equal to the stored dtype, no low-precision
            # copy is made (_uses_param_mixed_precision is False): nothing is gathered.
            # Measured (fsdp1_h200_grid.json): the allocated memory after an optimizer
            # step is 2 + 2 + 4 bytes per parameter (parameters, gradients, Adam moments)
            # plus the previous output, with no unsharded buffers.
            self.block_gathered, self.root_gathered = 0.0, 0
        # Unsharded gradients are produced in the compute dtype; FSDP copies them
        # into a reduce-scatter input of reduce_dtype (FSDP2 foreach_reduce).
        r = DTYPE_BYTES[s.reduce_dtype] if s.precision != "fp32" else 4
        self.reduce_bytes = r
        self.block_grad_unsharded = self.p_block * self.c
        self.block_rs_buffer = self.p_block * r
        self.root_grad_unsharded = self.p_root * self.c
        self.root_rs_buffer = self.p_root * r
        self.root_copy = self.block_copy = 0.0
        if s.unsharded:
            # --no-single-gpu-fsdp (trainer/parallel.py ``prepare``): the plain module, its
            # fp32 weights used under torch.autocast. Nothing is gathered or reduce-scattered;
            # the weights' compute copies live instead, each from its forward to its backward:
            # - the root's (embedding / LM head): autocast's cached 16-bit cast, saved by the
            #   head's forward (FSDP2's gathered root is as large, but only for the head's
            #   backward);
            # - every block's linear weights: TE casts them to 16 bits, or quantises them (FP8
            #   data and, on Hopper, its transpose: ``q_weight``), and saves the copy for the
            #   dgrad GEMM until that block's backward. Already quantised weights
            #   (quantized_model_init) need no copy; 16-bit stored weights none in 16 bits.
            # Checked against the rows of benchmarks/trainer/small_steps.json (H100, 1b b4 s4096,
            # unsharded): bf16 43.21 GiB predicted / 43.25 measured, fp8 41.21 / 41.25, fp8 +
            # quantized_model_init 42.19 / 41.25 (benchmarks/memory/README.md).
            self.block_gathered, self.root_gathered = 0.0, 0
            self.block_rs_buffer, self.root_rs_buffer = 0, 0
            self.root_copy = self.p_root * self.c
            if s.quantized_model_init:
                self.block_copy = 0.0
            elif self.te_low:
                self.block_copy = self.p_block_linear * self.q_weight
            elif stored != self.c:
                self.block_copy = self.p_block_linear * self.c

    def _activations_and_loss(self, blackwell: bool) -> None:
        """Saved activations, the loss's tensors and the GEMM workspaces."""
        s, m = self.s, self.s.model
        self.act_layer = self.tokens * _block_saved_bytes_per_token(s, blackwell)
        self.act_ckpt_layer = self.tokens * m.hidden_size * self.c  # the block's input
        self.act_work = _block_backward_work(s, self.tokens, blackwell)
        self.act_root = self.tokens * _root_saved_bytes_per_token(s)
        self.q_block = self.p_block_linear * self.q_weight  # one block's quantised weights
        # ---- logits and loss ----
        self.loss_fwd, self.loss_bwd, self.head_bwd, self.logits_held = _loss_bytes(
            s, self.tokens
        )
        # ---- workspaces ----
        self.workspaces = float(
            _TORCH_CUBLAS_WORKSPACE + (_TE_CUBLAS_WORKSPACE if s.backend == "te" else 0)
        )

    # Each phase: (name, {part: bytes}).
    def phases(self) -> list[tuple[str, dict[str, float]]]:
        """The step laid out as (name, {part: bytes}): the end of forward with the loss and
        the LM head's backward, the backward of the last and of the first block, the end of
        backward and the optimizer step."""
        base = {
            "parameters": self.params,
            "master_weights": self.master,
            "optimizer_states": self.states,
            "workspaces": self.workspaces,
        }
        return [
            *self._loss_phases(base),
            *(self._block_backward_phase(base, i) for i in (self.layers - 1, 0)),
            *self._end_phases(base),
        ]

    def _held_grads(self) -> float:
        """Gradient accumulation: the trainer skips the reduce-scatter on all but the
        last micro-batch (set_requires_gradient_sync(False)), so FSDP2 keeps every
        unit's *unsharded* gradient, accumulated in the reduce dtype
        (FSDPParam.unsharded_accumulated_grad), through the next micro-batches:
        P x reduce bytes, not divided by the world size. Unmeasured here."""
        return self.p_total * self.reduce_bytes if self.s.gradient_accumulation_steps > 1 else 0.0

    def _graph_grads(self) -> float:
        """``cuda_graphs``: every block's weight gradients, through the whole step.

        ``te.make_graphed_callables`` captures each block's backward with its weight
        gradients as the graph's static outputs, in the graphs' private pool, and keeps them
        (the trainer's ``.grad`` aliases them): they exist from the first forward on, where
        the eager step has none before its backward. Not a fit: the 21 graphed footprints
        measured (allocated peak + the pool's free part, H100, sessions v15 and v18, 1b and
        te-fsdp-example, 2k-16k tokens, bf16, fp8 and fp8 + qinit) exceed the unsharded eager
        estimate by 0.7-3.4 GiB, never by more than this term (3.6 GiB at 1b): an over-estimate
        of up to 15% below 16k tokens (benchmarks/memory/README.md, "CUDA graphs")."""
        return self.layers * self.grads_block if self.s.cuda_graphs else 0.0

    def _with_graph_grads(self, eager: float) -> float:
        """The eager step's gradients ``eager`` with the graphs' static ones: the same memory
        with one micro-batch per step (``.grad`` aliases them), beside it when accumulating
        micro-batches (TE clones each returned gradient: ``clone_param_grads_on_return``)."""
        graphs = self._graph_grads()
        return eager + graphs if self._held_grads() else max(eager, graphs)

    def _live_copies(self, saved_blocks: int) -> float:
        """The unsharded model's weight copies (``root_copy``, ``block_copy``) while
        ``saved_blocks`` blocks hold theirs; with checkpointing the forward saves none and
        only the recomputed block holds one."""
        blocks = 1 if self.s.activation_checkpointing else saved_blocks
        return self.root_copy + blocks * self.block_copy

    def _live_quant(self, block: int) -> float:
        """TE's quantised weight copies live while block ``block`` runs its backward.

        Under FSDP2: measured, they are not kept from the forward to the backward
        (h200_grid.json: fp8 minus bf16 equals the activation formats' difference alone,
        within 0.1 GB, for 1b and 3b at world size 1 and 2); only the copy of the block
        being computed is live. Taken to hold for MXFP8 / NVFP4 too (same TE code path;
        unmeasured).

        Under FSDP1 they are: with fsdp.py (FSDP1, use_orig_params=True) fp8 needs 2.0
        bytes per linear weight per block more than bf16 at any token count
        (fsdp1_h200_grid.json calibration: the fp8 - bf16 intercept grows by 83.7 MB per
        block at hidden 2048, 41.9M linear weights per block): every block's FP8 weight
        and its transpose, saved by the forward for the dgrad GEMM and freed by that
        block's backward (FSDP1's parameters are persistent views into the
        FlatParameter, which FSDP2's per-block unshard/reshard is not). With
        checkpointing the forward saves nothing and one block's copy is live."""
        if self.s.fsdp_version == 1 and not self.s.activation_checkpointing:
            return (block + 1) * self.q_block
        return self.q_block

    def _loss_phases(self, base: dict[str, float]) -> list[tuple[str, dict[str, float]]]:
        """End of forward, the loss (forward and backward of the cross-entropy) and the
        LM head's backward.

        The trainer keeps the last block's gathered parameters after forward
        (reshard_after_forward=False for it: backward needs them at once). The root unit
        (embedding, final norm, LM head) is resharded after its forward and gathered
        again for the LM head's backward: with it counted during the loss, the trainer
        runs on an H200 came out 0.48-2.05 GB (= the root's gathered size) high at world
        size 1 and 2 (spot_checks_h200.json, 1b and 8b x 8 layers); without it they agree."""
        s = self.s
        saved_per_layer = self.act_ckpt_layer if s.activation_checkpointing else self.act_layer
        fwd_acts = self.layers * saved_per_layer + self.act_root
        last_block = self.block_gathered if s.fsdp_version == 2 else 0.0
        held_grads = self._with_graph_grads(self._held_grads())
        out = []
        for name, loss, head_grad, root in (
            ("loss forward", self.loss_fwd, 0.0, 0.0),
            ("loss backward", self.loss_bwd, 0.0, 0.0),
            (
                "LM head backward",
                self.head_bwd,
                self.root_grad_unsharded * self._head_share(),
                self.root_gathered,
            ),
        ):
            out.append(
                (
                    name,
                    dict(
                        base,
                        gradients=held_grads + head_grad,
                        fsdp_buffers=root + last_block,
                        quantized_weights=self._live_copies(self.layers),
                        activations=fwd_acts,
                        logits_and_loss=loss,
                    ),
                )
            )
        return out

    def _block_backward_phase(self, base: dict[str, float], i: int) -> tuple[str, dict[str, float]]:
        """Backward of block i (blocks run backward from the last, i = L-1, to the first)."""
        done = self.layers - 1 - i  # blocks whose sharded gradients exist
        gathered = self.block_gathered * (2 if i > 0 else 1)  # current + prefetched
        if self.s.activation_checkpointing:  # block i recomputed: its full activations
            acts = (i + 1) * self.act_ckpt_layer + self.act_layer
        else:
            acts = (i + 1) * self.act_layer
        return (
            f"backward of block {i}",
            dict(
                base,
                gradients=self._with_graph_grads(self._held_grads() or done * self.grads_block)
                + self.root_grad_unsharded * self._head_share()
                + self.block_grad_unsharded,
                # Block i+1's reduce-scatter input is still in flight (FSDP2 waits on it
                # at the next reduce-scatter); none after the last.
                fsdp_buffers=self.root_gathered
                + gathered
                + (self.block_rs_buffer if i < self.layers - 1 else 0.0),
                quantized_weights=self._live_copies(i + 1) if self.s.unsharded else self._live_quant(i),
                # The final norm's and LM head's saved inputs are freed before the
                # blocks' backward; token ids and targets remain.
                activations=acts + self.act_work + self.tokens * 16,
                logits_and_loss=self.logits_held,
            ),
        )

    def _end_phases(self, base: dict[str, float]) -> list[tuple[str, dict[str, float]]]:
        """End of backward (the root's gradients, embedding + LM head, reduce-scattered)
        and the optimizer step."""
        return [
            (
                "end of backward",
                dict(
                    base,
                    gradients=self._with_graph_grads(self._held_grads() or (self.layers * self.grads_block))
                    + self.root_grad_unsharded,
                    # Measured (spot_checks_h200.json, 8b x 4 layers, peak here): the first
                    # block's reduce-scatter input is gone by the root's copy-in.
                    fsdp_buffers=self.root_gathered + self.root_rs_buffer,
                    logits_and_loss=self.logits_held,
                ),
            ),
            (
                "optimizer step",
                dict(base, gradients=self._with_graph_grads(self.grads_full), fsdp_buffers=self.optimizer_temp),
            ),
        ]

    def _head_share(self) -> float:
        """Fraction of the root's unsharded gradient present during block backward:
        the LM head's (produced before the blocks'), the embedding's comes last."""
        m = self.s.model
        if not m.vocab_size:
            return 0.0
        if m.tie_embeddings:
            return 1.0
        return 0.5


def _block_linear_weights(m: ModelSpec) -> int:
    h, kv, f = m.hidden_size, m.kv_dim, m.ffn_hidden_size
    fc1 = 2 * f if m.mlp == "swiglu" else f
    return h * (h + 2 * kv) + h * h + h * fc1 + f * h


def _block_saved_bytes_per_token(s: TrainingSetup, blackwell: bool = False) -> float:
    """Bytes per token one block saves for its backward (no checkpointing).

    Korthikanti et al. count sbh(34 + 5as/h) for a GPT block in 16-bit; flash /
    fused attention removes the 5as/h score term (only the fp32 log-sum-exp per
    head is kept), and the block shapes here differ (GQA, SwiGLU, no dropout), so
    the tensors are listed one by one from the code that runs.
    """
    m = s.model
    h, kv, f, heads = m.hidden_size, m.kv_dim, m.ffn_hidden_size, m.num_heads
    c = DTYPE_BYTES[s.compute_dtype]
    norm_stats = 4 * (2 if m.norm == "layernorm" else 1)  # fp32 rstd (and mean) per token
    lse = 4 * heads  # flash-attention fp32 log-sum-exp per head
    if s.backend == "torch":
        # trainer/model.py: norm saves its input x; qkv saves the norm output; the
        # fused qkv output stays alive through v (a view SDPA saves); rotary makes
        # new q and k (saved by SDPA); SDPA output is the proj input.
        attn = h + h + (h + 2 * kv) + h
        if m.rotary:
            attn += h + kv
        # MLP: norm input and output; SwiGLU: fc1 output (gate|up, kept by silu
        # and mul through views), silu(gate), the product (fc2 input); GELU: fc1
        # output and gelu output.
        mlp = h + h + (4 * f if m.mlp == "swiglu" else 2 * f)
        return (attn + mlp) * c + 2 * norm_stats + lse + _math_attention_bytes(s)
    # te backend (te.TransformerLayer, fused QKV, fused attention): per token,
    # - attention: the block input (for the norm's backward), the 16-bit norm output
    #   (the QKV GEMM's input), the fused QKV output (q, k, v: DotProductAttention
    #   saves views of it; RoPE adds no copy) and the attention output (the proj
    #   input); low precisions add the proj input's quantised column-wise copy;
    # - MLP: its input, the (quantised) norm output, the 16-bit fc1 output (for the
    #   activation's backward) and the (quantised) activation output (fc2's input).
    # Calibrated on h200_grid.json (TE 2.20, H200): with the rotary q/k copies of the
    # torch backend counted, bf16 rows came out 4.5-7.6 KB/token/layer high (1b/3b:
    # (h + kv) x 2 bytes); with a quantised attention norm output, fp8 rows came out
    # h bytes/token/layer low. As listed, fp8 saves f bytes/token/layer less than bf16,
    # the measured difference.
    qa = _QUANT_ACT_BYTES[s.precision] if s.low_precision else c
    fc1 = 2 * f if m.mlp == "swiglu" else f
    attn_b = h * c + h * c + (h + 2 * kv) * c + h * c + (h * qa if s.low_precision else 0)
    mlp_b = h * c + h * qa + fc1 * c + f * qa
    extra = 0.0
    if s.dropout > 0:
        extra += _DROPOUT_SAVED_PER_HIDDEN * h
    if s.precision == "fp8-block" and not blackwell:
        extra += _FP8_BLOCK_EXTRA_PER_FFN * f
    return attn_b + mlp_b + 2 * norm_stats + lse + extra


def _math_attention_bytes(s: TrainingSetup) -> float:
    """fp32 attention on the torch backend with GQA falls back to SDPA's math kernel,
    which materialises the softmax (heads x seq fp32 per token) and repeats k, v."""
    m = s.model
    if s.backend != "torch" or s.compute_dtype != "fp32" or m.num_kv_heads == m.num_heads:
        return 0.0
    return 4.0 * m.num_heads * s.seq_length + 2 * 4 * m.hidden_size


def _emulated_linears(s: TrainingSetup) -> bool:
    """The torch backend emulates FP8 / MXFP8 / NVFP4 GEMMs with ``kfp_sagemaker_blackwell.trainer.emulation``'s
    ``_EmulatedLinear`` (fp32 operands, rounded to the recipe's formats); 16-bit and
    fp32 precisions on a GPU use plain ``F.linear`` (trainer/build.py
    ``_build_torch_model``)."""
    return s.backend == "torch" and s.low_precision


def _linear_backward_work(
    s: TrainingSetup, tokens: int, fan_in: int, fan_out: int, quantised: bool = True,
    blackwell: bool = False,
) -> float:
    """Transient bytes while one linear layer runs its backward, beyond its saved
    input and the incoming gradient.

    - torch backend, emulated GEMMs (trainer/emulation.py ``_EmulatedLinear.backward``):
      fp32 copies of the gradient (4 x out per token) and of the input (4 x in),
      the rounded copies of both for dgrad and wgrad (4 x out, 4 x in), dgrad in
      fp32 and rounded (4 + 4 x in), and weight-sized fp32 tensors: the weight, its
      rounded copy, wgrad and its rounded copy plus a 16-bit cast (14 bytes/param).
      Per token 8 x out + 12 x in bytes, per parameter 14.
    - plain GEMMs (F.linear, TE): the dgrad output (c x in per token; the wgrad
      output is the unsharded gradient, counted with FSDP's buffers), plus, for TE
      low precisions, the quantised copy of the gradient (row- and column-wise).
    """
    c = DTYPE_BYTES[s.compute_dtype]
    params = fan_in * fan_out
    if _emulated_linears(s):
        return tokens * (8.0 * fan_out + 12.0 * fan_in) + 14.0 * params
    work = float(tokens * fan_in * c)
    if s.backend == "te" and s.low_precision and quantised:
        work += tokens * fan_out * 2 * _QUANT_ACT_BYTES[s.precision]
        if s.precision == "fp8-current":
            work += tokens * fan_out * _CURRENT_SCALING_GRAD_COPY_BYTES
        elif s.precision == "fp8-block" and not blackwell:
            work += tokens * fan_out * _FP8_BLOCK_EXTRA_PER_FFN
    return work


def _block_backward_work(s: TrainingSetup, tokens: int, blackwell: bool = False) -> float:
    """Transient bytes while one block runs its backward: the residual-stream
    gradients coming in and going out (2 x c x hidden per token) plus the largest
    linear layer's backward work (the MLP's first or second GEMM for common
    shapes). Checked against trainer blocks on an H200 (probe_h200.json, "blocks":
    the backward peak above its start).
    """
    m = s.model
    h, kv, f = m.hidden_size, m.kv_dim, m.ffn_hidden_size
    fc1 = 2 * f if m.mlp == "swiglu" else f
    c = DTYPE_BYTES[s.compute_dtype]
    linears = ((h, h + 2 * kv), (h, h), (h, fc1), (f, h))
    work = max(_linear_backward_work(s, tokens, i, o, blackwell=blackwell) for i, o in linears)
    return 2.0 * tokens * h * c + work


def _root_saved_bytes_per_token(s: TrainingSetup) -> float:
    """Embedding output is the first block's input (counted there); the final norm
    saves its input and the LM head its input; token ids and targets are int64."""
    m = s.model
    if not m.vocab_size:
        return 0.0
    c = DTYPE_BYTES[s.compute_dtype]
    return 2 * m.hidden_size * c + 2 * 8


def _loss_bytes(s: TrainingSetup, tokens: int) -> tuple[float, float, float, float]:
    """(loss forward peak, loss backward peak, LM-head backward peak, logits held
    through the blocks' backward), in bytes.

    ``loss_kernel="eager"``: ``F.cross_entropy(out.float().reshape(-1, V), targets)``,
    with ``out`` (the logits, c bytes per element) referenced until backward ends.
    Measured on an H200 (probe_h200.json, "loss"), per logit element above the held
    logits: forward peak 8.0 (the fp32 copy and log_softmax's saved output), 4.0 held
    after the forward, backward peak 12.0 (the saved output, nll_loss's gradient and
    log_softmax's gradient).

    ``loss_kernel="compiled"`` (the trainer's default): the same function through
    ``torch.compile``, which saves a log-sum-exp per token instead of fp32 copies and writes
    the gradient in the logits' dtype: forward c, backward 2c per element (measured on an
    H200, 1b preset, batch 4, seq 4096: 18.5 GiB below eager at bf16 and fp8;
    benchmarks/trainer/raw/like_for_like_h200.json).

    LM head backward: the logits' gradient (c) beside the held logits (c); with the
    torch backend's emulated GEMM also its fp32 copy and rounded copy (4 + 4) plus a
    16-bit cast temporary (2), and 14 bytes per head parameter
    (see ``_linear_backward_work``); TE / F.linear add the input gradient and the
    weight gradient.
    """
    m = s.model
    if not m.vocab_size:
        return 0.0, 0.0, 0.0, 0.0
    c = DTYPE_BYTES[s.compute_dtype]
    n = float(tokens) * m.vocab_size
    if s.loss_kernel == "compiled":
        # One fused reduction reads the 16-bit logits (no fp32 copy) and keeps a float32
        # log-sum-exp per token; backward writes the logits' gradient in their own dtype.
        fwd = n * c + tokens * 4.0
        bwd = n * 2 * c + tokens * 4.0
    else:
        fwd = n * (c + 8.0)
        bwd = n * (c + 12.0)
    # The LM head stays 16-bit on the te backend (the trainer's --high-precision-lm-head).
    head = n * 2 * c + _linear_backward_work(
        s, tokens, m.hidden_size, m.vocab_size, quantised=False
    )
    if _emulated_linears(s):
        head += n * 2.0  # the 16-bit cast temporary inside round_to
    return fwd, bwd, head, n * c
