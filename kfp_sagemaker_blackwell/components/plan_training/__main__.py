"""``python -m kfp_sagemaker_blackwell.components.plan_training``: which instances, precision, micro-batch,
checkpointing and capacity train this model on this many tokens cheapest?

Prints the ranked table (every figure with its source: predicted, probed or measured,
and by what) and what was not ranked and why. The flags and their defaults are the
KFP component's parameters (``components/plan_training/component.py``). Without
``--region`` no AWS call is made: prices come from your ``--instance-hour-prices`` and
the shipped table, and training plans are not searched.

Examples::

    # an 8B model on 100B tokens at sequence 8192: the worked example of docs/planning.md
    python -m kfp_sagemaker_blackwell.components.plan_training --model-preset 8b --training-tokens 100000000000 \\
        --seq-length 8192 --capacity-modes on-demand --precisions bf16,fp8

    # within 3 days and $60,000, with training plans and Price List prices in us-west-2
    python -m kfp_sagemaker_blackwell.components.plan_training --training-tokens 100000000000 --seq-length 8192 \\
        --deadline-hours 72 --max-cost-usd 60000 --region us-west-2

    # only what the convergence sweep passed; the chosen configuration as JSON
    python -m kfp_sagemaker_blackwell.components.plan_training --training-tokens 100000000000 \\
        --convergence-verdicts verdicts.json --choice-out choice.json

Exit status: 0 when a configuration was chosen; 2 when nothing can be (nothing fits,
meets the deadline or the budget: the message names the parameter to change).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kfp_sagemaker_blackwell.common import cli
from kfp_sagemaker_blackwell.common.errors import USER_ERROR_EXIT_CODE, UserError

# The component's signature, read from its source: importing component.py would import kfp
# (0.4 s at every start) for a parser.
COMPONENT = "kfp_sagemaker_blackwell.components.plan_training.component:plan_training"


def build_parser() -> tuple[argparse.ArgumentParser, list[cli.Parameter]]:
    parser, params = cli.derived_parser(COMPONENT, doc=__doc__, title="the component's parameters")
    out = parser.add_argument_group("inputs and outputs (artifacts of the component)")
    out.add_argument("--convergence-verdicts", metavar="JSON", type=cli.input_file,
                     help="the verdicts file of compare_convergence (python -m "
                     "kfp_sagemaker_blackwell.components.compare_convergence --verdicts ...)")
    out.add_argument("--json", action="store_true", help="print the candidates JSON instead "
                     "of the Markdown report")
    out.add_argument("--choice-out", type=cli.output_file, help="write the chosen configuration's JSON here")
    out.add_argument("--candidates-out", type=cli.output_file, help="write the candidates JSON here")
    out.add_argument("--markdown-out", type=cli.output_file, help="write the Markdown report here")
    return parser, params


def main(argv: list[str] | None = None) -> int:
    parser, params = build_parser()
    args = parser.parse_args(argv)
    from kfp_sagemaker_blackwell.components.plan_training.launcher import run_component

    try:
        out = run_component(verdicts=str(args.convergence_verdicts or ""),
                            **cli.values(args, params))
    except UserError as exc:
        print(f"plan_training: error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    for path, text in ((args.choice_out, out.choice), (args.candidates_out, out.candidates),
                       (args.markdown_out, out.markdown)):
        if path:
            Path(path).write_text(text, encoding="utf-8")
    print(out.candidates if args.json else out.markdown, end="")
    problem = out.result.problem()
    if problem is not None:
        print(f"plan_training: error: {problem}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    return 0


if __name__ == "__main__":
    sys.exit(main())
