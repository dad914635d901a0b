"""python -m kfp_sagemaker_blackwell.components.rank_throughput: rank batch-size tuning runs by tokens/s per GPU.

Takes the per-step series CSVs that parse_logs writes (one per candidate run),
ranks the completed runs by steady-state tokens/s per GPU, lists the failed ones
with their reason, prints the Markdown table and the best configuration, and
writes the HTML report. Flags are the KFP component's parameters
(components/rank_throughput/component.py); the series and the outputs are its
artifacts.

Examples:
  python -m kfp_sagemaker_blackwell.components.rank_throughput b4.csv b8.csv b16.csv --html report.html
  python -m kfp_sagemaker_blackwell.components.rank_throughput runs/*.csv --plan plan.json --json

Exit status: 0 when a candidate completed, 1 when none did, 2 for a usage error
(no series, a series that breaks its contract, an unreadable plan).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kfp_sagemaker_blackwell.common import cli
from kfp_sagemaker_blackwell.common.errors import UserError, cli_errors

# The component's signature, read from its source: importing component.py would import kfp
# (0.4 s at every start) for a parser.
COMPONENT = "kfp_sagemaker_blackwell.components.rank_throughput.component:rank_throughput"


def build_parser() -> tuple[argparse.ArgumentParser, list[cli.Parameter]]:
    p, params = cli.derived_parser(COMPONENT, doc=__doc__)
    cli.add_report_outputs(p, json_help="print the ranking as JSON, not Markdown")
    return p, params


def _plan(value: list) -> list:
    """--plan as given: the batch_candidates as JSON, or the path of a JSON file holding
    that list (or an object whose ``batch_candidates`` is that list)."""
    out: list = []
    for item in value:
        if not isinstance(item, str):
            out.append(item)
            continue
        try:
            loaded = json.loads(Path(item).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UserError("--plan", f"{item!r} is not a readable JSON file ({exc}).",
                            "give the batch_candidates as JSON or the path of their JSON file."
                            ) from None
        loaded = loaded.get("batch_candidates", []) if isinstance(loaded, dict) else loaded
        out.extend(loaded if isinstance(loaded, list) else [])
    return out


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args, values = cli.parse(build_parser(), argv)
    from kfp_sagemaker_blackwell.components.rank_throughput import launcher

    ranking = launcher.rank(launcher.load(args.series, _plan(values["plan"])))
    context = values["run_context"]
    text = launcher.markdown(ranking, context)
    if args.html:
        Path(args.html).write_text(launcher.html_report(ranking, context), encoding="utf-8")
    if args.markdown:
        Path(args.markdown).write_text(text, encoding="utf-8")
    sys.stdout.write(launcher.to_json(ranking) + "\n" if args.json else text)
    return 0 if ranking.best is not None else 1


if __name__ == "__main__":
    sys.exit(main())
