"""The local backend: AWS on 127.0.0.1, with SageMaker training jobs that really run.

``python -m kfp_sagemaker_blackwell.local_backend serve`` or, from Python::

    from kfp_sagemaker_blackwell.local_backend import LocalBackend
    with LocalBackend() as backend:
        env = backend.env()   # AWS_ENDPOINT_URL, this start's credentials, region

See ``kfp_sagemaker_blackwell.local_backend.auth`` for who may send requests (only holders of the
credentials ``env()`` exports), ``kfp_sagemaker_blackwell.local_backend.backend`` for how they are routed and
``kfp_sagemaker_blackwell.local_backend.executor`` for the training-job state machine.
"""

from kfp_sagemaker_blackwell.local_backend.backend import LocalBackend

__all__ = ["LocalBackend"]
