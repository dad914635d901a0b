"""The command line every pipeline module shares: ``--compile`` and ``--run-local``.

Pipeline parameters become flags (``--model-preset small``, ``--precisions
'["bf16","fp8"]'``) whose help text is the pipeline docstring's ``Args:``
entry, so ``--help`` documents them without a second copy.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _doc_args(doc: str) -> dict[str, str]:
    """Google-style ``Args:`` entries of a docstring, name -> one-line help."""
    out: dict[str, str] = {}
    section = doc.split("Args:", 1)[1] if "Args:" in doc else ""
    section = re.split(r"\n\s*(Returns|Raises):", section)[0]
    current = ""
    for line in section.splitlines():
        m = re.match(r"^\s{4,12}(\w+): (.*)$", line)
        if m and (not current or len(line) - len(line.lstrip()) <= 12):
            current = m.group(1)
            out[current] = m.group(2).strip()
        elif current and line.strip():
            out[current] += " " + line.strip()
    return out


def _parse_value(kind: Any, text: str) -> Any:
    if kind is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    if kind in (list, dict):
        try:
            value = json.loads(text)
        except ValueError:
            if kind is list:  # a comma-separated list is friendlier on a shell
                return [v.strip() for v in text.split(",") if v.strip()]
            raise argparse.ArgumentTypeError(f"expected JSON, got {text!r}") from None
        if not isinstance(value, kind):
            raise argparse.ArgumentTypeError(f"expected a JSON {kind.__name__}, got {text!r}")
        return value
    return kind(text)


def pipeline_parameters(func: Callable[..., Any]) -> list[inspect.Parameter]:
    return list(inspect.signature(func).parameters.values())


def _parser_for(kind: Any) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return _parse_value(kind, text)

    return parse


def add_parameter_flags(parser: argparse.ArgumentParser, func: Callable[..., Any]) -> None:
    helps = _doc_args(inspect.getdoc(func) or "")
    group = parser.add_argument_group(
        "pipeline parameters (for --run-local; lists and dicts as JSON, lists also a,b,c)"
    )
    for p in pipeline_parameters(func):
        kind = p.annotation if p.annotation in (str, int, float, bool, list, dict) else str
        default = "" if p.default is inspect.Parameter.empty else " (pipeline default: "
        if default:
            default += f"{json.dumps(p.default)})"
        group.add_argument(
            f"--{p.name.replace('_', '-')}",
            dest=f"param_{p.name}",
            type=_parser_for(kind),
            default=None,
            metavar=kind.__name__.upper(),
            help=helps.get(p.name, "") + default,
        )


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
    parser = argparse.ArgumentParser(
        prog=f"python pipelines/{name}.py",
        description=doc.strip().split("\n\n")[0],
        epilog=doc.strip().split("\n\n", 1)[1] if "\n\n" in doc.strip() else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--compile", action="store_true", help=f"write compiled/{name}.yaml")
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
        help=f"training jobs at a time (compile default {default_parallelism}; "
        "--run-local default 1: one job at a time suits a small machine)",
    )
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs",
                        help="--run-local: where run outputs are kept (default: runs/)")
    pipeline_func = build(default_parallelism).pipeline_func
    add_parameter_flags(parser, pipeline_func)
    args = parser.parse_args(argv)

    if args.compile:
        from kfp import compiler

        out = args.output or ROOT / "compiled" / f"{name}.yaml"
        out.parent.mkdir(parents=True, exist_ok=True)
        compiler.Compiler().compile(build(args.parallelism or default_parallelism), str(out))
        print(f"wrote {out}")
        return 0

    overrides = {
        k[len("param_"):]: v for k, v in vars(args).items() if k.startswith("param_") and v is not None
    }
    return run_local(
        name=name,
        pipeline=build(args.parallelism or 1),
        arguments={**local_defaults, **overrides},
        runs_dir=args.runs_dir,
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
