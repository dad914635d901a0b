"""``python -m components.sagemaker_training``: the training component from a shell.

Flags mirror the component's parameters (``--batch-size`` for ``batch_size``...);
``--dry-run`` validates and prints the exact CreateTrainingJob request without
calling AWS. Exit status: 0 Completed; 1 the job failed or was stopped (its
FailureReason is printed); 2 a user error (nothing was created); 69 SageMaker
was unreachable for longer than ``--max-outage-seconds`` while following the job
(the job may still be running: the message names it); 143 terminated by SIGTERM
or SIGINT (the job was stopped).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from components.common.cli import key_values
from components.common.errors import AWS_UNREACHABLE_EXIT_CODE, USER_ERROR_EXIT_CODE, UserError
from components.common.execution_context import (
    TERMINATED_EXIT_CODE,
    ExecutionContext,
    Terminated,
)
from components.sagemaker_training.request import DEFAULT_INSTANCE_TYPE, TrainingJobConfig
from components.sagemaker_training.runner import DEFAULT_MAX_OUTAGE_S, DEFAULT_POLL_INTERVAL_S


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m components.sagemaker_training",
        description=(
            "Run the LLM trainer as an Amazon SageMaker AI training job and wait for it, "
            "streaming its CloudWatch logs; the same launcher as the KFP component "
            "sagemaker_training. Against the local backend: start `python -m components.local "
            "serve` and export AWS_ENDPOINT_URL=<its URL>."
        ),
        epilog=(
            "Example: python -m components.sagemaker_training --run-id exp-1 "
            "--image-uri 123456789012.dkr.ecr.us-west-2.amazonaws.com/trainer:abc "
            "--role-arn arn:aws:iam::123456789012:role/SageMakerTraining "
            "--output-s3-uri s3://my-bucket/runs --precision mxfp8 --use-spot "
            "--checkpoint-s3-uri s3://my-bucket/ckpt/exp-1 --max-wait-seconds 172800 --dry-run"
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    req = p.add_argument_group("required")
    req.add_argument("--image-uri", required=True, help="trainer image in ECR (build_image)")
    req.add_argument("--role-arn", required=True, help="IAM role SageMaker assumes")
    req.add_argument("--output-s3-uri", required=True,
                     help="S3 prefix; the model lands at <prefix>/<job>/output/model.tar.gz")
    req.add_argument("--run-id", required=True,
                     help="run id for the job name and the kfp-sagemaker:run-id tag; the same "
                          "run id + task + configuration re-attaches to the existing job")
    g = p.add_argument_group("naming and tags")
    g.add_argument("--task", default="sagemaker-training", help="task name (job name)")
    g.add_argument("--pipeline", default="cli", help="pipeline name (tag)")
    g.add_argument("--job-name", default="", help="explicit job name (default: derived)")
    g.add_argument("--tag", action="append", metavar="KEY=VALUE", help="extra tag (repeatable)")
    g = p.add_argument_group("hardware and capacity")
    g.add_argument("--region", default="", help="AWS region (default: AWS_REGION)")
    g.add_argument("--instance-type", default=DEFAULT_INSTANCE_TYPE)
    g.add_argument("--instance-count", type=int, default=1)
    g.add_argument("--volume-size-gb", type=int, default=500)
    g.add_argument("--training-plan-arn", default="",
                   help="run on this Flexible Training Plan (checked with DescribeTrainingPlan)")
    g.add_argument("--use-spot", action="store_true", help="Managed Spot Training")
    g.add_argument("--max-wait-seconds", type=int, default=0,
                   help="spot: longest wait + run time (>= --max-runtime-seconds)")
    g.add_argument("--max-runtime-seconds", type=int, default=86400)
    g.add_argument("--max-retry-attempts", type=int, default=0)
    g.add_argument("--checkpoint-s3-uri", default="",
                   help="checkpoint sync/restore prefix (required with --use-spot)")
    g.add_argument("--vpc-subnet-id", action="append", help="VPC subnet (repeatable)")
    g.add_argument("--vpc-security-group-id", action="append",
                   help="VPC security group (repeatable)")
    g.add_argument("--output-kms-key-id", default="",
                   help="KMS key for the model artifacts and output (OutputDataConfig.KmsKeyId)")
    g.add_argument("--volume-kms-key-id", default="",
                   help="KMS key for the instances' EBS volumes (ResourceConfig.VolumeKmsKeyId)")
    g.add_argument("--enable-network-isolation", action=argparse.BooleanOptionalAction,
                   default=False, help="no network access for the training container")
    g.add_argument("--enable-inter-container-traffic-encryption",
                   action=argparse.BooleanOptionalAction, default=False,
                   help="encrypt traffic between the instances of a multi-node job")
    g = p.add_argument_group("model and training")
    g.add_argument("--precision", default="bf16",
                   help="fp32, bf16, fp16, fp8, fp8-current, fp8-block, mxfp8, nvfp4")
    g.add_argument("--model-preset", default="8b", help="tiny, small, 1b, 3b, 8b, 14b, 32b, 64b")
    g.add_argument("--num-layers", type=int, default=0, help="0: the preset's")
    g.add_argument("--hidden-size", type=int, default=0, help="0: the preset's")
    g.add_argument("--num-heads", type=int, default=0, help="0: the preset's")
    g.add_argument("--num-kv-heads", type=int, default=0, help="0: the preset's")
    g.add_argument("--ffn-hidden-size", type=int, default=0, help="0: the preset's")
    g.add_argument("--vocab-size", type=int, default=-1, help="-1: the preset's")
    g.add_argument("--batch-size", type=int, default=8, help="micro-batch per GPU")
    g.add_argument("--seq-length", type=int, default=2048)
    g.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction,
                   default=False)
    g.add_argument("--max-steps", type=int, default=100)
    g.add_argument("--hyperparameter", action="append", metavar="KEY=VALUE",
                   help="further trainer hyperparameter, flag name without dashes "
                        "(e.g. lr=3e-4; repeatable)")
    g.add_argument("--env", action="append", metavar="KEY=VALUE",
                   help="environment variable for the container (repeatable)")
    g.add_argument("--input-channel", action="append", metavar="NAME=S3URI",
                   help="input channel (repeatable)")
    g.add_argument("--memory-plan", default="",
                   help="memory_estimate plan JSON, or @file to read it from a file")
    g.add_argument("--override-memory-check", action="store_true",
                   help="launch even when the pre-flight memory estimate (run when no "
                        "--memory-plan is given) predicts the job will not fit")
    g = p.add_argument_group("outputs and behaviour")
    g.add_argument("--instance-hour-price", action="append", metavar="TYPE=USD",
                   help="override the price table for the cost estimate (repeatable)")
    g.add_argument("--max-cost-usd", type=float, default=0.0,
                   help="refuse to launch when the worst case (instances x max runtime x "
                        "instance-hour price) exceeds this; 0: no limit")
    g.add_argument("--poll-interval-seconds", "--poll-interval", dest="poll_interval",
                   type=float, default=DEFAULT_POLL_INTERVAL_S, help="seconds between polls")
    g.add_argument("--max-outage-seconds", type=float, default=DEFAULT_MAX_OUTAGE_S,
                   help="how long an unreachable SageMaker endpoint is ridden out while "
                        f"following the job before giving up (exit {AWS_UNREACHABLE_EXIT_CODE})")
    g.add_argument("--aws-resources-path", default=None,
                   help="write the aws_resources record here as soon as the job exists")
    g.add_argument("--output-json", default=None, help="write the result as JSON here")
    g.add_argument("--dry-run", action="store_true",
                   help="validate and print the CreateTrainingJob request; no AWS call")
    return p


def config_from_args(args: argparse.Namespace) -> TrainingJobConfig:
    memory_plan = args.memory_plan
    if memory_plan.startswith("@"):
        try:
            with open(memory_plan[1:], encoding="utf-8") as f:
                memory_plan = f.read()
        except OSError as exc:
            raise UserError("memory_plan", f"cannot read {memory_plan[1:]}: {exc}.") from None
    return TrainingJobConfig(
        image_uri=args.image_uri, role_arn=args.role_arn, output_s3_uri=args.output_s3_uri,
        run_id=args.run_id, task=args.task, pipeline=args.pipeline, region=args.region,
        instance_type=args.instance_type, instance_count=args.instance_count,
        precision=args.precision, model_preset=args.model_preset, num_layers=args.num_layers,
        hidden_size=args.hidden_size, num_heads=args.num_heads, num_kv_heads=args.num_kv_heads,
        ffn_hidden_size=args.ffn_hidden_size, vocab_size=args.vocab_size,
        batch_size=args.batch_size, seq_length=args.seq_length,
        activation_checkpointing=args.activation_checkpointing, max_steps=args.max_steps,
        hyperparameters=key_values("--hyperparameter", args.hyperparameter),
        environment=key_values("--env", args.env), checkpoint_s3_uri=args.checkpoint_s3_uri,
        input_channels=key_values("--input-channel", args.input_channel),
        training_plan_arn=args.training_plan_arn, use_spot=args.use_spot,
        max_wait_seconds=args.max_wait_seconds, max_runtime_seconds=args.max_runtime_seconds,
        max_retry_attempts=args.max_retry_attempts, volume_size_gb=args.volume_size_gb,
        vpc_subnet_ids=args.vpc_subnet_id or [],
        vpc_security_group_ids=args.vpc_security_group_id or [],
        output_kms_key_id=args.output_kms_key_id, volume_kms_key_id=args.volume_kms_key_id,
        enable_network_isolation=args.enable_network_isolation,
        enable_inter_container_traffic_encryption=args.enable_inter_container_traffic_encryption,
        tags=key_values("--tag", args.tag), memory_plan=memory_plan, job_name=args.job_name,
        override_memory_check=args.override_memory_check, max_cost_usd=args.max_cost_usd,
    )


def main(argv: list[str] | None = None) -> int:
    # SIGTERM/SIGINT are handled from here on, before the heavier imports and long
    # before the first AWS call (a signal during interpreter start-up finds nothing
    # created yet and takes the default action).
    with ExecutionContext("sagemaker_training") as ctx:
        return _main(build_parser().parse_args(argv), ctx)


def _main(args: argparse.Namespace, ctx: ExecutionContext) -> int:
    from components.sagemaker_training import launcher
    from components.sagemaker_training.runner import AwsUnreachable, TrainingJobFailed

    try:
        cfg = config_from_args(args)
        prices = key_values("--instance-hour-price", args.instance_hour_price)
        if args.dry_run:
            resolved, request = launcher.prepare(cfg)
            for note in resolved.notes:
                print(note, file=sys.stderr)
            launcher.cost_preview(resolved, launcher.pricing.price_table(prices),
                                  say=lambda line: print(line, file=sys.stderr))
            print(launcher.request_json(request))
            return 0
        result = launcher.launch(cfg, resources_path=args.aws_resources_path,
                                 instance_hour_prices=prices, poll_interval_s=args.poll_interval,
                                 max_outage_s=args.max_outage_seconds, raise_on_failure=False,
                                 ctx=ctx)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    except Terminated as exc:
        print(f"error: {exc}", file=sys.stderr)
        return TERMINATED_EXIT_CODE
    except AwsUnreachable as exc:
        print(f"error: {exc}. The training job may still be running: check it with aws "
              "sagemaker describe-training-job, re-run this command to re-attach to it.",
              file=sys.stderr)
        return AWS_UNREACHABLE_EXIT_CODE
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump(_asdict(result), f, indent=2)
    print(json.dumps(_asdict(result), indent=2))
    if result.status != "Completed":
        failure = TrainingJobFailed(result.job_name, result.status, result.secondary_status,
                                    result.failure_reason)
        print(f"error: {failure}", file=sys.stderr)
        return 1
    return 0


def _asdict(result: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(result)


if __name__ == "__main__":
    sys.exit(main())
