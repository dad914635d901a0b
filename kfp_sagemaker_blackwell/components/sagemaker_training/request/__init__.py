"""The training job's configuration, its validation and the CreateTrainingJob request,
one module per concern (``resolution.resolve`` runs them in order); the names
other modules use, handed on."""

from kfp_sagemaker_blackwell.components.sagemaker_training.request.build import build_request
from kfp_sagemaker_blackwell.components.sagemaker_training.request.capacity import (
    instance_choices,
)
from kfp_sagemaker_blackwell.components.sagemaker_training.request.config import (
    CUSTOM_SKIPPED,
    OUTSIDE_KFP_DEFAULTS,
    TrainingJobConfig,
)
from kfp_sagemaker_blackwell.components.sagemaker_training.request.hyperparameters import (
    merge_precision_hyperparameters,
)
from kfp_sagemaker_blackwell.components.sagemaker_training.request.resolution import (
    ResolvedConfig,
    resolve,
)
from kfp_sagemaker_blackwell.planning.pricing import Budget

__all__ = [
    "Budget", "CUSTOM_SKIPPED", "OUTSIDE_KFP_DEFAULTS", "ResolvedConfig", "TrainingJobConfig",
    "build_request", "instance_choices", "merge_precision_hyperparameters", "resolve",
]
