"""What a run trains, built: the model (the torch backend's here; ``te_backend`` builds
Transformer Engine's) sharded on the world, its optimizer, and the start-up's model line."""

from __future__ import annotations

from typing import Any

import torch

from kfp_sagemaker_blackwell.catalog.flags import TrainConfig
from kfp_sagemaker_blackwell.catalog.precisions import COMPUTE_DTYPE
from kfp_sagemaker_blackwell.trainer import emulation, metrics, parallel, precision
from kfp_sagemaker_blackwell.trainer.model import CausalLM, init_weights


def model(cfg: TrainConfig, world: parallel.World, plan: precision.Plan) -> Any:
    """The run's model, sharded and initialised on the world's device (its backend's)."""
    if plan.backend == "te":
        from kfp_sagemaker_blackwell.trainer import te_backend

        return te_backend.build(cfg, world, plan)
    return _build_torch_model(cfg, world, plan)


def model_record(cfg: TrainConfig, plan: precision.Plan, world: parallel.World) -> dict[str, Any]:
    """The start-up's model line: sizes, FLOPs, each block's precision, backend, sharding."""
    spec = cfg.model
    return {
        "params": spec.total_params(), "params_non_embedding": spec.non_embedding_params(),
        "flops_per_token": spec.flops_per_token(cfg.seq_length),
        "flops_per_token_blocks": metrics.block_flops_per_token(spec, cfg.seq_length),
        "block_precisions": _block_precisions(cfg),
        "lm_head_precision": "bf16" if cfg.high_precision_lm_head and cfg.precision in emulation_low() else cfg.precision,
        "backend": plan.backend, "preset": cfg.model_preset, "spec": spec.to_dict(),
        "sharding": "fsdp2" if parallel.shards(world, cfg.single_gpu_fsdp) else "none",
        "cuda_graphs": cfg.cuda_graphs, "fp8_weight_cache": cfg.fp8_weight_cache,
    }


def _block_precisions(cfg: TrainConfig) -> list[str]:
    kept = precision.high_precision_blocks(cfg.model.num_layers, cfg.high_precision_layers)
    hp = COMPUTE_DTYPE[cfg.precision]
    low = cfg.precision in emulation_low()
    return [hp if i in kept and low else cfg.precision for i in range(cfg.model.num_layers)]


def emulation_low() -> tuple[str, ...]:
    from kfp_sagemaker_blackwell.catalog.precisions import LOW_PRECISIONS

    return LOW_PRECISIONS


def _build_torch_model(cfg: TrainConfig, world: parallel.World, plan: precision.Plan):
    block_numerics = [emulation.numerics_for(p) for p in _block_precisions(cfg)]
    head_precision = cfg.precision
    if cfg.high_precision_lm_head and cfg.precision in emulation_low():
        head_precision = "bf16"
    if world.device.type == "cuda" and not plan.emulated:
        # Real 16-bit / fp32 numerics from FSDP2's mixed precision: plain F.linear.
        block_numerics = [emulation.numerics_for("fp32") for _ in block_numerics]
        head_numerics = emulation.numerics_for("fp32")
    else:
        head_numerics = emulation.numerics_for(head_precision)
    with torch.device("meta"):
        model = CausalLM(cfg.model, block_numerics, head_numerics, cfg.fp8_amax_history_len)
    model.checkpoint_blocks = cfg.activation_checkpointing
    if cfg.compile:
        for block in model.blocks:
            block.compile()
    parallel.prepare(model, list(model.blocks), world, plan.param_dtype, cfg.single_gpu_fsdp)
    model.to_empty(device=world.device)
    init_weights(model, cfg.model, cfg.seed)
    return model


def optimizer(model, cfg: TrainConfig, world: parallel.World):
    decay: list[torch.Tensor] = []
    no_decay: list[torch.Tensor] = []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "norm" in name or "layer_norm" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs: dict[str, Any] = {"lr": cfg.resolved_lr(), "betas": (cfg.beta1, cfg.beta2), "eps": 1e-8}
    if cfg.quantized_model_init:
        return _te_fused_adam(model, groups, kwargs)
    if world.device.type == "cuda":
        kwargs["fused"] = True
    return torch.optim.AdamW(groups, **kwargs)


def _te_fused_adam(model, groups, kwargs):
    """FP8 primary weights (TE quantized_model_init): TE's FusedAdam keeps fp32 master copies,
    seeded from the high-precision initial values TE preserved (as TE's fully_shard example)."""
    import transformer_engine.pytorch as te
    from transformer_engine.pytorch.quantized_tensor import QuantizedTensor

    opt = te.optimizers.FusedAdam(groups, adam_w_mode=True, master_weights=True,
                                  master_weight_dtype=torch.float32, **kwargs)
    for p in model.parameters():
        opt.initialize_state(p, store_param_remainders=False)
        local = p._local_tensor if hasattr(p, "_local_tensor") else p
        if isinstance(local, QuantizedTensor):
            hp = local.get_high_precision_init_val()
            if hp is not None:
                opt.set_scaled_state(p, "master_param", hp.to(device=local.device, dtype=torch.float32))
                local.clear_high_precision_init_val()
    return opt


