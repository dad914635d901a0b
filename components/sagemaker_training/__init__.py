"""SageMaker training component: ``from components.sagemaker_training import sagemaker_training``.

The KFP definition is in ``component``; validation and the request in
``request``; the job life cycle in ``runner``; ``launcher`` ties them together
for the component and for ``python -m components.sagemaker_training``.
"""

from components.sagemaker_training.component import sagemaker_training

__all__ = ["sagemaker_training"]
