"""The same causal LM built from TransformerEngine layers (the ``te`` backend, GPU only).

Blocks are ``te.TransformerLayer`` (fused QKV, RMSNorm/LayerNorm fused into the
following GEMM, SwiGLU or GELU, causal fused attention, rotary embeddings);
the token embedding is ``nn.Embedding``, the final norm a TE norm, the LM head
``te.Linear`` (or the tied embedding weight through ``F.linear``). The FP8/FP4
recipe applies inside ``te.autocast``; blocks listed as high precision and the
LM head (``--high-precision-lm-head``, the default) run with autocast disabled.
Sharding (FSDP2, bf16 compute copies of fp32 masters) is the same as the
PyTorch backend's; initialisation uses the same per-parameter seeded draws.
Activation checkpointing is the ``checkpoint_blocks`` flag ``forward`` reads
(``te.distributed.checkpoint`` per block, which keeps the FP8 scaling state
consistent across the recomputation).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from kfp_sagemaker_blackwell.catalog.flags import TrainConfig
from kfp_sagemaker_blackwell.trainer import parallel
from kfp_sagemaker_blackwell.trainer.model import init_weights, root_output, te_init_methods
from kfp_sagemaker_blackwell.trainer.precision import Plan, high_precision_blocks, te_recipe

# The residual stream's layout through the TE blocks: "bshd" (batch first, as the rest of the
# model) or "sbhd" (sequence first, TE's default and fsdp.py's; the model then transposes the
# embeddings once in and the last hidden states once out).
INPUT_FORMAT = "bshd"
# The dtype of the parameters FSDP2 shards and the optimizer updates (fp32 masters; the blocks
# compute on bf16 copies). bf16 here is fsdp.py's arrangement (no master copy), a diagnostic the
# trainer benchmark uses to price the fp32 masters; it is not offered as a training option.
MASTER_DTYPE = torch.float32


class TECausalLM(nn.Module):
    def __init__(self, cfg: TrainConfig, hp_blocks: set[int], device: str = "meta"):
        super().__init__()
        import transformer_engine.pytorch as te

        spec = cfg.model
        self.spec = spec
        self.hp_blocks = hp_blocks
        self.high_precision_head = cfg.high_precision_lm_head
        self.checkpoint_blocks = cfg.activation_checkpointing
        norm = "RMSNorm" if spec.norm == "rmsnorm" else "LayerNorm"
        recipe = te_recipe(cfg.precision, cfg.fp8_amax_history_len)
        # With FP8 primary weights FSDP2 casts nothing (no param_dtype), so every other parameter
        # (norms, biases, embeddings) is kept in the compute dtype, bf16, as TE's FusedAdam keeps
        # the fp32 masters of all of them: an fp32 LayerNorm weight meeting a bf16 input is
        # what failed ("Data types for parameters must match", benchmarks/trainer/README.md).
        pdtype = torch.bfloat16 if cfg.quantized_model_init else MASTER_DTYPE

        def init_ctx(i: int) -> Any:
            # FP8 primary weights only for the blocks that compute in FP8: a high-precision
            # block never runs an FP8 forward, so its weights' scale would stay TE's initial 1.0.
            if cfg.quantized_model_init and i not in hp_blocks:
                return te.quantized_model_init(enabled=True, recipe=recipe, preserve_high_precision_init_val=True)
            return contextlib.nullcontext()

        def block(i: int) -> Any:
            with init_ctx(i):
                return te.TransformerLayer(
                    spec.hidden_size, spec.ffn_hidden_size, spec.num_heads,
                    num_gqa_groups=spec.num_kv_heads, layernorm_epsilon=spec.norm_eps,
                    hidden_dropout=0.0, attention_dropout=0.0, layer_number=i + 1,
                    self_attn_mask_type="causal", params_dtype=pdtype,
                    seq_length=cfg.seq_length, micro_batch_size=cfg.batch_size,
                    fuse_qkv_params=True, bias=spec.bias,
                    activation="swiglu" if spec.mlp == "swiglu" else "gelu",
                    normalization=norm, device=device, attn_input_format=INPUT_FORMAT,
                    **te_init_methods(spec),
                )

        self.blocks = nn.ModuleList(block(i) for i in range(spec.num_layers))
        if spec.vocab_size:
            self.tok_embeddings = nn.Embedding(spec.vocab_size, spec.hidden_size, device=device, dtype=pdtype)
            norm_cls = te.RMSNorm if spec.norm == "rmsnorm" else te.LayerNorm
            self.norm = norm_cls(spec.hidden_size, eps=spec.norm_eps, params_dtype=pdtype, device=device)
            if not spec.tie_embeddings:
                self.lm_head = te.Linear(spec.hidden_size, spec.vocab_size, bias=False,
                                         params_dtype=pdtype, device=device,
                                         init_method=te_init_methods(spec)["init_method"])
        self.sequence_first = INPUT_FORMAT == "sbhd"
        self.rope = (te.RotaryPositionEmbedding(spec.head_dim, rotary_base=spec.rope_theta)
                     if spec.rotary else None)
        self._freqs: dict[tuple, torch.Tensor] = {}
        # The blocks as CUDA graphs (``graph_blocks``, --cuda-graphs); empty: run them eagerly.
        self.graphed: list[Any] = []

    def _rope(self, seq: int, device) -> torch.Tensor | None:
        if self.rope is None:
            return None
        key = (seq, str(device))
        if key not in self._freqs:
            self._freqs[key] = self.rope(seq).to(device)
        return self._freqs[key]

    def forward(self, inputs: torch.Tensor, is_first_microbatch: bool | None = None) -> torch.Tensor:
        """``is_first_microbatch`` (``--fp8-weight-cache``): True quantises the weights and keeps
        the copies, False reuses them (later micro-batches of a step); None: every call quantises."""
        import transformer_engine.pytorch as te

        h = self.tok_embeddings(inputs) if self.spec.vocab_size else inputs
        h = parallel.cast_to_compute(h)
        freqs = self._rope(h.shape[1], h.device)
        kwargs = block_kwargs(freqs, is_first_microbatch)
        if self.sequence_first:
            h = h.transpose(0, 1).contiguous()
        for i, block in enumerate(self.graphed or self.blocks):
            ctx = te.autocast(enabled=False) if i in self.hp_blocks else contextlib.nullcontext()
            with ctx:
                if self.checkpoint_blocks and torch.is_grad_enabled():
                    h = te.distributed.checkpoint(block, h, use_reentrant=False, **kwargs)
                else:
                    h = block(h, **kwargs)
        if self.sequence_first:
            h = h.transpose(0, 1).contiguous()
        if not self.spec.vocab_size:
            return root_output(h)
        h = self.norm(h)
        if self.spec.tie_embeddings:
            return root_output(F.linear(h, self.tok_embeddings.weight))
        ctx = te.autocast(enabled=False) if self.high_precision_head else contextlib.nullcontext()
        with ctx:
            head = self.lm_head(h, is_first_microbatch=is_first_microbatch)
            return root_output(head)  # te.Linear returns a view of its 2D GEMM

    def amax_states(self) -> list[torch.Tensor]:
        return []  # TE keeps its own scaling state


def build(cfg: TrainConfig, world: parallel.World, plan: Plan) -> nn.Module:
    from transformer_engine.pytorch.module.base import TransformerEngineBaseModule

    model = TECausalLM(cfg, set(high_precision_blocks(cfg.model.num_layers,
                                                      cfg.high_precision_layers)))
    param_dtype = None if cfg.quantized_model_init else plan.param_dtype
    # FP8 primary weights: every block resharded after its forward, as TE's own example
    # (examples/pytorch/quantized_model_init/fully_shard.py) shards them. A block kept gathered
    # asks Float8Tensor's all-gather for its transpose too, and TE 2.20's fsdp_post_all_gather
    # refreshes only the data of a reused buffer, so the backward could read a transpose from
    # an earlier step (read in TE's code, not measured: benchmarks/trainer/README.md, session v10).
    parallel.prepare(model, list(model.blocks), world, param_dtype, cfg.single_gpu_fsdp,
                     keep_last_block=not cfg.quantized_model_init)
    materialise(model, [m for m in model.modules() if isinstance(m, TransformerEngineBaseModule)],
                cfg, world.device)
    if cfg.cuda_graphs:
        graph_blocks(model, cfg, world, plan)
    return model


def materialise(model: nn.Module, te_modules: list[Any], cfg: TrainConfig, device: torch.device) -> None:
    """Give the meta-device model its memory and its initial values. TE's modules materialise
    their own (local) parameters; every other module gets empty memory, which ``init_weights``
    then fills. With ``--quantized-model-init`` TE's ``reset_parameters`` has drawn and quantised
    its weights, so ``init_weights`` fills only the rest (the token embedding): left empty, it was
    uninitialised memory, and the first loss was NaN (benchmarks/trainer/README.md, session v7)."""
    te_ids = {id(m) for m in te_modules}
    for m in model.modules():
        if id(m) not in te_ids and any(p.is_meta for p in m.parameters(recurse=False)):
            m.to_empty(device=device, recurse=False)
    for m in te_modules:
        m.reset_parameters()  # materialises TE's local shards (and quantises them with quantized_model_init)
    if not cfg.quantized_model_init:
        init_weights(model, cfg.model, cfg.seed)
        return
    te_params = {id(p) for m in te_modules for p in m.parameters()}
    init_weights(model, cfg.model, cfg.seed, only=lambda p: id(p) not in te_params)
    torch.manual_seed(cfg.seed)


def block_kwargs(freqs: torch.Tensor | None, is_first_microbatch: bool | None) -> dict[str, Any]:
    """The keyword arguments of a block call: the rotary tables when the model has them, and
    TE's ``is_first_microbatch`` when the FP8 weight cache is on (a graphed block reads it at
    the call to pick whether its graph requantises). Left out when None."""
    kwargs: dict[str, Any] = {}
    if freqs is not None:
        kwargs["rotary_pos_emb"] = freqs
    if is_first_microbatch is not None:
        kwargs["is_first_microbatch"] = is_first_microbatch
    return kwargs


def graph_blocks(model: TECausalLM, cfg: TrainConfig, world: parallel.World, plan: Plan) -> None:
    """``--cuda-graphs``: each block's forward and backward captured by
    ``te.make_graphed_callables`` on a static (micro-batch, sequence) input, the FP8 recipe on
    for the low-precision blocks (off for the ``hp_blocks``), the weight cache when
    ``--fp8-weight-cache`` is on. Captured inside the unsharded model's compute autocast, so
    the graphs cast the fp32 weights to bf16 (or quantise them) as the eager blocks do."""
    import transformer_engine.pytorch as te

    if parallel.shards(world, cfg.single_gpu_fsdp) or cfg.activation_checkpointing:
        raise ValueError("cuda graphs need the unsharded model without activation checkpointing "
                         "(TrainConfig.validate refuses the rest)")
    recipe = te_recipe(cfg.precision, cfg.fp8_amax_history_len)
    dims = (cfg.seq_length, cfg.batch_size) if model.sequence_first else (cfg.batch_size, cfg.seq_length)
    dtype = plan.param_dtype or torch.float32
    n = len(model.blocks)
    sample = tuple((torch.randn(*dims, cfg.model.hidden_size, device=world.device, dtype=dtype,
                                requires_grad=True),) for _ in range(n))
    freqs = model._rope(cfg.seq_length, world.device)
    kwargs = block_kwargs(freqs, None)  # is_first_microbatch is a call-time flag, not captured
    enabled = tuple(recipe is not None and i not in model.hp_blocks for i in range(n))
    extra: dict[str, Any] = {}
    if "clone_param_grads_on_return" in inspect.signature(te.make_graphed_callables).parameters:
        # One micro-batch per step: the optimizer consumes each .grad (and zero_grad drops
        # it) before the next replay rewrites the graph's gradient buffer, so .grad may
        # alias it (no copy of every gradient per step). Accumulating micro-batches would
        # see the buffer rewritten under the first .grad: there TE clones (TE >= 2.20).
        extra["clone_param_grads_on_return"] = cfg.grad_accum_steps > 1
    with parallel.compute_autocast(world, plan.param_dtype, sharded=False)():
        graphed = te.make_graphed_callables(
            tuple(model.blocks), sample, sample_kwargs=tuple(dict(kwargs) for _ in range(n)),
            enabled=enabled, recipe=recipe if any(enabled) else None,
            cache_quantized_params=bool(cfg.fp8_weight_cache and any(enabled)), **extra)
    model.graphed = list(graphed)


def autocast_factory(cfg: TrainConfig, plan: Plan):
    import torch.distributed as dist
    import transformer_engine.pytorch as te

    recipe = te_recipe(cfg.precision, cfg.fp8_amax_history_len)
    if recipe is None:
        return contextlib.nullcontext
    group = dist.group.WORLD if cfg.precision == "fp8" and dist.get_world_size() > 1 else None

    def make():
        return te.autocast(enabled=True, recipe=recipe, amax_reduction_group=group)

    return make
