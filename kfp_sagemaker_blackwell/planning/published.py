"""Published end-to-end training throughput on Blackwell, and the throughput model beside it.

A plan's B200/B300 rows are predicted from datasheet figures and published GEMM rates
(``planning/throughput.py`` ``BLACKWELL_SOURCE``): this project has measured no Blackwell
GPU. NVIDIA publishes end-to-end pretraining throughput of Llama models on Blackwell
systems (Megatron-Bridge's performance summary). This module holds those figures, each
with the configuration it was measured on and its source, and :func:`check` predicts the
nearest shape this project's trainer can run with the throughput model's public
:func:`~kfp_sagemaker_blackwell.planning.throughput.predict`, so a plan can say how far the
model is from each figure (plan_training's "Blackwell check").

Only figures read in a source are here. Looked for and not found (so not here): an
end-to-end NVFP4 (or MXFP8) figure for a dense Llama on DGX-B200 or DGX-B300 other than
the two 25.11 rows below; any Llama figure on DGX-B300 (the summary's B300-class Llama
rows are GB300, Grace-Blackwell Ultra systems); the recompute (activation checkpointing)
setting of the published runs (the tables do not state it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.catalog.precisions import parse_precision
from kfp_sagemaker_blackwell.catalog.spec import preset
from kfp_sagemaker_blackwell.planning import throughput
from kfp_sagemaker_blackwell.planning.training_setup import TrainingSetup


@dataclass(frozen=True)
class Source:
    """Where a figure was read."""

    title: str
    url: str
    section: str  # the page's section (NeMo container release) and table
    published: str  # when the figure first appeared in the page (its git history)
    read_from: str  # the repository file and commit the figure was read from
    label: str = ""  # a few words for one line of a report

    def short(self) -> str:
        return f"{self.title}, {self.section}, published {self.published}: {self.url}"


# The performance summary of NVIDIA's Megatron-Bridge (the NeMo framework's Megatron
# training library). Older releases' tables move to the archive page; the figures are the
# same in both.
_REPO = "github.com/NVIDIA-NeMo/Megatron-Bridge"
MB_25_11_B200 = Source(
    "Megatron-Bridge performance summary",
    "https://docs.nvidia.com/nemo/megatron-bridge/latest/performance-summary-archive.html",
    "25.11 NeMo container, Pre-Training Performance, System: DGX-B200",
    "2025-12-04 (commit 97ad8cc6f, 'Added 25.11 starter pack')",
    f"{_REPO} docs/performance-summary-archive.md at 4ab94dfad (2026-08-11)",
    "Megatron-Bridge 25.11, DGX-B200",
)
MB_25_11_GB300 = Source(
    MB_25_11_B200.title, MB_25_11_B200.url,
    "25.11 NeMo container, Pre-Training Performance, System: DGX-GB300",
    MB_25_11_B200.published, MB_25_11_B200.read_from, "Megatron-Bridge 25.11, DGX-GB300",
)
MB_26_04_01 = Source(
    MB_25_11_B200.title, MB_25_11_B200.url,
    "26.04.01 NeMo container, Pre-Training Performance, Model: LLAMA3_70B and LLAMA3.1_405B",
    "2026-05-16 (commit 17a381f95, '2604_patch_perf_summary')",
    MB_25_11_B200.read_from, "Megatron-Bridge 26.04.01, GB200/GB300",
)


@dataclass(frozen=True)
class Run:
    """One published measurement: tokens/s per GPU and what it was measured on."""

    key: str
    model: str
    system: str  # as published: DGX-B200 (8x B200, like ml.p6-b200), DGX-GB200/GB300
    gpus: int
    precision: str  # as published (FP8-CS: FP8 current scaling; FP8-MX: MXFP8)
    seq_length: int
    micro_batch: int
    global_batch: int
    parallelism: str  # data parallelism, TP/PP/CP/VP and gradient accumulation as published
    tokens_per_s_per_gpu: float
    source: Source
    recompute: str = "not stated"

    def config(self) -> str:
        return (f"{self.model}, {self.gpus} x {self.system}, {self.precision}, sequence "
                f"{self.seq_length:,}, micro-batch {self.micro_batch}, global batch "
                f"{self.global_batch:,}, {self.parallelism}, recompute {self.recompute}")


def _llama3_8b(system: str, precision: str, tokens: float, source: Source) -> Run:
    return Run(f"llama3-8b-{system.lower()}-{precision.lower()}", "Llama 3 8B", system, 8,
               precision, 8192, 2, 128, "DDP (FSDP 0), TP 1, PP 1, CP 1, GA 8", tokens, source)


def _large(model: str, system: str, precision: str, gpus: int, gbs: int, mbs: int,
           parallelism: str, tokens: float) -> Run:
    key = f"{model.lower().replace(' ', '').replace('.', '')}-{system.lower()}-{precision.lower()}"
    return Run(key, model, system, gpus, precision, 8192, mbs, gbs, parallelism, tokens,
               MB_26_04_01)


# Every figure, as read. The 26.04.01 tables write "FP8" for the recipe the 26.02 tables
# of the same rows called FP8-CS (current scaling).
RUNS: tuple[Run, ...] = (
    _llama3_8b("DGX-B200", "FP8-CS", 30624, MB_25_11_B200),
    _llama3_8b("DGX-B200", "FP8-MX", 29521, MB_25_11_B200),
    _llama3_8b("DGX-GB300", "FP8-CS", 37556, MB_25_11_GB300),
    Run("llama31-405b-dgx-b200-fp8-cs", "Llama 3.1 405B", "DGX-B200", 128, "FP8-CS", 8192, 1, 64,
        "DDP, TP 4, PP 8, CP 2, VP 8, GA 32", 661, MB_25_11_B200),
    Run("llama31-405b-dgx-b200-fp8-mx", "Llama 3.1 405B", "DGX-B200", 128, "FP8-MX", 8192, 1, 64,
        "DDP, TP 4, PP 8, CP 2, VP 8, GA 32", 624, MB_25_11_B200),
    _large("Llama 3 70B", "DGX-GB300", "FP8", 64, 256, 2, "FSDP 64, TP 1, PP 1, CP 1", 5248),
    _large("Llama 3 70B", "DGX-GB300", "MXFP8", 64, 256, 1, "TP 1, PP 4, CP 1, VP 5", 4864),
    _large("Llama 3 70B", "DGX-GB300", "NVFP4", 64, 256, 1, "TP 1, PP 4, CP 1, VP 5", 7296),
    _large("Llama 3 70B", "DGX-GB200", "FP8", 64, 256, 2, "FSDP 64, TP 1, PP 1, CP 1", 4224),
    _large("Llama 3 70B", "DGX-GB200", "MXFP8", 64, 256, 1, "TP 2, PP 4, CP 1, VP 5", 3712),
    _large("Llama 3 70B", "DGX-GB200", "NVFP4", 64, 256, 1, "TP 2, PP 4, CP 1, VP 5", 4864),
    _large("Llama 3.1 405B", "DGX-GB300", "FP8", 256, 1536, 1, "TP 4, PP 8, CP 1, VP 4", 1024),
    _large("Llama 3.1 405B", "DGX-GB300", "MXFP8", 256, 1536, 1, "TP 2, PP 8, CP 2, VP 4", 960),
    _large("Llama 3.1 405B", "DGX-GB300", "NVFP4", 256, 1536, 1, "TP 4, PP 8, CP 1, VP 4", 1440),
    _large("Llama 3.1 405B", "DGX-GB200", "FP8", 256, 1536, 1, "TP 4, PP 16, CP 1, VP 4", 864),
    _large("Llama 3.1 405B", "DGX-GB200", "MXFP8", 256, 1536, 1, "TP 4, PP 16, CP 1, VP 8", 800),
    _large("Llama 3.1 405B", "DGX-GB200", "NVFP4", 256, 1536, 1, "TP 4, PP 16, CP 1, VP 8", 1184),
)
_BY_KEY = {r.key: r for r in RUNS}


def run(key: str) -> Run:
    return _BY_KEY[key]


@dataclass(frozen=True)
class Shape:
    """The trainer setup closest to a published configuration, and what it cannot copy."""

    label: str  # e.g. "8B"
    preset: str
    world_size: int
    batch_size: int
    gradient_accumulation_steps: int
    activation_checkpointing: bool
    seq_length: int = 8192
    gpu: str = "B200"
    instance_type: str = hardware.DEFAULT_INSTANCE_TYPE  # ml.p6-b200.48xlarge: 8x B200 like a DGX-B200

    def setup(self, precision: str) -> TrainingSetup:
        return TrainingSetup(preset(self.preset), self.batch_size, self.seq_length,
                             precision=precision,
                             activation_checkpointing=self.activation_checkpointing,
                             world_size=self.world_size,
                             gradient_accumulation_steps=self.gradient_accumulation_steps)

    def tokens_per_s_per_gpu(self, precision: str) -> float:
        return throughput.predict(self.setup(precision), self.gpu,
                                  instance_type=self.instance_type).tokens_per_s_per_gpu


# Llama 3 8B as published: 8 GPUs, micro-batch 2 x GA 8 x 8 ranks = global batch 128,
# checkpointing off (the published runs do not say; an 8B model needs none on Blackwell).
SHAPE_8B = Shape("8B", "8b", 8, 2, 8, False)
P6_B300 = "ml.p6-b300.48xlarge"  # the B300 rows' instance type (8x B300)
SHAPE_8B_B300 = Shape("8B", "8b", 8, 2, 8, False, gpu="B300", instance_type=P6_B300)
# The 70B class: the 64b preset (80 layers, hidden 8192, 62.5B parameters; Llama 3 70B has
# hidden 8192, 80 layers, FFN 28672) on one instance. The trainer shards with FSDP only,
# so it needs checkpointing at this size where Megatron splits layers with TP/PP.
SHAPE_70B = Shape("64B", "64b", 8, 1, 32, True)

# What the trainer cannot copy of Megatron-Bridge's runs, for every comparison.
TRAINER_DIFFERENCES = ("the trainer runs FSDP2 + TransformerEngine layers without tensor or "
                       "pipeline parallelism, CUDA graphs or Megatron's fused kernels")


@dataclass(frozen=True)
class Absolute:
    """A published tokens/s per GPU against the model's prediction for the same shape."""

    label: str
    run: Run
    precision: str  # this project's name for the published precision (parsed: a Precision)
    shape: Shape
    differences: str

    def __post_init__(self) -> None:  # checked once, when the table is built
        object.__setattr__(self, "precision", parse_precision(self.precision, "precision"))


