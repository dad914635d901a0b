"""``resolve``: every parameter checked, in order, before any AWS call (a ``UserError`` naming the
field and the fix), into a ``ResolvedConfig``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kfp_sagemaker_blackwell.components.sagemaker_training.request.capacity import (
    PLAN_ARN_RE,
    Budget,
    _capacity,
    _capacity_controls,
    _hardware,
)
from kfp_sagemaker_blackwell.components.sagemaker_training.request.config import (
    CUSTOM_SKIPPED,
    TrainingJobConfig,
    _check_s3,
    _custom,
)
from kfp_sagemaker_blackwell.components.sagemaker_training.request.hyperparameters import (
    _check_with_trainer,
    _environment,
    _free_hyperparameters,
    _hyperparameters,
    merge_precision_hyperparameters,
)
from kfp_sagemaker_blackwell.components.sagemaker_training.request.identity import (
    _identity,
    _tags,
    _where,
    derived_job_name,
)
from kfp_sagemaker_blackwell.components.sagemaker_training.request.model import (
    _fallback_memory,
    _memory,
    _model,
)
from kfp_sagemaker_blackwell.components.sagemaker_training.request.network import _network


@dataclass(frozen=True)
class ResolvedConfig:
    """A validated configuration plus what was derived from it."""

    config: TrainingJobConfig
    region: str
    job_name: str
    hyperparameters: dict[str, str]
    environment: dict[str, str]
    tags: dict[str, str]
    batch_size: int
    activation_checkpointing: bool
    notes: tuple[str, ...] = ()
    budget: Budget = Budget(0.0)

    @property
    def training_plan_name(self) -> str:
        m = PLAN_ARN_RE.match(self.config.training_plan_arn)
        return m.group(1) if m else ""


def resolve(cfg: TrainingJobConfig, *, region: str | None = None) -> ResolvedConfig:
    """Validates everything that can be checked without AWS; raises UserError.

    The steps, in order: identity (run, task, job name), where (region, image,
    role, output), the budget, hardware, model, the memory plan (or a pre-flight
    estimate), capacity (on-demand / plan / spot, limits, checkpoints), network (channels,
    VPC), then the hyperparameters as the trainer will parse them, and tags.
    """
    from kfp_sagemaker_blackwell.common.aws import resolve_region

    cfg = _identity(cfg)
    cfg = dataclasses.replace(cfg, precision_hyperparameters={}, hyperparameters=(
        merge_precision_hyperparameters(cfg.hyperparameters, cfg.precision_hyperparameters,
                                        cfg.precision)))
    resolved_region = _where(cfg, resolve_region(region or cfg.region or None))
    budget = Budget.parse(cfg.max_cost_usd, cfg.budget_items)
    _custom(cfg)
    cfg = _hardware(cfg)  # from here on cfg.precision is a parsed Precision, trusted
    notes: list[str] = []
    if cfg.custom:
        notes.append(CUSTOM_SKIPPED)
        batch_size, checkpointing = cfg.batch_size, cfg.activation_checkpointing
    else:
        model, overrides = _model(cfg)
        batch_size, checkpointing = _memory(cfg, model, notes)
    _capacity(cfg, resolved_region)
    _capacity_controls(cfg)
    if not cfg.custom:
        _fallback_memory(cfg, model, batch_size, checkpointing, notes)
    _network(cfg, resolved_region)
    if cfg.custom:
        hps = _free_hyperparameters(cfg.hyperparameters)
    else:
        hps = _hyperparameters(cfg, model_overrides=overrides, batch_size=batch_size,
                               checkpointing=checkpointing)
    env = _environment(cfg.environment)
    if not cfg.custom:
        _check_with_trainer(hps, env)
    merged_tags = _tags(cfg)
    job_name = cfg.job_name or derived_job_name(cfg, hps)
    if cfg.checkpoint_s3_prefix:  # the job's own prefix, named after the job
        cfg = dataclasses.replace(cfg, checkpoint_s3_prefix="", checkpoint_s3_uri=(
            f"{cfg.checkpoint_s3_prefix.rstrip('/')}/{job_name}"))
        _check_s3("checkpoint_s3_prefix", cfg.checkpoint_s3_uri, "CheckpointConfig.S3Uri")
    return ResolvedConfig(cfg, resolved_region, job_name, hps, env, merged_tags, batch_size,
                          checkpointing, tuple(notes), budget)
