"""Plan and train: verify the plan before committing the money.

The planner (``plan_training``) ranks every instance type x count x precision x
micro-batch x checkpointing x capacity for the model and the token budget, within the
risk ceiling ``max_risk``. **Validate before betting**: when the best row above the
ceiling beats the choice by more than its error band (the planner's
``validate_precision``), a short convergence comparison runs first (``dsl.If`` /
``dsl.Else``): that precision and bf16 each train ``validation_steps`` steps on its
instances (the precision sweep's jobs), compare_convergence compares them, and the
planner plans again with those verdicts: it trains on that precision only if it passed,
else on the best row within the ceiling (its report says which, and why). Then the best
``probe_count`` distinct candidates each train for ``probe_steps`` steps (short
SageMaker jobs, on-demand, the candidate's own instances); their logs are parsed;
the planner re-ranks those candidates on their measured speed (the report shows
predicted against probed for each); the winner trains on all the tokens with the
training component's spend guard (``max_cost_usd``: yours, else the planned worst
case) and the capacity parameters (``fallback_instances``, ``max_pending_seconds``,
``keep_alive_seconds``: the warm pool's retained time is in the planned cost). All
inside an exit handler whose exit task is ``cleanup``.

    python pipelines/plan_and_train.py --compile           # compiled/plan_and_train.yaml
    python pipelines/plan_and_train.py --run-local         # on this machine
"""

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

if __package__ in (None, ""):  # `python pipelines/plan_and_train.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's root

from kfp import dsl

from kfp_sagemaker_blackwell.components.compare_convergence.component import compare_convergence
from kfp_sagemaker_blackwell.components.parse_logs.component import parse_logs
from kfp_sagemaker_blackwell.components.plan_training.component import plan_training
from kfp_sagemaker_blackwell.components.plan_training.launcher import VALIDATION_BASELINE
from kfp_sagemaker_blackwell.components.sagemaker_training.component import sagemaker_training
from kfp_sagemaker_blackwell.pipelines import _steps

NAME = "plan-and-train"
DEFAULT_PARALLELISM = 3
# What the pipeline launches: a training plan is bought by you (CreateTrainingPlan), so
# the pipeline plans on-demand and spot capacity only.
CAPACITY_MODES = ("on-demand", "spot")


