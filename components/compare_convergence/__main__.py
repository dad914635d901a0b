"""python -m components.compare_convergence: compare a precision sweep's loss curves.

Takes the per-step series CSVs that parse_logs writes (one per precision and seed),
compares each precision with the baseline run of the same seed, prints a Markdown
verdict table and the recommended precision (a riskier precision only when it is at
least --min-speedup-gain faster than the safer one that passed), and writes
the HTML report (images embedded), the Markdown and the JSON verdicts.

Examples:
  python -m components.compare_convergence bf16.csv fp8.csv mxfp8.csv nvfp4.csv \\
      --baseline bf16 --html report.html
  python -m components.compare_convergence runs/*.csv --loss-tolerance-rel 0.005 --json

Exit status: 0 when a recommendation exists and the report is complete, 1 when it
is partial or nothing passed, 2 for a usage error (no series, duplicate runs, bad
settings).
"""

from __future__ import annotations

import argparse
import sys

from components.common.errors import USER_ERROR_EXIT_CODE, UserError


def build_parser() -> argparse.ArgumentParser:
    from components.compare_convergence.compare import Settings

    d = Settings()
    p = argparse.ArgumentParser(
        prog="python -m components.compare_convergence",
        description=__doc__.split("\n\n")[1],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("series", nargs="+", help="series CSV files written by parse_logs")
    p.add_argument("--baseline", default=d.baseline, help="reference precision (%(default)s)")
    p.add_argument("--loss-tolerance-rel", type=float, default=d.loss_tolerance_rel,
                   help="allowed final loss excess, fraction of the baseline's (%(default)s)")
    p.add_argument("--loss-tolerance-abs", type=float, default=d.loss_tolerance_abs,
                   help="allowed final loss excess in nats (%(default)s)")
    p.add_argument("--divergence-tolerance-rel", type=float, default=d.divergence_tolerance_rel,
                   help="largest smoothed gap after warm-up, fraction (%(default)s)")
    p.add_argument("--seed-spread-factor", type=float, default=d.seed_spread_factor,
                   help="with seeds, pass within this many seed spreads (%(default)s)")
    p.add_argument("--final-window", type=float, default=d.final_window,
                   help="fraction of points averaged as the final loss (%(default)s)")
    p.add_argument("--smoothing-window", type=int, default=d.smoothing_window,
                   help="moving average in logged points, 0 = automatic (%(default)s)")
    p.add_argument("--align-by", choices=("step", "tokens"), default=d.align_by)
    p.add_argument("--min-step-coverage", type=float, default=d.min_step_coverage,
                   help="a run reaching less of the baseline's steps is incomplete "
                        "(%(default)s)")
    p.add_argument("--target-gpu", default=d.target_gpu,
                   help="GPU the speed-ups are for; runs not timed on it get the throughput "
                        "model's prediction (%(default)s)")
    p.add_argument("--min-speedup-gain", type=float, default=d.min_speedup_gain,
                   help="gain a riskier precision needs over the safer one (%(default)s)")
    p.add_argument("--html", metavar="PATH", help="write the HTML report here")
    p.add_argument("--markdown", metavar="PATH", help="write the Markdown summary here")
    p.add_argument("--verdicts", metavar="PATH", help="write the JSON verdicts here")
    p.add_argument("--json", action="store_true", help="print the JSON verdicts, not Markdown")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from components.compare_convergence.compare import Settings
    from components.compare_convergence.report import markdown, verdicts_json
    from components.compare_convergence.run import compare_files, write_outputs

    try:
        settings = Settings(
            baseline=args.baseline, loss_tolerance_rel=args.loss_tolerance_rel,
            loss_tolerance_abs=args.loss_tolerance_abs,
            divergence_tolerance_rel=args.divergence_tolerance_rel,
            seed_spread_factor=args.seed_spread_factor, final_window=args.final_window,
            smoothing_window=args.smoothing_window, align_by=args.align_by,
            min_step_coverage=args.min_step_coverage, target_gpu=args.target_gpu,
            min_speedup_gain=args.min_speedup_gain)
        cmp = compare_files(args.series, settings)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    write_outputs(cmp, html_path=args.html, markdown_path=args.markdown,
                  verdicts_path=args.verdicts)
    sys.stdout.write(verdicts_json(cmp) if args.json else markdown(cmp))
    return 0 if cmp.passed else 1


if __name__ == "__main__":
    sys.exit(main())
