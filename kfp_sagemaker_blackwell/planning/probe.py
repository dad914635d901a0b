"""Probe, then extrapolate: a short measured run corrects the prediction for the full run.

A ``Probe`` is a measured speed (and optionally peak memory) of one configuration
(precision, micro-batch, activation checkpointing) on ``world_size`` GPUs of one GPU
type: a short probe job (about ten steps) or a full run. :func:`correct` compares it
with the throughput model's prediction for that same configuration at the probe's
world size and applies the measured / predicted ratio to the prediction for the full
run (its world size, its network): the model extrapolates, the probe calibrates.
:func:`fit_at_probe` asks the memory estimate whether the probe's own configuration
fits where it ran: one that cannot, yet says it ran, contradicts the memory model and
is reported as such. One implementation for every component that takes probes (plan_training's search,
memory_estimate's ``probe`` parameter, batch tuning's pre-ranking).

A probe corrects the prediction for its own configuration; with
``same_configuration=False`` also for another micro-batch or checkpointing of the same
precision on the same GPU type (the ratio is then taken at the probe's configuration:
how far the models are off for this model, precision and GPU, carried to the
neighbours a batch-size sweep compares). Peak memory is corrected the same way
(:func:`correct_peak`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.catalog.precisions import parse_precision
from kfp_sagemaker_blackwell.common.documents import check_keys
from kfp_sagemaker_blackwell.common.errors import UserError, unknown_name
from kfp_sagemaker_blackwell.planning import estimator, planner, throughput
from kfp_sagemaker_blackwell.planning.training_setup import TrainingSetup

KINDS = ("probed", "measured")
REQUIRED = ("precision", "batch_size", "activation_checkpointing", "tokens_per_s_per_gpu")
FIX = ("give each probe as a JSON object of precision, batch_size, activation_checkpointing, "
       "tokens_per_s_per_gpu and a known instance_type or gpu (optional: world_size, "
       "peak_memory_bytes, source, kind).")


@dataclass(frozen=True)
class Probe:
    """A measured speed of one configuration: a short probe job or a full run, on
    ``world_size`` GPUs of ``instance_type`` (or of ``gpu``, when only that is known)."""

    precision: str
    batch_size: int
    activation_checkpointing: bool
    tokens_per_s_per_gpu: float
    instance_type: str = ""
    gpu: str = ""  # a GPU name (H200, "NVIDIA H200"); default: the instance type's
    world_size: int = 1  # GPUs the probe ran on
    # Peak reserved by PyTorch's caching allocator (torch.cuda.max_memory_reserved, the
    # trainer's peak_reserved, parse_logs' peak_reserved_gib): no CUDA context. 0: not measured
    peak_memory_bytes: int = 0
    source: str = ""  # e.g. the probe's training job name
    kind: str = "probed"  # probed (a short job) or measured (a full run)

    @classmethod
    def from_dict(cls, data: Any, *, field: str = "probe") -> Probe:
        """A probe from its JSON object; a UserError naming ``field`` (the parameter
        that carried it) when it is not one."""
        check_keys(data, cls.__dataclass_fields__, field=field, what="a probe",
                   fix=FIX, required=REQUIRED)
        try:  # the one check of the name: a "did you mean" and the precisions known
            data = {**data, "precision": parse_precision(data["precision"],
                                                         f"{field}.precision")}
        except ValueError as exc:
            raise unknown_name(f"{field}.precision", exc) from None
        try:
            probe = cls(**data)
            ok = probe.tokens_per_s_per_gpu > 0 and probe.world_size >= 1 and \
                probe.batch_size >= 1 and probe.kind in KINDS and probe.peak_memory_bytes >= 0
            probe.gpu_name()
        except (TypeError, ValueError, KeyError) as exc:
            raise UserError(field, f"{data!r}: {exc}.", FIX) from None
        if not ok:
            raise UserError(field, f"{data!r} is not a measurement.", "give tokens_per_s_"
                            "per_gpu > 0, batch_size and world_size >= 1, peak_memory_bytes "
                            ">= 0, kind probed or measured.")
        return probe

    @classmethod
    def from_json(cls, text: str, *, field: str = "probe") -> Probe:
        """A probe from a JSON object's text (a UserError naming ``field`` otherwise)."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(field, f"{text!r} is not JSON ({exc.msg} at character {exc.pos}).",
                            'give one JSON object, e.g. {"precision": "fp8", "batch_size": 2, '
                            '"activation_checkpointing": false, "tokens_per_s_per_gpu": 9000, '
                            '"gpu": "H200"}.') from None
        return cls.from_dict(data, field=field)

    def gpu_name(self) -> str:
        """The GPU it ran on (a KeyError/ValueError when neither field names one)."""
        if self.gpu:
            return hardware.gpu(self.gpu).name
        return hardware.INSTANCE_TYPES[self.instance_type].gpu

    def matches(self, precision: str, batch_size: int, checkpointing: bool, gpu: str) -> bool:
        """Whether it probed this configuration on this GPU (by name)."""
        return (self.precision, self.batch_size, self.activation_checkpointing,
                self.gpu_name()) == (precision, batch_size, checkpointing, gpu)


