"""The compare_convergence KFP component (the work is in ``launcher``).

Verdict per precision: PASS when the run trained, has no NaN/inf loss, did not
diverge, and its final-window loss is at most
``max(loss_tolerance_abs, loss_tolerance_rel x baseline)`` above the baseline's (or
within ``seed_spread_factor`` x the seed spread); a run with no baseline run of the
same seed is "not compared", never a fail. Speed-ups are measured steady-state
tokens/s when the runs were timed on ``target_gpu``; otherwise (emulated numerics,
CPU runs, another GPU) the throughput model's prediction for ``target_gpu`` and
each run's configuration, labelled "predicted". The recommendation walks up the
risk order bf16 < fp8 < fp8-current / fp8-block < mxfp8 < nvfp4: a riskier passing
precision is recommended only when it is at least ``min_speedup_gain`` faster than
the safer one, and one sentence says why. Bad input (no series, a missing or
failed baseline, a baseline that stopped early, unreadable files, no pairs) gives
a clear error or a report marked PARTIAL with no recommendation, never a silent
pass. A series that breaks its contract (a repeated step with another loss, an
unknown precision, metadata that contradicts the rows, a value of the wrong type)
is left out and named with its line; rows out of order are sorted. Labels and
reasons appear in the summary and the report as text, never as markup.
"""

from typing import NamedTuple

from kfp.dsl import HTML, Artifact, Dataset, Input, Markdown, Metrics, Output

from kfp_sagemaker_blackwell.common.component import component


@component(aws=False)
def compare_convergence(
    series: Input[list[Dataset]],
    report: Output[HTML],
    summary: Output[Markdown],
    metrics: Output[Metrics],
    verdicts: Output[Artifact],
    baseline: str = "bf16",
    loss_tolerance_rel: float = 0.01,
    loss_tolerance_abs: float = 0.0,
    divergence_tolerance_rel: float = 0.1,
    seed_spread_factor: float = 1.0,
    final_window: float = 0.1,
    smoothing_window: int = 0,
    align_by: str = "step",
    min_step_coverage: float = 0.9,
    target_gpu: str = "B200",
    min_speedup_gain: float = 0.05,
    require_complete: bool = False,
    run_context: dict = {},  # noqa: B006 (KFP default)
) -> NamedTuple("Outputs", [("recommended_precision", str), ("passed", bool)]):  # type: ignore[valid-type]
    """Compares the loss curves of a precision sweep with its baseline and recommends one.

    Takes the per-step series that ``parse_logs`` wrote for each precision (pass them
    with ``dsl.Collected`` from a ``ParallelFor``). The comparison is paired: every run
    is compared with the baseline run of the same seed (same data order and init), on
    the baseline's steps (or tokens), after the same smoothing; where several seeds
    exist, the difference is also set against the baseline's seed-to-seed spread,
    because at small scale precision effects are smaller than seed noise.

    Args:
        series: the parse_logs series Datasets (CSV, ``kfp-sagemaker/step-series/v1``).
        baseline: the reference precision.
        loss_tolerance_rel: allowed final loss excess, as a fraction of the baseline's.
        loss_tolerance_abs: allowed final loss excess in nats (the larger one applies).
        divergence_tolerance_rel: the smoothed loss may never (after warm-up) be more than
            this fraction above the baseline's.
        seed_spread_factor: with several seeds, a difference within this many baseline
            seed spreads (standard deviation of the final loss) passes too.
        final_window: fraction of the aligned points averaged as the final loss.
        smoothing_window: moving-average window in logged points (0: about 5%).
        align_by: step or tokens.
        min_step_coverage: a run that reaches less than this fraction of the baseline's
            steps is incomplete (fails).
        target_gpu: GPU the speed-ups are for: runs not timed on it get the throughput
            model's prediction (B200 for ml.p6-b200.48xlarge).
        min_speedup_gain: the gain a riskier precision needs over the next safer passing
            one to be recommended (0.05 = 5%).
        require_complete: fail the step (after writing the outputs' messages to the log)
            when the report is partial.
        run_context: what the pipeline knows about the run, shown on top of the report
            beside what the series say (model, sequence, batch, steps, job names): e.g.
            {"pipeline": ..., "run_id": ..., "instance_type": ..., "instance_count": ...,
            "region": ..., "model_preset": ...}.

    Returns:
        report: HTML with the loss curves (all precisions, second half zoomed), the
            difference to the baseline, speed-up and memory bars and the verdict table;
            images are embedded PNGs, so it renders in the KFP UI offline.
        summary: Markdown verdict table and recommendation.
        metrics: precisions, passed, failed, partial, left_out (series files not
            compared: the report and summary name each), recommended_speedup, and per
            precision ``<p>_pass``, ``<p>_final_loss_diff(_rel)``, ``<p>_speedup``,
            ``<p>_memory_ratio``, ``<p>_worst_divergence_rel``, ``<p>_gap_to_floor``.
        verdicts: JSON (``kfp-sagemaker/convergence-verdicts/v1``): every number and
            reason per precision.
        recommended_precision: the recommended precision ("" when none or partial).
        passed: True when a recommendation exists and the report is complete. (With
            kfp.local 2.17, branch on it inside a sub-pipeline that takes it as an input:
            ``dsl.If`` on a named output of a multi-output task is never true locally.)
    """
    from collections import namedtuple

    from kfp_sagemaker_blackwell.common.errors import UserError
    from kfp_sagemaker_blackwell.components.compare_convergence.launcher import (
        compare_files,
        write_outputs,
    )
    from kfp_sagemaker_blackwell.components.compare_convergence.records import Settings
    from kfp_sagemaker_blackwell.components.compare_convergence.report import (
        metrics as comparison_metrics,
    )

    # every setting by its name (tests/test_declarations.py holds them)
    cmp = compare_files([s.path for s in series], Settings(
        baseline=baseline,
        loss_tolerance_rel=loss_tolerance_rel,
        loss_tolerance_abs=loss_tolerance_abs,
        divergence_tolerance_rel=divergence_tolerance_rel,
        seed_spread_factor=seed_spread_factor,
        final_window=final_window,
        smoothing_window=smoothing_window,
        align_by=align_by,
        min_step_coverage=min_step_coverage,
        target_gpu=target_gpu,
        min_speedup_gain=min_speedup_gain,
    ).validate())
    write_outputs(cmp, html_path=report.path, markdown_path=summary.path,
                  verdicts_path=verdicts.path, context=run_context)
    for name, value in comparison_metrics(cmp).items():
        metrics.log_metric(name, value)
    print(open(summary.path, encoding="utf-8").read())
    if require_complete and cmp.partial:
        raise UserError("series", "the comparison is partial: " + "; ".join(cmp.problems),
                        "fix the runs above, or set require_complete=False to get the "
                        "partial report.")
    Outputs = namedtuple("Outputs", ["recommended_precision", "passed"])
    return Outputs(cmp.recommended, cmp.passed)
