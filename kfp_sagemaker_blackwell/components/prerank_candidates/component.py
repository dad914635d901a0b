"""KFP definition of prerank_candidates (the work is in ``kfp_sagemaker_blackwell.planning.prerank``)."""

from typing import NamedTuple

from kfp.dsl import Markdown, Metrics, Output

from kfp_sagemaker_blackwell.common.component import component


@component(aws=False)
def prerank_candidates(
    summary: Output[Markdown],
    metrics: Output[Metrics],
    memory_plan: str,
    batch_candidates: list,
    probe: str = "",
    trial_count: int = 3,
) -> NamedTuple("Outputs", [("trials", list)]):  # type: ignore[valid-type]
    """Pre-ranks batch-tuning candidates with probes ("probe, then extrapolate").

    Without a probe every candidate is timed by a trial, as memory_estimate lists them.
    With probes (short measured runs of the plan's precision on its GPU type), each
    candidate's predicted tokens/s per GPU and peak memory are corrected by the nearest
    probe (its own configuration, else the same checkpointing and the nearest
    micro-batch): the measured / predicted ratio at the probe's configuration, applied
    to the candidate's prediction for the full run. Candidates whose corrected peak
    exceeds the plan's usable memory are dropped; the rest are ranked by corrected
    tokens/s per GPU and the best ``trial_count`` are timed. One probe scales every
    candidate by one factor (their order stays; which fit may change); probes of
    several micro-batches can reorder them. Pure Python, no AWS call.

    Args:
        memory_plan: memory_estimate's ``plan`` output (the MemoryPlan JSON the
            candidates come from: model, sequence, GPU, world size, headroom).
        batch_candidates: memory_estimate's ``batch_candidates`` output.
        probe: Probes, as memory_estimate's ``probe`` takes one: a JSON object
            {precision, batch_size, activation_checkpointing, tokens_per_s_per_gpu,
            instance_type or gpu, world_size, peak_memory_bytes, source, kind}, or a
            JSON list of them; on the command line also @FILE. peak_memory_bytes: the
            peak reserved per GPU (parse_logs' peak_reserved_gib x 2^30), 0 = not
            measured. Of a runnable precision
            of the plan, on its GPU type (any micro-batch, checkpointing and world
            size). "" = none: every candidate is timed.
        trial_count: With a probe: how many of the best pre-ranked candidates are timed
            (0: every one that fits). Without a probe every candidate is.

    Returns:
        trials: The candidates to time, best first ({precision, batch_size,
            activation_checkpointing, predicted_tokens_per_s_per_gpu}, and with a probe
            corrected_tokens_per_s_per_gpu, throughput_kind, throughput_source,
            predicted_peak_bytes, corrected_peak_bytes, memory_kind).
        summary: Markdown table: per candidate its predicted and probe-corrected
            tokens/s per GPU and peak GiB, whether it fits, and whether a trial times it
            (and why not).
        metrics: candidates, trials, dropped, and with a probe probe_factor and
            best_corrected_tokens_per_s_per_gpu.
    """
    from collections import namedtuple

    from kfp_sagemaker_blackwell.components.prerank_candidates import launcher
    from kfp_sagemaker_blackwell.components.prerank_candidates.report import markdown, metric_values

    result = launcher.prerank_candidates(memory_plan, batch_candidates, probe, trial_count)
    text = markdown(result)
    with open(summary.path, "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    for name, value in metric_values(result).items():
        metrics.log_metric(name, value)
    return namedtuple("Outputs", ["trials"])(result.trials)  # type: ignore[call-arg]
