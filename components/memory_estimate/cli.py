"""``python -m components.memory_estimate``: will this training configuration fit?

Predicts the peak GPU memory per GPU of a training step (FSDP-sharded decoder LM)
for one or several precisions and batch sizes, says whether it fits with the
given headroom, the largest micro-batch that fits with and without activation
checkpointing, and which precisions the GPU runs. Pure Python, no GPU needed.

Examples::

    # 8B model, 8x B200, sequence 4096: the largest batch per precision
    python -m components.memory_estimate --preset 8b --instance-type ml.p6-b200.48xlarge \\
        --seq-length 4096 --precision bf16,fp8,mxfp8,nvfp4

    # one configuration, JSON with peak_bytes and the breakdown in bytes
    python -m components.memory_estimate --preset 14b --gpu H200 --world-size 8 \\
        --batch-size 4 --seq-length 4096 --precision fp8 --no-activation-checkpointing --json

    # TransformerEngine's examples/pytorch/fsdp/fsdp.py (bf16 params, bf16 Adam, FSDP1)
    python -m components.memory_estimate --preset te-fsdp-example --gpu B200 --world-size 8 \\
        --batch-size 16 --seq-length 8192 --precision mxfp8 --activation-checkpointing \\
        --param-dtype bf16 --no-master-weights --optimizer-state-dtype bf16 \\
        --fsdp-version 1 --optimizer adamw-foreach
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from components.common.errors import USER_ERROR_EXIT_CODE, UserError
from components.memory_estimate import estimator, planner, report
from trainer import hardware
from trainer.spec import add_model_args


class _Checkpointing(argparse.Action):
    """--activation-checkpointing [auto|on|off] / --no-activation-checkpointing."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        if option_string and option_string.startswith("--no-"):
            setattr(namespace, self.dest, "off")
        else:
            setattr(namespace, self.dest, planner.parse_checkpointing(values or "on"))


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    p = argparse.ArgumentParser(
        prog="python -m components.memory_estimate",
        description=doc.split("Examples::")[0],
        epilog="Examples:" + doc.split("Examples::")[1] if "Examples::" in doc else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_args(p)  # the trainer's own model flags: same names, same meaning

    hw = p.add_argument_group("hardware")
    hw.add_argument(
        "--instance-type",
        help=f"SageMaker instance type: {', '.join(hardware.INSTANCE_TYPES)}",
    )
    hw.add_argument("--gpu", help=f"GPU instead of an instance type: {', '.join(hardware.GPUS)}")
    hw.add_argument(
        "--instance-count",
        type=int,
        default=1,
        help="instances (nodes) per training job; the default world size is all their GPUs",
    )
    hw.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="GPUs FSDP shards over (GPUs per node x nodes); default: all GPUs of "
        "--instance-count instances, or 1 with --gpu",
    )

    tr = p.add_argument_group("training")
    tr.add_argument(
        "--precision",
        nargs="+",
        default=["bf16"],
        help=f"one or more of {', '.join(hardware.PRECISIONS)} (space or comma separated; "
        "several = sweep)",
    )
    tr.add_argument(
        "--batch-size",
        nargs="+",
        type=int,
        default=[0],
        help="micro-batch per GPU; several = candidates (the plan takes the largest that fits); "
        "0 = the largest that fits (default)",
    )
    tr.add_argument("--seq-length", type=int, default=2048, help="tokens per sequence (2048)")
    tr.add_argument(
        "--activation-checkpointing",
        "--no-activation-checkpointing",
        dest="activation_checkpointing",
        nargs="?",
        action=_Checkpointing,
        default="auto",
        metavar="auto|on|off",
        help="per-block activation checkpointing: on, off, or auto (default: off when the batch "
        "fits without it, else on)",
    )
    tr.add_argument(
        "--headroom",
        type=float,
        default=planner.DEFAULT_HEADROOM,
        help="fraction of GPU memory kept free (default 0.05)",
    )
    tr.add_argument("--backend", choices=estimator.BACKENDS, default="te",
                    help="te (TransformerEngine layers, default) or torch")
    tr.add_argument(
        "--param-dtype",
        choices=estimator.PARAM_DTYPES,
        default="fp32",
        help="dtype of the sharded parameters (fp32: they are the master weights; default)",
    )
    tr.add_argument(
        "--master-weights",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep an fp32 master copy when --param-dtype is 16-bit (default on)",
    )
    tr.add_argument("--optimizer-state-dtype", choices=estimator.OPTIMIZER_STATE_DTYPES,
                    default="fp32", help="AdamW moments dtype (fp32)")
    tr.add_argument("--fsdp-version", type=int, choices=estimator.FSDP_VERSIONS, default=2,
                    help="2: fully_shard (default), 1: FullyShardedDataParallel")
    tr.add_argument("--reduce-dtype", choices=estimator.REDUCE_DTYPES, default="fp32",
                    help="gradient reduce-scatter dtype (fp32)")
    tr.add_argument("--optimizer", choices=estimator.OPTIMIZERS, default="adamw-fused",
                    help="adamw-fused (in place, default) or adamw-foreach (one state-sized "
                    "temporary)")
    tr.add_argument(
        "--quantized-model-init",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="TE quantized_model_init: weights stored quantised (te backend, low precisions)",
    )
    tr.add_argument("--gradient-accumulation-steps", type=int, default=1,
                    help="micro-batches per optimizer step (gradients then live throughout)")

    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true",
                     help="print JSON: peak_bytes, breakdown (bytes) and the plan")
    out.add_argument(
        "--cross-check",
        action="store_true",
        help="also run PyTorch's FSDPMemTracker (FakeTensorMode, CPU, needs torch) on the "
        "trainer's model for each configuration (torch backend, 16-bit/fp32 only; slow)",
    )
    out.add_argument("--plan-out", type=Path, help="also write the MemoryPlan JSON to this file")
    out.add_argument("--markdown-out", type=Path, help="also write the Markdown report here")
    return p