def parse_probes(text: str, *, field: str = "probe") -> tuple[Probe, ...]:
    """``text``: "" (none), one probe's JSON object, or a JSON list of them; a UserError
    naming ``field`` and the format otherwise."""
    if not (text or "").strip():
        return ()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return (Probe.from_json(text, field=field),)  # its error names the format
    if isinstance(data, list):
        if not data:
            raise UserError(field, "is an empty list.", 'give "" (no probe), one probe\'s '
                            "JSON object, or a list of them.")
        return tuple(Probe.from_dict(item, field=field) for item in data)
    return (Probe.from_dict(data, field=field),)


@dataclass(frozen=True)
class Correction:
    """The full run's predicted tokens/s per GPU, corrected by a probe."""

    predicted: float  # the throughput model, full run
    predicted_at_probe: float  # the throughput model, at the probe's world size
    probed: float  # the probe's measurement
    corrected: float  # predicted x probed / predicted_at_probe
    source: str  # what corrected it, with the ratio

    @property
    def factor(self) -> float:
        return self.probed / self.predicted_at_probe


def correct(probe: Probe, setup: TrainingSetup, gpu: hardware.GPU, *,
            instance_type: str = "", predicted: float | None = None,
            same_configuration: bool = True) -> Correction:
    """The prediction for ``setup`` (the full run, already checked) corrected by ``probe``
    of the same configuration on the same GPU type: the measured / predicted ratio at the
    probe's world size, applied to the full run's prediction (``predicted`` when the
    caller has it). ``same_configuration=False``: a probe of the same precision on the
    same GPU type whose micro-batch or checkpointing may differ (the ratio at the
    probe's own configuration). A ValueError for a probe that says nothing about it."""
    _check_applies(probe, setup, gpu, same_configuration)
    full = predicted if predicted is not None else throughput.predict_checked(
        setup, gpu, instance_type=instance_type).tokens_per_s_per_gpu
    at = throughput.predict(at_probe(probe, setup), gpu,
                            instance_type=instance_type).tokens_per_s_per_gpu
    factor = probe.tokens_per_s_per_gpu / at
    source = (f"{probe.kind}: {probe.source or 'a probe'} on {probe.world_size} "
              f"{probe.gpu_name()} GPU(s), x{factor:.3f} the throughput model's prediction there"
              + _elsewhere(probe, setup))
    return Correction(full, at, probe.tokens_per_s_per_gpu, full * factor, source)


