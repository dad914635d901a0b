"""The memory plan: which precisions fit, with which batch and activation checkpointing.

``plan(request)`` turns a user's request (model, hardware, sequence length, batch
sizes, precisions, checkpointing mode, headroom) into the shared
:class:`components.common.memory_plan.MemoryPlan` plus the per-configuration
estimates behind it. Rules, in the user's words:

- ``batch_sizes`` are candidates; 0 means "the largest that fits". The plan takes
  the largest candidate that fits without activation checkpointing; when none
  does and the mode is ``auto``, the largest that fits with it (checkpointing is
  then switched on and ``checkpointing_required`` is true).
- ``activation_checkpointing``: ``auto`` (the rule above), ``on`` or ``off`` (only
  that mode is considered).
- A configuration fits when its predicted peak (allocated tensors + CUDA
  context + allocator reserve) is at most ``(1 - headroom) x`` the GPU's memory.
- A precision the GPU cannot run is reported (``supported: false`` and the
  reason) rather than raised, so that one plan covers a whole sweep.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from components.common.errors import UserError
from components.common.memory_plan import MemoryPlan, PrecisionPlan
from components.memory_estimate import estimator
from components.memory_estimate.estimator import Estimate, TrainingSetup
from trainer import hardware
from trainer.spec import ModelSpec

CHECKPOINTING_MODES = ("auto", "on", "off")
DEFAULT_HEADROOM = 0.05
MAX_BATCH_SIZE = 1 << 16  # search bound for "largest that fits"
# Precisions only Blackwell runs: their numbers come from the formats' byte sizes
# and are not measured on the H200 grid (benchmarks/memory/README.md).
UNMEASURED_NOTE = "estimated from the format's byte sizes; not measured (no Blackwell GPU here)"


@dataclass(frozen=True)
class Hardware:
    gpu: hardware.GPU
    instance_type: str  # "" when only a GPU was named
    gpus_per_node: int
    world_size: int


def resolve_hardware(
    *,
    gpu: str | None = None,
    instance_type: str | None = None,
    world_size: int | None = None,
    instance_count: int = 1,
) -> Hardware:
    """GPU spec, instance type and world size, checked (UserError names the field).

    ``world_size`` None or 0: all GPUs of ``instance_count`` instances (1 with a GPU name).
    """
    if isinstance(instance_count, bool) or not isinstance(instance_count, int) or instance_count < 1:
        raise UserError("instance_count", f"={instance_count!r} must be a positive integer.", "")
    gpu = (gpu or "").strip() or None
    instance_type = (instance_type or "").strip() or None
    if not gpu and not instance_type:
        raise UserError(
            "instance_type",
            "no hardware given.",
            f"name a SageMaker instance type ({', '.join(hardware.INSTANCE_TYPES)}) or a GPU "
            f"({', '.join(hardware.GPUS)}).",
        )
    it = None
    if instance_type:
        try:
            it = hardware.instance_type(instance_type)
        except ValueError as exc:
            raise UserError("instance_type", str(exc).split(": ", 1)[-1], "") from None
    spec = None
    if gpu:
        try:
            spec = hardware.gpu(gpu)
        except ValueError as exc:
            raise UserError("gpu", str(exc).split(": ", 1)[-1], "") from None
    if it and spec and spec.name != it.gpu:
        raise UserError(
            "gpu",
            f"={spec.name} but instance_type {it.name} has {it.gpu} GPUs.",
            "give one of the two, or make them agree.",
        )
    per_node = it.gpus_per_node if it else 0
    if world_size is None or world_size == 0:
        world_size = (per_node or 1) * instance_count
    elif instance_count > 1 and per_node and world_size != per_node * instance_count:
        raise UserError(
            "world_size",
            f"={world_size} but {instance_count} x {it.name} have "  # type: ignore[union-attr]
            f"{per_node * instance_count} GPUs.",
            "leave world_size at 0 (all GPUs of the instances) or make them agree.",
        )
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise UserError("world_size", f"={world_size!r} must be a positive integer.", "")
    if it and not (world_size % per_node == 0 or per_node % world_size == 0):
        valid = [d for d in range(1, per_node + 1) if per_node % d == 0]
        raise UserError(
            "world_size",
            f"={world_size} neither divides nor is a multiple of the {per_node} GPUs of "
            f"{it.name}.",
            f"use one of {', '.join(map(str, valid))} (part of one node) or a multiple of "
            f"{per_node} (whole nodes, GPUs x nodes).",
        )
    gpu_spec = spec or hardware.GPUS[it.gpu]  # type: ignore[union-attr]
    return Hardware(gpu_spec, it.name if it else "", per_node or world_size, world_size)


@dataclass(frozen=True)
class Request:
    """What a user asks: the model, the hardware and the training settings."""

    model: ModelSpec
    seq_length: int
    hardware: Hardware
    precisions: tuple[str, ...] = ("bf16",)
    batch_sizes: tuple[int, ...] = (0,)
    activation_checkpointing: str = "auto"
    headroom: float = DEFAULT_HEADROOM
    # Training settings (see estimator.TrainingSetup); defaults: this project's trainer.
    training: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> Request:
        if not self.precisions:
            raise UserError("precisions", "is empty.", f"list some of {', '.join(hardware.PRECISIONS)}.")
        for p in self.precisions:
            if p not in hardware.PRECISIONS:
                raise UserError(
                    "precisions", f"{p!r} is not a precision.",
                    f"use some of {', '.join(hardware.PRECISIONS)}.",
                )
        if len(set(self.precisions)) != len(self.precisions):
            raise UserError("precisions", f"{list(self.precisions)} lists a precision twice.", "")
        if not self.batch_sizes:
            raise UserError("batch_size", "is empty.", "give a batch size (0 = largest that fits).")
        for b in self.batch_sizes:
            if isinstance(b, bool) or not isinstance(b, int) or b < 0:
                raise UserError(
                    "batch_size", f"={b!r} must be a positive integer, or 0 for the largest "
                    "that fits.", "",
                )
        if self.activation_checkpointing not in CHECKPOINTING_MODES:
            raise UserError(
                "activation_checkpointing",
                f"={self.activation_checkpointing!r} is not one of "
                f"{', '.join(CHECKPOINTING_MODES)}.",
                "",
            )
        if not (0.0 <= self.headroom < 1.0):
            raise UserError(
                "headroom", f"={self.headroom!r} must be a fraction in [0, 1), e.g. 0.05.", ""
            )
        # Build one setup so that model / training errors surface here, named.
        self.setup(self.precisions[0], max(1, max(self.batch_sizes)), False)
        return self

    def setup(self, precision: str, batch_size: int, checkpointing: bool) -> TrainingSetup:
        unknown = set(self.training) - set(TrainingSetup.__dataclass_fields__)
        if unknown:
            raise UserError("training", f"unknown setting(s) {', '.join(sorted(unknown))}.", "")
        return TrainingSetup(
            model=self.model,
            batch_size=batch_size,
            seq_length=self.seq_length,
            precision=precision,
            activation_checkpointing=checkpointing,
            world_size=self.hardware.world_size,
            **self.training,
        ).validate()

    @property
    def usable_bytes(self) -> int:
        return int(self.hardware.gpu.memory_bytes * (1.0 - self.headroom))


@dataclass(frozen=True)
class PlanResult:
    plan: MemoryPlan
    # Estimates behind the plan: every requested batch size in each allowed
    # checkpointing mode, per precision (batch 0 replaced by the largest that fits).
    estimates: list[Estimate]
    request: Request


def _fits(request: Request, e: Estimate) -> bool:
    return e.peak_bytes <= request.usable_bytes


def largest_batch(request: Request, precision: str, checkpointing: bool) -> int:
    """The largest micro-batch that fits (0 when even 1 does not)."""

    def fits(b: int) -> bool:
        s = request.setup(precision, b, checkpointing)
        return _fits(request, estimator.estimate(s, request.hardware.gpu))

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= MAX_BATCH_SIZE and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, MAX_BATCH_SIZE + 1)
    while hi - lo > 1:  # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _modes(request: Request) -> tuple[bool, ...]:
    return {"auto": (False, True), "on": (True,), "off": (False,)}[request.activation_checkpointing]


def plan(request: Request) -> PlanResult:
    request = request.validate()
    hw = request.hardware
    entries: dict[str, PrecisionPlan] = {}
    estimates: list[Estimate] = []
    for p in request.precisions:
        entry, rows = _plan_precision(request, p)
        entries[p] = entry
        estimates.extend(rows)
    mp = MemoryPlan(
        instance_type=hw.instance_type,
        gpu=hw.gpu.name,
        gpu_memory_bytes=hw.gpu.memory_bytes,
        world_size=hw.world_size,
        seq_length=request.seq_length,
        model=request.model.to_dict(),
        precisions=entries,
        headroom_fraction=request.headroom,
        supported_precisions=hw.gpu.supported_precisions(),
        training=_training_settings(request),
    )
    return PlanResult(mp, estimates, request)


def _training_settings(request: Request) -> dict[str, Any]:
    s = request.setup(request.precisions[0], 1, False)
    return {
        **s.optimizer_settings(),
        "activation_checkpointing_mode": request.activation_checkpointing,
        "batch_sizes_requested": list(request.batch_sizes),
    }


def _gib(x: float) -> str:
    return f"{x / estimator.GiB:.1f} GiB"


def _plan_precision(request: Request, precision: str) -> tuple[PrecisionPlan, list[Estimate]]:
    hw = request.hardware
    gpu = hw.gpu
    supported = gpu.supports(precision)
    unsupported_reason = ""
    if not supported:
        try:
            hardware.check_precision_for_gpu(precision, gpu.name, where=hw.instance_type)
        except ValueError as exc:
            unsupported_reason = str(exc)
    modes = _modes(request)
    max_no = largest_batch(request, precision, False)
    max_ac = largest_batch(request, precision, True)
    max_for = {False: max_no, True: max_ac}

    # Every (batch, mode) the request asks about.
    rows: list[Estimate] = []
    for ac in modes:
        for b in sorted(set(request.batch_sizes)):
            batch = b or max_for[ac]
            if batch == 0:  # nothing fits: show batch 1 so the table says by how much
                batch = 1
            rows.append(estimator.estimate(request.setup(precision, batch, ac), gpu))
    rows = _dedupe(rows)

    def best(ac: bool) -> Estimate | None:
        fitting = [
            e for e in rows if e.setup.activation_checkpointing == ac and _fits(request, e)
        ]
        return max(fitting, key=lambda e: e.setup.batch_size) if fitting else None

    chosen = None
    for ac in modes:  # no checkpointing first when both are allowed
        chosen = best(ac)
        if chosen:
            break
    note = UNMEASURED_NOTE if precision in ("mxfp8", "nvfp4") else ""
    usable = request.usable_bytes
    if chosen is not None:
        s = chosen.setup
        reason = ""
        required = False
        if s.activation_checkpointing:
            without = estimator.estimate(request.setup(precision, s.batch_size, False), gpu)
            required = not _fits(request, without)
            if required and request.activation_checkpointing == "auto":
                reason = (
                    f"batch {s.batch_size} fits only with activation checkpointing (without: "
                    f"{_gib(without.peak_bytes)} > {_gib(usable)} usable); checkpointing "
                    "switched on."
                )
        if not supported:
            reason = unsupported_reason
        return (
            PrecisionPlan(
                precision=precision,
                supported=supported,
                fits=True,
                batch_size=s.batch_size,
                activation_checkpointing=s.activation_checkpointing,
                peak_bytes=chosen.peak_bytes,
                headroom_bytes=gpu.memory_bytes - chosen.peak_bytes,
                max_batch_size_without_checkpointing=max_no,
                max_batch_size_with_checkpointing=max_ac,
                checkpointing_required=required,
                reason=reason,
                peak_allocated_bytes=chosen.peak_allocated_bytes,
                breakdown=dict(chosen.breakdown),
                note=note,
            ),
            rows,
        )
    # Nothing fits: report the smallest request in the most frugal allowed mode.
    ac = modes[-1]
    smallest = min(
        (e for e in rows if e.setup.activation_checkpointing == ac),
        key=lambda e: e.setup.batch_size,
    )
    b = smallest.setup.batch_size
    mode = "with" if ac else "without"
    if max_for[ac] > 0:
        hint = f"the largest batch that fits {mode} activation checkpointing is {max_for[ac]}"
    else:
        hint = (
            f"even batch 1 does not fit {mode} activation checkpointing: use more GPUs "
            "(world_size), a shorter sequence or a smaller model"
        )
    if not ac and max_ac > 0:
        hint += f"; with activation checkpointing batch {max_ac} fits"
    reason = (
        f"batch {b} {mode} activation checkpointing needs {_gib(smallest.peak_bytes)} per GPU "
        f"but {_gib(usable)} of {gpu.name}'s {_gib(gpu.memory_bytes)} are usable at "
        f"{request.headroom:.0%} headroom; {hint}."
    )
    if not supported:
        reason = unsupported_reason + " " + reason
    return (
        PrecisionPlan(
            precision=precision,
            supported=supported,
            fits=False,
            batch_size=b,
            activation_checkpointing=ac,
            peak_bytes=smallest.peak_bytes,
            headroom_bytes=gpu.memory_bytes - smallest.peak_bytes,
            max_batch_size_without_checkpointing=max_no,
            max_batch_size_with_checkpointing=max_ac,
            checkpointing_required=max_no == 0 and max_ac > 0,
            reason=reason,
            peak_allocated_bytes=smallest.peak_allocated_bytes,
            breakdown=dict(smallest.breakdown),
            note=note,
        ),
        rows,
    )


def _dedupe(rows: list[Estimate]) -> list[Estimate]:
    seen: set[tuple[int, bool]] = set()
    out = []
    for e in rows:
        key = (e.setup.batch_size, e.setup.activation_checkpointing)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def batch_candidates(result: PlanResult, max_batch_size: int = 0) -> list[dict[str, Any]]:
    """Configurations worth timing (the article's "tune batch size first"): per runnable
    precision and allowed checkpointing mode, powers of two up to the largest batch
    that fits (capped at ``max_batch_size`` when > 0), and that largest batch."""
    if max_batch_size < 0:
        raise UserError("max_candidate_batch_size", f"{max_batch_size} is negative.",
                        "pass 0 (no cap) or a positive batch size.")
    out: list[dict[str, Any]] = []
    modes = _modes(result.request)
    for p, e in result.plan.precisions.items():
        if not e.supported:
            continue
        for ac in modes:
            top = e.max_batch_size_with_checkpointing if ac else e.max_batch_size_without_checkpointing
            if max_batch_size:
                top = min(top, max_batch_size)
            sizes = sorted({1 << k for k in range(top.bit_length()) if (1 << k) <= top} | ({top} if top else set()))
            for b in sizes:
                out.append({"precision": p, "batch_size": b, "activation_checkpointing": ac})
    return out


def model_from_values(preset: str | None = None, **dims: Any) -> ModelSpec:
    """A validated ModelSpec from a preset and explicit dimensions (None keeps the
    preset's); the trainer's ValueError becomes a UserError naming the field."""
    from trainer.spec import spec_from_values

    try:
        return spec_from_values(preset or None, **dims)
    except ValueError as exc:
        text = str(exc)
        name = text.split("=", 1)[0].split(" ", 1)[0].strip() or "model"
        if name.startswith("unknown"):
            name = "model"
        raise UserError(name, text, "") from None


def parse_precisions(values: Any) -> tuple[str, ...]:
    """'bf16,fp8' or ['bf16', 'fp8'] -> ('bf16', 'fp8')."""
    if isinstance(values, str):
        values = [values]
    out: list[str] = []
    for v in values:
        out += [p.strip().lower() for p in str(v).split(",") if p.strip()]
    return tuple(out)


def parse_checkpointing(value: Any) -> str:
    """True/False/None or 'on'/'off'/'auto' (also 'true', 'false', 'block', 'none')."""
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "on" if value else "off"
    v = str(value).strip().lower()
    aliases = {"true": "on", "1": "on", "yes": "on", "block": "on", "false": "off", "0": "off",
               "no": "off", "none": "off", "": "auto"}
    v = aliases.get(v, v)
    if v not in CHECKPOINTING_MODES:
        raise UserError(
            "activation_checkpointing", f"={value!r} is not one of auto, on, off.", ""
        )
    return v
