"""The memory plan: which precisions fit, with which batch and activation checkpointing.

``plan(request)`` turns a user's request (model, hardware, sequence length, batch
sizes, precisions, checkpointing mode, headroom) into the shared
:class:`kfp_sagemaker_blackwell.planning.memory_plan.MemoryPlan` plus the per-configuration
estimates behind it. Rules, in the user's words:

- ``batch_sizes`` are candidates; 0 means "the largest that fits" at full speed
  (``full_speed_batch``: near the memory limit the allocator gives memory back every step),
  capped at a sensible micro-batch (``batch_cap``: 65,536 tokens per GPU per micro-batch and
  4,194,304 tokens per optimizer step over all GPUs; the entry's ``reason`` says
  when the cap applied). The plan takes the largest candidate that fits without
  activation checkpointing; when none does and the mode is ``auto``, the largest
  that fits with it (checkpointing is then switched on and
  ``checkpointing_required`` is true).
- ``activation_checkpointing``: ``auto`` (the rule above), ``on`` or ``off`` (only
  that mode is considered).
- A configuration fits when its predicted peak (allocated tensors + CUDA
  context + allocator reserve) is at most ``(1 - headroom) x`` the GPU's memory.
- A precision the GPU cannot run is reported (``supported: false`` and the
  reason) rather than raised, so that one plan covers a whole sweep
  (``check_single_precision_supported`` makes it an error when it is the only one).
- Entries the GPU runs carry the throughput model's prediction for the chosen
  configuration (``throughput.predict``: tokens/s per GPU, step time, MFU, cost).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.catalog.precisions import PRECISIONS, Precision, parse_precision
from kfp_sagemaker_blackwell.catalog.spec import ModelSpec
from kfp_sagemaker_blackwell.common.errors import UserError, check_count, unknown_name
from kfp_sagemaker_blackwell.planning import estimator, throughput
from kfp_sagemaker_blackwell.planning.estimator import Estimate
from kfp_sagemaker_blackwell.planning.memory_plan import MemoryPlan, PrecisionPlan
from kfp_sagemaker_blackwell.planning.training_setup import TrainingSetup

CHECKPOINTING_MODES = ("auto", "on", "off")
DEFAULT_HEADROOM = 0.05
MAX_BATCH_SIZE = 1 << 16  # search bound for "largest that fits"
# The cap on what batch_size=0 ("the largest that fits") chooses: see batch_cap().
MAX_TOKENS_PER_MICRO_BATCH = 1 << 16  # 65,536 tokens per GPU per micro-batch
MAX_TOKENS_PER_STEP = 1 << 22  # 4,194,304 tokens per optimizer step over all GPUs
# The throughput model's keys in each plan entry (planning/memory_plan.py).
PLAN_THROUGHPUT_KEYS = ("tokens_per_s_per_gpu", "step_seconds", "mfu",
                        "cost_usd_per_billion_tokens", "throughput_source", "throughput_bound",
                        "price_source")
# Precisions only Blackwell runs: their numbers come from the formats' byte sizes
# and are not measured on the H200 grid (benchmarks/memory/README.md).
UNMEASURED_NOTE = "estimated from the format's byte sizes; not measured (no Blackwell GPU here)"


@dataclass(frozen=True)
class Hardware:
    gpu: hardware.GPU
    instance_type: str  # "" when only a GPU was named
    gpus_per_node: int
    world_size: int

    @classmethod
    def of(cls, it: hardware.InstanceType, instance_count: int) -> Hardware:
        """Every GPU of ``instance_count`` instances of a catalog type (already looked up:
        nothing is checked again; :func:`resolve_hardware` checks what a user gives)."""
        return cls(it.gpu_spec, it.name, it.gpus_per_node, it.gpus_per_node * instance_count)


_T = TypeVar("_T")


def _catalog_entry(field: str, lookup: Callable[[str], _T], name: str) -> _T:
    """``lookup(name)`` from the hardware catalog; an unknown name is a UserError on ``field``."""
    try:
        return lookup(name)
    except ValueError as exc:
        raise unknown_name(field, exc) from None


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
    check_count("instance_count", instance_count)
    gpu = (gpu or "").strip() or None
    instance_type = (instance_type or "").strip() or None
    if not gpu and not instance_type:
        raise UserError(
            "instance_type",
            "no hardware given.",
            f"name a SageMaker instance type ({', '.join(hardware.INSTANCE_TYPES)}) or a GPU "
            f"({', '.join(hardware.GPUS)}).",
        )
    it = _catalog_entry("instance_type", hardware.instance_type, instance_type) if instance_type else None
    spec = _catalog_entry("gpu", hardware.gpu, gpu) if gpu else None
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
    check_count("world_size", world_size)
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
    # Training settings (see common.training_setup.TrainingSetup); defaults: this project's trainer.
    training: dict[str, Any] = field(default_factory=dict)
    # USD per instance-hour overriding kfp_sagemaker_blackwell.planning.pricing's defaults
    # (for the predicted cost); None: the defaults.
    instance_hour_prices: dict[str, float] | None = None

    def validate(self) -> Request:
        if not self.precisions:
            raise UserError("precisions", "is empty.", f"list some of {', '.join(PRECISIONS)}.")
        try:  # parsed: the request returned carries Precisions (not checked again)
            parsed = tuple(parse_precision(p, "precisions") for p in self.precisions)
        except ValueError as exc:
            raise unknown_name("precisions", exc) from None
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
        unknown = set(self.training) - set(TrainingSetup.__dataclass_fields__)
        if unknown:
            raise UserError("training", f"unknown setting(s) {', '.join(sorted(unknown))}.", "")
        # Check one setup so that model / training errors surface here, named: the others
        # differ from it only in what was just checked (precision, batch, checkpointing).
        checked = replace(self, precisions=parsed)
        checked.setup(parsed[0], max(1, max(self.batch_sizes)), self.activation_checkpointing == "on").validate()
        return checked

    def setup(self, precision: str, batch_size: int, checkpointing: bool) -> TrainingSetup:
        """The training setup of one configuration of this request, checked by
        :meth:`validate` (call it first: ``plan`` does)."""
        return TrainingSetup(
            model=self.model,
            batch_size=batch_size,
            seq_length=self.seq_length,
            precision=precision,
            activation_checkpointing=checkpointing,
            world_size=self.hardware.world_size,
            **self.training,
        )

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
        return _fits(request, estimator.estimate_checked(s, request.hardware.gpu))

    return largest_fitting(fits)


def full_speed_batch(request: Request, precision: str, checkpointing: bool,
                     largest: int | None = None) -> int:
    """The largest micro-batch that fits *and* runs at full speed: below the memory limit, where
    the allocator's cache (``Estimate.full_speed_bytes``) still fits beside the step on the GPU.
    Past it the step runs, but under expandable segments the allocator unmaps and remaps pages
    every step: 8-29% slower per token at the measured boundaries (one H100,
    benchmarks/memory/README.md), for at most a few percent more tokens per step. The largest
    that fits when even batch 1 has no room for the cache (0 when nothing fits). ``largest``:
    ``largest_batch``'s answer when the caller has it."""
    if largest is None:
        largest = largest_batch(request, precision, checkpointing)

    def fast(b: int) -> bool:
        s = request.setup(precision, b, checkpointing)
        e = estimator.estimate_checked(s, request.hardware.gpu)
        return e.full_speed_bytes <= request.hardware.gpu.memory_bytes

    return min(largest, largest_fitting(fast)) or largest


