"""``resolve``: every parameter checked, in order, before any AWS call (a ``UserError`` naming the
field and the fix), into a ``ResolvedConfig``: the request's parts, each by its name."""

from __future__ import annotations

from dataclasses import dataclass

from kfp_sagemaker_blackwell.components.sagemaker_training.request import (
    capacity,
    config,
    hyperparameters,
    identity,
    model,
    network,
)
from kfp_sagemaker_blackwell.components.sagemaker_training.request.capacity import PLAN_ARN_RE
from kfp_sagemaker_blackwell.components.sagemaker_training.request.config import (
    TrainingJobConfig,
)
from kfp_sagemaker_blackwell.planning.pricing import Budget


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

    The steps, in order: identity (run, task, job name), where (region, image, role,
    output), the budget, the trainer, hardware, the model and its memory (the plan, or a
    pre-flight estimate), capacity (on-demand / plan / spot, limits, checkpoints, fallback
    types and their memory), network (channels, VPC, encryption), the hyperparameters as the
    trainer will parse them, tags, and the job's name.
    """
    cfg = hyperparameters.pick_precision(identity.check(cfg))
    job_region = identity.where(cfg, region)
    budget = Budget.parse(cfg.max_cost_usd, cfg.budget_items)
    config.check_trainer(cfg)
    cfg = capacity.check_hardware(cfg)  # from here on cfg.precision is a parsed Precision
    memory = model.plan_memory(cfg)
    capacity.check(cfg, job_region)
    fallback_notes = model.check_fallbacks(cfg, memory)
    network.check(cfg, job_region)
    hps, env = hyperparameters.for_trainer(cfg, memory)
    job_tags = identity.job_tags(cfg)
    job_name = cfg.job_name or identity.derived_job_name(cfg, hps)
    cfg = capacity.own_checkpoints(cfg, job_name)
    return ResolvedConfig(cfg, job_region, job_name, hps, env, job_tags, memory.batch_size,
                          memory.activation_checkpointing, memory.notes + fallback_notes, budget)
