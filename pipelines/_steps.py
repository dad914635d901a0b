"""Steps both pipelines start with, so that they are declared once.

Called inside a ``@dsl.pipeline`` function: each helper adds its task to the
pipeline being built and returns it.
"""

from typing import Any

from kfp import dsl

from components.build_image.component import build_image
from components.cleanup.component import cleanup

RUN_ID = dsl.PIPELINE_JOB_ID_PLACEHOLDER


def run_prefix(bucket: Any, s3_prefix: Any) -> str:
    """Where a run writes: ``s3://<bucket>/<prefix>/<run id>`` (cleanup searches it)."""
    return f"s3://{bucket}/{s3_prefix}/{RUN_ID}"


def job_prefixes(prefix: str) -> dict[str, Any]:
    """Where a training job of the run writes: prefixes of its own, named after the job.

    SageMaker puts a job's output under ``<output_s3_uri>/<job name>/``, and the
    training component its checkpoints under ``<checkpoint_s3_prefix>/<job name>``.
    The job name is deterministic and covers what the job trains (run id, task, and
    a digest of image, instances and hyperparameters: every loop-item value), so no
    two jobs of a run share a checkpoint prefix (one would resume the other's) or an
    output prefix, while a retried task re-attaches to its job and its checkpoints
    (``tests/test_pipelines.py`` checks it for every pipeline).
    """
    return {"output_s3_uri": f"{prefix}/output", "checkpoint_s3_prefix": f"{prefix}/checkpoints"}


def cleanup_step(*, region: Any, policy: Any, prefix: str, repository: Any) -> Any:
    """The exit task: removes what the run created, found by its tag."""
    task = cleanup(
        run_id=RUN_ID, region=region, policy=policy, s3_uris=[prefix],
        ecr_repositories=[repository],
    ).set_display_name("cleanup")
    return task


def trainer_image_step(*, region: Any, prefix: str, repository: Any, instance_type: Any,
                       codebuild_role_arn: Any, pipeline: str) -> Any:
    task = build_image(
        run_id=RUN_ID, s3_uri=f"{prefix}/build", region=region, repository=repository,
        instance_type=instance_type, codebuild_role_arn=codebuild_role_arn,
        pipeline=pipeline,
    ).set_display_name("build trainer image")
    return task


def model_arguments(**model: Any) -> dict[str, Any]:
    """The model preset and dimension overrides, passed alike to every step that takes them."""
    expected = {"model_preset", "num_layers", "hidden_size", "num_heads", "num_kv_heads",
                "ffn_hidden_size", "vocab_size"}
    if set(model) != expected:
        raise TypeError(f"model_arguments needs exactly {sorted(expected)}")
    return model


def report_context(*, pipeline: str, instance_type: Any, instance_count: Any, region: Any,
                   model_preset: Any) -> dict[str, Any]:
    """What a report step is told about its run (``components.common.run_context``)."""
    return {"pipeline": pipeline, "run_id": RUN_ID, "instance_type": instance_type,
            "instance_count": instance_count, "region": region, "model_preset": model_preset}


# ---- the pipelines' arguments, checked before anything starts or is compiled ----

MODEL_KEYS = ("model_preset", "num_layers", "hidden_size", "num_heads", "num_kv_heads",
              "ffn_hidden_size", "vocab_size")


def check_precision_names(field: str, names: list[Any]) -> list[str]:
    """Every name a precision the trainer knows, with a "did you mean" for a misspelling
    (catalog.precisions.check_precision_name's)."""
    from catalog.precisions import check_precision_name
    from components.common.errors import UserError, unknown_name

    if not isinstance(names, list) or not names:
        raise UserError(field, f"{names!r} is not a non-empty list of precisions.",
                        'pass a JSON list, e.g. ["bf16", "fp8"] (or bf16,fp8 on a shell).')
    for name in names:
        try:
            check_precision_name(name)
        except ValueError as exc:
            raise unknown_name(field, exc) from None
    return [str(n) for n in names]


def check_training_arguments(arguments: dict[str, Any], *, precisions: list[str],
                             batch_size: int, activation_checkpointing: str,
                             require_all_runnable: bool) -> None:
    """Runs the checks the memory plan and every training step would run, in-process
    (``--run-local`` before it starts, ``--compile`` before it writes).

    The memory plan is pure Python (no AWS call), and so is the training step's
    validation (``launcher.prepare``), so a misspelled precision, model, hyperparameter
    or capacity setting fails here, with the step's own message, before the local
    backend starts or an image is built. ``arguments`` has every pipeline parameter.
    """
    import re

    from components.cleanup.plan import resolve_policy
    from components.common.errors import UserError
    from components.common.s3 import BUCKET_PATTERN
    from components.memory_estimate.cli import with_defaults
    from components.memory_estimate.run import run_component
    from components.sagemaker_training import launcher
    from components.sagemaker_training.request import (
        TrainingJobConfig,
        merge_precision_hyperparameters,
    )

    model = {k: arguments[k] for k in MODEL_KEYS}
    a = arguments
    if not re.fullmatch(BUCKET_PATTERN, str(a["bucket"])):
        raise UserError("bucket", f"{a['bucket']!r} is not an S3 bucket name.",
                        "use 3-63 lowercase letters, digits, dots or hyphens, starting and "
                        "ending with a letter or digit (S3's bucket naming rules).")
    plan = run_component(**with_defaults(dict(
        instance_type=a["instance_type"], instance_count=a["instance_count"], **model,
        seq_length=a["seq_length"], batch_size=batch_size, precisions=precisions,
        activation_checkpointing=activation_checkpointing,
        instance_hour_prices=a.get("instance_hour_prices") or None,
        require_all_runnable=require_all_runnable)))
    account = str(a["role_arn"]).split(":")[4] if str(a["role_arn"]).count(":") >= 5 else ""
    image = (f"{account or '123456789012'}.dkr.ecr.{a['region']}.amazonaws.com/"
             f"{a['trainer_repository']}:ctx-000000000000")
    prefix = f"s3://{a['bucket']}/{a['s3_prefix']}/argument-check"
    for precision in plan.runnable_precisions:
        launcher.prepare(TrainingJobConfig(
            image_uri=image, role_arn=a["role_arn"], **job_prefixes(prefix),
            run_id="argument-check", region=a["region"], instance_type=a["instance_type"],
            instance_count=a["instance_count"], precision=precision, **model,
            seq_length=a["seq_length"], max_steps=a["max_steps"],
            hyperparameters=merge_precision_hyperparameters(
                a["hyperparameters"], a.get("precision_hyperparameters"), precision),
            training_plan_arn=a["training_plan_arn"], use_spot=a["use_spot"],
            max_wait_seconds=a["max_wait_seconds"], max_runtime_seconds=a["max_runtime_seconds"],
            fallback_instances=list(a.get("fallback_instances") or []),
            max_pending_seconds=a.get("max_pending_seconds", 0),
            keep_alive_seconds=a.get("keep_alive_seconds", 0),
            memory_plan=plan.plan))
    resolve_policy(a["cleanup_policy"])
