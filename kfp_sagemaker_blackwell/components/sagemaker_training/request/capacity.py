"""Capacity: the precision on the instance type, count and volume; on-demand, a training plan or
spot; fallback types, run-time limits, warm pools (the budget: ``pricing.Budget``)."""

from __future__ import annotations

import dataclasses
import re

from kfp_sagemaker_blackwell.common.errors import UserError, unknown_name
from kfp_sagemaker_blackwell.common.training_job import MAX_RUNTIME_LIMIT_S
from kfp_sagemaker_blackwell.components.sagemaker_training import limits
from kfp_sagemaker_blackwell.components.sagemaker_training.request.config import (
    TrainingJobConfig,
    check_s3,
)

MAX_VOLUME_SIZE_GB = 16384  # EBS gp2/gp3 ceiling (botocore has min 0 only)
PLAN_ARN_RE = re.compile(
    r"^arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]+:\d{12}:training-plan/([a-z0-9](-*[a-z0-9]){0,62})$"
)


def check_hardware(cfg: TrainingJobConfig) -> TrainingJobConfig:
    """Checks the precision (parsed: the config returned carries the Precision), the
    instance type and count and the volume."""
    from kfp_sagemaker_blackwell.catalog import hardware
    from kfp_sagemaker_blackwell.catalog.precisions import parse_precision

    try:
        cfg = dataclasses.replace(cfg, precision=parse_precision(cfg.precision))
    except ValueError as exc:  # with a "did you mean" for a misspelling
        raise unknown_name("precision", exc) from None
    try:
        hardware.check_precision_for_instance(cfg.precision, cfg.instance_type)
    except hardware.UnsupportedPrecisionError as exc:
        raise UserError("precision", str(exc),
                        "choose a precision that GPU runs, or a Blackwell instance type "
                        "(ml.p6-b200.48xlarge).") from None
    except ValueError:
        raise UserError("instance_type", f"{cfg.instance_type!r} is not a known GPU instance "
                        "type.", f"choose one of {', '.join(hardware.INSTANCE_TYPES)}.") from None
    limits.check("instance_type", "ResourceConfig.InstanceType", cfg.instance_type)
    if (isinstance(cfg.instance_count, bool) or not isinstance(cfg.instance_count, int)
            or cfg.instance_count < 1):
        raise UserError("instance_count", f"{cfg.instance_count!r}: must be at least 1.",
                        "pass 1 for one ml.p6-b200.48xlarge (8 GPUs) or more for multi-node.")
    if (isinstance(cfg.volume_size_gb, bool) or not isinstance(cfg.volume_size_gb, int)
            or not 1 <= cfg.volume_size_gb <= MAX_VOLUME_SIZE_GB):
        raise UserError("volume_size_gb", f"{cfg.volume_size_gb!r}: must be 1-"
                        f"{MAX_VOLUME_SIZE_GB}.", "pass the EBS volume size in GB.")
    return cfg


def check(cfg: TrainingJobConfig, region: str) -> None:
    """The capacity (on-demand, a plan or spot, limits, checkpoints) and its controls
    (fallback types, pending time-out, warm pools)."""
    _capacity(cfg, region)
    _capacity_controls(cfg)


def own_checkpoints(cfg: TrainingJobConfig, job_name: str) -> TrainingJobConfig:
    """``checkpoint_s3_prefix`` made the job's own prefix, named after the job
    (``<prefix>/<job name>``, as checkpoint_s3_uri)."""
    if not cfg.checkpoint_s3_prefix:
        return cfg
    cfg = dataclasses.replace(cfg, checkpoint_s3_prefix="", checkpoint_s3_uri=(
        f"{cfg.checkpoint_s3_prefix.rstrip('/')}/{job_name}"))
    check_s3("checkpoint_s3_prefix", cfg.checkpoint_s3_uri, "CheckpointConfig.S3Uri")
    return cfg


