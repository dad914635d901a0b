"""Cleanup: stop and delete what one run created, found by the run's tag only.

``from components.cleanup import cleanup`` gives the KFP component (kfp is
imported only then); ``plan`` and ``run`` are plain Python. CLI:
``python -m components.cleanup --run-id <id> [--dry-run]``.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "cleanup":
        from components.cleanup.component import cleanup

        return cleanup
    raise AttributeError(name)
