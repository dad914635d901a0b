"""Cleanup: stop and delete what one run created, found by the run's tag only.

``from kfp_sagemaker_blackwell.components.cleanup import cleanup`` gives the KFP component (kfp is
imported only then); ``plan`` and ``run`` are plain Python. CLI:
``python -m kfp_sagemaker_blackwell.components.cleanup --run-id <id> [--dry-run]``.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "cleanup":
        from kfp_sagemaker_blackwell.components.cleanup.component import cleanup

        return cleanup
    raise AttributeError(name)
