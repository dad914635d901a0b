"""Memory estimate: per-GPU peak memory predictor, planner and KFP component.

``from kfp_sagemaker_blackwell.components.memory_estimate import memory_estimate`` gives the KFP
component (kfp is imported only then); ``estimator``, ``planner`` and ``report``
are plain Python and import neither kfp nor torch.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "memory_estimate":
        from kfp_sagemaker_blackwell.components.memory_estimate.component import memory_estimate

        return memory_estimate
    raise AttributeError(name)