def build_pipeline(parallelism: int = DEFAULT_PARALLELISM) -> Any:
    """The pipeline with ``parallelism`` probe jobs at a time (a compile-time setting)."""

    @_steps.pipeline(
        NAME,
        "Plan the cheapest (or fastest) configuration for a model and a token "
        "budget, probe the best candidates with short jobs, re-rank them on measured speed, "
        "and train the winner within the spend guard.",
    )
    def plan_and_train(
        # catalog/parameters.py's PIPELINE_RUN, documented there:
        role_arn: str, bucket: str, region: str = "us-west-2",
        s3_prefix: str = "kfp-sagemaker-blackwell",
        training_tokens: int = 100_000_000_000,
        # catalog/parameters.py's MODEL, documented there:
        model_preset: str = "8b", num_layers: int = 0, hidden_size: int = 0, num_heads: int = 0,
        num_kv_heads: int = 0, ffn_hidden_size: int = 0, vocab_size: int = -1,
        seq_length: int = 2048,
        # catalog/parameters.py's PLAN_LIMITS, documented there:
        max_batch_size: int = 0, deadline_hours: float = 0.0, max_cost_usd: float = 0.0,
        instance_types: list = [], max_instance_count: int = 16, precisions: list = [],  # noqa: B006 (KFP default)
        max_risk: str = "medium",
        capacity_modes: list = ["on-demand"],  # noqa: B006 (KFP default)
        instance_hour_prices: dict = {},  # noqa: B006 (KFP default)
        headroom: float = 0.05,
        runtime_margin: float = 0.0,
        startup_seconds: int = 600,
        rank_by: str = "cost",
        fallback_instances: list = [],  # noqa: B006 (KFP default)
        max_pending_seconds: int = 0,
        keep_alive_seconds: int = 0,
        validation_steps: int = 300,
        validation_max_runtime_seconds: int = 7200,
        validation_max_cost_usd: float = 0.0,
        loss_tolerance_rel: float = 0.01,
        divergence_tolerance_rel: float = 0.1,
        probe_count: int = 3,
        probe_steps: int = 30,
        probe_max_runtime_seconds: int = 3600,
        probe_max_cost_usd: float = 0.0,
        hyperparameters: dict = {},  # noqa: B006 (KFP default)
        # catalog/parameters.py's PIPELINE_IMAGE_AND_CLEANUP, documented there:
        trainer_repository: str = "kfp-sagemaker-blackwell/trainer", codebuild_role_arn: str = "",
        cleanup_policy: dict = {},  # noqa: B006 (KFP default)
    ) -> None:
        """Plan, probe, re-rank, train.

        Args:
            training_tokens: Tokens to train the winner on (e.g. 100000000000 for 100B).
            seq_length: Tokens per sequence.
            capacity_modes: on-demand and/or spot (training plans are bought by you:
                plan them with the plan_training component and pass training_plan_arn
                to sagemaker_training).
            instance_hour_prices: Instance type -> USD per instance-hour (e.g. a Savings
                Plans rate), before the AWS Price List API and the shipped table.
            headroom: Fraction of GPU memory to keep free (0.05 = 5%).
            runtime_margin: The run's max_runtime_seconds = the steps' predicted time x
                (1 + this) + startup_seconds. 0: each row's error band's margin
                (planning/uncertainty.py).
            startup_seconds: Billed time before a job's first step (image download,
                initialisation), added to every predicted time.
            rank_by: cost (cheapest first) or time (fastest first).
            fallback_instances: The training job's fallback instance types
                ([{"InstanceType": ..., "InstanceCount": ...}], on-demand only): its worst
                case is the costliest's (probes and comparisons run on their own type).
            max_pending_seconds: How long every job may wait for capacity (1800-2419200 s;
                unbilled; 0: SageMaker's default).
            keep_alive_seconds: Warm pool of every job (up to 21600 s): the next job on the
                same instances starts without provisioning; the retained time is billed and
                in the planned cost and worst case.
            validation_steps: Optimizer steps of each convergence comparison job.
            validation_max_runtime_seconds: The longest a comparison job may run.
            validation_max_cost_usd: Budget for the comparison jobs together (0: no limit).
            loss_tolerance_rel: The comparison's largest relative final-loss difference to
                bf16 that passes.
            divergence_tolerance_rel: The comparison's largest relative worst-case
                divergence that passes.
            probe_count: How many of the best distinct candidates are probed.
            probe_steps: Optimizer steps per probe (enough to pass warm-up).
            probe_max_runtime_seconds: The longest a probe job may run.
            probe_max_cost_usd: Budget for all probe jobs together (their worst cases
                summed; 0: no limit).
            hyperparameters: Extra trainer hyperparameters for every job.
        """
        arguments = dict(locals())  # the pipeline's parameters, as the argument check has them
        planning = planning_arguments(arguments)
        with _steps.cleaned_up(arguments, "plan-and-train") as prefix:
            plan = plan_training(**planning).set_display_name("plan")
            image = _steps.trainer_image(arguments, prefix,
                                         instance_type=plan.outputs["instance_type"], pipeline=NAME)
            with dsl.If(plan.outputs["validate_precision"] == "", name="within-the-ceiling"):
                _probe_and_train(arguments, planning, plan, image, prefix, parallelism)
            with dsl.Else(name="validate-first"):
                with dsl.ParallelFor(plan.outputs["validation_runs"], parallelism=2) as run:
                    checked = _job_and_its_logs(validation_arguments(
                        arguments, image_uri=image.outputs["image_uri"], prefix=prefix,
                        run=run, runs=plan.outputs["validation_runs"],
                    ), region, run, "convergence probe")
                compared = compare_convergence(
                    series=dsl.Collected(checked.outputs["series"]), baseline=VALIDATION_BASELINE,
                    loss_tolerance_rel=loss_tolerance_rel,
                    divergence_tolerance_rel=divergence_tolerance_rel,
                    run_context=_steps.report_context(
                        pipeline=NAME, instance_type=plan.outputs["instance_type"],
                        instance_count=plan.outputs["instance_count"], region=region,
                        model_preset=model_preset),
                ).set_display_name("compare convergence")
                replanned = plan_training(
                    **planning, convergence_verdicts=compared.outputs["verdicts"],
                ).set_display_name("plan with the verdicts")
                # its own prefixes: no two training tasks of the pipeline share one
                _probe_and_train(arguments, planning, replanned, image, f"{prefix}/validated",
                                 parallelism, verdicts=compared.outputs["verdicts"])

    return plan_and_train


