"""``python -m kfp_sagemaker_blackwell.components.sagemaker_training``: the training component from a shell.

The flags are the KFP component's parameters, derived from its signature and
docstring (``kfp_sagemaker_blackwell.common.cli``): one name, default and help text each
(``--batch-size`` for ``batch_size``; dicts as ``KEY=VALUE`` repeated or JSON,
lists as ``a,b`` or JSON, booleans ``--x``/``--no-x``/``--x false``).
``--dry-run`` validates and prints the exact CreateTrainingJob request without
calling AWS. Exit status: 0 Completed; 1 the job failed or was stopped (its
FailureReason is printed); 2 a user error (nothing was created); 69 SageMaker
was unreachable for longer than ``--max-outage-seconds`` while following the job
(the job may still be running: the message names it); 143 terminated by SIGTERM
or SIGINT (the message says whether the stop was accepted within
``--stop-timeout-seconds`` and, when not, gives the command that stops the job; a
SIGINT the process was started to ignore, as a script's background job is, stays ignored).
An output path that cannot be written is refused before the first AWS call; an
unexpected error once the job exists stops it and exits 1, naming it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from kfp_sagemaker_blackwell.common import cli
from kfp_sagemaker_blackwell.common.errors import (
    AWS_UNREACHABLE_EXIT_CODE,
    UserError,
    cli_errors,
)
from kfp_sagemaker_blackwell.common.execution_context import (
    ExecutionContext,
)

# Parameters a pipeline fills (KFP placeholders, the loop's items): this command
# line declares its own run id, task and pipeline below.
PIPELINE_ONLY = ("run_id", "task", "pipeline", "budget_items")
# The component's signature, read from its source: importing component.py would import kfp
# (0.4 s at every start) for a parser.
COMPONENT = "kfp_sagemaker_blackwell.components.sagemaker_training.component:sagemaker_training"
CLI_TASK, CLI_PIPELINE = "sagemaker-training", "cli"
# Spellings of earlier versions, still accepted with a warning.
ALIASES = {"--poll-interval": "poll_interval_seconds", "--hyperparameter": "hyperparameters",
           "--env": "environment", "--tag": "tags", "--input-channel": "input_channels",
           "--instance-hour-price": "instance_hour_prices"}
DESCRIPTION = (
    "Run the LLM trainer as an Amazon SageMaker AI training job and wait for it, streaming "
    "its CloudWatch logs; the same launcher as the KFP component sagemaker_training, whose "
    "parameters the flags are. Against the local backend: start `python -m kfp_sagemaker_blackwell.local_backend "
    "serve` and export AWS_ENDPOINT_URL=<its URL>.\n\nExit status: 0 Completed, 1 failed or "
    "stopped, 2 bad parameters (nothing created), 69 SageMaker unreachable past "
    "--max-outage-seconds, 143 terminated (SIGTERM/SIGINT; the job is stopped within "
    "--stop-timeout-seconds, or the message says how to stop it).\n\n"
    "Examples::\n"
    "  python -m kfp_sagemaker_blackwell.components.sagemaker_training --run-id exp-1 \\\n"
    "    --image-uri 123456789012.dkr.ecr.us-west-2.amazonaws.com/trainer:abc \\\n"
    "    --role-arn arn:aws:iam::123456789012:role/SageMakerTraining \\\n"
    "    --output-s3-uri s3://my-bucket/runs --precision mxfp8 --use-spot \\\n"
    "    --checkpoint-s3-uri s3://my-bucket/ckpt/exp-1 --max-wait-seconds 172800 --dry-run"
)


def build_parser() -> tuple[argparse.ArgumentParser, list[cli.Parameter]]:
    parser, params = cli.derived_parser(
        COMPONENT, doc=DESCRIPTION, exclude=PIPELINE_ONLY,
        title="parameters (the sagemaker_training component's)", aliases=ALIASES,
        notes={"memory_plan": "or @FILE to read it from a file"})
    g = parser.add_argument_group("this command line")
    g.add_argument("--run-id", required=True,
                   help="run id for the job name and the kfp-sagemaker:run-id tag; the same run "
                        "id + task + configuration re-attaches to the existing job")
    g.add_argument("--task", default=CLI_TASK, help=f"task name, part of the job name "
                   f"(default: {CLI_TASK})")
    g.add_argument("--pipeline", default=CLI_PIPELINE,
                   help=f"pipeline name for the tags (default: {CLI_PIPELINE})")
    g.add_argument("--aws-resources-path", default=None, type=cli.output_file,
                   help="write the aws_resources record here as soon as the job exists")
    g.add_argument("--output-json", default=None, type=cli.output_file, help="write the result as JSON here")
    cli.add_switch(g, "--dry-run", "validate and print the CreateTrainingJob request; no AWS call")
    return parser, params


def launch_arguments(args: argparse.Namespace, params: list[cli.Parameter]) -> Any:
    """The TrainingJobConfig of the parsed flags (with this command line's run id, task
    and pipeline; ``--memory-plan @FILE`` read)."""
    from kfp_sagemaker_blackwell.components.sagemaker_training.request import TrainingJobConfig

    values = cli.values(args, params)
    values.update(run_id=args.run_id, task=args.task, pipeline=args.pipeline)
    plan = values.get("memory_plan") or ""
    if plan.startswith("@"):
        try:
            with open(plan[1:], encoding="utf-8") as f:
                values["memory_plan"] = f.read()
        except OSError as exc:
            raise UserError("memory_plan", f"cannot read {plan[1:]}: {exc}.") from None
    return TrainingJobConfig.from_values(values)


@cli_errors
def main(argv: list[str] | None = None) -> int:
    # SIGTERM/SIGINT are handled from here on, before the heavier imports and long
    # before the first AWS call (a signal during interpreter start-up finds nothing
    # created yet and takes the default action).
    with ExecutionContext("sagemaker_training") as ctx:
        parser, params = build_parser()
        return _main(parser.parse_args(argv), params, ctx)


def _main(args: argparse.Namespace, params: list[cli.Parameter], ctx: ExecutionContext) -> int:
    from kfp_sagemaker_blackwell.components.sagemaker_training import launcher
    from kfp_sagemaker_blackwell.components.sagemaker_training.runner import (
        AwsUnreachable,
        JobStoppedAfterError,
        TrainingJobFailed,
    )

    try:
        cfg = launch_arguments(args, params)  # (the output files were checked by the parser)
        if args.dry_run:
            request = launcher.dry_run(cfg, say=lambda line: print(line, file=sys.stderr))
            print(launcher.request_json(request))
            return 0
        result = launcher.launch(cfg, resources_path=args.aws_resources_path,
                                 raise_on_failure=False, ctx=ctx)
    except AwsUnreachable as exc:
        print(f"error: {exc}. The training job may still be running: check it with aws "
              "sagemaker describe-training-job, re-run this command to re-attach to it.",
              file=sys.stderr)
        return AWS_UNREACHABLE_EXIT_CODE
    except JobStoppedAfterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    record = dataclasses.asdict(result)
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
    print(json.dumps(record, indent=2))
    if result.status != "Completed":
        failure = TrainingJobFailed(result.job_name, result.status, result.secondary_status,
                                    result.failure_reason)
        print(f"error: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
