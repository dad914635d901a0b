"""What the convergence comparison reads and answers with.

Its settings (the component's parameters, checked), each run's series as a ``Run``, each
precision's ``Result`` and the ``Comparison``; ``compare.py`` makes them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.catalog.precisions import (
    PRECISIONS,
    as_precision,
    parse_precision,
)
from kfp_sagemaker_blackwell.common import cli
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.common.step_series import FAILED_STATUSES, Series

NOT_COMPARED = "not compared"


# The component's own parameters, not the comparison's: whether a partial comparison fails
# the step, and what the reports say about the run on top.
ENTRY_PARAMETERS = ("require_complete", "run_context")
_Declared: Any = cli.dataclass_of(
    [p for p in cli.source_parameters(
        "kfp_sagemaker_blackwell.components.compare_convergence.component", "compare_convergence")
     if p.name not in ENTRY_PARAMETERS], "Settings", frozen=True)


class Settings(_Declared):  # type: ignore[misc]
    """The comparison's settings: the compare_convergence component's parameters as values,
    a frozen keyword-only dataclass derived from its signature (components/
    compare_convergence/component.py, the one declaration: names, kinds, defaults, the
    documentation), checked by :meth:`validate`. Elsewhere than the component and its CLI:
    ``Settings.from_parameters(cli.declared(compare_convergence, ...))``.
    """

    warmup = 0.1  # not a parameter: the start of the curves divergence ignores

    @classmethod
    def from_parameters(cls, params: Mapping[str, Any]) -> Settings:
        """The checked settings for the component's parameters, by name (other keys, the
        artifacts and the entry's own parameters, are ignored); a bad value is a UserError
        naming its parameter."""
        return cls(**{f.name: params[f.name] for f in fields(cls)}).validate()

    @functools.cached_property
    def gpu(self) -> hardware.GPU:
        """``target_gpu``'s datasheet (:meth:`validate` refuses an unknown name)."""
        return hardware.gpu(self.target_gpu)

    def validate(self) -> Settings:
        """Every setting checked (a UserError naming it): a copy whose baseline is parsed."""
        try:
            self.gpu  # noqa: B018 - read once here, where an unknown name is the user's error
        except ValueError as exc:
            raise UserError("target_gpu", str(exc), "e.g. B200 (ml.p6-b200.48xlarge).") from None
        checks = [
            ("loss_tolerance_rel", 0 <= self.loss_tolerance_rel < 1, "a fraction, e.g. 0.01"),
            ("loss_tolerance_abs", self.loss_tolerance_abs >= 0, ">= 0 (nats)"),
            ("divergence_tolerance_rel", 0 < self.divergence_tolerance_rel,
             "a positive fraction, e.g. 0.1"),
            ("seed_spread_factor", self.seed_spread_factor >= 0, ">= 0"),
            ("final_window", 0 < self.final_window <= 1, "a fraction in (0, 1], e.g. 0.1"),
            ("warmup", 0 <= self.warmup < 1, "a fraction in [0, 1)"),
            ("smoothing_window", self.smoothing_window >= 0, ">= 0 (0 = automatic)"),
            ("align_by", self.align_by in ("step", "tokens"), "step or tokens"),
            ("min_step_coverage", 0 < self.min_step_coverage <= 1, "a fraction in (0, 1]"),
            ("min_speedup_gain", 0 <= self.min_speedup_gain < 10, "a fraction, e.g. 0.05"),
        ]
        for name, ok, want in checks:
            if not ok:
                raise UserError(name, f"{getattr(self, name)!r} is not valid.", f"use {want}.")
        try:  # parsed: the comparison trusts the baseline's Precision
            baseline = parse_precision(self.baseline, "baseline")
        except ValueError:
            raise UserError("baseline", f"{self.baseline!r} is not a precision the trainer "
                            "knows.", f"name one of {', '.join(PRECISIONS)}, e.g. "
                            "bf16.") from None
        return replace(self, baseline=baseline)


@dataclass
class Run:
    """One training run's series, as compare needs it."""

    label: str
    precision: str
    seed: int | None
    emulated: bool
    status: str
    failure_reason: str
    step: np.ndarray
    tokens: np.ndarray
    loss: np.ndarray
    tokens_per_s: float
    peak_memory_gib: float
    entropy_floor: float | None
    source: str
    gpu: str = ""  # the GPU it ran on ("" on a CPU)
    world_size: int = 1
    training: dict[str, Any] = field(default_factory=dict)  # batch, sequence, model...

    @property
    def failed(self) -> bool:
        return self.status in FAILED_STATUSES or len(self.step) == 0

    @property
    def nan_step(self) -> int | None:
        bad = ~np.isfinite(self.loss)
        return int(self.step[np.argmax(bad)]) if bad.any() else None