def _job_and_its_logs(job_arguments: dict[str, Any], region: Any, item: Any, what: str) -> Any:
    """One loop item's training job (``what``: its display name) and the parse of its logs,
    labelled with the item's precision and label; returns the parse task."""
    job = sagemaker_training(**job_arguments).set_display_name(what)
    return parse_logs(
        job_name=job.outputs["job_name"], region=region,
        requested_precision=item.precision, run_label=item.label,
    ).set_display_name(f"parse {what}")


def _probe_and_train(arguments: dict[str, Any], planning: dict[str, Any], plan: Any, image: Any,
                     prefix: str, parallelism: int, verdicts: Any = None) -> None:
    """Probe the plan's top candidates, re-rank them on measured speed (with the
    convergence verdicts, when a comparison ran), train the winner and parse its logs."""
    region = arguments["region"]
    with dsl.ParallelFor(plan.outputs["top_candidates"], parallelism=parallelism) as candidate:
        probed = _job_and_its_logs(probe_arguments(
            arguments, image_uri=image.outputs["image_uri"], prefix=prefix,
            candidate=candidate, candidates=plan.outputs["top_candidates"],
        ), region, candidate, "probe")
    more = {"convergence_verdicts": verdicts} if verdicts is not None else {}
    chosen = plan_training(
        **planning, **more, probe_series=dsl.Collected(probed.outputs["series"]),
    ).set_display_name("re-rank on probes")
    train = sagemaker_training(**train_arguments(
        arguments, image_uri=image.outputs["image_uri"], prefix=prefix,
        chosen={k: chosen.outputs[k] for k in CHOSEN},
    )).set_display_name("train")
    parse_logs(job_name=train.outputs["job_name"], region=region,
               requested_precision=chosen.outputs["precision"],
               ).set_display_name("parse training")


# The re-ranked plan's outputs the training step takes.
CHOSEN = ("instance_type", "instance_count", "precision", "batch_size",
          "activation_checkpointing", "max_steps", "max_runtime_seconds", "use_spot",
          "max_wait_seconds", "max_cost_usd")


def planning_arguments(a: dict[str, Any]) -> dict[str, Any]:
    """What both plan steps are passed (the DSL's calls and the argument check's)."""
    return {k: a[k] for k in (
        "training_tokens", *_steps.MODEL_KEYS, "seq_length", "max_batch_size", "deadline_hours",
        "max_cost_usd", "instance_types", "max_instance_count", "precisions", "max_risk",
        "capacity_modes", "region", "instance_hour_prices", "headroom", "runtime_margin",
        "startup_seconds", "rank_by", "probe_count", "keep_alive_seconds",
        "fallback_instances")}


def probe_arguments(a: dict[str, Any], *, image_uri: Any, prefix: Any, candidate: Any,
                    candidates: Any) -> dict[str, Any]:
    """What each probe's training task is passed (the DSL's call and the argument check's):
    the pipeline's parameters of the component's names, the candidate's configuration, the
    probes' steps, run time and budget."""
    return _steps.training_arguments(
        a, exclude=("fallback_instances",), image_uri=image_uri,
        **_steps.job_prefixes(f"{prefix}/probes"), instance_type=candidate.instance_type, instance_count=candidate.instance_count,
        precision=candidate.precision, batch_size=candidate.batch_size,
        activation_checkpointing=candidate.activation_checkpointing,
        max_steps=a["probe_steps"], max_runtime_seconds=a["probe_max_runtime_seconds"],
        max_cost_usd=a["probe_max_cost_usd"], budget_items=candidates, pipeline=NAME)