def largest_fitting(fits: Callable[[int], bool]) -> int:
    """The largest micro-batch (up to ``MAX_BATCH_SIZE``) for which ``fits`` holds, peak
    memory growing with the batch (0 when even 1 does not fit)."""
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
    if request.training.get("cuda_graphs") and request.activation_checkpointing == "auto":
        return (False,)  # the graphs refuse checkpointing ("on" is refused by validate)
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
        supported_precisions=[p.name for p in hw.gpu.supported_precisions()],
        training=_training_settings(request),
    )
    return PlanResult(mp, estimates, request)


def check_single_precision_supported(result: PlanResult) -> None:
    """A precision the GPU cannot run is a row of a sweep's plan, but an error when it is
    the only precision asked for (nothing could be trained): UserError naming it."""
    if len(result.plan.precisions) != 1:
        return
    (entry,) = result.plan.precisions.values()
    if not entry.supported:
        runs = ", ".join(result.plan.supported_precisions)
        raise UserError("precision", entry.reason or f"{entry.precision} is not supported on "
                        f"{result.plan.gpu}.", f"choose one {result.plan.gpu} runs ({runs}), "
                        "or another GPU.")


def _training_settings(request: Request) -> dict[str, Any]:
    s = request.setup(request.precisions[0], 1, False)
    return {
        **s.optimizer_settings(),
        "activation_checkpointing_mode": request.activation_checkpointing,
        "batch_sizes_requested": list(request.batch_sizes),
        "batch_size_zero_cap": batch_cap(request)[0],
        "batch_size_zero_cap_reason": batch_cap(request)[1],
    }


