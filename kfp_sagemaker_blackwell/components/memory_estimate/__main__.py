"""``python -m kfp_sagemaker_blackwell.components.memory_estimate``: will this training configuration fit?

Predicts the peak GPU memory per GPU of a training step (FSDP-sharded decoder LM)
for one or several precisions, says whether it fits with the given headroom, the
largest micro-batch that fits with and without activation checkpointing, and
which precisions the GPU runs. Pure Python, no GPU needed. The flags and their
defaults are the KFP component's parameters (``components/memory_estimate/component.py``);
``--gpu`` without ``--instance-type`` plans for that GPU alone.

Examples::

    # 8B model, 8x B200, sequence 4096: the largest batch per precision
    python -m kfp_sagemaker_blackwell.components.memory_estimate --model-preset 8b --instance-type ml.p6-b200.48xlarge \\
        --seq-length 4096 --precisions bf16,fp8,mxfp8,nvfp4

    # one configuration, JSON with peak_bytes and the breakdown in bytes
    python -m kfp_sagemaker_blackwell.components.memory_estimate --model-preset 14b --gpu H200 --world-size 8 \\
        --batch-size 4 --seq-length 4096 --precisions fp8 --activation-checkpointing off --json

    # TransformerEngine's examples/pytorch/fsdp/fsdp.py (bf16 params, bf16 foreach Adam, FSDP1,
    # hidden dropout 0.1)
    python -m kfp_sagemaker_blackwell.components.memory_estimate --model-preset te-fsdp-example --gpu B200 --world-size 8 \\
        --batch-size 16 --seq-length 8192 --precisions mxfp8 --activation-checkpointing on \\
        --param-dtype bf16 --no-master-weights --optimizer-state-dtype bf16 \\
        --fsdp-version 1 --optimizer adamw-foreach --dropout 0.1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from kfp_sagemaker_blackwell.catalog.spec import NORM_TYPES as MODEL_NORMS
from kfp_sagemaker_blackwell.common import cli
from kfp_sagemaker_blackwell.common.errors import (
    USER_ERROR_EXIT_CODE,
    UserError,
    check_count,
    cli_errors,
)
from kfp_sagemaker_blackwell.components.memory_estimate import launcher, report
from kfp_sagemaker_blackwell.planning import estimator, planner, training_setup

# The component's signature, read from its source: importing component.py would import kfp
# (0.4 s at every start) for a parser.
COMPONENT = "kfp_sagemaker_blackwell.components.memory_estimate.component:memory_estimate"

# Shapes only an output the pipeline reads (batch_candidates), not what this prints.
PIPELINE_ONLY = ("max_candidate_batch_size",)
# ModelSpec fields the component does not expose (None: the preset's).
MODEL_SWITCHES = {"bias": "biases in linears", "tie_embeddings": "share the embedding and LM "
                  "head weights", "rotary": "rotary position embeddings"}
# Old spellings, still accepted with a deprecation message.
ALIASES = {"--preset": "model_preset", "--precision": "precisions"}


def build_parser() -> tuple[argparse.ArgumentParser, list[cli.Parameter]]:
    parser, params = cli.derived_parser(
        COMPONENT, doc=__doc__,
        title="the component's parameters", aliases=ALIASES, exclude=PIPELINE_ONLY,
        notes={"world_size": "here a count >= 1: leave --world-size out for all GPUs"})
    model = parser.add_argument_group("model (not parameters of the component; default: the preset's)")
    model.add_argument("--norm", choices=MODEL_NORMS, help="rmsnorm or layernorm")
    for name, text in MODEL_SWITCHES.items():
        model.add_argument(cli.flag_name(name), action=argparse.BooleanOptionalAction,
                           default=None, help=text)
    tr = parser.add_argument_group("training (not parameters of the component)")
    # None: not given, so the planner's TrainingSetup default applies (shown in the help).
    defaults = {f.name: f.default for f in dataclasses.fields(training_setup.TrainingSetup)}
    tr.add_argument("--reduce-dtype", choices=training_setup.REDUCE_DTYPES,
                    help=f"gradient reduce-scatter dtype (default: {defaults['reduce_dtype']})")
    accum: dict[str, Any] = {"dest": "grad_accum_steps", "type": int, "metavar": "INT"}
    tr.add_argument("--grad-accum-steps", **accum,  # the trainer's hyperparameter's spelling
                    help="micro-batches per optimizer step (gradients then live throughout) "
                    f"(default: {defaults['gradient_accumulation_steps']})")
    tr.add_argument("--gradient-accumulation-steps", **accum, help=argparse.SUPPRESS,
                    action=cli.deprecated("--gradient-accumulation-steps", "--grad-accum-steps",
                                          argparse._StoreAction))

    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true",
                     help="print JSON: peak_bytes, breakdown (bytes) and the plan")
    out.add_argument(
        "--cross-check",
        action="store_true",
        help="also run PyTorch's FSDPMemTracker (FakeTensorMode, CPU, needs torch) on the "
        "trainer's model for each configuration (torch backend, 16-bit/fp32 only; slow)",
    )
    out.add_argument("--plan-out", type=cli.output_file, help="also write the MemoryPlan JSON to this file")
    out.add_argument("--markdown-out", type=cli.output_file, help="also write the Markdown report here")
    return parser, params


def with_defaults(given: dict[str, Any]) -> dict[str, Any]:
    """Every component parameter: as given, else the signature's default; a ``gpu`` given
    without an ``instance_type`` plans for that GPU alone (no default instance type). A
    world size given is a count of GPUs: 0 (the component's "all GPUs", its default) is
    refused, not taken as the instances' GPUs (1 for a GPU alone)."""
    if "world_size" in given:
        check_count("world_size", given["world_size"], fix="give the GPUs the model is "
                    "sharded over, or leave --world-size out for all GPUs of the instances.")
    alone = {"instance_type": ""} if given.get("gpu") and "instance_type" not in given else {}
    return cli.declared(COMPONENT, {**given, **alone})


def component_values(args: argparse.Namespace, params: list[cli.Parameter]) -> dict[str, Any]:
    """The component's parameters as given on the command line, else as declared
    (``--probe @FILE``: the file's text)."""
    values = with_defaults(cli.given(args, params))
    if values["probe"].startswith("@"):
        path = Path(values["probe"][1:])
        try:
            values["probe"] = path.read_text()
        except OSError as exc:
            raise UserError("probe", f"{path} could not be read ({exc.strerror}).",
                            "give the probe's JSON, or @FILE of a file holding it.") from None
    return values


@cli_errors
def main(argv: list[str] | None = None) -> int:
    parser, params = build_parser()
    args = parser.parse_args(argv)
    try:
        values = component_values(args, params)
        probe = launcher.parse_probe(values)
        model = {name: getattr(args, name) for name in ("norm", *MODEL_SWITCHES)}
        training = {"reduce_dtype": args.reduce_dtype,
                    "gradient_accumulation_steps": args.grad_accum_steps}
        result = planner.plan(launcher.request(values, model=model, training={
            k: v for k, v in training.items() if v is not None}))
        planner.check_single_precision_supported(result)
        launcher.check_runnable(result, values)
        probed = launcher.compare_probe(result, probe)
        md = report.markdown(result, probed)
        doc = report.json_document(result)
        if probed is not None:
            doc["probe"] = report.probe_document(probed)
            if args.json and doc["probe"]["warning"]:  # (the Markdown carries it otherwise)
                print(f"memory_estimate: warning: {doc['probe']['warning']}", file=sys.stderr)
        if args.cross_check:
            _cross_check(result, doc)
            md += "\n" + _cross_check_markdown(doc)
    except UserError as exc:
        print(f"memory_estimate: error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    if args.plan_out:
        Path(args.plan_out).write_text(result.plan.to_json() + "\n")
    if args.markdown_out:
        Path(args.markdown_out).write_text(md)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(md, end="")
    return 0


def _cross_check(result: planner.PlanResult, doc: dict) -> None:
    """Adds ``cross_check`` (FSDPMemTracker's peak) to each estimate in ``doc``."""
    from kfp_sagemaker_blackwell.components.memory_estimate import crosscheck

    rows = doc.get("estimates") or [doc]
    by_key = {
        (e.setup.precision, e.setup.batch_size, e.setup.activation_checkpointing): e
        for e in result.estimates
    }
    for row in rows:
        e = by_key[(row["precision"], row["batch_size"], row["activation_checkpointing"])]
        crosscheck.check_supported(e.setup)
        # The tracker runs the eager cross-entropy (torch.compile does not run under
        # FakeTensorMode): compare it with the estimate of that same loss.
        eager = dataclasses.replace(e.setup, loss_kernel="eager")
        peak = crosscheck.tracker_peak(eager)
        eager_estimate = estimator.estimate(eager, e.gpu).peak_allocated_bytes
        row["cross_check"] = {
            "fsdp_mem_tracker_peak_bytes": peak,
            "estimate_eager_loss_allocated_bytes": eager_estimate,
            "estimate_minus_tracker": eager_estimate / peak - 1.0,
        }


def _cross_check_markdown(doc: dict) -> str:
    lines = [
        "#### Cross-check: FSDPMemTracker (FakeTensorMode on CPU) vs this estimate",
        "",
        "Both with the eager cross-entropy (the tracker cannot run the compiled one).",
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
            f"{report.gib(c['estimate_eager_loss_allocated_bytes']):.2f} | "
            f"{c['estimate_minus_tracker']:+.1%} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
