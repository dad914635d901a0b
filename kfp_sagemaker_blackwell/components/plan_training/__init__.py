"""Training planner: the cheapest (or fastest) configuration that trains a model on a
token budget, within a deadline and a budget.

``from kfp_sagemaker_blackwell.components.plan_training import plan_training`` gives the KFP component (kfp is
imported only then); ``search``, ``offerings``, ``report`` and ``run`` are plain Python
and import neither kfp nor torch.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "plan_training":
        from kfp_sagemaker_blackwell.components.plan_training.component import plan_training

        return plan_training
    raise AttributeError(name)
