"""The command line every pipeline module shares: ``--compile`` and ``--run-local``.

Pipeline parameters become flags (``--model-preset small``, ``--precisions
bf16,fp8``) derived by ``kfp_sagemaker_blackwell.common.cli`` from the pipeline function: its
signature gives the flags and defaults, its docstring's ``Args:`` the help, so
``--help`` documents them without a second copy. Both modes check the values
before anything happens, with one check (:func:`refuse`: the pipeline module's
``check_arguments``, and no control characters): ``--run-local`` before it starts,
``--compile`` before it writes the defaults a cluster run would use.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kfp_sagemaker_blackwell.catalog.bounds import count
from kfp_sagemaker_blackwell.common import cli, shipped
from kfp_sagemaker_blackwell.common.errors import cli_errors


def build_parser(
    *,
    name: str,
    doc: str,
    build: Callable[[int], Any],
    default_parallelism: int,
    local_defaults: dict[str, Any],
) -> tuple[argparse.ArgumentParser, list[cli.Parameter]]:
    """The pipeline's command line: the modes, and a flag per pipeline parameter."""
    params = cli.parameters(build(default_parallelism).pipeline_func)
    text = cli.plain(doc.strip(), [p.name for p in params])
    parser = cli.ArgumentParser(
        prog=f"python pipelines/{name}.py",
        description=text.split("\n\n")[0],
        epilog=text.split("\n\n", 1)[1] if "\n\n" in text else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--compile", action="store_true",
                      help=f"write compiled/{name}.yaml; parameter flags given become its defaults "
                      "(checked as --run-local checks them)")
    mode.add_argument(
        "--run-local",
        action="store_true",
        help="run the pipeline with kfp.local on the embedded local backend (AWS on "
        "127.0.0.1, training jobs on this machine's CPU or GPU)",
    )
    parser.add_argument("--output", type=cli.output_file, help=f"--compile: where to write "
                        f"(default: compiled/{name}.yaml, the checkout's; installed: in the "
                        "working directory)")
    parser.add_argument(
        "--parallelism",
        type=count(),
        default=None,
        help=f"training jobs at a time (--compile default {default_parallelism}; "
        "--run-local default 1: one job at a time suits a small machine)",
    )
    parser.add_argument("--runs-dir", type=cli.output_dir, default=None,
                        help="--run-local: where run outputs and logs are kept (default: runs/)")
    parser.add_argument("--verbose", action="store_true",
                        help="--run-local: show every task's full log live (default: one "
                        "progress line per training job; the full log goes to a file)")
    cli.add_flags(
        parser.add_argument_group(
            "pipeline parameters (lists as JSON or a,b,c, dicts as JSON or KEY=VALUE; both repeatable)"
        ),
        params,
        required=False,  # the local backend supplies role_arn and bucket; a run supplies them
        notes={k: "--run-local: " + (cli.show_default(v) or "''") for k, v in local_defaults.items()},
    )
    return parser, params


@cli_errors
def main(
    argv: list[str] | None,
    *,
    name: str,
    doc: str,
    build: Callable[[int], Any],
    default_parallelism: int,
    local_defaults: dict[str, Any],
    report_task: str,
    check: Callable[[dict[str, Any]], None] | None = None,
    progress_label_keys: tuple[str, ...] = (),
) -> int:
    """``--compile`` or ``--run-local`` for the pipeline ``build`` makes.

    Parameter flags given with ``--compile`` become the compiled pipeline's
    defaults (what a run submitted without that argument uses); with
    ``--run-local`` they override ``local_defaults``, which override the
    pipeline's. ``--help`` shows both defaults.
    """
    parser, params = build_parser(name=name, doc=doc, build=build,
                                  default_parallelism=default_parallelism,
                                  local_defaults=local_defaults)
    args = parser.parse_args(argv)
    overrides = cli.given(args, params)

    if args.compile:
        if args.runs_dir is not None:
            parser.error("--runs-dir goes with --run-local, not --compile")
        # The defaults a run of the compiled pipeline uses get the checks a local run gets
        # (role_arn and bucket, when not given, are a run's own: stand-ins are checked).
        if refused := refuse(check, local_arguments(params, overrides), "Nothing was written."):
            return refused
        from kfp_sagemaker_blackwell.common.component import components_image
        from kfp_sagemaker_blackwell.pipelines.compile import compile_one

        out = Path(args.output) if args.output else shipped.output_dir() / f"{name}.yaml"
        out.parent.mkdir(parents=True, exist_ok=True)
        compile_one(build(args.parallelism or default_parallelism), out, components_image(),
                    pipeline_parameters=overrides or None)
        print(f"wrote {out} (components image {components_image()})"
              + (f" (defaults set: {', '.join(sorted(overrides))})" if overrides else ""))
        return 0

    if args.output is not None:
        parser.error("--output goes with --compile, not --run-local")
    arguments = local_arguments(params, {**local_defaults, **overrides})
    if refused := refuse(check, arguments, "Nothing was started."):
        return refused
    return run_local(name=name, pipeline=build(args.parallelism or 1), arguments=arguments,
                     runs_dir=Path(args.runs_dir or "runs"), report_task=report_task,
                     verbose=args.verbose, progress_label_keys=progress_label_keys)