def request_from_args(args: argparse.Namespace) -> planner.Request:
    from trainer.spec import ModelSpec

    dims = {k: v for k, v in vars(args).items() if k in ModelSpec.__dataclass_fields__}
    model = planner.model_from_values(args.preset, **dims)
    hw = planner.resolve_hardware(
        gpu=args.gpu,
        instance_type=args.instance_type,
        world_size=args.world_size,
        instance_count=args.instance_count,
    )
    return planner.Request(
        model=model,
        seq_length=args.seq_length,
        hardware=hw,
        precisions=planner.parse_precisions(args.precision),
        batch_sizes=tuple(args.batch_size),
        activation_checkpointing=planner.parse_checkpointing(args.activation_checkpointing),
        headroom=args.headroom,
        training={
            "backend": args.backend,
            "param_dtype": args.param_dtype,
            "master_weights": args.master_weights,
            "optimizer_state_dtype": args.optimizer_state_dtype,
            "fsdp_version": args.fsdp_version,
            "reduce_dtype": args.reduce_dtype,
            "optimizer": args.optimizer,
            "quantized_model_init": args.quantized_model_init,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
        },
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = planner.plan(request_from_args(args))
        planner.check_single_precision_supported(result)
    except UserError as exc:
        print(f"memory_estimate: error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    md = report.markdown(result)
    doc = report.json_document(result)
    if args.cross_check:
        try:
            _cross_check(result, doc)
        except UserError as exc:
            print(f"memory_estimate: error: {exc}", file=sys.stderr)
            return USER_ERROR_EXIT_CODE
        md += "\n" + _cross_check_markdown(doc)
    if args.plan_out:
        args.plan_out.write_text(result.plan.to_json() + "\n")
    if args.markdown_out:
        args.markdown_out.write_text(md)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(md, end="")
    return 0


def _cross_check(result: planner.PlanResult, doc: dict) -> None:
    """Adds ``cross_check`` (FSDPMemTracker's peak) to each estimate in ``doc``."""
    from components.memory_estimate import crosscheck

    rows = doc.get("estimates") or [doc]
    by_key = {
        (e.setup.precision, e.setup.batch_size, e.setup.activation_checkpointing): e
        for e in result.estimates
    }
    for row in rows:
        e = by_key[(row["precision"], row["batch_size"], row["activation_checkpointing"])]
        crosscheck.check_supported(e.setup)
        peak = crosscheck.tracker_peak(e.setup)
        row["cross_check"] = {
            "fsdp_mem_tracker_peak_bytes": peak,
            "estimate_minus_tracker": e.peak_allocated_bytes / peak - 1.0,
        }


def _cross_check_markdown(doc: dict) -> str:
    lines = [
        "#### Cross-check: FSDPMemTracker (FakeTensorMode on CPU) vs this estimate",
        "",
        "| precision | batch | activation checkpointing | tracker GiB | estimate (allocated) GiB "
        "| difference |",
        "|---|---|---|---|---|---|",
    ]
    for row in doc.get("estimates") or [doc]:
        c = row["cross_check"]
        lines.append(
            f"| {row['precision']} | {row['batch_size']} | "
            f"{'on' if row['activation_checkpointing'] else 'off'} | "
            f"{report.gib(c['fsdp_mem_tracker_peak_bytes']):.2f} | "
            f"{report.gib(row['peak_allocated_bytes']):.2f} | "
            f"{c['estimate_minus_tracker']:+.1%} |"
        )
    return "\n".join(lines) + "\n"