def _capacity(cfg: TrainingJobConfig, region: str) -> None:
    """On-demand, a training plan or managed spot; run-time limits; checkpoints."""
    if cfg.training_plan_arn:
        if not PLAN_ARN_RE.match(cfg.training_plan_arn):
            raise UserError("training_plan_arn", f"{cfg.training_plan_arn!r} is not a training "
                            "plan ARN.", "use arn:aws:sagemaker:<region>:<account>:"
                            "training-plan/<name> (from CreateTrainingPlan).")
        limits.check("training_plan_arn", "ResourceConfig.TrainingPlanArn",
                     cfg.training_plan_arn)
        if cfg.training_plan_arn.split(":")[3] != region:
            raise UserError("training_plan_arn", f"is in region "
                            f"{cfg.training_plan_arn.split(':')[3]}, the job in {region}.",
                            "run the job in the plan's region.")
        if cfg.use_spot:
            raise UserError("use_spot", "cannot be combined with a training plan.",
                            "choose either training_plan_arn or use_spot.")
    limits.check("max_runtime_seconds", "StoppingCondition.MaxRuntimeInSeconds",
                 cfg.max_runtime_seconds, "pass the longest the job may train, in seconds.")
    if cfg.max_runtime_seconds > MAX_RUNTIME_LIMIT_S:
        raise UserError("max_runtime_seconds", f"{cfg.max_runtime_seconds}: must be 1-"
                        f"{MAX_RUNTIME_LIMIT_S} (SageMaker's 28 days).",
                        "pass the longest the job may train.")
    if cfg.checkpoint_s3_uri and cfg.checkpoint_s3_prefix:
        raise UserError("checkpoint_s3_prefix", "is given together with checkpoint_s3_uri.",
                        "pass checkpoint_s3_prefix (the job's checkpoints at <prefix>/<job "
                        "name>) or checkpoint_s3_uri (exactly that prefix), not both.")
    if cfg.checkpoint_s3_prefix:
        check_s3("checkpoint_s3_prefix", cfg.checkpoint_s3_prefix, "CheckpointConfig.S3Uri")
    if cfg.use_spot:
        if not (cfg.checkpoint_s3_uri or cfg.checkpoint_s3_prefix):
            raise UserError("checkpoint_s3_uri", "is required with use_spot: an interrupted spot "
                            "job resumes from its checkpoints.",
                            "pass checkpoint_s3_uri=s3://<bucket>/<prefix>/checkpoints.")
        if cfg.max_wait_seconds < cfg.max_runtime_seconds:
            raise UserError("max_wait_seconds", f"{cfg.max_wait_seconds} is less than "
                            f"max_runtime_seconds={cfg.max_runtime_seconds}.",
                            "set max_wait_seconds >= max_runtime_seconds (it includes the time "
                            "spent waiting for spot capacity).")
        limits.check("max_wait_seconds", "StoppingCondition.MaxWaitTimeInSeconds",
                     cfg.max_wait_seconds)
    elif cfg.max_wait_seconds:
        raise UserError("max_wait_seconds", "is only valid with use_spot=True.",
                        "set use_spot=True or leave max_wait_seconds at 0.")
    if cfg.checkpoint_s3_uri:
        check_s3("checkpoint_s3_uri", cfg.checkpoint_s3_uri, "CheckpointConfig.S3Uri")
    if cfg.max_retry_attempts:
        limits.check("max_retry_attempts", "RetryStrategy.MaximumRetryAttempts",
                     cfg.max_retry_attempts, "pass 0 (no retries) to 30.")


def instance_choices(cfg: TrainingJobConfig) -> list[tuple[str, int]]:
    """The job's instance types in SageMaker's order of preference, each with its count:
    ``instance_type`` x ``instance_count`` first, then ``fallback_instances`` (each
    ``{"InstanceType": ..., "InstanceCount": ...}``, the count defaulting to
    ``instance_count``). One entry: no InstancePreferences in the request."""
    out = [(cfg.instance_type, cfg.instance_count)]
    for entry in cfg.fallback_instances or []:
        count = entry.get("InstanceCount", cfg.instance_count)  # an int: from_values
        out.append((str(entry.get("InstanceType", "")), count))
    return out


