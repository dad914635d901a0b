"""How much numerical risk a precision carries: one order for the recommendation
(compare_convergence) and the planner (plan_training).

Lowest first, the article's order: start with FP8; block formats need newer kernels;
NVFP4 needs real engineering (validated recipes, Megatron Core).
"""

from __future__ import annotations

RISK: dict[str, int] = {"fp32": 0, "bf16": 0, "fp16": 1, "fp8": 1, "fp8-current": 2,
                        "fp8-block": 2, "mxfp8": 3, "nvfp4": 4}
# What each level means to a user (the planner's risk column).
RISK_WORDS = {0: "baseline", 1: "low", 2: "medium", 3: "higher", 4: "high"}


def risk(precision: str) -> int:
    """The precision's level in ``RISK`` (an unknown one is riskier than any known)."""
    return RISK.get(precision, max(RISK.values()) + 1)
