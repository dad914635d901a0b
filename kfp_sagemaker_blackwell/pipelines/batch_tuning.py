"""Batch-size tuning: the article's first advice, tune the batch size before anything else.

For one precision, the memory plan picks candidate micro-batch sizes (powers of
two up to the largest that fits, with and without activation checkpointing);
each candidate trains briefly on SageMaker, its logs are parsed, and the
candidates are ranked by tokens/s per GPU next to their peak memory. All inside
an exit handler whose exit task is ``cleanup``.

Probe, then extrapolate: given ``probe`` (a short measured run's tokens/s and peak
memory, memory_estimate's probe JSON), ``prerank_candidates`` corrects every
candidate's predicted speed and peak by it, drops those that no longer fit, and only
the best ``trial_count`` are timed. Without a probe every candidate is timed.

    python pipelines/batch_tuning.py --compile           # compiled/batch_tuning.yaml
    python pipelines/batch_tuning.py --run-local         # on this machine
"""

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

if __package__ in (None, ""):  # `python pipelines/batch_tuning.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's root

from kfp import dsl

from kfp_sagemaker_blackwell.catalog.hardware import DEFAULT_INSTANCE_TYPE
from kfp_sagemaker_blackwell.components.memory_estimate.component import memory_estimate
from kfp_sagemaker_blackwell.components.parse_logs.component import parse_logs
from kfp_sagemaker_blackwell.components.prerank_candidates.component import prerank_candidates
from kfp_sagemaker_blackwell.components.rank_throughput.component import rank_throughput
from kfp_sagemaker_blackwell.components.sagemaker_training.component import sagemaker_training
from kfp_sagemaker_blackwell.pipelines import _steps

NAME = "batch-tuning"
DEFAULT_PARALLELISM = 2