def _capacity_controls(cfg: TrainingJobConfig) -> None:
    """Fallback instance types (ResourceConfig.InstancePreferences), the pending time-out
    (StoppingCondition.MaxPendingTimeInSeconds) and warm pools (KeepAlivePeriodInSeconds),
    within botocore's limits and SageMaker's exclusions."""
    from kfp_sagemaker_blackwell.catalog import hardware

    fallbacks = cfg.fallback_instances or []
    if fallbacks:
        if not isinstance(fallbacks, list):
            raise UserError("fallback_instances", f"{fallbacks!r} is not a list.",
                            'pass [{"InstanceType": "ml.p5.48xlarge", "InstanceCount": 2}, ...].')
        limits.check("fallback_instances", "ResourceConfig.InstancePreferences",
                     [None, *fallbacks], "pass at most 4 fallbacks (5 types in all).")
        if cfg.use_spot:
            raise UserError("fallback_instances", "cannot be combined with use_spot: SageMaker "
                            "takes InstancePreferences with on-demand capacity and flexible "
                            "training plans only.", "choose use_spot or fallback_instances.")
        if cfg.training_plan_arn:
            raise UserError("fallback_instances", "cannot be combined with training_plan_arn "
                            "here (each preference would need its own plan).",
                            "choose training_plan_arn or fallback_instances.")
        for i, entry in enumerate(fallbacks):
            fld = f"fallback_instances[{i}]"
            if (not isinstance(entry, dict) or set(entry) - {"InstanceType", "InstanceCount"}
                    or "InstanceType" not in entry):
                raise UserError(fld, f"{entry!r} is not {{InstanceType, InstanceCount}}.",
                                'pass {"InstanceType": "ml.p5.48xlarge", "InstanceCount": 2} '
                                "(InstanceCount defaults to instance_count).")
        seen = set()
        for i, (itype, count) in enumerate(instance_choices(cfg)[1:]):
            fld = f"fallback_instances[{i}]"
            try:
                hardware.check_precision_for_instance(cfg.precision, itype)
            except hardware.UnsupportedPrecisionError as exc:
                raise UserError(fld, str(exc), "drop that type from the fallbacks or choose "
                                "a precision every type runs (bf16).") from None
            except ValueError:
                raise UserError(fld, f"{itype!r} is not a known GPU instance type.",
                                f"choose one of {', '.join(hardware.INSTANCE_TYPES)}.") from None
            limits.check(fld, "ResourceConfig.InstancePreferences[].InstanceType", itype)
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise UserError(fld, f"InstanceCount {count!r}: must be at least 1.",
                                "pass a count of instances >= 1.")
            if (itype, count) in seen or (itype, count) == (cfg.instance_type,
                                                            cfg.instance_count):
                raise UserError(fld, f"{count} x {itype} is already in the preferences.",
                                "list each instance type and count once.")
            seen.add((itype, count))
    for fld, path, value, fix in (
            ("max_pending_seconds", "StoppingCondition.MaxPendingTimeInSeconds",
             cfg.max_pending_seconds, "pass 0 (SageMaker's default) or 1800-2419200 s."),
            ("keep_alive_seconds", "ResourceConfig.KeepAlivePeriodInSeconds",
             cfg.keep_alive_seconds, "pass 0 (no warm pool) to 21600 s.")):
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(fld, f"{value!r} is not a number of seconds.", fix)
        if value:
            limits.check(fld, path, value, fix)
    if cfg.keep_alive_seconds and cfg.use_spot:
        raise UserError("keep_alive_seconds", "cannot be combined with use_spot: SageMaker "
                        "warm pools keep on-demand instances only.",
                        "choose use_spot or keep_alive_seconds.")