def _gib(x: float) -> str:
    return f"{x / estimator.GiB:.1f} GiB"


@dataclass(frozen=True)
class _Limits:
    """What bounds the batch of one precision: the largest that fits in each mode and
    the cap on "the largest that fits" (batch 0)."""

    max_no: int
    max_ac: int
    cap: int
    cap_reason: str
    fast_no: int = 0  # the largest at full speed (``full_speed_batch``); 0: as max_no
    fast_ac: int = 0

    def largest(self, ac: bool) -> int:
        return self.max_ac if ac else self.max_no

    def fast(self, ac: bool) -> int:
        return (self.fast_ac if ac else self.fast_no) or self.largest(ac)

    def for_zero(self, ac: bool) -> int:
        """The batch that ``batch_size=0`` stands for: the largest that fits at full speed,
        capped."""
        return min(self.fast(ac), self.cap)


def batch_cap(request: Request) -> tuple[int, str]:
    """The largest micro-batch ``batch_size=0`` may choose, and why.

    Fitting in memory is not what makes a micro-batch sensible: past a few tens of
    thousands of tokens per GPU the GEMMs are saturated (the throughput model gains
    < 1% per doubling), while a huge optimizer step changes the training itself. So
    "the largest that fits" is capped at ``MAX_TOKENS_PER_MICRO_BATCH`` tokens per GPU
    and ``MAX_TOKENS_PER_STEP`` tokens per optimizer step over all GPUs (Llama 3's
    pre-training batch was 4M tokens; GPT-3's 3.2M), whichever is smaller, and at
    least 1."""
    s, w = request.seq_length, request.hardware.world_size
    accum = int(request.training.get("gradient_accumulation_steps", 1) or 1)
    by_micro = MAX_TOKENS_PER_MICRO_BATCH // s
    by_step = MAX_TOKENS_PER_STEP // (s * w * accum)
    cap = max(1, min(by_micro, by_step))
    if by_micro <= by_step:
        why = f"{MAX_TOKENS_PER_MICRO_BATCH:,} tokens per micro-batch per GPU"
    else:
        why = f"{MAX_TOKENS_PER_STEP:,} tokens per optimizer step over {w} GPU(s)"
    return cap, f"batch 0 (largest that fits) is capped at {cap} ({why} at sequence {s})"


def _support(request: Request, precision: str) -> tuple[bool, str]:
    hw = request.hardware
    if hw.gpu.supports(precision):
        return True, ""
    try:
        hardware.check_precision_for_gpu(precision, hw.gpu.name, where=hw.instance_type)
    except ValueError as exc:
        return False, str(exc)
    return False, f"{precision} is not supported on {hw.gpu.name}"


def _estimate_rows(request: Request, precision: str, limits: _Limits) -> list[Estimate]:
    """Every (batch, mode) the request asks about; batch 0 -> the capped largest fit;
    nothing fits: batch 1, so that the table says by how much."""
    rows: list[Estimate] = []
    for ac in _modes(request):
        for b in sorted(set(request.batch_sizes)):
            batch = (b or limits.for_zero(ac)) or 1
            rows.append(estimator.estimate_checked(request.setup(precision, batch, ac),
                                                   request.hardware.gpu))
    return _dedupe(rows)


def _choose(request: Request, rows: list[Estimate]) -> Estimate | None:
    """The largest fitting batch, no checkpointing first when both modes are allowed."""
    for ac in _modes(request):
        fitting = [e for e in rows if e.setup.activation_checkpointing == ac and _fits(request, e)]
        if fitting:
            return max(fitting, key=lambda e: e.setup.batch_size)
    return None