@dataclass(frozen=True)
class FitAtProbe:
    """The memory estimate of a probe's own configuration: its precision, micro-batch,
    checkpointing and sequence on ``world_size`` GPUs of its type, against the GPU's whole
    memory (no headroom: the question is not what to plan but whether it could run at all).

    Every probe record says it ran (it carries a measured speed), so a record the model
    says cannot fit contradicts the memory model: evidence about the model, reported,
    never an error (the record may also not be what ran: a wrong world_size or batch)."""

    probe: Probe
    gpu: hardware.GPU
    seq_length: int
    peak_bytes: int  # predicted per GPU at the probe's world size
    # What the model says fits instead: the largest micro-batch at the probe's world size
    # in each checkpointing mode (0: none), and the fewest GPUs, doubling the probe's up
    # to the full run's, on which the probe's own configuration fits (0: none).
    largest_batch_without_checkpointing: int
    largest_batch_with_checkpointing: int
    fitting_world_size: int

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.gpu.memory_bytes

    def warning(self, field: str = "probe") -> str:
        """One line naming ``field``: the prediction, the contradiction, what to change
        ("" when it fits)."""
        if self.fits:
            return ""
        p, gib = self.probe, estimator.GiB
        where = f"{p.world_size} x {self.gpu.name}"
        measured = f", peak {p.peak_memory_bytes / gib:.1f} GiB measured" \
            if p.peak_memory_bytes else ""
        return (
            f"{field}: {p.precision} batch {p.batch_size}, checkpointing "
            f"{'on' if p.activation_checkpointing else 'off'}, sequence {self.seq_length} on "
            f"{where} is predicted by the memory estimate at {self.peak_bytes / gib:.1f} GiB "
            f"per GPU, more than the {self.gpu.name}'s {self.gpu.memory_bytes / gib:.1f} GiB, "
            f"yet this record says it ran there ({p.tokens_per_s_per_gpu:,.0f} tokens/s per "
            f"GPU{measured}): the probe contradicts the memory model (evidence, kept; not an "
            "error). Check that the record is what ran (precision, batch_size, "
            "activation_checkpointing, world_size); to probe what the model says fits on "
            f"{where}: {self._alternatives()}.")

    def _alternatives(self) -> str:
        p, out = self.probe, []
        if self.fitting_world_size:
            out.append(f"world_size {self.fitting_world_size} (the same configuration on "
                       f"{self.fitting_world_size} GPUs)")
        # (the probe's own batch does not fit in its mode: a fitting one is smaller)
        same = self.largest_batch_with_checkpointing if p.activation_checkpointing \
            else self.largest_batch_without_checkpointing
        if same:
            out.append(f"a smaller probe batch (up to {same})")
        if not p.activation_checkpointing and self.largest_batch_with_checkpointing:
            out.append("activation checkpointing on (batch up to "
                       f"{self.largest_batch_with_checkpointing})")
        return " or ".join(out) or (f"nothing at this sequence on {p.world_size} GPU(s): more "
                                    "GPUs (world_size), a shorter sequence or a smaller model")


def fit_at_probe(probe: Probe, setup: TrainingSetup, gpu: hardware.GPU) -> FitAtProbe:
    """:class:`FitAtProbe` of ``probe``, whose configuration is ``setup``'s (the full run:
    its model, sequence and training settings; its world size bounds the search for one
    on which the probe's configuration fits)."""
    at = replace(setup, world_size=probe.world_size)

    def fits(s: TrainingSetup) -> bool:
        return estimator.estimate_checked(s, gpu).peak_bytes <= gpu.memory_bytes

    def largest(ac: bool) -> int:
        return planner.largest_fitting(
            lambda b: fits(replace(at, batch_size=b, activation_checkpointing=ac)))

    world = probe.world_size * 2
    while world <= setup.world_size and not fits(replace(at, world_size=world)):
        world *= 2
    return FitAtProbe(probe, gpu, setup.seq_length,
                      estimator.estimate_checked(at, gpu).peak_bytes, largest(False),
                      largest(True), world if world <= setup.world_size else 0)

def _check_applies(probe: Probe, setup: TrainingSetup, gpu: hardware.GPU,
                   same_configuration: bool) -> None:
    if same_configuration and not probe.matches(
            setup.precision, setup.batch_size, setup.activation_checkpointing, gpu.name):
        raise ValueError(f"{probe} did not probe {setup.precision} batch {setup.batch_size} "
                         f"on {gpu.name}")
    if (probe.precision, probe.gpu_name()) != (setup.precision, gpu.name):
        raise ValueError(f"{probe} did not probe {setup.precision} on {gpu.name}")


