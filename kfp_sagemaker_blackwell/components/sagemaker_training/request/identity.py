"""The job's identity: run, task and job name, region, image, role and output; its tags."""

from __future__ import annotations

import dataclasses
import json
import re

from kfp_sagemaker_blackwell.catalog.sagemaker import parse_image
from kfp_sagemaker_blackwell.common import naming, tags
from kfp_sagemaker_blackwell.common.errors import FieldError, UserError
from kfp_sagemaker_blackwell.components.sagemaker_training import limits
from kfp_sagemaker_blackwell.components.sagemaker_training.request.capacity import instance_choices
from kfp_sagemaker_blackwell.components.sagemaker_training.request.config import (
    TrainingJobConfig,
    as_str,
    check_s3,
)

ROLE_ARN_RE = re.compile(r"^arn:aws[a-z\-]*:iam::\d{12}:role/[\w+=,.@\-/]{1,512}$")


def check(cfg: TrainingJobConfig) -> TrainingJobConfig:
    """Run id, task and job name; an unresolved pipeline placeholder is dropped."""
    for fld in ("run_id", "task"):
        if "{{$" in getattr(cfg, fld):
            raise UserError(fld, f"{getattr(cfg, fld)!r} is an unresolved KFP placeholder (this "
                            "backend does not resolve placeholders in component defaults).",
                            f"pass {fld}=dsl.PIPELINE_"
                            f"{'JOB_ID' if fld == 'run_id' else 'TASK_NAME'}_PLACEHOLDER "
                            "explicitly from the pipeline.")
    if "{{$" in cfg.pipeline:
        cfg = dataclasses.replace(cfg, pipeline="")
    if not cfg.run_id or not cfg.run_id.strip():
        raise UserError("run_id", "is empty.", "pass the KFP run id "
                        "(dsl.PIPELINE_JOB_ID_PLACEHOLDER) or any id unique to this run.")
    try:
        tags.validate_run_id(cfg.run_id)
    except FieldError as exc:
        raise UserError(exc.field, exc.problem + ".",
                        "use letters, digits and . _ : - only.") from None
    if not cfg.task.strip():
        raise UserError("task", "is empty.", "pass the pipeline task name.")
    if cfg.job_name and not naming.is_valid_sagemaker_name(cfg.job_name):
        raise UserError(
            "job_name", f"{cfg.job_name!r} is not a valid training job name.",
            "use 1-63 letters, digits and hyphens, starting and ending with a letter or "
            "digit, or leave it empty for a name derived from the run, task and precision.")
    return cfg


def where(cfg: TrainingJobConfig, region: str | None) -> str:
    """The job's region (``region``, else the configuration's, else the environment's: known to
    botocore), checked with the image (in ECR), the role and the output prefix."""
    from kfp_sagemaker_blackwell.common.aws import check_region, resolve_region

    region = resolve_region(region or cfg.region or None)
    check_region(region, "sagemaker")
    image = cfg.image_uri or ""
    parsed = parse_image(image)
    if parsed is None or not parsed.in_ecr:
        raise UserError("image_uri", f"{image!r} is not an image in Amazon ECR; SageMaker "
                        "training runs images from ECR only.",
                        "push the trainer with build_image and pass its image_uri output, "
                        "<account>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag> or "
                        "...@sha256:<digest>.")
    limits.check("image_uri", "AlgorithmSpecification.TrainingImage", image)
    if not ROLE_ARN_RE.match(cfg.role_arn or ""):
        raise UserError("role_arn", f"{cfg.role_arn!r} is not an IAM role ARN.",
                        "use arn:aws:iam::<12-digit account>:role/<name> of a role SageMaker "
                        "can assume.")
    limits.check("role_arn", "RoleArn", cfg.role_arn)
    check_s3("output_s3_uri", cfg.output_s3_uri)
    return region


def job_tags(cfg: TrainingJobConfig) -> dict[str, str]:
    extra = {str(k): as_str(v) for k, v in (cfg.tags or {}).items()}
    for key, value in extra.items():
        limits.check("tags", "Tags[].Key", key, "use letters, digits, spaces and _ . : / = + - @ "
                     "(1-128 characters).")
        limits.check("tags", "Tags[].Value", value, "use letters, digits, spaces and "
                     "_ . : / = + - @ (up to 256 characters).")
    try:
        merged = tags.merge(tags.run_tags(cfg.run_id, cfg.pipeline, "sagemaker_training"), extra)
    except FieldError as exc:
        raise UserError(exc.field, exc.problem + ".",
                        "SageMaker allows 50 tags, keys up to 128 and values up to 256 "
                        "characters; 3 are taken by the run's tags.") from None
    limits.check("tags", "Tags", merged, "pass fewer tags (3 are the run's own).")
    return merged


def derived_job_name(cfg: TrainingJobConfig, hyperparameters: dict[str, str]) -> str:
    """``naming.training_job_name(run_id, task, precision)``, the task qualified by a digest.

    The digest covers what the job trains (image, instances, hyperparameters), so
    two tasks of one run that differ only by a loop variable other than the
    precision (a batch-size sweep in a ParallelFor shares run id, task name and
    precision) get two jobs, while a retry of the same task (same inputs) gets
    the same name and re-attaches.
    """
    # fallbacks join the digest only when given, so the names of other jobs stay the same
    fallbacks = [instance_choices(cfg)[1:]] if cfg.fallback_instances else []
    variant = naming.short_hash(json.dumps(
        [cfg.image_uri, cfg.instance_type, cfg.instance_count, hyperparameters, *fallbacks],
        sort_keys=True), length=6)
    return naming.training_job_name(cfg.run_id, f"{cfg.task}-{variant}", cfg.precision)
