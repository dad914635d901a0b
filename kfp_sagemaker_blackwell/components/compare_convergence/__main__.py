"""python -m kfp_sagemaker_blackwell.components.compare_convergence: compare a precision sweep's loss curves.

Takes the per-step series CSVs that parse_logs writes (one per precision and seed),
compares each precision with the baseline run of the same seed, prints a Markdown
verdict table and the recommended precision (a riskier precision only when it is at
least --min-speedup-gain faster than the safer one that passed), and writes
the HTML report (images embedded), the Markdown and the JSON verdicts.

Examples:
  python -m kfp_sagemaker_blackwell.components.compare_convergence bf16.csv fp8.csv mxfp8.csv nvfp4.csv \\
      --baseline bf16 --html report.html
  python -m kfp_sagemaker_blackwell.components.compare_convergence runs/*.csv --loss-tolerance-rel 0.005 --json

Exit status: 0 when a recommendation exists and the report is complete, 1 when it
is partial or nothing passed, 2 for a usage error (no series, duplicate runs, bad
settings, a series that breaks its contract: left out, the partial reports naming it
are still written).
"""

from __future__ import annotations

import argparse
import sys

from kfp_sagemaker_blackwell.common import cli
from kfp_sagemaker_blackwell.common.errors import USER_ERROR_EXIT_CODE, cli_errors

# The component's signature, read from its source: importing component.py would import kfp
# (0.4 s at every start) for a parser.
COMPONENT = "kfp_sagemaker_blackwell.components.compare_convergence.component:compare_convergence"


def build_parser() -> tuple[argparse.ArgumentParser, list[cli.Parameter]]:
    p, params = cli.derived_parser(COMPONENT, doc=__doc__)
    cli.add_report_outputs(p, json_help="print the JSON verdicts, not Markdown")
    p.add_argument("--verdicts", metavar="PATH", type=cli.output_file, help="write the JSON verdicts here")
    return p, params


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args, values = cli.parse(build_parser(), argv)
    from kfp_sagemaker_blackwell.components.compare_convergence import launcher, report
    from kfp_sagemaker_blackwell.components.compare_convergence.records import Settings

    context = values["run_context"]
    cmp = launcher.compare_files(args.series, Settings.from_parameters(values))
    launcher.write_outputs(cmp, html_path=args.html, markdown_path=args.markdown,
                           verdicts_path=args.verdicts, context=context)
    sys.stdout.write(report.verdicts_json(cmp) if args.json else report.markdown(cmp, context))
    broken = [lo.source for lo in cmp.left_out if lo.contract]
    if broken:  # the user's input error, as rank_throughput says it (its reports are written)
        print(f"error: series: {', '.join(broken)} broke the step-series contract and "
              f"{'was' if len(broken) == 1 else 'were'} left out (the report is partial; "
              "each file's problem is in it). Fix: pass the series files parse_logs wrote, "
              "unedited.", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    if values["require_complete"] and cmp.partial:
        print("error: the comparison is partial: " + "; ".join(cmp.problems), file=sys.stderr)
        return 1
    return 0 if cmp.passed else 1


if __name__ == "__main__":
    sys.exit(main())
