"""The article's SageMaker Python SDK v2 code, run against the local backend.

Run with a Python that has ``sagemaker>=2.200,<3`` (it cannot share this project's
venv: SDK v2 needs sagemaker-core 1.x, the project needs 2.x), the local backend's
environment (``AWS_ENDPOINT_URL`` ...) and these arguments::

    python tests/clients/sdk_v2_article.py BUCKET IMAGE_URI ROLE_ARN

It opts out of the SDK's telemetry (``TelemetryOptOut`` in an SDK config file named by
``SAGEMAKER_USER_CONFIG_OVERRIDE``, which the backend's environment sets) and refuses every connection that is not to
127.0.0.1, so a request to AWS fails loudly instead of leaking. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile

BLOCKED: list[str] = []
_connect = socket.socket.connect


def _loopback_only(self: socket.socket, address: object) -> object:
    host = address[0] if isinstance(address, tuple) else str(address)
    if self.family in (socket.AF_INET, socket.AF_INET6) and host not in ("127.0.0.1", "::1",
                                                                           "localhost"):
        BLOCKED.append(str(address))
        raise OSError(f"blocked: {address} is not 127.0.0.1 (nothing may leave the machine)")
    return _connect(self, address)


socket.socket.connect = _loopback_only  # type: ignore[method-assign]


def opt_out_of_telemetry() -> None:
    """The SDK sends telemetry after fit() unless its config says TelemetryOptOut; the local
    backend's environment names such a config (``LocalBackend.env()``)."""
    if os.environ.get("SAGEMAKER_USER_CONFIG_OVERRIDE"):
        return
    path = os.path.join(tempfile.mkdtemp(), "sagemaker-config.yaml")
    with open(path, "w") as f:
        f.write("SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n"
                "      TelemetryOptOut: true\n")
    os.environ["SAGEMAKER_USER_CONFIG_OVERRIDE"] = path


def main(bucket: str, image_uri: str, role: str) -> dict[str, object]:
    opt_out_of_telemetry()
    import boto3
    import sagemaker
    from sagemaker.estimator import Estimator

    session = sagemaker.Session(boto_session=boto3.Session(region_name=os.environ["AWS_REGION"]))
    hyperparameters = {"precision": "bf16", "num-layers": 2, "batch-size": 8, "seq-length": 128}
    entry = ["bash", "-c", 'echo "step 1 loss 2.0 precision=$SM_HP_PRECISION"']
    results: dict[str, object] = {}
    for spot in (False, True):
        extra = dict(use_spot_instances=True, max_run=3600, max_wait=7200,
                     checkpoint_s3_uri=f"s3://{bucket}/checkpoints") if spot else {}
        estimator = Estimator(
            image_uri=image_uri, role=role, instance_count=1,
            instance_type="ml.p6-b200.48xlarge", hyperparameters=hyperparameters,
            output_path=f"s3://{bucket}/output", disable_profiler=True,
            container_entry_point=entry, sagemaker_session=session, **extra)
        estimator.fit(wait=True, logs=True)
        name = estimator.latest_training_job.name
        attached = Estimator.attach(name, sagemaker_session=session)
        description = attached.latest_training_job.describe()
        results["spot" if spot else "on_demand"] = {
            "job": name, "status": description["TrainingJobStatus"],
            "model_data": attached.model_data,
            "attached_instance_type": attached.instance_type,
            "billable": description.get("BillableTimeInSeconds"),
            "training": description.get("TrainingTimeInSeconds"),
        }
    results["blocked"] = BLOCKED
    return results


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))