def pipeline_main(argv: list[str] | None, module_name: str, *, report_task: str,
                  progress_label_keys: tuple[str, ...] = ()) -> int:
    """:func:`main` for a pipeline module, from what every pipeline module defines: its
    docstring (the help), ``build_pipeline``, ``DEFAULT_PARALLELISM``, ``LOCAL_DEFAULTS``
    and ``check_arguments``. ``report_task``: the task whose report a local run shows."""
    module = sys.modules[module_name]
    return main(argv, name=Path(module.__file__ or module_name).stem, doc=module.__doc__ or "",
                build=module.build_pipeline, default_parallelism=module.DEFAULT_PARALLELISM,
                local_defaults=module.LOCAL_DEFAULTS, report_task=report_task,
                check=module.check_arguments, progress_label_keys=progress_label_keys)


def refuse(check: Callable[[dict[str, Any]], None] | None, arguments: dict[str, Any],
           nothing_done: str) -> int:
    """Checks ``arguments`` (every pipeline parameter) as ``--compile`` and ``--run-local``
    both do; prints the UserError and returns its exit code, or returns 0 when they pass."""
    from kfp_sagemaker_blackwell.common.errors import USER_ERROR_EXIT_CODE, UserError

    try:
        refuse_control_characters(arguments)
        if check is not None:
            check(arguments)
    except UserError as exc:
        print(f"error: {exc}\n{nothing_done}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    return 0


def refuse_control_characters(arguments: dict[str, Any]) -> None:
    """No text value (in lists and dicts too) holds a control character or line break.

    A newline in a default ends the compiled YAML's comment header and starts a
    key of its own; in a job name, tag or S3 key it is an error at best.
    """
    import unicodedata

    from kfp_sagemaker_blackwell.common.errors import UserError

    def walk(field: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(field, key)
                walk(field, item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(field, item)
        elif isinstance(value, str):
            bad = next((c for c in value if unicodedata.category(c) in ("Cc", "Zl", "Zp")), "")
            if bad:
                raise UserError(field, f"{value!r} holds the control character {bad!r}.",
                                "remove it (no newlines, tabs or other control characters).")

    for name, value in arguments.items():
        walk(name, value)


def local_arguments(params: list[cli.Parameter], given: dict[str, Any]) -> dict[str, Any]:
    """Every pipeline parameter's value: the pipeline's defaults, the local role and
    bucket (a local run's; stand-ins for ``--compile``'s check), then ``given``."""
    from kfp_sagemaker_blackwell.pipelines import local

    out = {p.name: p.default for p in params if not p.required}
    out.update(role_arn=local.LOCAL_ROLE_ARN, bucket=local.LOCAL_BUCKET)
    out.update(given)
    return out


def run_local(
    *,
    name: str,
    pipeline: Any,
    arguments: dict[str, Any],
    runs_dir: Path,
    report_task: str,
    verbose: bool = False,
    progress_label_keys: tuple[str, ...] = (),
) -> int:
    from kfp_sagemaker_blackwell.pipelines import _progress, local

    log_file = runs_dir.resolve() / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    shown = {k: v for k, v in arguments.items()
             if k not in ("role_arn", "bucket") and v not in ("", {}, [], 0)}
    print(f"[{name}] local run (AWS APIs on 127.0.0.1, kfp.local): "
          f"{json.dumps(shown, sort_keys=True)}", flush=True)
    print(f"[{name}] full log: {log_file}" + ("" if verbose else " (--verbose shows it live)"),
          flush=True)
    terminal = sys.stdout  # the run sends sys.stdout to the log file

    def show(text: str) -> None:
        terminal.write(text)
        terminal.flush()

    progress = _progress.Progress(show, tty=sys.stdout.isatty(),
                                  label_keys=progress_label_keys)
    run = local.run_pipeline(pipeline, arguments, runs_dir=runs_dir,
                             region=arguments.get("region", "us-west-2"), log_file=log_file,
                             echo=verbose, on_line=None if verbose else progress.feed)
    summary = local.summarise(run, run.jobs, report_task=report_task)
    print(summary.text, flush=True)
    if summary.report and summary.report.exists():
        html = run.root / "report.html"
        shutil.copyfile(summary.report, html)
        print(f"\nReport: {html}")
    print(f"Full log: {log_file}")
    return 0 if run.state == "SUCCEEDED" else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run a pipeline module, e.g. python pipelines/precision_sweep.py --help")
