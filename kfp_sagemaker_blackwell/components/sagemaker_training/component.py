"""KFP definition of the SageMaker training component (the work is in ``launcher``).

Behaviour that matters when things go wrong:

- Every parameter is validated before any AWS call; a bad one fails with a message
  naming the parameter and the fix (a precision the instance's GPU cannot run, spot
  without ``checkpoint_s3_uri``, ``max_wait_seconds`` < ``max_runtime_seconds``,
  malformed S3 URIs or ARNs, too many hyperparameters/variables/tags, ...).
- The job name is derived from the run id, the task name, the precision and a digest
  of what the job trains, so a retried or restarted task re-attaches to the job its
  first attempt created instead of launching a second one; a job of that name that
  does not carry this run's ``kfp-sagemaker:run-id`` tag is refused, never adopted.
- ``aws_resources`` is written as soon as the job exists (for cleanup and humans).
- Terminating the run (SIGTERM, or SIGINT) at any instant stops the training job:
  the handler is installed before the first AWS call, a termination during
  CreateTrainingJob stops the job as soon as it exists, and the task waits until
  SageMaker reports it Stopping (at most ``stop_timeout_seconds``, even while
  SageMaker is unreachable), then exits 143 saying whether the stop was accepted. A process started with SIGINT
  ignored (`nohup`, a script's `cmd &`) keeps ignoring it, as Python does; SIGTERM is
  always handled.
- Any other error once the job exists (an output that cannot be written...)
  stops the job the same way before the task fails.
- A failed job fails this task with SageMaker's FailureReason (for example the
  trainer's CUDA out-of-memory message and the fix it suggests).

Bring your own image (``trainer="custom"``, as the retired AWS TrainingJob
component and GCPC's CustomTrainingJobOp): ``image_uri`` is your image,
``entry_point`` its ContainerEntrypoint, ``hyperparameters`` are free (any names,
SageMaker's limits only), ``metric_definitions`` go into
AlgorithmSpecification.MetricDefinitions (SageMaker's console and CloudWatch show
them; parse_logs reads them back from DescribeTrainingJob and fills the step series).
Still checked: SageMaker's limits, the precision against the GPU, cost, capacity
(plans, spot, fallbacks), tags, re-attach and stop. Skipped, and said in a log line:
the in-repo trainer's flag table for the hyperparameters, the memory pre-flight for
its model (``model_preset``, dimensions, ``batch_size``, ``seq_length``,
``max_steps``, ``activation_checkpointing``, ``memory_plan`` are then not sent) and
the precision recipe confirmation (parse_logs cannot confirm another image's recipe).

Locally, with ``python -m kfp_sagemaker_blackwell.local_backend serve`` running and ``AWS_ENDPOINT_URL``
set to its URL, the same calls run the trainer from this checkout on this machine.
"""

from typing import NamedTuple, Optional

from kfp import dsl
from kfp.dsl import Model, Output, OutputPath

from kfp_sagemaker_blackwell.common.component import component