def build_pipeline(parallelism: int = DEFAULT_PARALLELISM) -> Any:
    """The pipeline with ``parallelism`` candidate jobs at a time (a compile-time setting)."""

    @_steps.pipeline(
        NAME,
        "Time short training runs of the batch sizes (with and without activation "
        "checkpointing) the memory plan says fit (with a probe: the best that still fit once "
        "the probe corrects their predictions), and rank them by tokens/s per GPU.",
    )
    def batch_tuning(
        # catalog/parameters.py's PIPELINE_RUN, documented there:
        role_arn: str, bucket: str, region: str = "us-west-2",
        s3_prefix: str = "kfp-sagemaker-blackwell",
        instance_type: str = DEFAULT_INSTANCE_TYPE,
        instance_count: int = 1,
        # catalog/parameters.py's CAPACITY, documented there:
        training_plan_arn: str = "", use_spot: bool = False, max_wait_seconds: int = 0,
        fallback_instances: list = [], max_pending_seconds: int = 0, keep_alive_seconds: int = 0,  # noqa: B006 (KFP default)
        max_runtime_seconds: int = 7200,
        # catalog/parameters.py's MODEL, documented there:
        model_preset: str = "8b", num_layers: int = 0, hidden_size: int = 0, num_heads: int = 0,
        num_kv_heads: int = 0, ffn_hidden_size: int = 0, vocab_size: int = -1,
        precision: str = "fp8",
        seq_length: int = 2048,
        activation_checkpointing: str = "auto",
        max_batch_size: int = 64,
        max_steps: int = 50,
        probe: str = "",
        trial_count: int = 3,
        hyperparameters: dict = {},  # noqa: B006 (KFP default)
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
        """Batch-size tuning.

        Args:
            instance_type: SageMaker instance type (8x B200 by default).
            instance_count: Instances per training job.
            max_runtime_seconds: The longest a candidate job may run.
            precision: The precision to tune for.
            seq_length: Tokens per sequence.
            activation_checkpointing: auto (try with and without), on, or off.
            max_batch_size: Largest candidate micro-batch (0 = the largest that fits).
            max_steps: Optimizer steps per candidate (enough to pass warm-up).
            probe: A short measured run ("probe, then extrapolate"), as memory_estimate's
                probe: a JSON object {precision, batch_size, activation_checkpointing,
                tokens_per_s_per_gpu, instance_type or gpu, world_size, peak_memory_bytes,
                source, kind}, or a JSON list of them; peak_memory_bytes: the peak
                reserved per GPU (parse_logs' peak_reserved_gib x 2^30), 0 = not measured.
                Of ``precision`` on the instance type's GPU (any batch, checkpointing and
                world size): every candidate's
                predicted tokens/s and peak are corrected by the nearest probe, those that
                no longer fit are dropped, and the best ``trial_count`` are timed. "" =
                none: every candidate is timed.
            trial_count: With a probe: how many of the best pre-ranked candidates are
                timed (0: every one that fits). Without a probe every candidate is.
            hyperparameters: Extra trainer hyperparameters for every candidate.
        """
        arguments = dict(locals())  # the pipeline's parameters, as the argument check has them
        with _steps.cleaned_up(arguments, "tuning") as prefix:
            image = _steps.trainer_image(arguments, prefix, instance_type=instance_type,
                                         pipeline=NAME)
            plan = memory_estimate(**plan_arguments(arguments)).set_display_name("memory plan")
            chosen = prerank_candidates(**prerank_arguments(
                arguments, memory_plan=plan.outputs["plan"],
                batch_candidates=plan.outputs["batch_candidates"],
            )).set_display_name("pre-rank candidates")
            trials = chosen.outputs["trials"]
            with dsl.ParallelFor(trials, parallelism=parallelism) as candidate:
                train = sagemaker_training(**training_arguments(
                    arguments, image_uri=image.outputs["image_uri"], prefix=prefix,
                    candidate=candidate, candidates=trials,
                )).set_display_name("train candidate")
                logs = parse_logs(
                    job_name=train.outputs["job_name"],
                    region=region,
                    requested_precision=candidate.precision,
                ).set_display_name("parse logs")
            rank_throughput(
                series=dsl.Collected(logs.outputs["series"]),
                plan=trials,
                run_context=_steps.report_context(
                    pipeline=NAME, instance_type=instance_type, instance_count=instance_count,
                    region=region, model_preset=model_preset),
            ).set_display_name("rank candidates")

    return batch_tuning


def plan_arguments(a: dict[str, Any]) -> dict[str, Any]:
    """What the memory plan step is passed (the DSL's call and the argument check's)."""
    return dict(
        instance_type=a["instance_type"], instance_count=a["instance_count"],
        **{k: a[k] for k in _steps.MODEL_KEYS}, seq_length=a["seq_length"], batch_size=0,
        precisions=[a["precision"]], activation_checkpointing=a["activation_checkpointing"],
        max_candidate_batch_size=a["max_batch_size"],
        instance_hour_prices=a["instance_hour_prices"], require_all_runnable=True)


def prerank_arguments(a: dict[str, Any], *, memory_plan: Any,
                      batch_candidates: Any) -> dict[str, Any]:
    """What the pre-ranking step is passed (the DSL's call and the argument check's)."""
    return dict(memory_plan=memory_plan, batch_candidates=batch_candidates, probe=a["probe"],
                trial_count=a["trial_count"])


def training_arguments(a: dict[str, Any], *, image_uri: Any, prefix: Any, candidate: Any,
                       candidates: Any) -> dict[str, Any]:
    """What each candidate's training task is passed (the DSL's call and the argument
    check's): the pipeline's parameters of the component's names, the candidate's
    precision, batch size and checkpointing."""
    return _steps.training_arguments(
        a, image_uri=image_uri, **_steps.job_prefixes(prefix), precision=candidate.precision,
        batch_size=candidate.batch_size, activation_checkpointing=candidate.activation_checkpointing,
        budget_items=candidates, pipeline=NAME)


PIPELINE = build_pipeline()

# What `--run-local` runs: a small model on this machine's CPU.
LOCAL_DEFAULTS: dict[str, Any] = {
    "model_preset": "small",
    "precision": "fp8",
    "seq_length": 128,
    "max_batch_size": 8,
    "activation_checkpointing": "auto",
    "max_steps": 20,
    "hyperparameters": {"log-every": "1", "checkpoint-every": "0"},
}


def check_arguments(arguments: dict[str, Any]) -> None:
    """Checks a run's arguments (``--run-local``) or the compiled defaults (``--compile``)
    before anything starts or is written; raises UserError."""
    from kfp_sagemaker_blackwell.common.errors import UserError
    from kfp_sagemaker_blackwell.planning.memory_plan import MemoryPlan
    from kfp_sagemaker_blackwell.planning.prerank import prerank
    from kfp_sagemaker_blackwell.planning.probe import parse_probes

    # parsed once: the memory plan and the training checks below trust the Precision
    arguments = {**arguments,
                 "precision": _steps.check_precision_names("precision", [arguments["precision"]])[0]}
    if int(arguments["max_batch_size"]) < 0:
        raise UserError("max_batch_size", f"{arguments['max_batch_size']!r} is negative.",
                        "pass 0 (no cap) or the largest batch size to try.")
    _steps.check_bucket(arguments["bucket"])
    probes = parse_probes(arguments["probe"], field="probe")  # before the plan: its own error
    plan = _steps.check_memory_plan(plan_arguments(arguments))
    # the trials a run would start: the pre-ranking step's own code, in-process
    trials = prerank(MemoryPlan.from_json(plan.plan), plan.batch_candidates, probes,
                     arguments["trial_count"]).trials
    run = _steps.stand_ins(arguments)
    _steps.check_training(trials, lambda candidate: training_arguments(
        arguments, image_uri=run["image_uri"], prefix=run["prefix"],
        candidate=SimpleNamespace(**candidate), candidates=trials))
    _steps.check_cleanup_policy(arguments["cleanup_policy"])


def main(argv: list[str] | None = None) -> int:
    from kfp_sagemaker_blackwell.pipelines import _cli

    return _cli.pipeline_main(argv, __name__, report_task="rank-throughput",
                              progress_label_keys=("batch_size", "activation_checkpointing"))


if __name__ == "__main__":
    sys.exit(main())
