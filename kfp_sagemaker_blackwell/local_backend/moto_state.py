"""Every use of moto's private state, in one place.

moto serves S3, IAM, ECR, CloudWatch Logs and SageMaker's tag and search APIs
from process-global backends. The local executor owns training jobs, so it
mirrors each one into moto's training-job table (``MotoMirror``): moto's
AddTags / ListTags / DeleteTags / Search then see local jobs. ``reset()`` empties
every moto backend; ``moto_serves`` tells which operations moto implements (the
rest are answered "not served" at once); ``log_stream_names`` resolves the
``logStreamNamePrefix`` that moto's FilterLogEvents ignores. Everything here reaches into ``moto.*.models`` and may need
care on a moto upgrade; nothing else in ``kfp_sagemaker_blackwell.local_backend`` does.
"""

from __future__ import annotations

import functools
import importlib
import threading
from typing import Any

from kfp_sagemaker_blackwell.local_backend.jobs import ACCOUNT_ID, Job


def reset(lock: threading.RLock) -> None:
    """Empties every moto backend of this process (moto's state is process-global)."""
    from moto.moto_api._internal.models import moto_api_backend

    with lock:
        moto_api_backend.reset()


def moto_serves(service: str, operation: str) -> bool:
    """Whether moto implements ``operation`` (its response class has the handler)."""
    return operation in _moto_operations(service)


@functools.cache
def _moto_operations(service: str) -> frozenset[str]:
    import botocore.session
    from botocore import xform_name

    responses = {"sagemaker": "moto.sagemaker.responses:SageMakerResponse"}[service]
    module, _, cls = responses.partition(":")
    handler = getattr(importlib.import_module(module), cls)
    model = botocore.session.get_session().get_service_model(service)
    return frozenset(op for op in model.operation_names if hasattr(handler, xform_name(op)))


def log_stream_names(region: str, group: str, prefix: str) -> list[str] | None:
    """The streams of a CloudWatch Logs group whose names start with ``prefix``, sorted;
    None when there is no such group. The caller holds the moto lock."""
    from moto.logs.models import logs_backends

    log_group = logs_backends[ACCOUNT_ID][region].groups.get(group)
    if log_group is None:
        return None
    return sorted(name for name in log_group.streams if name.startswith(prefix))


class MotoMirror:
    """Keeps a stand-in for each local training job in moto's training-job table."""

    def __init__(self, lock: threading.RLock) -> None:
        self.lock = lock

    def _table(self, region: str) -> dict[str, Any]:
        from moto.sagemaker.models import sagemaker_backends

        return sagemaker_backends[ACCOUNT_ID][region].training_jobs  # type: ignore[no-any-return]

    def create(self, job: Job) -> None:
        from moto.sagemaker.models import FakeTrainingJob

        r = job.request

        def optional(member: str) -> Any:
            return r.get(member) or None

        with self.lock:
            standin = FakeTrainingJob(
                account_id=ACCOUNT_ID, region_name=job.region, training_job_name=job.name,
                hyper_parameters=dict(r.get("HyperParameters") or {}),
                algorithm_specification=dict(r.get("AlgorithmSpecification") or {}),
                role_arn=r.get("RoleArn", ""), input_data_config=r.get("InputDataConfig") or [],
                output_data_config=dict(r["OutputDataConfig"]),
                resource_config=dict(r.get("ResourceConfig") or {}),
                # moto drops None members from its answers; an empty {} would break the
                # shapes (VpcConfig's required SecurityGroupIds) of Search's results
                vpc_config=optional("VpcConfig"),
                stopping_condition=dict(r.get("StoppingCondition") or {}),
                tags=[dict(t) for t in r.get("Tags") or []],
                enable_network_isolation=bool(r.get("EnableNetworkIsolation")),
                enable_inter_container_traffic_encryption=bool(
                    r.get("EnableInterContainerTrafficEncryption")),
                enable_managed_spot_training=job.spot,
                checkpoint_config=optional("CheckpointConfig"),
                debug_hook_config=optional("DebugHookConfig"),
                debug_rule_configurations=r.get("DebugRuleConfigurations") or [],
                tensor_board_output_config=optional("TensorBoardOutputConfig"),
                experiment_config=optional("ExperimentConfig"),
            )
            standin.arn = job.arn
            standin.creation_time = job.creation_time
            self._table(job.region)[job.name] = standin
        self.update(job)

    def update(self, job: Job) -> None:
        with self.lock:
            standin = self._table(job.region).get(job.name)
            if standin is None:
                return
            standin.training_job_status = job.status
            standin.secondary_status = job.secondary_status
            standin.last_modified_time = job.last_modified_time
            standin.training_start_time = job.training_start_time
            standin.training_end_time = job.training_end_time
            standin.secondary_status_transitions = [dict(t) for t in job.transitions]

    def delete(self, job: Job) -> None:
        with self.lock:
            self._table(job.region).pop(job.name, None)
