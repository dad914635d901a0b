"""A component's parameter values as a cluster gives them, whoever ran the pipeline.

KFP carries parameters as protobuf ``Value``s, whose numbers are doubles: an integer
inside a list or dict parameter comes back a float (kfp.local 2.17 hands memory_estimate's
``[{"batch_size": 4, ...}]`` to the next step as ``[{"batch_size": 4.0, ...}]``; a top-level
``int`` parameter is cast back by its declared type, a number inside a container is not).
``integral`` is applied where such a value enters this package's code (the component's
boundary: ``TrainingJobConfig`` as it is made, ``prerank``, ``rank_throughput.load``), so the
same pipeline computes, names and reports the same numbers locally and on a cluster.

The other kfp.local quirk, a loop body handed its loop item for an input that is the
loop's own list (``budget_items``), cannot be undone here (the list is gone): it is fixed
in kfp.local itself (``pipelines/_kfp_local_fixes.py``), and ``budget_items`` that is not
a list is refused (``planning/pricing.py``'s ``Budget``).
"""

from __future__ import annotations

from typing import Any


def integral(value: Any) -> Any:
    """``value`` with every float inside its lists and dicts that is a whole number (4.0)
    turned back into an int (4); a top-level value, strings, bools and other floats as given."""
    if isinstance(value, dict):
        return {k: _item(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_item(v) for v in value)
    return value


def _item(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return integral(value)
