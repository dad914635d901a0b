"""The precision sweep: which precision should this model train in on SageMaker Blackwell?

Inside an exit handler whose exit task is ``cleanup`` (it runs even when a step
fails): build the trainer image (skipped when its content-addressed tag exists),
plan memory for every precision (a precision the GPU cannot run, or a
configuration predicted not to fit, is reported and skipped, or fails the run
before any job starts), train and parse the logs of every runnable precision in
a ParallelFor, then compare the loss curves against the baseline and publish
the HTML report and the recommended precision.

    python pipelines/precision_sweep.py --compile            # compiled/precision_sweep.yaml
    python pipelines/precision_sweep.py --run-local          # the whole sweep on this machine
"""


import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python pipelines/precision_sweep.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's root

from kfp import dsl

from kfp_sagemaker_blackwell.catalog.hardware import DEFAULT_INSTANCE_TYPE
from kfp_sagemaker_blackwell.catalog.sagemaker import MAX_RUNTIME_SECONDS
from kfp_sagemaker_blackwell.components.compare_convergence.component import compare_convergence
from kfp_sagemaker_blackwell.components.memory_estimate.component import memory_estimate
from kfp_sagemaker_blackwell.components.parse_logs.component import parse_logs
from kfp_sagemaker_blackwell.components.sagemaker_training.component import sagemaker_training
from kfp_sagemaker_blackwell.pipelines import _steps

NAME = "precision-sweep"
DEFAULT_PARALLELISM = 4


def build_pipeline(parallelism: int = DEFAULT_PARALLELISM) -> Any:
    """The pipeline with ``parallelism`` training jobs at a time (a compile-time setting)."""

    @_steps.pipeline(
        NAME,
        "Train one model in several precisions on SageMaker (ml.p6-b200.48xlarge), "
        "compare their loss curves against a baseline and recommend the fastest that converges.",
    )
    def precision_sweep(
        # catalog/parameters.py's PIPELINE_RUN, documented there:
        role_arn: str, bucket: str, region: str = "us-west-2",
        s3_prefix: str = "kfp-sagemaker-blackwell",
        instance_type: str = DEFAULT_INSTANCE_TYPE,
        instance_count: int = 1,
        # catalog/parameters.py's CAPACITY, documented there:
        training_plan_arn: str = "", use_spot: bool = False, max_wait_seconds: int = 0,
        fallback_instances: list = [], max_pending_seconds: int = 0, keep_alive_seconds: int = 0,  # noqa: B006 (KFP default)
        max_runtime_seconds: int = MAX_RUNTIME_SECONDS,
        # catalog/parameters.py's MODEL, documented there:
        model_preset: str = "8b", num_layers: int = 0, hidden_size: int = 0, num_heads: int = 0,
        num_kv_heads: int = 0, ffn_hidden_size: int = 0, vocab_size: int = -1,
        precisions: list = ["bf16", "fp8", "mxfp8", "nvfp4"],  # noqa: B006 (KFP default)
        batch_size: int = 8,
        seq_length: int = 2048,
        activation_checkpointing: str = "auto",
        max_steps: int = 500,
        hyperparameters: dict = {},  # noqa: B006 (KFP default)
        precision_hyperparameters: dict = {},  # noqa: B006 (KFP default)
        fail_on_unrunnable: bool = False,
        baseline: str = "bf16",
        loss_tolerance_rel: float = 0.01,
        divergence_tolerance_rel: float = 0.1,
        target_gpu: str = "B200",
        # catalog/parameters.py's SWEEP_BUDGET, documented there:
        max_cost_usd: float = 0.0, instance_hour_prices: dict = {},  # noqa: B006 (KFP default)
        # catalog/parameters.py's ENCRYPTION, documented there:
        output_kms_key_id: str = "", volume_kms_key_id: str = "",
        enable_network_isolation: bool = False,
        enable_inter_container_traffic_encryption: bool = False,
        # catalog/parameters.py's PIPELINE_IMAGE_AND_CLEANUP, documented there:
        trainer_repository: str = "kfp-sagemaker-blackwell/trainer", codebuild_role_arn: str = "",
        cleanup_policy: dict = {},  # noqa: B006 (KFP default)
    ) -> None:
        """Precision sweep.

        Args:
            instance_type: SageMaker instance type (8x B200 by default).
            instance_count: Instances per training job (multi-node FSDP when > 1).
            max_runtime_seconds: The longest a job may run.
            precisions: Precisions to train (fp32, bf16, fp16, fp8, fp8-current, fp8-block,
                mxfp8, nvfp4); include the baseline.
            batch_size: Micro-batch per GPU; 0 = the largest the memory plan says fits.
            seq_length: Tokens per sequence.
            activation_checkpointing: auto (on only where the memory plan needs it), on, off.
            max_steps: Optimizer steps per training job.
            hyperparameters: Extra trainer hyperparameters for every job (name -> value).
            precision_hyperparameters: Per-precision extra hyperparameters, e.g.
                {"nvfp4": {"high-precision-lm-head": "true"}}.
            fail_on_unrunnable: Fail before any training when a precision is unsupported
                or predicted not to fit (default: skip it and report it in the plan).
            baseline: The precision the others are compared with.
            loss_tolerance_rel: Largest relative final-loss difference to the baseline that passes.
            divergence_tolerance_rel: Largest relative worst-case divergence that passes.
            target_gpu: GPU the speed-ups are for (runs not timed on it: predicted).
        """
        arguments = dict(locals())  # the pipeline's parameters, as the argument check has them
        with _steps.cleaned_up(arguments, "sweep") as prefix:
            image = _steps.trainer_image(arguments, prefix, instance_type=instance_type,
                                         pipeline=NAME)
            plan = memory_estimate(**plan_arguments(arguments)).set_display_name("memory plan")
            with dsl.ParallelFor(
                plan.outputs["runnable_precisions"], parallelism=parallelism
            ) as precision:
                train = sagemaker_training(**training_arguments(
                    arguments, image_uri=image.outputs["image_uri"], prefix=prefix,
                    precision=precision, precisions=plan.outputs["runnable_precisions"],
                    plan=plan.outputs["plan"],
                )).set_display_name("train")
                logs = parse_logs(
                    job_name=train.outputs["job_name"],
                    region=region,
                    requested_precision=precision,
                ).set_display_name("parse logs")
            compare_convergence(
                series=dsl.Collected(logs.outputs["series"]),
                baseline=baseline,
                loss_tolerance_rel=loss_tolerance_rel,
                divergence_tolerance_rel=divergence_tolerance_rel,
                target_gpu=target_gpu,
                run_context=_steps.report_context(
                    pipeline=NAME, instance_type=instance_type, instance_count=instance_count,
                    region=region, model_preset=model_preset),
            ).set_display_name("compare convergence")

    return precision_sweep


