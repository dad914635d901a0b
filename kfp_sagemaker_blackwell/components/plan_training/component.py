"""KFP definition of the training planner (the work is in ``launcher``).

The table's every figure names its source (predicted, probed or measured, and by
what; the price's source; the precision's risk and whether the convergence sweep
validated it). Pure Python; seconds on a CPU for the default search. Without a
``region`` no AWS call is made (the shipped price table; no training plans).
"""

from typing import NamedTuple, Optional

from kfp.dsl import Artifact, Dataset, Input, Markdown, Output

from kfp_sagemaker_blackwell.common.component import component


@component(aws=True, retries=2)  # reads prices and offerings only
def plan_training(
    training_tokens: int,
    summary: Output[Markdown],
    candidates: Output[Artifact],
    choice: Output[Artifact],
    convergence_verdicts: Input[Artifact] = None,
    probe_series: Input[list[Dataset]] = None,
    # catalog/parameters.py's MODEL, documented there:
    model_preset: str = "8b", num_layers: int = 0, hidden_size: int = 0, num_heads: int = 0,
    num_kv_heads: int = 0, ffn_hidden_size: int = 0, vocab_size: int = -1,
    seq_length: int = 2048,
    # catalog/parameters.py's PLAN_LIMITS, documented there:
    max_batch_size: int = 0, deadline_hours: float = 0.0, max_cost_usd: float = 0.0,
    instance_types: Optional[list] = None, max_instance_count: int = 16,
    precisions: Optional[list] = None, max_risk: str = "medium",
    capacity_modes: list = ["on-demand", "spot", "training-plan"],  # noqa: B006 (KFP default)
    region: str = "",
    instance_hour_prices: Optional[dict] = None,
    headroom: float = 0.05,
    runtime_margin: float = 0.0,
    startup_seconds: int = 600,
    keep_alive_seconds: int = 0,
    fallback_instances: Optional[list] = None,
    rank_by: str = "cost",
    probes: Optional[list] = None,
    show_top: int = 10,
    probe_count: int = 3,
) -> NamedTuple(  # type: ignore[valid-type]
    "Outputs",
    [("instance_type", str), ("instance_count", int), ("precision", str), ("batch_size", int),
     ("activation_checkpointing", bool), ("max_steps", int), ("max_runtime_seconds", int),
     ("use_spot", bool), ("max_wait_seconds", int), ("max_cost_usd", float),
     ("top_candidates", list), ("validate_precision", str), ("validation_runs", list)],
):
    """Plans a training run: the cheapest (or fastest) configuration that trains this model
    on this many tokens, within a deadline and a budget, before any money is spent.

    Searches instance type x instance count x precision x micro-batch x activation
    checkpointing x capacity mode (on-demand, spot, a training plan) with the project's
    models, nothing new: the memory estimate (memory_estimate's planner: what fits, and
    the headroom) and the throughput model (planning/throughput.py: tokens/s
    per GPU, corrected by ``probes`` when given), priced by the price book
    (planning/pricing.py: your ``instance_hour_prices``, the AWS Price List
    API, the shipped table) through the one cost function. Configurations that do not fit
    in memory, miss the deadline, run longer than one SageMaker job may (28 days) or
    whose worst case (what sagemaker_training's spend guard checks) exceeds
    ``max_cost_usd`` are dropped with their reason; an instance type without a price is
    listed as unpriced, never ranked. For training plans, SearchTrainingPlanOfferings
    gives the exact up-front fee and window for the run's hours (nothing is bought).

    Args:
        training_tokens: Tokens to train on (e.g. 100000000000 for 100B).
        convergence_verdicts: The ``verdicts`` output of compare_convergence: a precision
            it passed is ranked even above ``max_risk`` (marked validated); one it failed is
            not planned; the others keep the ceiling.
        seq_length: Sequence length in tokens.
        capacity_modes: on-demand, spot (its expected cost: the typical saving and the
            interruptions' overhead, restart + one checkpoint interval each, with their
            source; its worst case is max_wait_seconds at the on-demand rate) and
            training-plan (needs ``region``).
        region: AWS region the prices and training-plan offerings are for (the AWS Price
            List API, SearchTrainingPlanOfferings); empty: no AWS call.
        instance_hour_prices: Instance type -> USD per instance-hour (e.g. a Savings
            Plans rate), before the Price List API and the shipped table.
        headroom: Fraction of GPU memory to keep free (0.05 = 5%).
        runtime_margin: max_runtime_seconds = the steps' predicted time x (1 + this) +
            ``startup_seconds``: room for the throughput model's error (the worst case
            is costed with it; a job past it is stopped before its last step). 0: each
            row's own band (planning/uncertainty.py): for measured H200 parts the model's
            worst error on configuration families left out of its fit plus a 10-point
            allowance (planning/throughput.py RUNTIME_MARGIN); for datasheet-only
            Blackwell rows a wider one.
        startup_seconds: Billed time before the first step (image download, torchrun and
            model initialisation, compilation), added to every job's predicted time.
        keep_alive_seconds: The training job's warm pool (sagemaker_training's parameter):
            its retained time is billed, so it is in every on-demand row's cost and worst
            case (spot cannot keep a warm pool: spot rows are dropped).
        fallback_instances: sagemaker_training's fallback instances
            ([{"InstanceType": ..., "InstanceCount": ...}]): a row's worst case is that of
            the costliest SageMaker may select (spot rows are dropped: on-demand only).
        rank_by: cost (cheapest first, then fastest) or time (fastest first).
        probes: Measured speeds that correct the prediction: a list of
            {instance_type, precision, batch_size, activation_checkpointing,
            tokens_per_s_per_gpu, world_size, peak_memory_bytes, source, kind
            (probed or measured)}; peak_memory_bytes: the peak reserved per GPU
            (parse_logs' peak_reserved_gib x 2^30; the predicted CUDA context is added
            to it), 0 = not measured. One the memory estimate says cannot fit where it
            ran is noted: it contradicts the memory model.
        show_top: Rows of the ranked table in the report.
        probe_count: How many of the best distinct configurations ``top_candidates``
            lists (the plan_and_train pipeline probes them).

    Returns:
        summary: Markdown: the ranked table with every figure's source, and what was not
            ranked and why (unpriced types, deadline, budget, memory).
        candidates: JSON (kfp-sagemaker/training-candidates/v1): every ranked and
            dropped candidate with its figures and their sources.
        choice: JSON (kfp-sagemaker/training-choice/v1): the chosen configuration as
            sagemaker_training's parameters, its predicted figures, and what it still
            needs (checkpoint_s3_uri for spot, training_plan_arn for a plan).
        instance_type: The chosen instance type (sagemaker_training's parameter).
        instance_count: The chosen instance count.
        precision: The chosen precision.
        batch_size: The chosen micro-batch per GPU.
        activation_checkpointing: Whether to checkpoint activations.
        max_steps: Optimizer steps for training_tokens.
        max_runtime_seconds: The predicted time with runtime_margin.
        use_spot: True when spot was chosen.
        max_wait_seconds: Spot only: max_runtime_seconds x 2 (0 otherwise).
        top_candidates: The best ``probe_count`` distinct configurations, best first.
        validate_precision: The precision above ``max_risk`` that beats the choice by more
            than its band ("" when none): plan_and_train compares its convergence first.
        validation_runs: The short jobs that comparison trains (the baseline bf16 and
            ``validate_precision``, on that row's instances), empty when none.
    """
    params = dict(locals())  # this signature's parameters: their one declaration
    from collections import namedtuple

    from kfp_sagemaker_blackwell.common.errors import UserError
    from kfp_sagemaker_blackwell.components.plan_training.launcher import run_component

    verdicts = convergence_verdicts.path if convergence_verdicts is not None else ""
    series = [s.path for s in probe_series] if probe_series is not None else []
    out = run_component(verdicts=verdicts, probe_series=series, **{
        k: v for k, v in params.items()
        if k not in ("summary", "candidates", "choice", "convergence_verdicts", "probe_series")})
    for artifact, text in ((summary, out.markdown), (candidates, out.candidates),
                           (choice, out.choice)):
        with open(artifact.path, "w", encoding="utf-8") as f:
            f.write(text)
    print(out.markdown)
    if out.parameters is None:
        raise out.result.problem() or UserError("instance_types", "nothing was chosen.", "")
    p = out.parameters
    outputs = namedtuple(  # type: ignore[name-match]
        "Outputs", ["instance_type", "instance_count", "precision", "batch_size",
                    "activation_checkpointing", "max_steps", "max_runtime_seconds", "use_spot",
                    "max_wait_seconds", "max_cost_usd", "top_candidates",
                    "validate_precision", "validation_runs"])
    return outputs(p["instance_type"], p["instance_count"], p["precision"], p["batch_size"],
                   p["activation_checkpointing"], p["max_steps"], p["max_runtime_seconds"],
                   p["use_spot"], p["max_wait_seconds"], p["max_cost_usd"],
                   out.top_candidates, out.validate_precision, out.validation_runs)
