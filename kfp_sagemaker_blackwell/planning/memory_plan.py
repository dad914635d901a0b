"""The memory plan: what ``memory_estimate`` hands to ``sagemaker_training`` and pipelines.

A JSON document (a string output parameter) with one entry per precision::

    {"schema": "kfp-sagemaker/memory-plan/v1",
     "instance_type": "ml.p6-b200.48xlarge", "gpu": "B200", "gpu_memory_bytes": 192...,
     "world_size": 8, "seq_length": 2048, "model": {...ModelSpec fields...},
     "precisions": {
        "bf16":  {"precision": "bf16", "supported": true, "fits": true, "batch_size": 8,
                  "activation_checkpointing": false, "peak_bytes": 1.2e11,
                  "headroom_bytes": 5e10, "max_batch_size_without_checkpointing": 12,
                  "max_batch_size_with_checkpointing": 48, "checkpointing_required": false,
                  "reason": ""},
        "mxfp8": {"precision": "mxfp8", "supported": false, "fits": false, ...,
                  "reason": "precision 'mxfp8' is not supported on H200 ..."}}}

``batch_size`` and ``activation_checkpointing`` are what the plan recommends
running (the requested batch when it fits, with checkpointing switched on when
only that makes it fit). ``entry_for`` is how consumers read it.

Entries of precisions the GPU runs also carry the throughput model's prediction
(``kfp_sagemaker_blackwell.planning.throughput``) for that configuration, all
predicted, never measured (``throughput_source`` says by what)::

    "tokens_per_s_per_gpu": 11033.0, "step_seconds": 0.742, "mfu": 0.27,
    "cost_usd_per_billion_tokens": 367.1,   # null without an instance price
    "throughput_source": "predicted by the throughput model v1 ...",
    "throughput_bound": "compute",          # or "host (CPU launch)", "communication"
    "price_source": "shipped table of ...: verify"   # the instance price's source

(absent or null for plans written before the model, or for unsupported precisions).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from kfp_sagemaker_blackwell.common.documents import check_keys, read_document
from kfp_sagemaker_blackwell.common.errors import UserError

SCHEMA = "kfp-sagemaker/memory-plan/v1"
FIELD = "memory_plan"  # the parameter a plan is passed in (sagemaker_training's)
FIX = "pass the plan output of the memory_estimate component."
# A plan's keys are its fields: one this version does not know comes from another version
# of memory_estimate (or an edit), which a field-by-field reading would get wrong.
KEYS_FIX = ("pass the plan output of memory_estimate of this version (estimate again: "
            "python -m kfp_sagemaker_blackwell.components.memory_estimate ... --plan-out "
            "FILE), or remove the keys it does not accept.")


@dataclass(frozen=True)
class PrecisionPlan:
    precision: str
    supported: bool
    fits: bool
    batch_size: int
    activation_checkpointing: bool
    peak_bytes: int = 0
    headroom_bytes: int = 0
    max_batch_size_without_checkpointing: int = 0
    max_batch_size_with_checkpointing: int = 0
    checkpointing_required: bool = False
    reason: str = ""
    # What the peak is made of (bytes per part), and a note such as "estimated from the
    # format's byte sizes, not measured".
    peak_allocated_bytes: int = 0
    breakdown: dict[str, int] = field(default_factory=dict)
    note: str = ""
    # The throughput model's prediction for this configuration (see the module docstring).
    tokens_per_s_per_gpu: float | None = None
    step_seconds: float | None = None
    mfu: float | None = None
    cost_usd_per_billion_tokens: float | None = None
    throughput_source: str = ""
    throughput_bound: str = ""
    price_source: str = ""  # where cost_usd_per_billion_tokens' price comes from

    @property
    def runnable(self) -> bool:
        return self.supported and self.fits


@dataclass(frozen=True)
class MemoryPlan:
    instance_type: str
    gpu: str
    gpu_memory_bytes: int
    world_size: int
    seq_length: int
    model: dict[str, Any]
    precisions: dict[str, PrecisionPlan] = field(default_factory=dict)
    schema: str = SCHEMA
    # The fraction of GPU memory kept free, what the GPU runs, and the training settings
    # the estimate assumed.
    headroom_fraction: float = 0.0
    supported_precisions: list[str] = field(default_factory=list)  # what the GPU runs
    training: dict[str, Any] = field(default_factory=dict)  # backend, dtypes, FSDP version...

    def runnable_precisions(self) -> list[str]:
        """Precisions that are supported and predicted to fit, in plan order."""
        return [p for p, e in self.precisions.items() if e.runnable]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, *, field: str = FIELD) -> MemoryPlan:
        """The plan ``text`` holds; a UserError naming ``field`` when it is not one (not
        JSON, another document, a key this version does not know or one it lacks)."""
        data = read_document(text, schema=SCHEMA, field=field, fix=FIX)
        check_keys(data, _names(cls), field=field, what="the plan", fix=KEYS_FIX,
                   required=_required(cls))
        precisions = data.get("precisions", {})
        if not isinstance(precisions, dict):
            raise UserError(field, f"the plan's precisions is {type(precisions).__name__}, "
                            "not an object of precision -> entry.", KEYS_FIX)
        entries = {k: PrecisionPlan(**check_keys(
            v, _names(PrecisionPlan), field=field, what=f"the plan's precisions[{k!r}]",
            fix=KEYS_FIX, required=_required(PrecisionPlan))) for k, v in precisions.items()}
        return cls(**{k: v for k, v in data.items() if k != "precisions"},
                   precisions=entries)

    def entry_for(self, precision: str) -> PrecisionPlan:
        """The plan for one precision; a UserError when it cannot run."""
        try:
            entry = self.precisions[precision]
        except KeyError:
            raise UserError(
                "memory_plan",
                f"has no entry for precision {precision!r} (it covers "
                f"{', '.join(self.precisions) or 'nothing'}).",
                "estimate memory for the same precisions you train.",
            ) from None
        if not entry.supported:
            raise UserError("precision", entry.reason or f"{precision} is not supported on "
                            f"{self.gpu}.", "choose a precision the instance's GPU runs.")
        if not entry.fits:
            raise UserError(
                "batch_size",
                entry.reason or f"{precision} is predicted not to fit in {self.gpu} memory.",
                "use a smaller batch or sequence, activation checkpointing, or more GPUs.",
            )
        return entry


def _names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _required(cls: type) -> list[str]:
    """The fields without a default (a plan must carry them)."""
    return [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING]
