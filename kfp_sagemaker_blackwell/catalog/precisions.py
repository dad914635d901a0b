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


class Precision(str):
    """A parsed precision: its name (it is the ``str``, so it goes wherever a name goes:
    hyperparameters, JSON, dict keys) with its facts. Only :func:`parse_precision` makes
    one, and whoever holds one trusts it: ``parse_precision(p)`` of a ``Precision``
    returns it without checking the name again.

    ``recipe``: the TransformerEngine recipe class ("" for a high precision); ``low``:
    quantised GEMM operands; ``compute_dtype``: what is not quantised; ``min_cc`` and
    ``excluded_cc``: the CUDA compute capabilities it needs; ``risk``: its level in RISK.
    """

    recipe: str
    low: bool
    compute_dtype: str
    min_cc: tuple[int, int]
    excluded_cc: tuple[tuple[int, int], ...]
    risk: int

    def __new__(cls, name: str) -> Precision:
        self = super().__new__(cls, name)
        for key, value in (("recipe", TE_RECIPES.get(name, "")), ("low", name in TE_RECIPES),
                           ("compute_dtype", COMPUTE_DTYPE[name]), ("min_cc", MIN_CC[name]),
                           ("excluded_cc", EXCLUDED_CC.get(name, ())), ("risk", RISK[name])):
            object.__setattr__(self, key, value)
        return self

    @property
    def name(self) -> str:
        return str.__str__(self)

    def __setattr__(self, key: str, value: object) -> None:
        raise AttributeError(f"Precision is frozen: cannot set {key}")

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return _known, (self.name,)

    def __repr__(self) -> str:
        return repr(self.name)

    def supported_on(self, cc: tuple[int, int]) -> bool:
        """Whether a GPU of this CUDA compute capability runs this precision."""
        return cc not in self.excluded_cc and cc >= self.min_cc


# Every precision, parsed once at import: what parse_precision hands out.
_BY_NAME: dict[str, Precision] = {p: Precision(p) for p in PRECISIONS}


def _known(name: str) -> Precision:
    return _BY_NAME[name]


def parse_precision(name: object, field: str = "precision") -> Precision:
    """The one check of a precision name, at the boundary where a value comes in.

    ``name``: a name from a user (a parameter, a flag, a document) or a Precision already
    parsed (returned as it is: not checked again). Raises UnknownName naming ``field``,
    with a "did you mean" for a misspelling.
    """
    if isinstance(name, Precision):
        return name
    found = _BY_NAME.get(name) if isinstance(name, str) else None
    if found is None:
        raise UnknownName(field, name, PRECISIONS)  # type: ignore[arg-type]
    return found


ALL_PRECISIONS: tuple[Precision, ...] = tuple(_BY_NAME.values())


def as_precision(name: str) -> Precision | str:
    """The Precision of a name a check has already let in (the trainer's ``--precision``
    flag, whose argparse ``choices`` check it next; a series document's schema), or the
    name unchanged (for that check to refuse, or for a report to call unknown). Converts,
    checks nothing: whoever needs the name checked calls :func:`parse_precision`."""
    return _BY_NAME.get(name, name)


def risk(precision: str) -> int:
    """The precision's level in ``RISK`` (an unknown one is riskier than any known)."""
    return RISK.get(precision, max(RISK.values()) + 1)