def plan_arguments(a: dict[str, Any]) -> dict[str, Any]:
    """What the memory plan step is passed (the DSL's call and the argument check's)."""
    return dict(
        instance_type=a["instance_type"], instance_count=a["instance_count"],
        **{k: a[k] for k in _steps.MODEL_KEYS}, seq_length=a["seq_length"],
        batch_size=a["batch_size"], precisions=a["precisions"],
        activation_checkpointing=a["activation_checkpointing"],
        instance_hour_prices=a["instance_hour_prices"],
        require_all_runnable=a["fail_on_unrunnable"])


def training_arguments(a: dict[str, Any], *, image_uri: Any, prefix: Any, precision: Any,
                       precisions: Any, plan: Any) -> dict[str, Any]:
    """What each training task is passed (the DSL's call and the argument check's): the
    sweep's parameters of the component's names, but the batch size and checkpointing,
    which the memory plan resolves per precision."""
    return _steps.training_arguments(
        a, exclude=("batch_size", "activation_checkpointing"), image_uri=image_uri,
        **_steps.job_prefixes(prefix), precision=precision, budget_items=precisions,
        memory_plan=plan, pipeline=NAME)


PIPELINE = build_pipeline()

# What `--run-local` runs: a small model on this machine's CPU, a few minutes in all.
LOCAL_DEFAULTS: dict[str, Any] = {
    "model_preset": "small",
    "precisions": ["bf16", "fp8", "mxfp8", "nvfp4"],
    "batch_size": 8,
    "seq_length": 128,
    "max_steps": 60,
    "activation_checkpointing": "off",
    "hyperparameters": {"log-every": "1", "checkpoint-every": "0"},
}


def check_arguments(arguments: dict[str, Any]) -> None:
    """Checks a run's arguments (``--run-local``) or the compiled defaults (``--compile``)
    before anything starts or is written; raises UserError."""
    from kfp_sagemaker_blackwell.common.errors import UserError

    precisions = _steps.check_precision_names("precisions", arguments["precisions"])
    # parsed once: the memory plan and the training checks below trust the Precisions
    arguments = {**arguments, "precisions": precisions}
    if arguments["baseline"] not in precisions:
        raise UserError("baseline", f"{arguments['baseline']!r} is not among the precisions "
                        f"{precisions}.", "add it to precisions, or pick one of them.")
    for key in ("loss_tolerance_rel", "divergence_tolerance_rel"):
        if not float(arguments[key]) > 0:
            raise UserError(key, f"{arguments[key]!r} is not a positive number.",
                            "pass a relative tolerance such as 0.01.")
    _steps.check_bucket(arguments["bucket"])
    plan = _steps.check_memory_plan(plan_arguments(arguments))
    run = _steps.stand_ins(arguments)
    _steps.check_training(plan.runnable_precisions, lambda precision: training_arguments(
        arguments, image_uri=run["image_uri"], prefix=run["prefix"], precision=precision,
        precisions=plan.runnable_precisions, plan=plan.plan))
    _steps.check_cleanup_policy(arguments["cleanup_policy"])


def main(argv: list[str] | None = None) -> int:
    from kfp_sagemaker_blackwell.pipelines import _cli

    return _cli.pipeline_main(argv, __name__, report_task="compare-convergence")


if __name__ == "__main__":
    sys.exit(main())
