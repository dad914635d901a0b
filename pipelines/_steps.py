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


def cleanup_step(*, region: Any, policy: Any, prefix: str, repository: Any) -> Any:
    """The exit task: removes what the run created, found by its tag."""
    task = cleanup(
        run_id=RUN_ID, region=region, policy=policy, s3_uris=[prefix],
        ecr_repositories=[repository],
    ).set_display_name("cleanup")
    task.set_retry(2)  # idempotent
    return task


def trainer_image_step(*, region: Any, prefix: str, repository: Any, instance_type: Any,
                       codebuild_role_arn: Any, pipeline_name: str) -> Any:
    task = build_image(
        run_id=RUN_ID, s3_uri=f"{prefix}/build", region=region, repository=repository,
        instance_type=instance_type, codebuild_role_arn=codebuild_role_arn,
        pipeline_name=pipeline_name,
    ).set_display_name("build trainer image")
    task.set_retry(2)  # re-attaches to its build; skipped when the tag exists
    return task


def model_arguments(**model: Any) -> dict[str, Any]:
    """The model preset and dimension overrides, passed alike to every step that takes them."""
    expected = {"model_preset", "num_layers", "hidden_size", "num_heads", "num_kv_heads",
                "ffn_hidden_size", "vocab_size"}
    if set(model) != expected:
        raise TypeError(f"model_arguments needs exactly {sorted(expected)}")
    return model