@component(aws=True, retries=2)  # a retry re-attaches to its job by its deterministic name
def sagemaker_training(
    image_uri: str,
    role_arn: str,
    output_s3_uri: str,
    model: Output[Model],
    aws_resources: OutputPath(str),  # type: ignore[valid-type]
    region: str = "",
    trainer: str = "in-repo",
    entry_point: Optional[list] = None,
    metric_definitions: Optional[list] = None,
    endpoint_url: str = "",
    instance_type: str = "ml.p6-b200.48xlarge",
    instance_count: int = 1,
    precision: str = "bf16",
    # catalog/parameters.py's MODEL, documented there:
    model_preset: str = "8b", num_layers: int = 0, hidden_size: int = 0, num_heads: int = 0,
    num_kv_heads: int = 0, ffn_hidden_size: int = 0, vocab_size: int = -1,
    batch_size: int = 8,
    seq_length: int = 2048,
    activation_checkpointing: bool = False,
    max_steps: int = 100,
    hyperparameters: Optional[dict] = None,
    precision_hyperparameters: Optional[dict] = None,
    environment: Optional[dict] = None,
    checkpoint_s3_uri: str = "",
    checkpoint_s3_prefix: str = "",
    input_channels: Optional[dict] = None,
    training_plan_arn: str = "",
    use_spot: bool = False,
    max_wait_seconds: int = 0,
    max_runtime_seconds: int = 86400,
    max_retry_attempts: int = 0,
    fallback_instances: Optional[list] = None,
    max_pending_seconds: int = 0,
    keep_alive_seconds: int = 0,
    volume_size_gb: int = 500,
    vpc_subnet_ids: Optional[list] = None,
    vpc_security_group_ids: Optional[list] = None,
    # catalog/parameters.py's ENCRYPTION, documented there:
    output_kms_key_id: str = "", volume_kms_key_id: str = "",
    enable_network_isolation: bool = False, enable_inter_container_traffic_encryption: bool = False,
    enable_infra_check: bool = False,
    tags: Optional[dict] = None,
    memory_plan: str = "",
    override_memory_check: bool = False,
    instance_hour_prices: Optional[dict] = None,
    max_cost_usd: float = 0.0,
    budget_items: Optional[list] = None,
    job_name: str = "",
    poll_interval_seconds: float = 5.0,
    max_outage_seconds: float = 300.0,
    stop_timeout_seconds: float = 5.0,
    run_id: str = dsl.PIPELINE_JOB_ID_PLACEHOLDER,
    task: str = dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    pipeline: str = dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
) -> NamedTuple(  # type: ignore[valid-type]
    "Outputs",
    [("job_name", str), ("job_arn", str), ("status", str), ("billable_seconds", int),
     ("estimated_cost_usd", float), ("worst_case_cost_usd", float)],
):
    """Trains the project's LLM trainer as an Amazon SageMaker AI training job.

    Runs the trainer image (``build_image``) on ``instance_count`` x ``instance_type``
    (default ml.p6-b200.48xlarge, 8x NVIDIA B200) with the given precision and model,
    on on-demand capacity, a Flexible Training Plan or Managed Spot, and waits for it:
    the job's CloudWatch logs (``/aws/sagemaker/TrainingJobs``, every host, new streams
    after a spot restart) and its secondary-status transitions are streamed into this
    task's log. Plain boto3 (CreateTrainingJob / DescribeTrainingJob / StopTrainingJob,
    https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_CreateTrainingJob.html).

    Args:
        image_uri: Trainer image in ECR (the ``image_uri`` output of build_image).
        role_arn: IAM role SageMaker assumes for the job (S3, ECR, CloudWatch access).
        output_s3_uri: S3 prefix for artifacts; the model lands at
            ``<output_s3_uri>/<job name>/output/model.tar.gz``.
        region: AWS region; empty uses AWS_REGION / AWS_DEFAULT_REGION.
        trainer: "in-repo" (this project's trainer image, all its checks) or "custom"
            (your own image; docs/components.md, "Bring your own image", says which checks
            still apply).
        entry_point: trainer="custom" only: the container's argv
            (AlgorithmSpecification.ContainerEntrypoint, at most 100 strings of 256
            characters, e.g. ["python", "/opt/ml/input/data/code/train.py", "--epochs",
            "3"]); empty: the image's own ENTRYPOINT.
        metric_definitions: trainer="custom" only: up to 40 {"Name": ..., "Regex": ...}
            (MetricDefinitions; the first group of the regex is the value, e.g.
            {"Name": "loss", "Regex": "loss=([0-9.eE+-]+)"}); the names parse_logs puts
            into the step series are those of components/parse_logs/metric_defs.py.
        endpoint_url: SageMaker and CloudWatch Logs endpoint (e.g. the URL that
            ``python -m kfp_sagemaker_blackwell.local_backend serve`` prints); empty: AWS_ENDPOINT_URL, else AWS.
        instance_type: SageMaker instance type; the precision is checked against its GPU.
        instance_count: Instances (8 GPUs each on p6-b200); >1 trains multi-node.
        precision: fp32, bf16, fp16, fp8, fp8-current, fp8-block, mxfp8 or nvfp4
            (mxfp8 and nvfp4 need Blackwell).
        batch_size: Micro-batch per GPU (a ``memory_plan`` replaces it).
        seq_length: Sequence length in tokens.
        activation_checkpointing: Recompute each block in the backward pass to save
            memory (a ``memory_plan`` replaces it).
        max_steps: Optimizer steps.
        hyperparameters: Further trainer hyperparameters by flag name without dashes
            (e.g. {"lr": 0.0003, "checkpoint-every": 50}); the parameters above own
            precision, model-preset, dimensions, batch-size, seq-length, max-steps and
            activation-checkpointing.
        precision_hyperparameters: Per-precision additions to ``hyperparameters``, keyed
            by precision (e.g. {"nvfp4": {"high-precision-lm-head": "true"}}); only
            this task's precision's entry applies, so a sweep passes one map to all.
        environment: Extra environment variables for the training container.
        checkpoint_s3_uri: S3 prefix the checkpoint directory is synced to and restored
            from (required with ``use_spot``, or ``checkpoint_s3_prefix``).
        checkpoint_s3_prefix: Instead of ``checkpoint_s3_uri``: the job's checkpoints
            are at ``<checkpoint_s3_prefix>/<job name>``, a prefix of its own (what a
            pipeline with several jobs passes: its jobs never share checkpoints).
        input_channels: Channel name -> S3 prefix, downloaded to
            /opt/ml/input/data/<name> (e.g. {"train": "s3://bucket/tokens/"}); the
            trainer reads token files with ``hyperparameters={"data-dir": ...}``.
        training_plan_arn: Run on a SageMaker Flexible Training Plan; before launch,
            DescribeTrainingPlan must show it Active or Scheduled and reserving this
            instance type and count.
        use_spot: Managed Spot Training (needs ``checkpoint_s3_uri`` and
            ``max_wait_seconds``); an interrupted job resumes from its checkpoint.
        max_wait_seconds: Spot only: the longest to wait for and run on spot capacity
            (>= ``max_runtime_seconds``).
        max_runtime_seconds: The longest the job may train (SageMaker stops it after).
        max_retry_attempts: SageMaker's RetryStrategy (retries InternalServerError only).
        fallback_instances: Instance types to fall back to, in order, when SageMaker has no
            capacity for ``instance_count`` x ``instance_type``: up to 4
            ``{"InstanceType": ..., "InstanceCount": ...}`` (count default:
            ``instance_count``). The request then carries
            ResourceConfig.InstancePreferences (the first type first) and SageMaker runs
            the first with capacity (SelectedInstanceType/SelectedInstanceCount, what
            is billed). On-demand only (not with ``use_spot`` or ``training_plan_arn``);
            each type must run ``precision`` and pass the memory pre-flight, and the
            worst case is that of the costliest type.
        max_pending_seconds: StoppingCondition.MaxPendingTimeInSeconds: how long the job
            may wait for capacity (1800-2419200 s; unbilled) before SageMaker fails it;
            0: SageMaker's default.
        keep_alive_seconds: Warm pool: keep the instances this long after the job
            (ResourceConfig.KeepAlivePeriodInSeconds, up to 21600 s) so the next
            matching job starts without provisioning; the retained time is billed
            (WarmPoolStatus.ResourceRetainedBillableTimeInSeconds x instances) and is
            part of the worst case. 0: no warm pool.
        volume_size_gb: EBS volume per instance.
        vpc_subnet_ids: Subnets for VPC mode (with ``vpc_security_group_ids``).
        vpc_security_group_ids: Security groups for VPC mode (with ``vpc_subnet_ids``).
        enable_infra_check: Have SageMaker test the instances' hardware and the
            cluster's network connectivity before training (InfraCheckConfig,
            https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_InfraCheckConfig.html).
        tags: Extra tags for the job (the run's kfp-sagemaker:* tags are always added).
        memory_plan: The ``plan`` output of memory_estimate; when given, its batch size
            and activation checkpointing for this precision are used, and a
            configuration it predicts not to fit (or a precision the GPU does not run)
            is refused before launch.
        override_memory_check: Launch even when, with no ``memory_plan``, the
            pre-flight estimate (memory_estimate's model, run before every launch)
            predicts the configuration will not fit in GPU memory.
        instance_hour_prices: Instance type -> USD per instance-hour (e.g. a Savings
            Plans rate). Default: the AWS Price List API's on-demand SageMaker training
            rate for the region (pricing:GetProducts, cached a day), else the shipped
            table (labelled "verify"); every cost in the log names its price's source.
            A job on a training plan costs its share of the plan's UpfrontFee instead.
        max_cost_usd: Refuse to launch (before CreateTrainingJob) when the worst case,
            instance_count x max_runtime_seconds (spot: max_wait_seconds; plus
            keep_alive_seconds) x the instance-hour price of the costliest of the
            preferred instance types, exceeds this many USD (in a pipeline's sweep:
            times its number of jobs); 0: no limit.
        budget_items: The items of the ParallelFor this job is one of (a sweep's
            precisions or batch candidates): ``max_cost_usd`` then bounds the sum
            of all their worst cases, so no job starts when the sweep is over it.
        job_name: Explicit training job name (default: derived from the run id, the
            task, the precision and a digest of what the job trains, so that a retry
            re-attaches to its job).
        poll_interval_seconds: Seconds between DescribeTrainingJob/log polls.
        max_outage_seconds: How long an unreachable SageMaker endpoint is ridden out
            while following the job (it keeps running meanwhile); past it the task
            fails (exit 69) naming the job, and a retry re-attaches to it.
        stop_timeout_seconds: How long the stop on termination may take, whatever
            ``max_outage_seconds`` (KFP kills a terminated pod 30 s after SIGTERM);
            when SageMaker cannot be reached in that time, the task says so and
            prints the ``aws sagemaker stop-training-job`` command that stops the job.
        run_id: Run id for naming and tags (default: the KFP run's id).
        task: Task name for naming (default: this task's name).
        pipeline: Pipeline name for tags (default: the KFP job name).

    Returns:
        model: Model artifact whose URI is the S3 model.tar.gz (metadata: job name,
            precision, instance type/count).
        aws_resources: JSON record of the training job (ARN, region, console link).
        job_name: Training job name.
        job_arn: Training job ARN.
        status: Final status (Completed; any other status fails the task).
        billable_seconds: BillableTimeInSeconds (per instance, as SageMaker reports it).
        estimated_cost_usd: (billable + warm-pool retained) hours x the selected
            instance count x the selected type's instance-hour price (for spot, BillableTimeInSeconds is what SageMaker bills; on a
            training plan, the plan's fee per reserved instance-hour), -1 without a price.
        worst_case_cost_usd: instance_count x max_runtime_seconds (spot:
            max_wait_seconds; plus keep_alive_seconds) x the price (the costliest
            preference) (what was checked against ``max_cost_usd``),
            -1 without a price.
    """
    from collections import namedtuple

    from kfp_sagemaker_blackwell.common.execution_context import TERMINATED_EXIT_CODE, Terminated
    from kfp_sagemaker_blackwell.components.sagemaker_training.launcher import launch
    from kfp_sagemaker_blackwell.components.sagemaker_training.request import TrainingJobConfig

    try:  # every parameter but the outputs, by its name (tests/test_declarations.py holds them)
        result = launch(TrainingJobConfig(
            image_uri=image_uri,
            role_arn=role_arn,
            output_s3_uri=output_s3_uri,
            region=region,
            trainer=trainer,
            entry_point=entry_point,
            metric_definitions=metric_definitions,
            endpoint_url=endpoint_url,
            instance_type=instance_type,
            instance_count=instance_count,
            precision=precision,
            model_preset=model_preset,
            num_layers=num_layers,
            hidden_size=hidden_size,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            ffn_hidden_size=ffn_hidden_size,
            vocab_size=vocab_size,
            batch_size=batch_size,
            seq_length=seq_length,
            activation_checkpointing=activation_checkpointing,
            max_steps=max_steps,
            hyperparameters=hyperparameters,
            precision_hyperparameters=precision_hyperparameters,
            environment=environment,
            checkpoint_s3_uri=checkpoint_s3_uri,
            checkpoint_s3_prefix=checkpoint_s3_prefix,
            input_channels=input_channels,
            training_plan_arn=training_plan_arn,
            use_spot=use_spot,
            max_wait_seconds=max_wait_seconds,
            max_runtime_seconds=max_runtime_seconds,
            max_retry_attempts=max_retry_attempts,
            fallback_instances=fallback_instances,
            max_pending_seconds=max_pending_seconds,
            keep_alive_seconds=keep_alive_seconds,
            volume_size_gb=volume_size_gb,
            vpc_subnet_ids=vpc_subnet_ids,
            vpc_security_group_ids=vpc_security_group_ids,
            output_kms_key_id=output_kms_key_id,
            volume_kms_key_id=volume_kms_key_id,
            enable_network_isolation=enable_network_isolation,
            enable_inter_container_traffic_encryption=enable_inter_container_traffic_encryption,
            enable_infra_check=enable_infra_check,
            tags=tags,
            memory_plan=memory_plan,
            override_memory_check=override_memory_check,
            instance_hour_prices=instance_hour_prices,
            max_cost_usd=max_cost_usd,
            budget_items=budget_items,
            job_name=job_name,
            poll_interval_seconds=poll_interval_seconds,
            max_outage_seconds=max_outage_seconds,
            stop_timeout_seconds=stop_timeout_seconds,
            run_id=run_id,
            task=task,
            pipeline=pipeline,
        ), resources_path=aws_resources)
    except Terminated as exc:
        print(f"error: {exc}", flush=True)
        raise SystemExit(TERMINATED_EXIT_CODE) from None
    model.uri = result.model_s3_uri
    model.metadata.update({"training_job_name": result.job_name, "precision": precision,
                           "instance_type": result.instance_type or instance_type,
                           "instance_count": result.instance_count or instance_count,
                           "s3_uri": result.model_s3_uri})
    Outputs = namedtuple(  # noqa: N806
        "Outputs", ["job_name", "job_arn", "status", "billable_seconds", "estimated_cost_usd",
                    "worst_case_cost_usd"])
    return Outputs(result.job_name, result.job_arn, result.status, result.billable_seconds,
                   result.estimated_cost_usd, result.worst_case_cost_usd)