def _elsewhere(probe: Probe, setup: TrainingSetup) -> str:
    """What a correction of another configuration says about where its ratio comes from."""
    if (probe.batch_size, probe.activation_checkpointing) == (
            setup.batch_size, setup.activation_checkpointing):
        return ""
    return (f" (batch {probe.batch_size}, checkpointing "
            f"{'on' if probe.activation_checkpointing else 'off'}), applied to batch "
            f"{setup.batch_size}, checkpointing {'on' if setup.activation_checkpointing else 'off'}")


def at_probe(probe: Probe, setup: TrainingSetup) -> TrainingSetup:
    """``setup`` as the probe ran it: its micro-batch, checkpointing and world size."""
    return replace(setup, batch_size=probe.batch_size,
                   activation_checkpointing=probe.activation_checkpointing,
                   world_size=probe.world_size)


@dataclass(frozen=True)
class PeakCorrection:
    """The full run's predicted peak memory per GPU, corrected by a probe's peak."""

    predicted: int  # the memory estimate's device peak, full run (reserved + CUDA context)
    predicted_at_probe: int  # its peak reserved, at the probe's configuration
    probed: int  # the probe's measured peak reserved
    corrected: int  # the full run's reserved x probed / predicted_at_probe, + its CUDA context
    source: str

    @property
    def factor(self) -> float:
        return self.probed / self.predicted_at_probe


def correct_peak(probe: Probe, setup: TrainingSetup, gpu: hardware.GPU, *,
                 same_configuration: bool = True) -> PeakCorrection:
    """The memory estimate's device peak per GPU for ``setup`` corrected by the probe's
    measured peak reserved (``peak_memory_bytes`` > 0) as :func:`correct` corrects the
    speed: the measured / predicted ratio of the peak reserved at the probe's
    configuration, applied to the full run's peak reserved; the CUDA context, which the
    allocator's figure does not hold, is added back unscaled (like for like: scaling the
    device peak by reserved / device-peak would be optimistic by the context's share)."""
    if not probe.peak_memory_bytes:
        raise ValueError(f"{probe} measured no peak memory")
    _check_applies(probe, setup, gpu, same_configuration)
    full = estimator.estimate_checked(setup, gpu)
    at = predicted_peak_at_probe(probe, setup, gpu)
    factor = probe.peak_memory_bytes / at
    source = (f"{probe.kind}: peak reserved of {probe.source or 'a probe'} on "
              f"{probe.world_size} {probe.gpu_name()} GPU(s), x{factor:.3f} the memory "
              f"estimate's there" + _elsewhere(probe, setup))
    corrected = full.peak_bytes - full.peak_reserved_bytes + round(
        full.peak_reserved_bytes * factor)
    return PeakCorrection(full.peak_bytes, at, probe.peak_memory_bytes, corrected, source)


def predicted_peak_at_probe(probe: Probe, setup: TrainingSetup, gpu: hardware.GPU) -> int:
    """The memory estimate's peak reserved per GPU for ``setup`` as the probe ran it (what
    the probe's ``peak_memory_bytes`` is compared with, like for like: the allocator's
    figure, no CUDA context; sharded parts depend on its world size)."""
    return estimator.estimate_checked(at_probe(probe, setup), gpu).peak_reserved_bytes


@dataclass(frozen=True)
class Comparison:
    """A probe beside the predictions for its configuration: the corrected throughput,
    the predicted peak at the probe's world size when it measured its peak, and whether
    the memory estimate says the probe's configuration fits where it ran."""

    probe: Probe
    throughput: Correction
    predicted_peak_at_probe_bytes: int | None  # peak reserved; None: the probe measured none
    fit: FitAtProbe


def compare(probe: Probe, setup: TrainingSetup, gpu: hardware.GPU, *,
            instance_type: str = "", predicted: float | None = None) -> Comparison:
    """:func:`correct` and :func:`fit_at_probe` (its predicted peak is the one the
    probe's measured peak is compared with: sharded parts depend on the world size)."""
    fit = fit_at_probe(probe, setup, gpu)
    peak = predicted_peak_at_probe(probe, setup, gpu) if probe.peak_memory_bytes else None
    return Comparison(probe, correct(probe, setup, gpu, instance_type=instance_type,
                                     predicted=predicted), peak, fit)
