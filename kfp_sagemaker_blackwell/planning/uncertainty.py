"""How sure a predicted time (and the cost that follows from it) is: the throughput model's
error band per source, in one table.

Two sources of a prediction (``throughput.source_for``):

- **measured parts** (Hopper: "measured H200 parts", "measured H100 parts"): the model's parts
  were measured on that GPU and its residuals fitted there; its band is its error on
  configuration families left out of the fit (``throughput.ACCURACY[gpu]``; the H200's are
  ``throughput.HELD_OUT_MEDIAN_ERROR``, ``HELD_OUT_WORST_TOO_FAST``) and its run-time margin
  (the H200's: ``throughput.RUNTIME_MARGIN``). A refit changes those constants, and these bands
  with them: nothing here is a copy of them.
- **datasheet only** (Blackwell, and any GPU without measured parts): the same model with
  constants never fitted to the GPU (its host time: the H200's measured one,
  ``Constants.host_reference_gpu``). Its band is the held-out one compounded with the miss of
  uncalibrated constants, ``UNCALIBRATED_*`` below (declared here, with their source). Hopper
  runs predicted this way, as if without parts of their own, missed by at most 43% too fast
  (benchmarks/throughput/host_reference_study.json): inside that band's worst.

A probed or measured speed (``planning/probe.py``) is at least as good as the calibrated
model's extrapolation: such rows take the measured-parts band.
"""

from __future__ import annotations

from dataclasses import dataclass

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.planning import throughput

# The one measurement of this model predicting a setup its constants were not fitted to:
# the torch backend on H200 before it had constants of its own, median |error| 15%, worst
# 25% over 6 runs / 5 families (benchmarks/throughput/README.md, the "v1 | v2" table:
# "torch ... 15%, 25% (uncalibrated, not LOFO)"). A datasheet-only prediction carries that
# miss on top of the calibrated model's own held-out miss.
UNCALIBRATED_MEDIAN_ERROR = 0.15
UNCALIBRATED_WORST_TOO_FAST = 0.25
UNCALIBRATED_SOURCE = ("the model's uncalibrated torch backend on H200: median 15%, worst 25% "
                       "(benchmarks/throughput/README.md)")

# Two rows on the same GPU share the model's GPU-level miss (the same parts, the same residuals):
# it cancels in their ratio, so what can reorder them is the model's error on one precision
# against another, not its absolute error. Measured-parts GPUs: their held-out fp8/bf16
# speed-up error (median), read from their calibration file (``HeldOutAccuracy.
# speedup_median_error``). Datasheet only: no such measurement exists; the published spread of
# one low-precision format's end-to-end speed relative to another on B200 stands in: MXFP8 runs
# 4-12% below FP8 current scaling (Megatron-Bridge's B200 performance tables,
# /work/shared/REFERENCE.md), an 8-point spread.
SAME_GPU_RELATIVE_DATASHEET = 0.08
SAME_GPU_RELATIVE_SOURCE = ("rows on one GPU share its miss, which cancels in their ratio: the "
                            "model's held-out fp8/bf16 speed-up error on measured-parts GPUs "
                            "(their calibration files); datasheet-only GPUs: the published 4-12% "
                            "spread of MXFP8 against FP8 current scaling on B200")

MEASURED = "measured H200 parts"
DATASHEET = "datasheet only"


def measured_label(gpu: str) -> str:
    """The band source of a GPU with measured parts (MEASURED for the H200)."""
    return f"measured {gpu} parts"


@dataclass(frozen=True)
class Band:
    """A prediction's error band: ``typical`` (the +/- fraction shown beside a time or a
    cost, and what makes two rows a tie), ``worst_too_fast`` (how much longer than predicted
    a run took at worst) and ``runtime_margin`` (what max_runtime_seconds allows beyond the
    predicted steps: the worst plus ``throughput.RUNTIME_SAFETY_ALLOWANCE``)."""

    source: str
    typical: float
    worst_too_fast: float
    runtime_margin: float
    why: str
    same_gpu: float = 0.0  # the band between two rows on the same GPU (what makes them a tie)

    def text(self) -> str:
        return f"+/-{self.typical:.0%}"


def _compound(a: float, b: float) -> float:
    return round((1 + a) * (1 + b) - 1, 3)


def bands() -> dict[str, Band]:
    """The band of each source, from the throughput model's accuracy constants as they are
    now (called per plan, so a refit needs no change here)."""
    t = throughput
    out = {}
    for gpu, acc in t.ACCURACY.items():
        why = (f"held-out error of the {t.MODEL_NAME} on {gpu} configuration families left out "
               f"of its fit: median {acc.median_error:.1%}, worst {acc.worst_too_fast:.1%} too "
               f"fast (benchmarks/throughput/{acc.record}); max_runtime margin "
               f"{acc.runtime_margin:.1%}")
        label = measured_label(gpu)
        out[label] = Band(label, acc.median_error, acc.worst_too_fast, acc.runtime_margin, why,
                          acc.speedup_median_error)
    worst = _compound(t.HELD_OUT_WORST_TOO_FAST, UNCALIBRATED_WORST_TOO_FAST)
    typical = _compound(t.HELD_OUT_MEDIAN_ERROR, UNCALIBRATED_MEDIAN_ERROR)
    margin = round(worst + t.RUNTIME_SAFETY_ALLOWANCE, 3)
    datasheet_why = (f"no measured parts for this GPU: the held-out error compounded with "
                     f"{UNCALIBRATED_SOURCE}: typical {typical:.1%}, worst {worst:.1%} too "
                     f"fast; max_runtime margin {margin:.1%}")
    out[DATASHEET] = Band(DATASHEET, typical, worst, margin, datasheet_why, SAME_GPU_RELATIVE_DATASHEET)
    return out


def band_for(gpu: hardware.GPU | str, throughput_kind: str = "predicted") -> Band:
    """The band of a prediction for ``gpu``: its own measured-parts band where it has one; a
    probed or measured speed on another GPU takes the H200's measured band."""
    g = hardware.gpu(gpu) if isinstance(gpu, str) else gpu
    every = bands()
    if measured_label(g.name) in every:
        return every[measured_label(g.name)]
    return every[MEASURED if throughput_kind != "predicted" else DATASHEET]