def _entry(request: Request, precision: str, e: Estimate, limits: _Limits, *,
           supported: bool, fits: bool, required: bool, reason: str) -> PrecisionPlan:
    gpu = request.hardware.gpu
    s = e.setup
    return PrecisionPlan(
        precision=precision,
        supported=supported,
        fits=fits,
        batch_size=s.batch_size,
        activation_checkpointing=s.activation_checkpointing,
        peak_bytes=e.peak_bytes,
        headroom_bytes=gpu.memory_bytes - e.peak_bytes,
        max_batch_size_without_checkpointing=limits.max_no,
        max_batch_size_with_checkpointing=limits.max_ac,
        checkpointing_required=required,
        reason=reason,
        peak_allocated_bytes=e.peak_allocated_bytes,
        breakdown=dict(e.breakdown),
        note=UNMEASURED_NOTE if precision in ("mxfp8", "nvfp4") else "",
        **(_throughput(request, s) if supported else {}),
    )


def _throughput(request: Request, setup: TrainingSetup) -> dict[str, Any]:
    p = throughput.predict_checked(setup, request.hardware.gpu,
                                   instance_type=request.hardware.instance_type,
                                   prices=request.instance_hour_prices)
    out = throughput.summary(p)
    return {k: out[k] for k in PLAN_THROUGHPUT_KEYS}


def _fitting_reason(request: Request, precision: str, chosen: Estimate,
                    limits: _Limits) -> tuple[bool, str]:
    """(checkpointing required, the reason text) for a batch that fits."""
    s = chosen.setup
    notes = []
    if 0 in request.batch_sizes and limits.largest(s.activation_checkpointing) > limits.cap \
            and s.batch_size == limits.cap:
        notes.append(limits.cap_reason + f"; {limits.largest(s.activation_checkpointing)} "
                     "would fit.")
    ac = s.activation_checkpointing
    if 0 in request.batch_sizes and s.batch_size == limits.fast(ac) < min(limits.largest(ac),
                                                                           limits.cap):
        notes.append(f"batch 0 took batch {s.batch_size}, the largest at full speed: up to "
                     f"{limits.largest(ac)} fits, but past {s.batch_size} the allocator's cache no "
                     "longer fits beside the step and it gives memory back every step (measured "
                     "8-29% slower per token near the limit).")
    required = False
    if s.activation_checkpointing:
        without = estimator.estimate_checked(request.setup(precision, s.batch_size, False),
                                             request.hardware.gpu)
        required = not _fits(request, without)
        if required and request.activation_checkpointing == "auto":
            notes.insert(0, f"batch {s.batch_size} fits only with activation checkpointing "
                         f"(without: {_gib(without.peak_bytes)} > {_gib(request.usable_bytes)} "
                         "usable); checkpointing switched on.")
    return required, " ".join(notes)


def _not_fitting_reason(request: Request, smallest: Estimate, limits: _Limits) -> str:
    gpu = request.hardware.gpu
    ac = smallest.setup.activation_checkpointing
    mode = "with" if ac else "without"
    if limits.largest(ac) > 0:
        hint = f"the largest batch that fits {mode} activation checkpointing is {limits.largest(ac)}"
    else:
        hint = (
            f"even batch 1 does not fit {mode} activation checkpointing: use more GPUs "
            "(world_size), a shorter sequence or a smaller model"
        )
    if not ac and limits.max_ac > 0:
        hint += f"; with activation checkpointing batch {limits.max_ac} fits"
    return (
        f"batch {smallest.setup.batch_size} {mode} activation checkpointing needs "
        f"{_gib(smallest.peak_bytes)} per GPU but {_gib(request.usable_bytes)} of {gpu.name}'s "
        f"{_gib(gpu.memory_bytes)} are usable at {request.headroom:.0%} headroom; {hint}."
    )


