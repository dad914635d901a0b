"""What the KFP component does, as a plain function (tested without KFP)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from components.common.errors import UserError
from components.memory_estimate import planner, report


@dataclass(frozen=True)
class ComponentOutputs:
    plan: str
    runnable_precisions: list[str]
    all_runnable: bool
    batch_candidates: list[dict[str, Any]]
    markdown: str
    metrics: dict[str, float]


def run_component(
    *,
    instance_type: str = "",
    instance_count: int = 1,
    world_size: int = 0,
    gpu: str = "",
    model_preset: str = "",
    num_layers: int = 0,
    hidden_size: int = 0,
    num_heads: int = 0,
    num_kv_heads: int = 0,
    ffn_hidden_size: int = 0,
    vocab_size: int = -1,
    mlp: str = "",
    seq_length: int = 2048,
    batch_size: int = 0,
    precisions: Any = ("bf16",),
    activation_checkpointing: Any = "auto",
    headroom: float = planner.DEFAULT_HEADROOM,
    backend: str = "te",
    param_dtype: str = "fp32",
    master_weights: bool = True,
    optimizer_state_dtype: str = "fp32",
    fsdp_version: int = 2,
    quantized_model_init: bool = False,
    require_all_runnable: bool = False,
    max_candidate_batch_size: int = 0,
) -> ComponentOutputs:
    """Component semantics: 0 / -1 / "" model values keep the preset's."""
    dims: dict[str, Any] = {
        "num_layers": num_layers or None,
        "hidden_size": hidden_size or None,
        "num_heads": num_heads or None,
        "num_kv_heads": num_kv_heads or None,
        "ffn_hidden_size": ffn_hidden_size or None,
        "vocab_size": None if vocab_size == -1 else vocab_size,
        "mlp": mlp or None,
    }
    model = planner.model_from_values(model_preset or None, **dims)
    request = planner.Request(
        model=model,
        seq_length=seq_length,
        hardware=planner.resolve_hardware(
            gpu=gpu, instance_type=instance_type, world_size=world_size,
            instance_count=instance_count,
        ),
        precisions=planner.parse_precisions(precisions),
        batch_sizes=(batch_size,),
        activation_checkpointing=planner.parse_checkpointing(activation_checkpointing),
        headroom=headroom,
        training={
            "backend": backend,
            "param_dtype": param_dtype,
            "master_weights": master_weights,
            "optimizer_state_dtype": optimizer_state_dtype,
            "fsdp_version": fsdp_version,
            "quantized_model_init": quantized_model_init,
        },
    )
    result = planner.plan(request)
    planner.check_single_precision_supported(result)
    runnable = result.plan.runnable_precisions()
    all_runnable = len(runnable) == len(result.plan.precisions)
    if require_all_runnable and not all_runnable:
        bad = [e for e in result.plan.precisions.values() if not e.runnable]
        raise UserError(
            "precisions",
            "cannot all run: "
            + " ".join(f"{e.precision}: {e.reason or 'not runnable'}" for e in bad),
            "drop those precisions, or set require_all_runnable=False to skip them.",
        )
    return ComponentOutputs(
        plan=result.plan.to_json(),
        runnable_precisions=runnable,
        all_runnable=all_runnable,
        batch_candidates=planner.batch_candidates(result, max_candidate_batch_size),
        markdown=report.markdown(result),
        metrics=report.metrics(result),
    )
