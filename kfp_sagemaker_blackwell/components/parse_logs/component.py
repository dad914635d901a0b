"""The parse_logs KFP component (the work is in ``launcher``).

A bring-your-own-image job (sagemaker_training with ``trainer="custom"``): the
job's MetricDefinitions (DescribeTrainingJob) are applied to its log lines and the
matched values fill the step series (``loss``/``train:loss`` -> loss, ``lr``,
``throughput``/``tokens_per_s``..., ``step``/``epoch`` number the rows; other names
are named in a warning and left out: components/parse_logs/metric_defs.py), its
TrainingJobStatus gives the status and ``requested_precision`` labels the rows;
no recipe is confirmed (another image's log does not say it).
"""

from typing import NamedTuple

from kfp.dsl import Artifact, Dataset, Input, Markdown, Metrics, Output

from kfp_sagemaker_blackwell.common.component import component


@component(aws=True, retries=3)  # read-only
def parse_logs(
    metrics: Output[Metrics],
    series: Output[Dataset],
    summary: Output[Markdown],
    events: Output[Artifact],
    job_name: str = "",
    region: str = "",
    requested_precision: str = "",
    log_file: Input[Artifact] = None,
    log_group: str = "/aws/sagemaker/TrainingJobs",
    run_label: str = "",
    spike_threshold: float = 0.5,
    fail_on_failed_run: bool = True,
) -> NamedTuple("Outputs", [("status", str), ("precision", str)]):  # type: ignore[valid-type]
    """Reads a training job's logs and reports what happened, step by step.

    Reads every CloudWatch stream of the job (``/aws/sagemaker/TrainingJobs``,
    ``{job_name}/algo-N-{epoch}``: all hosts, and the new streams a spot restart
    adds) with full GetLogEvents pages and back-off on throttling, or a log file.
    Understands the trainer's log format (``catalog/logformat.py``), TransformerEngine's
    ``examples/pytorch/fsdp/fsdp.py`` lines ("Using FP8 recipe", "Avg. Iter. Time",
    "Peak Memory Use") and the noise around them (torchrun/NCCL/TE warnings,
    tracebacks, progress bars, interleaved ranks, non-UTF-8 bytes). Never fails on
    a log's content: a trainer line it cannot read is counted, not fatal.

    Args:
        job_name: SageMaker training job name to read from CloudWatch Logs (leave
            empty when a log file is given).
        region: AWS region of the job (default: the pod's AWS_REGION).
        requested_precision: the precision the job was asked to run (fp32, bf16,
            fp16, fp8, fp8-current, fp8-block, mxfp8, nvfp4); a warning is raised when
            the log confirms another recipe, or none.
        log_file: a training log to parse instead of CloudWatch.
        log_group: CloudWatch log group (SageMaker's by default).
        run_label: the run's name in reports (default: the job name).
        spike_threshold: a loss more than this fraction above its running average
            is reported as a loss spike.
        fail_on_failed_run: fail the step (after printing the summary) when the log
            could not be read (empty, no step lines) or the run failed (OOM, NaN,
            error), so that such a step never looks green; False keeps it green
            whenever the log was parsed.

    Returns:
        metrics: final_loss (mean over the last 10% of the steps: common/losses.py),
            last_loss, mean_tokens_per_s (after warm-up), mean_tokens_per_s_per_gpu,
            mean_tflops_per_gpu, mfu, peak_memory_gib, peak_reserved_gib, steps, counts of
            oom/nan_loss/loss_spike/restart/nccl_error events, log_lines,
            unparsed_trainer_lines (only the values the log has).
        series: per-step CSV (schema ``kfp-sagemaker/step-series/v1``): a first comment
            line with the run's metadata as JSON (precision, status, failure reason,
            emulated, seed, entropy floor...), then columns step, tokens, loss, lr,
            grad_norm, tokens_per_s, tokens_per_s_per_gpu, tflops_per_gpu, mfu,
            mem_alloc_gib, mem_reserved_gib, precision, emulated, seed, entropy_floor, run.
            Read it with ``pandas.read_csv(path, comment="#")``. compare_convergence
            takes these (one per precision, via ``dsl.Collected``).
        summary: Markdown: status, confirmed precision and recipe, loss, throughput, MFU,
            memory, warnings and events.
        events: JSON (schema ``kfp-sagemaker/log-events/v1``): status, confirmed
            precision, warnings, event counts and events (recipe confirmed, CUDA OOM with
            the allocation size in bytes, NaN/inf loss, loss spikes, checkpoint
            saved/resumed, SIGTERM, restarts, NCCL errors, exceptions), the trainer's
            summary, TE fsdp.py values.
        status: completed, stopped, failed, oom, nan, nccl_error, error, incomplete,
            no_steps or no_logs.
        precision: the precision the log confirms (else the requested one).
    """
    from collections import namedtuple

    from kfp_sagemaker_blackwell.components.parse_logs.launcher import (
        parse_file,
        parse_training_job,
    )
    from kfp_sagemaker_blackwell.components.parse_logs.report import kfp_metrics, write_outputs

    spike = float(spike_threshold)
    if log_file is not None and log_file.path:
        parsed = parse_file(log_file.path, spike_threshold=spike)
        label = run_label or job_name or "log file"
    else:
        parsed, _ = parse_training_job(job_name, region or None, group=log_group,
                                       spike_threshold=spike, precision=requested_precision)
        label = run_label or job_name
    out = write_outputs(parsed, requested_precision=requested_precision, run=label,
                        series_path=series.path, markdown_path=summary.path,
                        events_path=events.path)
    report = out.report
    for name, value in kfp_metrics(report).items():
        metrics.log_metric(name, value)
    for key in ("precision", "status", "emulated", "seed", "entropy_floor", "run"):
        if report.get(key) is not None:
            series.metadata[key] = report[key]
    series.metadata["rows"] = out.rows
    print(open(summary.path, encoding="utf-8").read())
    if fail_on_failed_run and report["failed"]:
        raise RuntimeError(
            f"parse_logs: status {report['status']}: {report.get('failure_reason') or 'failed'} "
            "(the summary above has the details; fail_on_failed_run=False keeps this step "
            "green)")
    Outputs = namedtuple("Outputs", ["status", "precision"])
    return Outputs(report["status"], report["precision"] or "")
