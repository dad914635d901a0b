"""What "final loss" means, everywhere in this library (parse_logs and compare_convergence).

The last logged loss is one noisy sample; the final loss is the mean training loss
over the final window: the last ``FINAL_WINDOW`` (10%) of the logged steps, at
least one step. parse_logs reports it per run (``final_loss``, next to
``last_loss``, the last step's value); compare_convergence computes it on the
steps a run shares with the baseline run of the same seed, and its tolerance
applies to the difference of the two final losses only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

FINAL_WINDOW = 0.1
DEFINITION = ("final loss = mean training loss over the final window: the last 10% of the "
              "logged steps (at least one)")


def window_size(n: int, fraction: float = FINAL_WINDOW) -> int:
    """How many of ``n`` points the final window holds."""
    return max(1, math.ceil(fraction * n)) if n else 0


def final_loss(losses: Sequence[float], fraction: float = FINAL_WINDOW) -> float:
    """The mean of the last ``fraction`` of ``losses`` (NaN for none)."""
    values = [float(v) for v in losses]
    w = window_size(len(values), fraction)
    return sum(values[-w:]) / w if w else math.nan
