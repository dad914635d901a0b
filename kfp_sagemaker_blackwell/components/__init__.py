"""Kubeflow Pipelines components for training transformer LLMs on SageMaker Blackwell.

Importing this package is cheap (no kfp, boto3, torch or SageMaker SDK): each
component lives in its own sub-package, e.g.
``from kfp_sagemaker_blackwell.components.sagemaker_training import sagemaker_training``.
"""

from kfp_sagemaker_blackwell.catalog.release import __version__  # noqa: F401 (the package's version)