@dataclass(frozen=True)
class Relative:
    """A published speed-up of one precision over another (the range over the published
    pairs) against the model's predicted speed-up at the shapes nearest those pairs."""

    label: str
    precision: str  # numerator, this project's name (parsed: a Precision)
    baseline: str  # denominator, this project's name (parsed: a Precision)
    pairs: tuple[tuple[Run, Run], ...]  # (numerator run, baseline run), same model and system
    shapes: tuple[Shape, ...]
    differences: str

    def __post_init__(self) -> None:  # checked once, when the table is built
        object.__setattr__(self, "precision", parse_precision(self.precision, "precision"))
        object.__setattr__(self, "baseline", parse_precision(self.baseline, "baseline"))

    def published_range(self) -> tuple[float, float]:
        ratios = [a.tokens_per_s_per_gpu / b.tokens_per_s_per_gpu for a, b in self.pairs]
        return min(ratios), max(ratios)


def _pairs(models: tuple[str, ...], systems: tuple[str, ...], num: str, den: str
           ) -> tuple[tuple[Run, Run], ...]:
    out = []
    for m in models:
        for s in systems:
            a = [r for r in RUNS if (r.model, r.system, r.precision) == (m, s, num)]
            b = [r for r in RUNS if (r.model, r.system, r.precision) == (m, s, den)]
            if a and b:
                out.append((a[0], b[0]))
    return tuple(out)