def _plan_precision(request: Request, precision: str) -> tuple[PrecisionPlan, list[Estimate]]:
    supported, unsupported_reason = _support(request, precision)
    cap, cap_reason = batch_cap(request)
    max_no, max_ac = largest_batch(request, precision, False), largest_batch(request, precision, True)
    limits = _Limits(max_no, max_ac, cap, cap_reason,
                     full_speed_batch(request, precision, False, max_no),
                     full_speed_batch(request, precision, True, max_ac))
    rows = _estimate_rows(request, precision, limits)
    chosen = _choose(request, rows)
    if chosen is not None:
        required, reason = _fitting_reason(request, precision, chosen, limits)
        entry = _entry(request, precision, chosen, limits, supported=supported, fits=True,
                       required=required, reason=unsupported_reason or reason)
        return entry, rows
    # Nothing fits: report the smallest request in the most frugal allowed mode.
    ac = _modes(request)[-1]
    smallest = min((e for e in rows if e.setup.activation_checkpointing == ac),
                   key=lambda e: e.setup.batch_size)
    reason = _not_fitting_reason(request, smallest, limits)
    if not supported:
        reason = unsupported_reason + " " + reason
    entry = _entry(request, precision, smallest, limits, supported=supported, fits=False,
                   required=limits.max_no == 0 and limits.max_ac > 0, reason=reason)
    return entry, rows


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
    that fits (capped at ``max_batch_size`` when > 0), and that largest batch. Ranked by
    the throughput model's predicted tokens/s per GPU, fastest first (each candidate
    carries ``predicted_tokens_per_s_per_gpu``), so that a sweep cut short has timed the
    likeliest winners."""
    if max_batch_size < 0:
        raise UserError("max_candidate_batch_size", f"{max_batch_size} is negative.",
                        "pass 0 (no cap) or a positive batch size.")
    out: list[dict[str, Any]] = []
    request, hw = result.request, result.request.hardware
    for p, e in result.plan.precisions.items():
        if not e.supported:
            continue
        for ac in _modes(request):
            top = e.max_batch_size_with_checkpointing if ac else e.max_batch_size_without_checkpointing
            if max_batch_size:
                top = min(top, max_batch_size)
            sizes = sorted({1 << k for k in range(top.bit_length()) if (1 << k) <= top} | ({top} if top else set()))
            for b in sizes:
                predicted = throughput.predict_checked(request.setup(p, b, ac), hw.gpu,
                                                       instance_type=hw.instance_type)
                out.append({"precision": p, "batch_size": b, "activation_checkpointing": ac,
                            "predicted_tokens_per_s_per_gpu":
                                round(predicted.tokens_per_s_per_gpu, 1)})
    out.sort(key=lambda c: -c["predicted_tokens_per_s_per_gpu"])
    return out


def model_from_parameters(params: Mapping[str, Any], **more: Any) -> ModelSpec:
    """The model of a component's parameters: ``model_preset`` and each ModelSpec field
    the component declares, 0 or "" (-1 for ``vocab_size``, where 0 means no embedding)
    keeping the preset's; ``more``: further fields (None keeps the preset's)."""
    dims: dict[str, Any] = {}
    for f in fields(ModelSpec):
        if f.name in params:
            value = params[f.name]
            keep = value == -1 if f.name == "vocab_size" else not value
            dims[f.name] = None if keep else value
    return model_from_values(params["model_preset"] or None, **{**dims, **more})


def model_from_values(preset: str | None = None, **dims: Any) -> ModelSpec:
    """A validated ModelSpec from a preset and explicit dimensions (None keeps the
    preset's); the trainer's ValueError becomes a UserError naming the field."""
    from kfp_sagemaker_blackwell.catalog.spec import spec_from_values

    try:
        return spec_from_values(preset or None, **dims)
    except ValueError as exc:
        text = str(exc)
        name = text.split("=", 1)[0].split(" ", 1)[0].strip() or "model"
        if name.startswith("unknown"):
            name = "model"
        if " choose one of " in text:  # an unknown preset: its "did you mean" and the list
            raise unknown_name(name, exc) from None
        raise UserError(name, text.removeprefix(f"{name}="), "") from None


def parse_precisions(values: Any) -> tuple[str, ...]:
    """'bf16,fp8' or ['bf16', 'fp8'] -> ('bf16', 'fp8'); a parsed Precision stays one."""
    if isinstance(values, str):
        values = [values]
    out: list[str] = []
    for v in values:
        if isinstance(v, Precision):
            out.append(v)
            continue
        out += [p.strip().lower() for p in str(v).split(",") if p.strip()]
    return tuple(out)


def parse_checkpointing(value: Any) -> Any:
    """True/False/None or 'on'/'off'/'auto' (also 'true', 'false', 'block', 'none') as
    'on', 'off' or 'auto'; anything else as given, for :meth:`Request.validate`, the one
    check of the mode, to refuse naming the parameter."""
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "on" if value else "off"
    v = str(value).strip().lower()
    aliases = {"true": "on", "1": "on", "yes": "on", "block": "on", "false": "off", "0": "off",
               "no": "off", "none": "off", "": "auto"}
    v = aliases.get(v, v)
    return v if v in CHECKPOINTING_MODES else value
