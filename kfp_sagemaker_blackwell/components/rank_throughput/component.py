"""KFP definition of rank_throughput (the work is in ``kfp_sagemaker_blackwell.components.rank_throughput.launcher``)."""

from typing import NamedTuple

from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Output

from kfp_sagemaker_blackwell.common.component import component


@component(aws=False)
def rank_throughput(
    series: Input[list[Dataset]],
    report: Output[HTML],
    summary: Output[Markdown],
    metrics: Output[Metrics],
    plan: list = [],  # noqa: B006 (KFP default)
    run_context: dict = {},  # noqa: B006 (KFP default)
) -> NamedTuple(  # type: ignore[valid-type]
    "Outputs", [("best_batch_size", int), ("best_activation_checkpointing", bool),
                ("found", bool)]
):
    """Ranks training runs by throughput: the batch-size tuning step.

    Takes the series of several short training runs (``parse_logs`` outputs,
    gathered with ``dsl.Collected``), ranks the completed ones by steady-state
    tokens/s per GPU, shows each run's peak memory, and names the fastest
    configuration (batch size and activation checkpointing). Runs that failed
    (e.g. out of memory) are listed with their reason, never ranked. Runs with
    emulated numerics are labelled: their speed ranks this machine, not the GPU.
    A series that breaks its contract (``kfp-sagemaker/step-series/v1``: a value of
    the wrong type, an unknown precision, metadata that contradicts the rows) fails
    the step with an error naming the file, the line and the fix.

    Args:
        series: The parse_logs ``series`` Datasets of the candidate runs.
        plan: memory_estimate's ``batch_candidates`` (or prerank_candidates' ``trials``):
            their predicted tokens/s per GPU (for the target instance), and a probe's
            correction of it where there is one, stand beside the measured ones.
        run_context: What the pipeline knows about the run, shown on top of the report
            beside what the series say (model, sequence, batch sizes, steps, job names):
            e.g. {"pipeline": ..., "run_id": ..., "instance_type": ..., "region": ...}.

    Returns:
        report: HTML: the run context, throughput and (when measured) memory bars per
            candidate, each labelled measured, and the table.
        summary: Markdown table (rank, setting, status, tokens/s per GPU measured and,
            where a prediction exists, predicted by the plan (probe-corrected) or on the
            run's GPU, peak GiB).
        metrics: best_tokens_per_s_per_gpu, best_batch_size, candidates, completed.
        best_batch_size: The fastest completed candidate's batch size (0 when none).
        best_activation_checkpointing: Whether that candidate used checkpointing.
        found: True when at least one candidate completed.
    """
    from collections import namedtuple

    from kfp_sagemaker_blackwell.components.rank_throughput.launcher import (
        html_report,
        load,
        markdown,
        rank,
    )

    ranking = rank(load([s.path for s in series], plan))
    with open(report.path, "w", encoding="utf-8") as f:
        f.write(html_report(ranking, run_context))
    text = markdown(ranking, run_context)
    with open(summary.path, "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    best = ranking.best
    metrics.log_metric("candidates", len(ranking.candidates))
    metrics.log_metric("completed", sum(1 for c in ranking.candidates if c.ok))
    if best is not None:
        metrics.log_metric("best_tokens_per_s_per_gpu", best.tokens_per_s_per_gpu or 0.0)
        metrics.log_metric("best_batch_size", best.batch_size or 0)
    Outputs = namedtuple(  # noqa: N806
        "Outputs", ["best_batch_size", "best_activation_checkpointing", "found"])
    return Outputs(
        best.batch_size or 0 if best else 0,
        bool(best.activation_checkpointing) if best else False,
        best is not None,
    )
