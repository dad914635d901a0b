"""The model the job trains and its memory: the plan's batch size and checkpointing or a pre-flight
estimate, for the instance type and every fallback."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kfp_sagemaker_blackwell.catalog.spec import DIMENSION_BOUNDS
from kfp_sagemaker_blackwell.common.errors import FieldError, UserError
from kfp_sagemaker_blackwell.components.sagemaker_training.request.capacity import instance_choices
from kfp_sagemaker_blackwell.components.sagemaker_training.request.config import (
    CUSTOM_SKIPPED,
    TrainingJobConfig,
)

MODEL_DIMENSIONS = {name: name.replace("_", "-") for name in DIMENSION_BOUNDS}


@dataclass(frozen=True)
class Memory:
    """The model the job trains (None for a custom image: not modelled), the dimensions
    overriding its preset's, and what it runs with: the batch size and activation
    checkpointing (the memory plan's, else the configuration's after the pre-flight)."""

    model: Any
    overrides: dict[str, int]
    batch_size: int
    activation_checkpointing: bool
    notes: tuple[str, ...] = ()


def plan_memory(cfg: TrainingJobConfig) -> Memory:
    """The model and its memory on the job's instance type (custom: the configuration's, a
    note of what is not checked)."""
    if cfg.custom:
        return Memory(None, {}, cfg.batch_size, cfg.activation_checkpointing, (CUSTOM_SKIPPED,))
    model, overrides = _model(cfg)
    notes: list[str] = []
    batch_size, checkpointing = _memory(cfg, model, notes)
    return Memory(model, overrides, batch_size, checkpointing, tuple(notes))


def check_fallbacks(cfg: TrainingJobConfig, memory: Memory) -> tuple[str, ...]:
    """The memory pre-flight on every fallback type (none for a custom image); its notes."""
    notes: list[str] = []
    if memory.model is not None:
        _fallback_memory(cfg, memory.model, memory.batch_size, memory.activation_checkpointing,
                         notes)
    return tuple(notes)


def _model(cfg: TrainingJobConfig) -> tuple[Any, dict[str, int]]:
    """The model the job trains (preset + overrides), and the overrides."""
    from kfp_sagemaker_blackwell.catalog import spec

    for fld, low in (*((k, 0) for k in MODEL_DIMENSIONS if k != "vocab_size"),
                     ("vocab_size", -1)):
        value = getattr(cfg, fld)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            keep = "0" if low == 0 else "-1"
            raise UserError(fld, f"{value!r}: must be a positive integer, or {keep} for the "
                            "preset's.", f"pass {fld}={keep} to keep the preset's value.")
    overrides = {k: getattr(cfg, k) for k in MODEL_DIMENSIONS
                 if getattr(cfg, k) > (0 if k != "vocab_size" else -1)}
    try:
        model = spec.spec_from_values(cfg.model_preset or None, **overrides)
    except FieldError as exc:  # the field it names, when it is one of the parameters
        fld = (exc.field if exc.field in ("model_preset", *MODEL_DIMENSIONS)
               else "model dimensions")
        raise UserError(fld, str(exc) + ".", "pick a preset "
                        f"({', '.join(spec.PRESETS)}) or consistent dimensions.") from None
    for fld, value, low in (("batch_size", cfg.batch_size, 1), ("seq_length", cfg.seq_length, 2),
                            ("max_steps", cfg.max_steps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UserError(fld, f"{value!r}: must be an integer >= {low}.",
                            f"pass {fld}={max(low, 1)} or more.")
    return model, overrides


def _memory(cfg: TrainingJobConfig, model: Any, notes: list[str]) -> tuple[int, bool]:
    """Batch size and checkpointing: the plan's when one is given, else the configuration's,
    checked by a pre-flight memory estimate (refused when predicted not to fit)."""
    from kfp_sagemaker_blackwell.planning.memory_plan import MemoryPlan

    batch_size, checkpointing = cfg.batch_size, cfg.activation_checkpointing
    if not cfg.memory_plan.strip():
        if not cfg.override_memory_check:
            notes.append(preflight(cfg, model))
        else:
            notes.append("memory check skipped (override_memory_check): the job may run out "
                         "of GPU memory")
        return batch_size, checkpointing
    plan = MemoryPlan.from_json(cfg.memory_plan)
    if plan.instance_type and plan.instance_type != cfg.instance_type:
        raise UserError("memory_plan", f"was estimated for {plan.instance_type}, the job "
                        f"runs on {cfg.instance_type}.",
                        "estimate memory for the instance type you train on.")
    if plan.seq_length and plan.seq_length != cfg.seq_length:
        raise UserError("memory_plan", f"was estimated for seq_length {plan.seq_length}, "
                        f"the job uses {cfg.seq_length}.",
                        "estimate memory with the same sequence length.")
    planned = {k: plan.model.get(k) for k in MODEL_DIMENSIONS if k in plan.model}
    ours = {k: getattr(model, k) for k in planned}
    if planned and planned != ours:
        raise UserError("memory_plan", f"was estimated for another model ({planned}; the "
                        f"job trains {ours}).", "estimate memory for the same model.")
    entry = plan.entry_for(cfg.precision)
    if (entry.batch_size, entry.activation_checkpointing) != (batch_size, checkpointing):
        notes.append(
            f"memory plan: batch_size {batch_size} -> {entry.batch_size}, activation "
            f"checkpointing {checkpointing} -> {entry.activation_checkpointing} "
            f"(predicted peak {entry.peak_bytes / 2**30:.1f} GiB/GPU on {plan.gpu})")
    return entry.batch_size, entry.activation_checkpointing


def preflight(cfg: TrainingJobConfig, model: Any) -> str:
    """Estimates this configuration's peak GPU memory (memory_estimate's planner); a note,
    or a UserError with the numbers and the fixes when it is predicted not to fit."""
    from kfp_sagemaker_blackwell.planning import planner

    hw = planner.resolve_hardware(instance_type=cfg.instance_type,
                                  instance_count=cfg.instance_count)
    request = planner.Request(
        model=model, seq_length=cfg.seq_length, hardware=hw, precisions=(cfg.precision,),
        batch_sizes=(cfg.batch_size,),
        activation_checkpointing="on" if cfg.activation_checkpointing else "off")
    entry = planner.plan(request).plan.precisions[cfg.precision]
    if not entry.fits:
        fixes = []
        if entry.max_batch_size_without_checkpointing:
            fixes.append(f"batch_size={entry.max_batch_size_without_checkpointing}")
        if entry.max_batch_size_with_checkpointing and not cfg.activation_checkpointing:
            fixes.append("activation_checkpointing=True with batch_size="
                         f"{entry.max_batch_size_with_checkpointing}")
        elif entry.max_batch_size_with_checkpointing:
            fixes.append(f"batch_size={entry.max_batch_size_with_checkpointing}")
        fixes += ["a lower precision (fp8, mxfp8)", "more instances", "a shorter seq_length",
                  "or override_memory_check=True to launch anyway"]
        raise UserError("batch_size", f"predicted not to fit in GPU memory (memory_estimate, "
                        f"not measured): {entry.reason}", "use " + ", ".join(fixes) + ".")
    return (f"memory pre-flight: predicted peak {entry.peak_bytes / 2**30:.1f} GiB per GPU of "
            f"{hw.gpu.memory_bytes / 2**30:.0f} GiB on {hw.gpu.name} (memory_estimate's model, "
            "not measured)")


def _fallback_memory(cfg: TrainingJobConfig, model: Any, batch_size: int, checkpointing: bool,
                     notes: list[str]) -> None:
    """The memory pre-flight for every fallback type, with the batch size and checkpointing
    the job will run (refused, naming the type, where one is predicted not to fit)."""
    for i, (itype, count) in enumerate(instance_choices(cfg)[1:]):
        if cfg.override_memory_check:
            notes.append(f"memory check skipped for fallback {count} x {itype} "
                         "(override_memory_check)")
            continue
        other = dataclasses.replace(cfg, instance_type=itype, instance_count=count,
                                    batch_size=batch_size,
                                    activation_checkpointing=checkpointing)
        try:
            notes.append(f"fallback {count} x {itype}: " + preflight(other, model))
        except UserError as exc:
            raise UserError(f"fallback_instances[{i}]", f"{count} x {itype}: {exc.problem}",
                            "drop that fallback, give it more instances, or " + exc.fix
                            ) from None
