"""The command line every pipeline module shares: ``--compile`` and ``--run-local``.

Pipeline parameters become flags (``--model-preset small``, ``--precisions
bf16,fp8``) derived by ``components.common.cli`` from the pipeline function: its
signature gives the flags and defaults, its docstring's ``Args:`` the help, so
``--help`` documents them without a second copy.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.common import cli

ROOT = Path(__file__).resolve().parent.parent


def main(
    argv: list[str] | None,
    *,
    name: str,
    doc: str,
    build: Callable[[int], Any],
    default_parallelism: int,
    local_defaults: dict[str, Any],
    report_task: str,
) -> int:
    """``--compile`` or ``--run-local`` for the pipeline ``build`` makes.

    Parameter flags given with ``--compile`` become the compiled pipeline's
    defaults (what a run submitted without that argument uses); with
    ``--run-local`` they override ``local_defaults``, which override the
    pipeline's. ``--help`` shows both defaults.
    """
    parser = argparse.ArgumentParser(
        prog=f"python pipelines/{name}.py",
        description=doc.strip().split("\n\n")[0],
        epilog=doc.strip().split("\n\n", 1)[1] if "\n\n" in doc.strip() else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--compile", action="store_true",
                      help=f"write compiled/{name}.yaml; parameter flags given become its defaults")
    mode.add_argument(
        "--run-local",
        action="store_true",
        help="run the pipeline with kfp.local on the embedded local backend (AWS on "
        "127.0.0.1, training jobs on this machine's CPU or GPU)",
    )
    parser.add_argument("--output", type=Path, help=f"--compile: where to write "
                        f"(default: compiled/{name}.yaml)")
    parser.add_argument(
        "--parallelism",
        type=int,
        default=None,
        help=f"training jobs at a time (--compile default {default_parallelism}; "
        "--run-local default 1: one job at a time suits a small machine)",
    )
    parser.add_argument("--runs-dir", type=Path, default=None,
                        help="--run-local: where run outputs are kept (default: runs/)")
    params = cli.parameters(build(default_parallelism).pipeline_func)
    cli.add_flags(
        parser.add_argument_group(
            "pipeline parameters (lists as JSON or a,b,c; dicts as JSON or KEY=VALUE, repeatable)"
        ),
        params,
        required=False,  # the local backend supplies role_arn and bucket; a run supplies them
        notes={k: "--run-local: " + (cli.show_default(v) or "''") for k, v in local_defaults.items()},
    )
    args = parser.parse_args(argv)
    overrides = cli.given(args, params)

    if args.compile:
        if args.runs_dir is not None:
            parser.error("--runs-dir goes with --run-local, not --compile")
        from kfp import compiler

        out = args.output or ROOT / "compiled" / f"{name}.yaml"
        out.parent.mkdir(parents=True, exist_ok=True)
        compiler.Compiler().compile(build(args.parallelism or default_parallelism), str(out),
                                    pipeline_parameters=overrides or None)
        print(f"wrote {out}" + (f" (defaults set: {', '.join(sorted(overrides))})"
                                if overrides else ""))
        return 0

    if args.output is not None:
        parser.error("--output goes with --compile, not --run-local")
    return run_local(
        name=name,
        pipeline=build(args.parallelism or 1),
        arguments={**local_defaults, **overrides},
        runs_dir=args.runs_dir or ROOT / "runs",
        report_task=report_task,
    )


def run_local(
    *,
    name: str,
    pipeline: Any,
    arguments: dict[str, Any],
    runs_dir: Path,
    report_task: str,
) -> int:
    from pipelines import _local

    region = arguments.get("region", "us-west-2")
    print(f"[{name}] starting the local backend (AWS APIs on 127.0.0.1) ...", flush=True)
    with _local.local_aws(region) as backend:
        arguments = {"role_arn": _local.LOCAL_ROLE_ARN, "bucket": _local.LOCAL_BUCKET,
                     **arguments, "region": backend.region}
        shown = {k: v for k, v in arguments.items() if k not in ("role_arn", "bucket")}
        print(f"[{name}] running with kfp.local: {json.dumps(shown, sort_keys=True)}", flush=True)
        run = _local.run_local(pipeline, arguments, runs_dir=runs_dir)
        jobs = _local.training_jobs(backend)
    summary = _local.summarise(run, jobs, report_task=report_task)
    print(summary.text, flush=True)
    if summary.report and summary.report.exists():
        html = run.root / "report.html"
        shutil.copyfile(summary.report, html)
        print(f"\nReport: {html}")
    return 0 if run.state == "SUCCEEDED" else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run a pipeline module, e.g. python pipelines/precision_sweep.py --help")
