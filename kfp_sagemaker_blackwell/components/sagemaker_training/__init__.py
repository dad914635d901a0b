"""SageMaker training component: ``from kfp_sagemaker_blackwell.components.sagemaker_training import sagemaker_training``.

The KFP definition is in ``component``; validation and the request in
``request``; the job life cycle in ``runner``; ``launcher`` ties them together
for the component and for ``python -m kfp_sagemaker_blackwell.components.sagemaker_training``.

The component is loaded lazily: the component's own body (running inside a KFP
executor) imports ``launcher`` from this package, and must not re-enter kfp.dsl
while the executor is still importing it.
"""

from typing import Any

__all__ = ["sagemaker_training"]


def __getattr__(name: str) -> Any:
    if name == "sagemaker_training":
        from kfp_sagemaker_blackwell.components.sagemaker_training.component import (
            sagemaker_training,
        )

        return sagemaker_training
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