def _finite_or_nan(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v if math.isfinite(v) else math.nan


def _steady_mean(values: np.ndarray) -> float:
    if len(values) >= 3:
        values = values[max(1, len(values) // 10):]
    values = values[np.isfinite(values)]
    return float(values.mean()) if len(values) else math.nan


def run_from_series(s: Series) -> Run:
    cols = s.columns
    meta = s.meta
    metrics = meta.get("metrics") or {}
    step = np.asarray(cols.get("step", []), dtype=np.int64)
    n = len(step)

    def col(name: str) -> np.ndarray:
        values = cols.get(name)
        return np.asarray(values, dtype=float) if values else np.full(n, math.nan)

    loss, tps, mem = col("loss"), col("tokens_per_s"), col("mem_alloc_gib")
    throughput = _finite_or_nan(metrics.get("mean_tokens_per_s"))
    if math.isnan(throughput):
        throughput = _steady_mean(tps)
    peak = _finite_or_nan(metrics.get("peak_memory_gib"))
    if math.isnan(peak) and np.isfinite(mem).any():
        peak = float(np.nanmax(mem))
    floor = _finite_or_nan(meta.get("entropy_floor"))
    emulated = meta.get("emulated")
    if emulated is None:
        emulated = bool(cols.get("emulated") and cols["emulated"][-1])
    seed = meta.get("seed")
    status = str(meta.get("status") or ("incomplete" if n else "no_steps"))
    return Run(
        # the series reader checked the name (step_series' schema): converted, not re-checked
        label=str(meta.get("run") or s.source), precision=as_precision(s.precision), seed=seed
        if isinstance(seed, int) and not isinstance(seed, bool) else None,
        emulated=bool(emulated), status=status,
        failure_reason=str(meta.get("failure_reason") or ""), step=step, tokens=col("tokens"),
        loss=loss, tokens_per_s=throughput, peak_memory_gib=peak,
        entropy_floor=None if math.isnan(floor) else floor, source=s.source,
        gpu=str(meta.get("gpu") or ""), world_size=_positive_int(meta.get("world_size"), 1),
        training=dict(meta.get("training") or {}))


def _positive_int(x: Any, default: int) -> int:
    return x if isinstance(x, int) and not isinstance(x, bool) and x > 0 else default


@dataclass
class Pair:
    """A precision run and the baseline run of the same seed, on a common grid."""

    seed: int | None
    x: np.ndarray  # steps (or tokens) of the comparison grid
    x_name: str
    base: np.ndarray  # baseline loss on the grid
    cand: np.ndarray  # candidate loss on the grid
    base_smooth: np.ndarray
    cand_smooth: np.ndarray
    final_base: float
    final_cand: float
    worst_rel: float
    worst_x: float
    coverage: float


@dataclass
class Result:
    precision: str
    emulated: bool
    verdict: str = "fail"  # pass | fail | not compared
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seeds: list[int | None] = field(default_factory=list)
    final_loss: float = math.nan
    baseline_final_loss: float = math.nan
    final_loss_diff: float = math.nan
    final_loss_diff_rel: float = math.nan
    diff_seed_std: float = math.nan  # spread of the paired differences across seeds
    seed_spread: float = math.nan  # the baseline's seed-to-seed spread of the final loss
    tolerance: float = math.nan
    worst_divergence_rel: float = math.nan
    worst_divergence_at: float = math.nan
    diverged: bool = False
    nan: bool = False
    speedup: float = math.nan
    speedup_source: str = ""  # "measured on <GPU>" | "predicted on <GPU> by ..." | why none
    measured_speedup: float = math.nan  # on the GPU the runs were timed on, when real
    measured_on: str = ""
    memory_ratio: float = math.nan
    tokens_per_s: float = math.nan
    peak_memory_gib: float = math.nan
    gap_to_floor: float = math.nan
    status: str = ""
    pairs: list[Pair] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def compared(self) -> bool:
        return self.verdict != NOT_COMPARED

    @property
    def speedup_predicted(self) -> bool:
        return self.speedup_source.startswith("predicted")


@dataclass(frozen=True)
class LeftOut:
    """A series file the comparison could not use: ``contract``: it breaks the step-series
    contract (kfp-sagemaker/step-series/v1), the user's input error, as rank_throughput
    takes it; else it could not be read at all."""

    source: str
    problem: str
    contract: bool = True


@dataclass
class Comparison:
    settings: Settings
    baseline: str
    results: dict[str, Result]
    recommended: str
    partial: bool
    problems: list[str]
    notes: list[str]
    runs: dict[str, list[Run]]
    recommendation: str = ""  # one sentence: why this precision (or why none)
    left_out: list[LeftOut] = field(default_factory=list)  # files not compared (partial)

    @property
    def passed(self) -> bool:
        """A recommendation exists and nothing made the comparison partial."""
        return bool(self.recommended) and not self.partial

    @property
    def emulated(self) -> list[str]:
        return [p for p, r in self.results.items() if r.emulated]
