"""python -m kfp_sagemaker_blackwell.components.prerank_candidates: which batch-tuning candidates are worth a trial?

Reads memory_estimate's plan and batch candidates and a probe's measurements, corrects
each candidate's predicted tokens/s per GPU and peak memory by the probe, drops those
that no longer fit, ranks the rest and prints the Markdown table (or, with --json, the
trials). Flags are the KFP component's parameters
(components/prerank_candidates/component.py); --memory-plan, --batch-candidates and
--probe also take @FILE.

Examples::

    python -m kfp_sagemaker_blackwell.components.prerank_candidates --memory-plan @plan.json \\
        --batch-candidates @candidates.json --probe @probe.json --trial-count 2

Exit status: 0, or 2 for a usage error (a plan, candidates or probe that cannot be read,
a probe of another precision or GPU type).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kfp_sagemaker_blackwell.common import cli
from kfp_sagemaker_blackwell.common.errors import UserError, cli_errors

# The component's signature, read from its source: importing component.py would import kfp
# (0.4 s at every start) for a parser.
COMPONENT = "kfp_sagemaker_blackwell.components.prerank_candidates.component:prerank_candidates"


def build_parser() -> tuple[argparse.ArgumentParser, list[cli.Parameter]]:
    p, params = cli.derived_parser(COMPONENT, doc=__doc__)
    p.add_argument("--json", action="store_true", help="print the trials as JSON, not Markdown")
    return p, params


def _text(field: str, value: str) -> str:
    """A text parameter as given, or the text of the file ``@FILE`` names."""
    if not value.startswith("@"):
        return value
    try:
        return Path(value[1:]).read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(field, f"{value[1:]} could not be read ({exc.strerror}).",
                        "give the JSON, or @FILE of a file holding it.") from None


def _candidates(value: list) -> list[Any]:
    """--batch-candidates: the JSON list, or @FILE of one (or of an object holding it)."""
    if not (len(value) == 1 and isinstance(value[0], str) and value[0].startswith("@")):
        return value
    text = _text("batch_candidates", value[0])
    try:
        loaded = json.loads(text)
    except ValueError as exc:
        raise UserError("batch_candidates", f"{value[0][1:]} is not JSON ({exc}).",
                        "give memory_estimate's batch_candidates list.") from None
    loaded = loaded.get("batch_candidates") if isinstance(loaded, dict) else loaded
    if not isinstance(loaded, list):
        raise UserError("batch_candidates", f"{value[0][1:]} holds no list.",
                        "give memory_estimate's batch_candidates list.")
    return loaded


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args, values = cli.parse(build_parser(), argv)
    from kfp_sagemaker_blackwell.components.prerank_candidates import launcher
    from kfp_sagemaker_blackwell.components.prerank_candidates.report import markdown

    result = launcher.prerank_candidates(
        _text("memory_plan", values["memory_plan"]), _candidates(values["batch_candidates"]),
        _text("probe", values["probe"]), values["trial_count"])
    sys.stdout.write(json.dumps(result.trials, indent=2) + "\n" if args.json
                     else markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