def validation_arguments(a: dict[str, Any], *, image_uri: Any, prefix: Any, run: Any,
                         runs: Any) -> dict[str, Any]:
    """What each convergence comparison job is passed: the run's precision on the
    above-ceiling row's instances (its own type: no fallback), ``validation_steps`` steps."""
    return _steps.training_arguments(
        a, exclude=("fallback_instances",), image_uri=image_uri,
        **_steps.job_prefixes(f"{prefix}/validation"), instance_type=run.instance_type,
        instance_count=run.instance_count, precision=run.precision, batch_size=run.batch_size,
        activation_checkpointing=run.activation_checkpointing,
        max_steps=a["validation_steps"], max_runtime_seconds=a["validation_max_runtime_seconds"],
        max_cost_usd=a["validation_max_cost_usd"], budget_items=runs, pipeline=NAME)


def train_arguments(a: dict[str, Any], *, image_uri: Any, prefix: Any,
                    chosen: dict[str, Any]) -> dict[str, Any]:
    """What the final training task is passed: the pipeline's parameters of the
    component's names and the re-ranked plan's choice (``CHOSEN``)."""
    return _steps.training_arguments(a, image_uri=image_uri, **_steps.job_prefixes(prefix),
                                     **chosen, pipeline=NAME)


PIPELINE = build_pipeline()

# What `--run-local` runs: a tiny model on this machine's CPU, one 1-GPU instance type,
# micro-batches of 8 x 128 tokens, 12 steps.
LOCAL_DEFAULTS: dict[str, Any] = {
    "model_preset": "tiny",
    "training_tokens": 12 * 8 * 128,
    "seq_length": 128,
    "max_batch_size": 8,
    "instance_types": ["ml.g5.xlarge"],
    "max_instance_count": 1,
    "precisions": ["bf16", "fp32"],
    "probe_count": 2,
    "probe_steps": 4,
    "hyperparameters": {"log-every": "1", "checkpoint-every": "0"},
}


def check_arguments(arguments: dict[str, Any]) -> None:
    """Checks a run's arguments before anything starts (``--run-local``): the planner runs
    in-process (no AWS call without a region) and must choose something; raises UserError."""
    from kfp_sagemaker_blackwell.common.errors import UserError
    from kfp_sagemaker_blackwell.components.plan_training.launcher import run_component

    modes = [str(m) for m in arguments["capacity_modes"] or []]
    if not modes or any(m not in CAPACITY_MODES for m in modes):
        raise UserError("capacity_modes", f"{modes!r}: the pipeline launches "
                        f"{' or '.join(CAPACITY_MODES)}.", "plan training plans with the "
                        "plan_training component and pass training_plan_arn to "
                        "sagemaker_training.")
    # region "": the shipped prices, no AWS Price List call before anything starts
    out = run_component(**{**planning_arguments(arguments), "region": ""}, probes=None,
                        show_top=10)
    problem = out.result.problem()
    if problem is not None:
        raise problem
    # the probes and the training a run would start (the training as planned before the
    # probes re-rank it), checked as their tasks check them
    run = _steps.stand_ins(arguments)
    _steps.check_training(out.top_candidates, lambda candidate: probe_arguments(
        arguments, image_uri=run["image_uri"], prefix=run["prefix"],
        candidate=SimpleNamespace(**candidate), candidates=out.top_candidates))
    _steps.check_training(out.validation_runs, lambda check: validation_arguments(
        arguments, image_uri=run["image_uri"], prefix=run["prefix"],
        run=SimpleNamespace(**check), runs=out.validation_runs))
    if out.parameters is not None:
        _steps.check_training([out.parameters], lambda chosen: train_arguments(
            arguments, image_uri=run["image_uri"], prefix=run["prefix"],
            chosen={k: chosen[k] for k in CHOSEN}))


def main(argv: list[str] | None = None) -> int:
    from kfp_sagemaker_blackwell.pipelines import _cli

    return _cli.pipeline_main(argv, __name__, report_task="plan-training-2")


if __name__ == "__main__":
    sys.exit(main())
