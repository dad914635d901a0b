"""Human and machine views of a plan: Markdown (KFP UI), JSON (pipelines), Metrics."""

from __future__ import annotations

from typing import Any

from kfp_sagemaker_blackwell.planning import estimator
from kfp_sagemaker_blackwell.planning.planner import PLAN_THROUGHPUT_KEYS, PlanResult
from kfp_sagemaker_blackwell.planning.probe import Comparison

_LABELS = {
    "parameters": "parameters (sharded)",
    "master_weights": "fp32 master weights (sharded)",
    "gradients": "gradients",
    "optimizer_states": "optimizer states (sharded)",
    "fsdp_buffers": "FSDP gathered weights / reduce buffers",
    "quantized_weights": "TE quantised / cast weight copies",
    "activations": "activations",
    "logits_and_loss": "logits and loss",
    "workspaces": "cuBLAS / TE workspaces",
    "cuda_context": "CUDA context + NCCL",
    "allocator_reserve": "allocator reserve",
}


def gib(x: float) -> float:
    return x / estimator.GiB


def _yn(x: bool) -> str:
    return "yes" if x else "no"


def markdown(result: PlanResult, probed: Comparison | None = None) -> str:
    plan, req = result.plan, result.request
    m = req.model
    hw = req.hardware
    where = (
        f"{plan.instance_type} ({hw.gpus_per_node} x {plan.gpu})" if plan.instance_type else plan.gpu
    )
    t = plan.training
    sharding = ("one GPU without FSDP (the plain module)"
                if req.setup(req.precisions[0], 1, False).unsharded  # TrainingSetup's one rule
                else f"FSDP{t['fsdp_version']} over {plan.world_size} GPU(s)")
    lines = [
        f"### Memory estimate: {m.total_params() / 1e9:.2f} B parameters on {where}",
        "",
        f"{m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads} heads "
        f"({m.num_kv_heads} KV), FFN {m.ffn_hidden_size} ({m.mlp}), vocab {m.vocab_size}; "
        f"sequence {plan.seq_length}; {sharding}; "
        f"{t['backend']} backend; parameters {t['param_dtype']}"
        f"{', fp32 master weights' if t['master_weights'] and t['param_dtype'] != 'fp32' else ''}; "
        f"AdamW states {t['optimizer_state_dtype']}. GPU memory {gib(plan.gpu_memory_bytes):.1f} GiB, "
        f"headroom {plan.headroom_fraction:.0%} (usable {gib(req.usable_bytes):.1f} GiB).",
        "",
        "| precision | GPU runs it | fits | batch | activation checkpointing | peak / GPU "
        "| of GPU | largest batch without / with checkpointing | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p, e in plan.precisions.items():
        notes = " ".join(x for x in (e.reason, e.note) if x).replace("|", "/")
        lines.append(
            f"| {p} | {_yn(e.supported)} | {_yn(e.fits)} | {e.batch_size} | "
            f"{'on' if e.activation_checkpointing else 'off'} | {gib(e.peak_bytes):.1f} GiB | "
            f"{e.peak_bytes / plan.gpu_memory_bytes:.0%} | "
            f"{e.max_batch_size_without_checkpointing} / {e.max_batch_size_with_checkpointing} | "
            f"{notes} |"
        )
    lines += _throughput_markdown(result)
    lines += probe_markdown(result, probed)
    lines += ["", "#### What the peak is made of (GiB per GPU)", ""]
    precs = list(plan.precisions)
    lines.append("| part | " + " | ".join(precs) + " |")
    lines.append("|---|" + "---|" * len(precs))
    for part in estimator.PARTS:
        vals = [gib(plan.precisions[p].breakdown.get(part, 0)) for p in precs]
        lines.append(f"| {_LABELS[part]} | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
    lines.append(
        "| **total** | " + " | ".join(f"**{gib(plan.precisions[p].peak_bytes):.2f}**" for p in precs)
        + " |"
    )
    if len(result.estimates) > len(precs):
        lines += [
            "",
            "#### Every configuration estimated",
            "",
            "| precision | batch | activation checkpointing | peak / GPU | fits | peak during |",
            "|---|---|---|---|---|---|",
        ]
        for est in result.estimates:
            s = est.setup
            lines.append(
                f"| {s.precision} | {s.batch_size} | {'on' if s.activation_checkpointing else 'off'} "
                f"| {gib(est.peak_bytes):.1f} GiB | {_yn(est.peak_bytes <= req.usable_bytes)} | "
                f"{est.phase} |"
            )
    lines += [
        "",
        "Peak = allocated tensors (predicts `torch.cuda.max_memory_allocated`) + CUDA context "
        "+ allocator reserve. MXFP8 and NVFP4 figures are derived from the formats' byte sizes "
        "and were not measured.",
    ]
    return "\n".join(lines) + "\n"


def _fmt_cost(x: float | None) -> str:
    return "n/a (no instance price)" if x is None else f"${x:,.2f}"


def _throughput_markdown(result: PlanResult) -> list[str]:
    """The throughput model's prediction for each runnable entry (predicted, labelled)."""
    plan = result.plan
    rows = [(p, e) for p, e in plan.precisions.items() if e.tokens_per_s_per_gpu]
    if not rows:
        return []
    base = plan.precisions.get("bf16")
    base_tps = base.tokens_per_s_per_gpu if base and base.runnable else None
    out = ["", "#### Predicted speed and cost (throughput model; predicted, not measured)", "",
           "| precision | batch | tokens/s per GPU | step s | MFU | vs bf16 | $ per billion tokens "
           "| limited by |", "|---|---|---|---|---|---|---|---|"]
    for p, e in rows:
        rate = e.tokens_per_s_per_gpu or 0.0
        vs = f"{rate / base_tps:.2f}x" if base_tps else "n/a"
        mfu = f"{e.mfu:.0%}" if e.mfu is not None else "n/a"
        out.append(f"| {p} | {e.batch_size} | {rate:,.0f} | "
                   f"{e.step_seconds or 0.0:.3f} | {mfu} | {vs} | "
                   f"{_fmt_cost(e.cost_usd_per_billion_tokens)} | {e.throughput_bound} |")
    sources = sorted({e.throughput_source for _, e in rows})
    prices = sorted({e.price_source for _, e in rows if e.price_source})
    out += ["", "Source: " + "; ".join(sources) + ". Instance price: "
            + ("; ".join(prices) if prices else "none") + ". MFU counts model FLOPs (6N + 12LHT per "
            "token) against the precision's dense peak, as the trainer reports it."]
    return out


def probe_markdown(result: PlanResult, probed: Comparison | None) -> list[str]:
    """Predicted, probed and corrected by the probe, each labelled (none without one)."""
    if probed is None:
        return []
    pr, t, fit = probed.probe, probed.throughput, probed.fit
    entry = result.plan.precisions[pr.precision]
    world = result.plan.world_size
    peak = probed.predicted_peak_at_probe_bytes
    what = f"{pr.kind}: {pr.source or 'a probe'} ({pr.world_size} x {pr.gpu_name()})"

    def gb(x: float | None) -> str:
        return "not measured" if x is None else f"{gib(x):.1f} GiB"

    return [
        "", f"#### Probe, then extrapolate ({pr.precision}, batch {pr.batch_size}, "
        f"checkpointing {'on' if pr.activation_checkpointing else 'off'})", "",
        "| | tokens/s per GPU | peak / GPU |", "|---|---|---|",
        f"| predicted, full run ({world} GPUs) | {t.predicted:,.0f} | {gb(entry.peak_bytes)} |",
        f"| predicted at the probe's world size ({pr.world_size} GPU(s)) | "
        f"{t.predicted_at_probe:,.0f} | {gb(fit.peak_bytes)} |",
        f"| {what} | {t.probed:,.0f} | {gb(pr.peak_memory_bytes or None)} reserved |",
        f"| corrected by the probe, full run ({world} GPUs) | {t.corrected:,.0f} | "
        "not corrected |",
        "", f"Corrected: {t.source}." + (
            f" Probed / predicted peak reserved (the allocator's, no CUDA context) at the "
            "probe's world size: "
            f"{pr.peak_memory_bytes / peak:.3f}." if peak else "")
        + " The plan's entries keep the prediction.",
    ] + (["", f"**Warning:** {fit.warning('probe')}"] if not fit.fits else [])


def metrics(result: PlanResult, probed: Comparison | None = None) -> dict[str, float]:
    """Scalars for KFP Metrics (one set per precision; a probe's under its precision)."""
    plan = result.plan
    out: dict[str, float] = {
        "parameters_billion": round(result.request.model.total_params() / 1e9, 4),
        "gpu_memory_gib": round(gib(plan.gpu_memory_bytes), 2),
        "runnable_precisions": float(len(plan.runnable_precisions())),
    }
    for p, e in plan.precisions.items():
        out[f"{p}_peak_gib"] = round(gib(e.peak_bytes), 2)
        out[f"{p}_fits"] = float(e.runnable)
        out[f"{p}_batch_size"] = float(e.batch_size)
        out[f"{p}_activation_checkpointing"] = float(e.activation_checkpointing)
        out[f"{p}_max_batch_without_checkpointing"] = float(e.max_batch_size_without_checkpointing)
        out[f"{p}_max_batch_with_checkpointing"] = float(e.max_batch_size_with_checkpointing)
        for key in ("tokens_per_s_per_gpu", "step_seconds", "mfu", "cost_usd_per_billion_tokens"):
            value = getattr(e, key)
            if value is not None:
                out[f"{p}_predicted_{key}"] = float(value)
    if probed is not None:
        p, t = probed.probe.precision, probed.throughput
        out[f"{p}_probed_tokens_per_s_per_gpu"] = float(t.probed)
        out[f"{p}_corrected_tokens_per_s_per_gpu"] = float(t.corrected)
        out[f"{p}_probe_factor"] = round(t.factor, 4)
        out[f"{p}_probe_fits_predicted"] = float(probed.fit.fits)
        if probed.predicted_peak_at_probe_bytes is not None:
            out[f"{p}_probed_peak_reserved_gib"] = round(gib(probed.probe.peak_memory_bytes), 2)
            out[f"{p}_predicted_peak_reserved_gib_at_probe"] = round(
                gib(probed.predicted_peak_at_probe_bytes), 2)
    return out


def probe_document(probed: Comparison) -> dict[str, Any]:
    """The CLI's ``--json`` ``probe``: the probe, its correction, the peaks compared, and
    whether the memory estimate says the probe's configuration fits where it ran
    (``warning``: "" when it does)."""
    from dataclasses import asdict

    return {"probe": asdict(probed.probe), "predicted_tokens_per_s_per_gpu":
            probed.throughput.predicted, "predicted_at_probe_tokens_per_s_per_gpu":
            probed.throughput.predicted_at_probe, "probed_tokens_per_s_per_gpu":
            probed.throughput.probed, "corrected_tokens_per_s_per_gpu":
            probed.throughput.corrected, "factor": probed.throughput.factor,
            "source": probed.throughput.source, "predicted_peak_at_probe_bytes":
            probed.predicted_peak_at_probe_bytes,
            "probed_peak_bytes": probed.probe.peak_memory_bytes or None,
            "fits_at_probe_predicted": probed.fit.fits,
            "predicted_peak_at_probe_world_size_bytes": probed.fit.peak_bytes,
            "warning": probed.fit.warning("probe")}


def json_document(result: PlanResult) -> dict[str, Any]:
    """The CLI's ``--json``. One precision and one batch size: the estimate of the
    configuration the plan chose (``peak_bytes``, ``breakdown``...) and the throughput
    model's prediction for it (``tokens_per_s_per_gpu``, ``step_seconds``, ``mfu``,
    ``cost_usd_per_billion_tokens``, ``throughput_source``; null where the GPU cannot
    run the precision). Otherwise a sweep: ``{"estimates": [...every
    configuration...]}``. Both carry ``plan``."""
    import json

    req = result.request
    plan = json.loads(result.plan.to_json())

    def row(e: Any) -> dict[str, Any]:
        return dict(e.to_dict(), fits=e.peak_bytes <= req.usable_bytes)

    if len(req.precisions) == 1 and len(req.batch_sizes) == 1:
        entry = result.plan.precisions[req.precisions[0]]
        for est in result.estimates:
            s = est.setup
            if (s.batch_size, s.activation_checkpointing) == (
                entry.batch_size,
                entry.activation_checkpointing,
            ):
                predicted = {k: getattr(entry, k) for k in PLAN_THROUGHPUT_KEYS}
                return dict(row(est), **predicted, plan=plan)
    return {"estimates": [row(e) for e in result.estimates], "plan": plan}
