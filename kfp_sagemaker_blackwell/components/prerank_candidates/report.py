"""The pre-ranking's summary (Markdown for the KFP UI) and metrics, every figure labelled."""

from __future__ import annotations

from kfp_sagemaker_blackwell.common import markdown as md
from kfp_sagemaker_blackwell.planning.estimator import GiB
from kfp_sagemaker_blackwell.planning.prerank import CORRECTED, PreRank, Ranked
from kfp_sagemaker_blackwell.planning.probe import Probe


def _setting(r: Ranked) -> str:
    c = r.candidate
    return (f"{c['precision']} batch {c['batch_size']}, checkpointing "
            f"{'on' if c['activation_checkpointing'] else 'off'}")


def _corrected(kind: str, value: str) -> str:
    return value if kind == CORRECTED else "n/a"


def probe_name(p: Probe) -> str:
    return (f"{p.source or 'a probe'} ({p.precision} batch {p.batch_size}, checkpointing "
            f"{'on' if p.activation_checkpointing else 'off'}, {p.world_size} x {p.gpu_name()})")


def _by(r: Ranked) -> str:
    parts = [f"{'speed' if i == 0 else 'peak'} x{f:.3f}: {q.source or 'a probe'}"
             for i, (q, f) in enumerate(((r.throughput_probe, r.throughput_factor),
                                         (r.memory_probe, r.memory_factor)))
             if q is not None and f is not None]
    return "; ".join(parts) or "n/a"


def _probes(result: PreRank) -> list[str]:
    lines = []
    for p in result.probes:
        peak = f", peak {p.peak_memory_bytes / GiB:.1f} GiB" if p.peak_memory_bytes else ""
        lines.append("- " + md.inline(
            f"{p.kind}: {probe_name(p)}: {p.tokens_per_s_per_gpu:,.0f} tokens/s per GPU{peak} "
            "(measured by the probe)"))
    return lines


def markdown(result: PreRank) -> str:
    """Per candidate: predicted and probe-corrected tokens/s per GPU and peak, fits, trial."""
    plan = result.plan
    lines = ["# Pre-ranked batch-tuning candidates", "",
             md.line(f"{plan.gpu} x {plan.world_size} ({plan.instance_type or 'GPU only'}), "
                     f"sequence {plan.seq_length}; usable memory "
                     f"{result.usable_bytes / GiB:.1f} GiB per GPU "
                     f"({plan.headroom_fraction:.0%} headroom)."), ""]
    if not result.probes:
        lines += ["No probe: every candidate is timed by a trial, in the plan's order "
                  "(predicted tokens/s per GPU).", ""]
    else:
        lines += ["Probes:", "", *_probes(result), "",
                  f"**{len(result.trials)} of {len(result.ranked)} candidates timed** "
                  f"(trial_count={result.trial_count}).", ""]
    lines += ["| rank | candidate | tokens/s/GPU (predicted) | tokens/s/GPU (probe-corrected) "
              "| peak GiB (predicted) | peak GiB (probe-corrected) | corrected by | fits "
              "| trial |", "|---:|---|---:|---:|---:|---:|---|---|---|"]
    for r in result.ranked:
        trial = "timed" if r.timed else f"not timed: {r.why_not}"
        lines.append("| " + " | ".join(md.inline(x) for x in (
            str(r.rank) if r.rank else "-", _setting(r),
            f"{r.predicted_tokens_per_s_per_gpu:,.0f}",
            _corrected(r.throughput_kind, f"{r.tokens_per_s_per_gpu:,.0f}"),
            f"{r.predicted_peak_bytes / GiB:.1f}",
            _corrected(r.memory_kind, f"{r.peak_bytes / GiB:.1f}"),
            _by(r), "yes" if r.fits else "no", trial)) + " |")
    lines += ["", "Predicted: memory_estimate's throughput model and memory estimate for each "
              "candidate's full run, before anything ran."]
    if result.probes:
        lines += ["", "Probe-corrected: the prediction x the probe's measured / predicted ratio "
                  "at the probe's own configuration and world size (planning/probe.py; the "
                  "nearest probe: the candidate's own configuration, else the same "
                  "checkpointing and the nearest micro-batch). Fits: the corrected peak "
                  "within the usable memory."]
    return "\n".join(lines) + "\n"


def metric_values(result: PreRank) -> dict[str, float]:
    out = {"candidates": float(len(result.ranked)), "trials": float(len(result.trials)),
           "dropped": float(len(result.dropped))}
    corrected = [r for r in result.ranked if r.throughput_kind == CORRECTED and r.fits]
    if corrected:
        best = max(corrected, key=lambda r: r.tokens_per_s_per_gpu)
        out["probe_factor"] = round(best.throughput_factor or 0.0, 4)
        out["best_corrected_tokens_per_s_per_gpu"] = round(best.tokens_per_s_per_gpu, 1)
    return out
