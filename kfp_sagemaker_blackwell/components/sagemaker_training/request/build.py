"""The CreateTrainingJob request for a resolved configuration (what the launcher sends and ``--dry-
run`` prints)."""

from __future__ import annotations

from typing import Any

from kfp_sagemaker_blackwell.common import tags
from kfp_sagemaker_blackwell.components.sagemaker_training.request.capacity import instance_choices
from kfp_sagemaker_blackwell.components.sagemaker_training.request.config import TrainingJobConfig
from kfp_sagemaker_blackwell.components.sagemaker_training.request.resolution import ResolvedConfig

CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"


def algorithm_specification(c: TrainingJobConfig) -> dict[str, Any]:
    """The image, and for a custom one its entry point and metric definitions."""
    spec: dict[str, Any] = {"TrainingImage": c.image_uri, "TrainingInputMode": "File"}
    if c.entry_point:
        spec["ContainerEntrypoint"] = list(c.entry_point)
    if c.metric_definitions:
        spec["MetricDefinitions"] = [{"Name": d["Name"], "Regex": d["Regex"]}
                                     for d in c.metric_definitions]
    return spec


def build_request(r: ResolvedConfig) -> dict[str, Any]:
    """The CreateTrainingJob request for a resolved configuration."""
    c = r.config
    choices = instance_choices(c)
    resource: dict[str, Any] = ({
        "InstancePreferences": [{"InstanceType": t, "InstanceCount": n} for t, n in choices]}
        if len(choices) > 1 else {"InstanceType": c.instance_type,
                                  "InstanceCount": c.instance_count})
    resource["VolumeSizeInGB"] = c.volume_size_gb
    if c.keep_alive_seconds:
        resource["KeepAlivePeriodInSeconds"] = c.keep_alive_seconds
    if c.training_plan_arn:
        resource["TrainingPlanArn"] = c.training_plan_arn
    if c.volume_kms_key_id:
        resource["VolumeKmsKeyId"] = c.volume_kms_key_id
    stopping: dict[str, int] = {"MaxRuntimeInSeconds": c.max_runtime_seconds}
    if c.max_pending_seconds:
        stopping["MaxPendingTimeInSeconds"] = c.max_pending_seconds
    request: dict[str, Any] = {
        "TrainingJobName": r.job_name,
        "RoleArn": c.role_arn,
        "AlgorithmSpecification": algorithm_specification(c),
        "HyperParameters": r.hyperparameters,
        "OutputDataConfig": {"S3OutputPath": c.output_s3_uri,
                             **({"KmsKeyId": c.output_kms_key_id} if c.output_kms_key_id else {})},
        "ResourceConfig": resource,
        "StoppingCondition": stopping,
        # The article's launch disables the profiler: it costs throughput and we log our own.
        "ProfilerConfig": {"DisableProfiler": True},
        "Tags": tags.as_key_value(r.tags),
    }
    if c.enable_network_isolation:
        request["EnableNetworkIsolation"] = True
    if c.enable_inter_container_traffic_encryption:
        request["EnableInterContainerTrafficEncryption"] = True
    if c.enable_infra_check:
        request["InfraCheckConfig"] = {"EnableInfraCheck": True}
    if c.use_spot:
        request["EnableManagedSpotTraining"] = True
        stopping["MaxWaitTimeInSeconds"] = c.max_wait_seconds
    if c.checkpoint_s3_uri:
        request["CheckpointConfig"] = {"S3Uri": c.checkpoint_s3_uri,
                                       "LocalPath": CHECKPOINT_LOCAL_PATH}
    if c.input_channels:
        request["InputDataConfig"] = [
            {"ChannelName": name, "InputMode": "File",
             "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri,
                                             "S3DataDistributionType": "FullyReplicated"}}}
            for name, uri in sorted(c.input_channels.items())
        ]
    if r.environment:
        request["Environment"] = r.environment
    if c.max_retry_attempts:
        request["RetryStrategy"] = {"MaximumRetryAttempts": c.max_retry_attempts}
    if c.vpc_subnet_ids:
        request["VpcConfig"] = {"Subnets": list(c.vpc_subnet_ids),
                                "SecurityGroupIds": list(c.vpc_security_group_ids)}
    return request
