"""python -m kfp_sagemaker_blackwell.components.parse_logs: read a training log and say what happened.

Reads a SageMaker training job's CloudWatch logs (every {job}/ stream: all hosts,
and the new streams a spot restart adds), or a log file, or standard input, and
prints a Markdown summary (default) or the JSON events document (--json). Writes
the per-step series CSV, the Markdown and the JSON with --series/--markdown/--events.

Examples:
  python -m kfp_sagemaker_blackwell.components.parse_logs --file train.log --json
  python -m kfp_sagemaker_blackwell.trainer --model-preset tiny --max-steps 20 | python -m kfp_sagemaker_blackwell.components.parse_logs --file -
  python -m kfp_sagemaker_blackwell.components.parse_logs --job-name my-run-fp8-1a2b3c4d --region us-west-2 \\
      --requested-precision fp8 --series fp8.csv

Exit status: 0 when the log was read and the run did not fail; 1 when the log
could not be read (empty, no step lines) or the run failed (OOM, NaN, error:
the summary says which); 2 for a usage error (bad job name, missing file, no log
stream). --no-fail-on-failed-run exits 0 whenever the log was parsed.
"""

from __future__ import annotations

import argparse
import sys

from kfp_sagemaker_blackwell.common import cli
from kfp_sagemaker_blackwell.common.errors import USER_ERROR_EXIT_CODE, UserError, cli_errors

# The component's signature, read from its source: importing component.py would import kfp
# (0.4 s at every start) for a parser.
COMPONENT = "kfp_sagemaker_blackwell.components.parse_logs.component:parse_logs"

# Old spellings, still accepted with a deprecation message.
ALIASES = {"--job": "job_name", "--precision": "requested_precision", "--run": "run_label"}


def build_parser() -> tuple[argparse.ArgumentParser, list[cli.Parameter]]:
    p, params = cli.derived_parser(COMPONENT, doc=__doc__, aliases=ALIASES)
    p.add_argument("--file", metavar="LOG", type=cli.input_file_or_stdin,
                   help="a log file, or - for standard input (instead of --job-name)")
    p.add_argument("--json", action="store_true", help="print the JSON events document")
    p.add_argument("--series", metavar="CSV", type=cli.output_file, help="write the per-step series CSV here")
    p.add_argument("--markdown", metavar="MD", type=cli.output_file, help="write the Markdown summary here")
    p.add_argument("--events", metavar="JSON", type=cli.output_file, help="write the JSON events document here")
    return p, params


@cli_errors
def main(argv: list[str] | None = None) -> int:
    p, params = build_parser()
    args = p.parse_args(argv)
    if bool(args.file) == bool(args.job_name):
        p.error("give one of --file or --job-name")
    values = cli.values(args, params)
    from kfp_sagemaker_blackwell.components.parse_logs.launcher import (
        parse_file,
        parse_training_job,
    )
    from kfp_sagemaker_blackwell.components.parse_logs.report import (
        events_document,
        markdown,
        write_outputs,
    )

    spike = values["spike_threshold"]
    try:
        if args.file:
            parsed = parse_file(args.file, spike_threshold=spike)
            run = values["run_label"] or ("stdin" if args.file == "-" else args.file)
        else:
            parsed, _ = parse_training_job(values["job_name"], values["region"] or None,
                                           group=values["log_group"], spike_threshold=spike,
                                           precision=values["requested_precision"])
            run = values["run_label"] or values["job_name"]
        out = write_outputs(parsed, requested_precision=values["requested_precision"], run=run,
                            series_path=args.series, markdown_path=args.markdown,
                            events_path=args.events)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    sys.stdout.write(events_document(out.report) if args.json else markdown(out.report))
    return 1 if values["fail_on_failed_run"] and out.report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
