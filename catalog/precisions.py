"""The precisions the trainer runs, what each needs of the GPU, and how much numerical
risk each carries.

One place for the names (the trainer's ``--precision`` choices, the launcher's and the
planner's checks, the log parser's columns), the TransformerEngine recipe of each
low-precision format, the minimum CUDA compute capability each needs, and one risk
order for the recommendation (compare_convergence) and the planner (plan_training).
"""

from __future__ import annotations

from kfp_sagemaker_blackwell.catalog.bounds import UnknownName

# Precisions the trainer understands, in the order a sweep usually lists them.
PRECISIONS = ("fp32", "bf16", "fp16", "fp8", "fp8-current", "fp8-block", "mxfp8", "nvfp4")

# TransformerEngine recipe class per low-precision format (transformer_engine.common.recipe).
TE_RECIPES = {
    "fp8": "DelayedScaling",
    "fp8-current": "Float8CurrentScaling",
    "fp8-block": "Float8BlockScaling",
    "mxfp8": "MXFP8BlockScaling",
    "nvfp4": "NVFP4BlockScaling",
}
# The quantised formats (GEMM operands below 16 bits); the others are high precision.
LOW_PRECISIONS = tuple(TE_RECIPES)
HIGH_PRECISIONS = tuple(p for p in PRECISIONS if p not in TE_RECIPES)
# The dtype of what a precision does not quantise: the gathered weights, the activations,
# the GEMM outputs and the blocks kept in high precision (FSDP's MixedPrecision param
# dtype). fp32 and fp16 keep their own; bf16 and every low precision use bf16.
COMPUTE_DTYPE: dict[str, str] = {p: p if p in ("fp32", "fp16") else "bf16" for p in PRECISIONS}

# Minimum CUDA compute capability per precision on the TE backend, and the
# capabilities where a family is known not to run it: MXFP8 needs the datacenter
# Blackwell family (sm_100/sm_103), not consumer Blackwell (sm_120).
MIN_CC: dict[str, tuple[int, int]] = {
    "fp32": (0, 0),
    "bf16": (8, 0),
    "fp16": (7, 0),
    "fp8": (8, 9),
    "fp8-current": (8, 9),
    "fp8-block": (9, 0),
    "mxfp8": (10, 0),
    "nvfp4": (10, 0),
}
EXCLUDED_CC: dict[str, tuple[tuple[int, int], ...]] = {"mxfp8": ((12, 0), (12, 1))}

# Lowest first, the article's order: start with FP8; block formats need newer kernels;
# NVFP4 needs real engineering (validated recipes, Megatron Core).
RISK: dict[str, int] = {"fp32": 0, "bf16": 0, "fp16": 1, "fp8": 1, "fp8-current": 2,
                        "fp8-block": 2, "mxfp8": 3, "nvfp4": 4}
# What each level means to a user (the planner's risk column).
RISK_WORDS = {0: "baseline", 1: "low", 2: "medium", 3: "higher", 4: "high"}


def check_precision_name(precision: str) -> str:
    if precision not in PRECISIONS:
        raise UnknownName("precision", precision, PRECISIONS)
    return precision


def precision_supported_on_cc(precision: str, cc: tuple[int, int]) -> bool:
    check_precision_name(precision)
    if cc in EXCLUDED_CC.get(precision, ()):
        return False
    return cc >= MIN_CC[precision]


def risk(precision: str) -> int:
    """The precision's level in ``RISK`` (an unknown one is riskier than any known)."""
    return RISK.get(precision, max(RISK.values()) + 1)