_LARGE = ("Llama 3 70B", "Llama 3.1 405B")
_GRACE = ("DGX-GB300", "DGX-GB200")
CHECKS: tuple[Absolute | Relative, ...] = (
    Absolute("Llama 3 8B, 8 x B200, FP8 current scaling", run("llama3-8b-dgx-b200-fp8-cs"),
             "fp8-current", SHAPE_8B, TRAINER_DIFFERENCES + "; its DDP is FSDP2 here"),
    Absolute("Llama 3 8B, 8 x B200, MXFP8", run("llama3-8b-dgx-b200-fp8-mx"), "mxfp8", SHAPE_8B,
             TRAINER_DIFFERENCES + "; its DDP is FSDP2 here"),
    Absolute("Llama 3 8B, 8 x GB300 (nearest to B300), FP8 current scaling",
             run("llama3-8b-dgx-gb300-fp8-cs"), "fp8-current", SHAPE_8B_B300,
             TRAINER_DIFFERENCES + "; GB300 (a Grace-Blackwell Ultra system) is not the "
             "HGX B300 of ml.p6-b300"),
    Relative("MXFP8 / FP8 current scaling", "mxfp8", "fp8-current",
             ((run("llama3-8b-dgx-b200-fp8-mx"), run("llama3-8b-dgx-b200-fp8-cs")),
              (run("llama31-405b-dgx-b200-fp8-mx"), run("llama31-405b-dgx-b200-fp8-cs")))
             + _pairs(_LARGE, _GRACE, "MXFP8", "FP8"),
             (SHAPE_8B, SHAPE_70B),
             TRAINER_DIFFERENCES + "; 70B/405B pairs ran on GB200/GB300 with other "
             "parallelism for each precision, predicted here for the 64b preset on 8 x B200"),
    Relative("NVFP4 / FP8 current scaling, 70B and above", "nvfp4", "fp8-current",
             _pairs(_LARGE, _GRACE, "NVFP4", "FP8"), (SHAPE_70B,),
             TRAINER_DIFFERENCES + "; published on GB200/GB300 only (no dense Llama NVFP4 "
             "figure on DGX-B200), predicted for the 64b preset on 8 x B200"),
)


