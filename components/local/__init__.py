"""The local backend: AWS on 127.0.0.1, with SageMaker training jobs that really run.

``python -m components.local serve`` or, from Python::

    from components.local import LocalBackend
    with LocalBackend() as backend:
        env = backend.env()   # AWS_ENDPOINT_URL, this start's credentials, region

See ``components.local.auth`` for who may send requests (only holders of the
credentials ``env()`` exports), ``components.local.backend`` for how they are routed and
``components.local.executor`` for the training-job state machine.
"""

from components.local.backend import LocalBackend

__all__ = ["LocalBackend"]
