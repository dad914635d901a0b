"""Steps the pipelines share, so that they are declared once, and their argument check.

Called inside a ``@dsl.pipeline`` function: each step helper adds its task to the
pipeline being built and returns it. A pipeline builds a training task's arguments
with one function (:func:`training_arguments` underneath) that its DSL and its
``--compile``/``--run-local`` check both call, so the check checks what a run passes.
"""

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from kfp import dsl

from kfp_sagemaker_blackwell.catalog import parameters
from kfp_sagemaker_blackwell.catalog.precisions import Precision
from kfp_sagemaker_blackwell.catalog.spec import DIMENSION_BOUNDS
from kfp_sagemaker_blackwell.common import cli
from kfp_sagemaker_blackwell.components.build_image.component import build_image
from kfp_sagemaker_blackwell.components.cleanup.component import cleanup

RUN_ID = dsl.PIPELINE_JOB_ID_PLACEHOLDER


def pipeline(name: str, description: str) -> Callable[[Callable[..., None]], Any]:
    """``dsl.pipeline`` as every pipeline here is declared: the ``Args:`` entries of the
    parameter groups it takes come from ``catalog/parameters.py``, where they are written."""
    def decorate(func: Callable[..., None]) -> Any:
        return dsl.pipeline(name=name, description=description)(parameters.documented(func))

    return decorate


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


@contextlib.contextmanager
def cleaned_up(arguments: Mapping[str, Any], name: str) -> Iterator[str]:
    """The run's exit handler: ``cleanup`` removes what the run created (found by its tag)
    even when a step fails. Yields the run's S3 prefix (``run_prefix``)."""
    prefix = run_prefix(arguments["bucket"], arguments["s3_prefix"])
    clean = cleanup(
        run_id=RUN_ID, region=arguments["region"], policy=arguments["cleanup_policy"],
        s3_uris=[prefix], ecr_repositories=[arguments["trainer_repository"]],
    ).set_display_name("cleanup")
    with dsl.ExitHandler(clean, name=name):
        yield prefix


def trainer_image(arguments: Mapping[str, Any], prefix: str, *, instance_type: Any,
                  pipeline: str) -> Any:
    """The trainer image the run's jobs use (built once, skipped when its tag exists)."""
    return build_image(
        run_id=RUN_ID, s3_uri=f"{prefix}/build", region=arguments["region"],
        repository=arguments["trainer_repository"], instance_type=instance_type,
        codebuild_role_arn=arguments["codebuild_role_arn"], pipeline=pipeline,
    ).set_display_name("build trainer image")


def training_arguments(arguments: Mapping[str, Any], *, exclude: tuple[str, ...] = (),
                       **step: Any) -> dict[str, Any]:
    """What a pipeline passes to ``sagemaker_training``: every pipeline parameter the
    component declares too, under the same name (one name, one meaning), except
    ``exclude`` (a pipeline parameter of that name that means something else there, e.g.
    the sweep's ``activation_checkpointing="auto"`` that the memory plan resolves), then
    ``step``: what the task gets from other tasks, the loop item or the pipeline.

    ``arguments``: the pipeline function's parameters (``locals()``, channels) in the
    DSL, their values in the argument check, which so checks exactly what a run passes.
    """
    from kfp_sagemaker_blackwell.components.sagemaker_training.component import sagemaker_training

    declared = {p.name for p in cli.parameters(sagemaker_training)}
    passed = {k: v for k, v in arguments.items()
              if k in declared and k not in exclude and k not in step}
    return {**passed, **step}


def report_context(*, pipeline: str, instance_type: Any, instance_count: Any, region: Any,
                   model_preset: Any) -> dict[str, Any]:
    """What a report step is told about its run (``kfp_sagemaker_blackwell.common.run_context``)."""
    return {"pipeline": pipeline, "run_id": RUN_ID, "instance_type": instance_type,
            "instance_count": instance_count, "region": region, "model_preset": model_preset}


# ---- the pipelines' arguments, checked before anything starts or is compiled ----

MODEL_KEYS = ("model_preset", *DIMENSION_BOUNDS)  # the preset and ModelSpec's dimensions
# What an argument check passes where a run passes another task's output or a placeholder.
CHECK_RUN_ID = "argument-check"


def check_precision_names(field: str, names: list[Any]) -> list[Precision]:
    """Every name a precision the trainer knows, with a "did you mean" for a misspelling:
    the parsed Precisions, which the argument check passes on (the memory plan and the
    training steps it runs trust them, not checking the names again)."""
    from kfp_sagemaker_blackwell.catalog.precisions import parse_precision
    from kfp_sagemaker_blackwell.common.errors import UserError, unknown_name

    if not isinstance(names, list) or not names:
        raise UserError(field, f"{names!r} is not a non-empty list of precisions.",
                        'pass a JSON list, e.g. ["bf16", "fp8"] (or bf16,fp8 on a shell).')
    try:
        return [parse_precision(name) for name in names]
    except ValueError as exc:
        raise unknown_name(field, exc) from None


def stand_ins(arguments: Mapping[str, Any]) -> dict[str, str]:
    """The values a run knows only once it runs, for the argument check: the trainer image
    (build_image's output) in the role's account and the run's region, and the run's S3
    prefix (with a stand-in run id)."""
    role = str(arguments["role_arn"])
    account = role.split(":")[4] if role.count(":") >= 5 else ""
    return {"image_uri": f"{account or '123456789012'}.dkr.ecr.{arguments['region']}."
                         f"amazonaws.com/{arguments['trainer_repository']}:ctx-000000000000",
            "prefix": f"s3://{arguments['bucket']}/{arguments['s3_prefix']}/{CHECK_RUN_ID}"}


def check_bucket(bucket: Any) -> None:
    import re

    from kfp_sagemaker_blackwell.common.errors import UserError
    from kfp_sagemaker_blackwell.common.s3 import BUCKET_PATTERN

    if not re.fullmatch(BUCKET_PATTERN, str(bucket)):
        raise UserError("bucket", f"{bucket!r} is not an S3 bucket name.",
                        "use 3-63 lowercase letters, digits, dots or hyphens, starting and "
                        "ending with a letter or digit (S3's bucket naming rules).")


def check_memory_plan(arguments: dict[str, Any]) -> Any:
    """The memory plan a run computes, in-process (memory_estimate's own code, the
    arguments the pipeline passes it): its outputs, or the UserError the step would fail with."""
    from kfp_sagemaker_blackwell.components.memory_estimate.__main__ import with_defaults
    from kfp_sagemaker_blackwell.components.memory_estimate.launcher import run_component

    return run_component(**with_defaults(arguments))


def check_training(items: Iterable[Any], arguments: Callable[[Any], dict[str, Any]]) -> None:
    """Every training task a run would start (one per loop item), checked as the task
    checks its parameters before the first AWS call (``launcher.dry_run``: validation,
    the memory pre-flight, the budget), with ``arguments(item)`` the task's arguments."""
    from kfp_sagemaker_blackwell.components.sagemaker_training import launcher
    from kfp_sagemaker_blackwell.components.sagemaker_training.request import TrainingJobConfig

    for item in items:
        values = {**arguments(item), "run_id": CHECK_RUN_ID, "task": "train"}
        launcher.dry_run(TrainingJobConfig.from_values(values), say=lambda _line: None,
                         refuse_unknown_price=False)


def check_cleanup_policy(policy: Any) -> None:
    from kfp_sagemaker_blackwell.components.cleanup.plan import resolve_policy

    resolve_policy(policy)