@dataclass(frozen=True)
class Comparison:
    """One published figure against the model: ``ratio`` is predicted / published for a
    figure, predicted / the nearest end of the published range for a speed-up (1.0 when
    the prediction lies inside it)."""

    label: str
    kind: str  # "tokens/s per GPU" or "speed-up"
    published_low: float
    published_high: float
    predicted_low: float
    predicted_high: float
    ratio: float
    configuration: str
    model_shape: str
    differences: str
    source: Source

    def published_text(self) -> str:
        if self.kind == "speed-up":
            return _range(self.published_low, self.published_high)
        return f"{self.published_low:,.0f} tokens/s per GPU"

    def predicted_text(self) -> str:
        if self.kind == "speed-up":
            return _range(self.predicted_low, self.predicted_high)
        return f"{self.predicted_low:,.0f}"

    def difference_text(self) -> str:
        if self.kind == "speed-up":
            if self.ratio == 1.0:
                return "within the published range"
            return f"{self.ratio - 1:+.0%} {'above' if self.ratio > 1 else 'below'} the range"
        return f"{self.ratio - 1:+.0%}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label, "kind": self.kind,
            "published_low": round(self.published_low, 4),
            "published_high": round(self.published_high, 4),
            "predicted_low": round(self.predicted_low, 4),
            "predicted_high": round(self.predicted_high, 4),
            "ratio": round(self.ratio, 4), "difference": self.difference_text(),
            "configuration": self.configuration, "model_shape": self.model_shape,
            "differences": self.differences, "source": self.source.url,
            "source_section": self.source.section, "source_published": self.source.published,
        }


def _range(low: float, high: float) -> str:
    a, b = f"{low:.2f}", f"{high:.2f}"
    return f"{a}x" if a == b else f"{a}-{b}x"


def _shape_text(shape: Shape, precision: str) -> str:
    s = shape.setup(precision)
    return (f"{shape.preset} preset, {s.world_size} x {shape.gpu} ({shape.instance_type}), "
            f"{precision}, sequence {s.seq_length:,}, micro-batch {s.batch_size}, "
            f"gradient accumulation {s.gradient_accumulation_steps}, checkpointing "
            f"{'on' if s.activation_checkpointing else 'off'}")


def compare(item: Absolute | Relative) -> Comparison:
    """One check: the published figure(s) and the model's prediction for the same shape."""
    if isinstance(item, Absolute):
        published = item.run.tokens_per_s_per_gpu
        predicted = item.shape.tokens_per_s_per_gpu(item.precision)
        return Comparison(item.label, "tokens/s per GPU", published, published, predicted,
                          predicted, predicted / published, item.run.config(),
                          _shape_text(item.shape, item.precision), item.differences,
                          item.run.source)
    low, high = item.published_range()
    speedups = [s.tokens_per_s_per_gpu(item.precision) / s.tokens_per_s_per_gpu(item.baseline)
                for s in item.shapes]
    p_low, p_high = min(speedups), max(speedups)
    if p_low > high:
        ratio = p_low / high
    elif p_high < low:
        ratio = p_high / low
    else:
        ratio = 1.0
    configs = "; ".join(f"{a.model} {a.system} {a.precision} {a.tokens_per_s_per_gpu:,.0f} / "
                        f"{b.precision} {b.tokens_per_s_per_gpu:,.0f}" for a, b in item.pairs)
    shapes = "; ".join(f"{s.label}: {_shape_text(s, item.precision)}" for s in item.shapes)
    sources = {a.source for pair in item.pairs for a in pair}
    source = item.pairs[0][0].source if len(sources) == 1 else Source(
        item.pairs[0][0].source.title, item.pairs[0][0].source.url,
        "; ".join(sorted({s.section for s in sources})),
        "; ".join(sorted({s.published for s in sources})), item.pairs[0][0].source.read_from,
        " + ".join(sorted({s.label for s in sources})))
    return Comparison(item.label, "speed-up", low, high, p_low, p_high, ratio, configs, shapes,
                      item.differences, source)


@functools.lru_cache(maxsize=1)
def check() -> tuple[Comparison, ...]:
    """Every published figure against the throughput model (about 10 predictions)."""
    return tuple(compare(item) for item in CHECKS)
