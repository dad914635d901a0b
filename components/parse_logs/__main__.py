"""python -m components.parse_logs: read a training log and say what happened.

Reads a SageMaker training job's CloudWatch logs (every {job}/ stream: all hosts,
and the new streams a spot restart adds), or a log file, or standard input, and
prints a Markdown summary (default) or the JSON events document (--json). Writes
the per-step series CSV, the Markdown and the JSON with --series/--markdown/--events.

Examples:
  python -m components.parse_logs --file train.log --json
  python -m trainer --preset tiny --max-steps 20 | python -m components.parse_logs --file -
  python -m components.parse_logs --job my-run-fp8-1a2b3c4d --region us-west-2 \\
      --precision fp8 --series fp8.csv

Exit status: 0 when the log was read and the run did not fail; 1 when the log
could not be read (empty, no step lines) or the run failed (OOM, NaN, error:
the summary says which); 2 for a usage error (bad job name, missing file, no log
stream). --no-fail-on-failed-run exits 0 whenever the log was parsed.
"""

from __future__ import annotations

import argparse
import sys

from components.common.errors import USER_ERROR_EXIT_CODE, UserError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m components.parse_logs",
        description=__doc__.split("\n\n")[1],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--file", metavar="LOG", help="a log file, or - for standard input")
    src.add_argument("--job", metavar="NAME", help="a SageMaker training job name")
    p.add_argument("--region", default="", help="AWS region of the job (default: AWS_REGION)")
    p.add_argument("--log-group", default="/aws/sagemaker/TrainingJobs",
                   help="CloudWatch log group (default: %(default)s)")
    p.add_argument("--precision", default="", help="the requested precision: a warning is "
                   "raised when the log confirms another one (or none)")
    p.add_argument("--run", default="", help="label for the run (default: job name or file)")
    p.add_argument("--spike-threshold", type=float, default=0.5,
                   help="loss above (1 + this) x its running average is a spike (default 0.5)")
    p.add_argument("--json", action="store_true", help="print the JSON events document")
    p.add_argument("--series", metavar="CSV", help="write the per-step series CSV here")
    p.add_argument("--markdown", metavar="MD", help="write the Markdown summary here")
    p.add_argument("--events", metavar="JSON", help="write the JSON events document here")
    p.add_argument("--fail-on-failed-run", action=argparse.BooleanOptionalAction, default=True,
                   help="exit 1 when the log could not be read or the run failed (empty log, "
                   "no steps, OOM, NaN, error); --no-fail-on-failed-run exits 0 whenever the "
                   "log was parsed (default: on)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from components.parse_logs.report import events_document, markdown, write_outputs
    from components.parse_logs.source import parse_file, parse_training_job

    try:
        if args.job:
            parsed, _ = parse_training_job(args.job, args.region or None, group=args.log_group,
                                           spike_threshold=args.spike_threshold)
            run = args.run or args.job
        else:
            parsed = parse_file(args.file, spike_threshold=args.spike_threshold)
            run = args.run or ("stdin" if args.file == "-" else args.file)
        out = write_outputs(parsed, requested_precision=args.precision, run=run,
                            series_path=args.series, markdown_path=args.markdown,
                            events_path=args.events)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    sys.stdout.write(events_document(out.report) if args.json else markdown(out.report))
    return 1 if args.fail_on_failed_run and out.report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
