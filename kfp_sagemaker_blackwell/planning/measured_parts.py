"""Measured timings of a step's parts, read from tables, interpolated at a step's shapes.

The throughput model (``planning/throughput.py``) times a step's linear layers and its
attention from measurements on the GPU where they exist, and falls back to its formulas
(datasheet peak x efficiency) where they do not. A table is a JSON file with a
``"results"`` list; every record names its measurement, so a richer table (more token
counts ``m``, more shapes, more recipes, attention by sequence and head size) plugs in
without code change:

- linear layers (``benchmarks/throughput/gemms.py``): ``in_features`` (K), ``out_features``
  (N), ``recipe``, ``fwd_bwd_s`` (one ``te.Linear`` forward + backward: fprop, dgrad, wgrad
  and the recipe's quantisation), the token count as ``m`` (or ``tokens``), optionally
  ``matmul_fwd_s`` (one plain ``torch.matmul`` forward in bf16: the torch backend's GEMM);
- fused attention: ``seq_length``, ``head_dim``, ``num_heads``, ``batch_size``, ``fwd_s``,
  ``bwd_s`` (causal, bf16).

Interpolation is in log space between the measured shapes: a linear layer's achieved rate
(FLOP/s) at (M, N, K) is the inverse-distance-weighted geometric mean of the rates of the
nearest measured shapes (distance: the Euclidean norm of the log ratios of M, N and K), so
it never leaves the range the table spans; with one measured M the rate is taken as
constant in M past a per-call overhead (time = overhead + tokens x a per-token cost). The same for attention's rate over
(sequence, head size).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MEASURED = Path(__file__).with_name("measured")
# How many measured neighbours an interpolation weighs.
NEIGHBOURS = 4
# A te.Linear this small (K x N elements; the "small" preset's layers, 128 x 704 at most)
# does too little GPU work to matter: its measured time is the host's per call.
HOST_BOUND_ELEMENTS = 128 * 704
# A linear layer's rate is read from measurements at least this many times its recipe's
# host time per call (GPU-bound ones): closer to it, the time is the host's, not the GPU's.
# Chosen on calibration data only (benchmarks/throughput/README.md, v3): of 1.0 / 1.3 / 1.6 /
# 2.0 / 3.0, 1.6 has the lowest leave-one-family-out median on h200_grid.json (1.4% vs 1.8% at
# 2.0) and predicts benchmarks/trainer's like-for-like 1b runs within 7% (2.0: fp8 12% fast).
GPU_BOUND = 1.6
# The weight of the token count in the distance between linear-layer shapes: a shape's rate
# changes little with M once GPU-bound, so the same (K, N) measured at other token counts is
# nearer than other shapes at the same M.
M_WEIGHT = 0.25


@dataclass(frozen=True)
class LinearTiming:
    """One measured linear layer: (m x k) @ (k x n), forward + backward."""

    m: int
    n: int
    k: int
    recipe: str
    fwd_bwd_s: float
    matmul_fwd_s: float | None = None

    def rate(self, torch_matmul: bool = False, overhead_s: float = 0.0) -> float | None:
        """Achieved FLOP/s of forward + backward (6 m n k FLOPs) once ``overhead_s`` (the
        per-call time an isolated timing includes: launches, host) is taken off (at most
        half the time); the torch backend's (three plain matmuls) from the forward
        matmul's time."""
        flops = 6.0 * self.m * self.n * self.k
        t = 3.0 * self.matmul_fwd_s if torch_matmul and self.matmul_fwd_s else self.fwd_bwd_s
        if torch_matmul and not self.matmul_fwd_s:
            return None
        return flops / (t - min(overhead_s, 0.5 * t))


@dataclass(frozen=True)
class AttentionTiming:
    """One measured causal fused attention (forward and backward, bf16)."""

    seq: int
    head_dim: int
    heads: int
    batch: int
    fwd_s: float
    bwd_s: float

    def rates(self) -> tuple[float, float]:
        flops = 2.0 * self.batch * self.seq * self.seq * self.heads * self.head_dim
        return flops / self.fwd_s, flops / self.bwd_s


# The block kind of the Llama-style presets (ModelSpec's defaults): what parts.py's tiny-block
# stacks were before they were timed per kind (session v13), and the fallback for a kind not timed
DEFAULT_BLOCK = "rmsnorm-swiglu"


@dataclass(frozen=True)
class LayerTiming:
    """A stack of ``layers`` tiny blocks of the trainer's model, forward + backward: so
    little GPU work that the time is the host's (launches, TE's Python, autograd)."""

    recipe: str
    layers: int
    fwd_bwd_s: float
    block: str = DEFAULT_BLOCK  # ModelSpec.block_kind of the stack's blocks (records before it: the default)


@dataclass(frozen=True)
class OptimizerTiming:
    """One optimizer-step op (``adamw_fused_step``, ``clip_grad_norm``,
    ``cast_fp32_to_bf16``) over ``elements`` fp32 values in ``tensors`` tensors."""

    op: str
    tensors: int
    elements: int
    seconds: float


def line_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of ys over xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return slope, my - slope * mx


def _idw(query: tuple[float, ...], points: list[tuple[tuple[float, ...], float]]) -> float:
    """Inverse-distance-weighted geometric mean of ``points``' values at ``query`` (all
    coordinates and values positive; distances between logs)."""
    q = [math.log(x) for x in query]
    scored = []
    for coords, value in points:
        d = math.sqrt(sum((a - math.log(b)) ** 2 for a, b in zip(q, coords, strict=True)))
        if d < 1e-9:
            return value
        scored.append((d, value))
    scored.sort()
    near = scored[:NEIGHBOURS]
    weights = [1.0 / d ** 2 for d, _ in near]
    return math.exp(sum(w * math.log(v) for w, (_, v) in zip(weights, near, strict=True))
                    / sum(weights))


@dataclass(frozen=True)
class PartsTable:
    """The measured parts of one GPU type: linear layers per recipe, attention."""

    gpu: str
    source: str  # where the measurements come from (file, command, date)
    linears: tuple[LinearTiming, ...] = ()
    attention: tuple[AttentionTiming, ...] = ()
    layers: tuple[LayerTiming, ...] = ()
    optimizer: tuple[OptimizerTiming, ...] = ()
    # every time multiplied by this (1.0 as measured; the model's "no dead constants" check
    # and sensitivity studies scale it)
    time_scale: float = 1.0
    _index: dict[tuple[str, bool, float], list[tuple[tuple[float, ...], float]]] = field(
        default_factory=dict, compare=False, repr=False)

    def __mul__(self, factor: float) -> PartsTable:
        return self.scaled(factor)

    def scaled(self, factor: float) -> PartsTable:
        return PartsTable(self.gpu, self.source, self.linears, self.attention, self.layers,
                          self.optimizer, self.time_scale * factor)

    def _points(self, recipe: str, torch_matmul: bool,
                overhead_s: float) -> list[tuple[tuple[float, ...], float]]:
        key = (recipe, torch_matmul, overhead_s)
        if key not in self._index:
            if len(self._index) > 256:
                self._index.clear()
            pts: list[tuple[tuple[float, ...], float]] = []
            floor = 0.0 if torch_matmul else GPU_BOUND * self.linear_host_s(recipe)
            for t in self.linears:
                if t.recipe == recipe and (t.fwd_bwd_s >= floor or floor == 0.0):
                    r = t.rate(torch_matmul, overhead_s)
                    if r:
                        pts.append(((float(t.m) ** M_WEIGHT, float(t.n), float(t.k)), r))
            self._index[key] = pts
        return self._index[key]

    def recipes(self) -> set[str]:
        return {t.recipe for t in self.linears}

    def linear_host_s(self, recipe: str) -> float:
        """The host's time per te.Linear forward + backward call in ``recipe``: the median
        measured time of the layers too small for the GPU to matter (K x N <= HOST_BOUND_ELEMENTS:
        the "small" preset's), 0 where the table has none. Its points are host-bound, so
        rates are read from the points at least GPU_BOUND times slower."""
        times = sorted(t.fwd_bwd_s for t in self.linears
                       if t.recipe == recipe and t.n * t.k <= HOST_BOUND_ELEMENTS)
        return times[len(times) // 2] * self.time_scale if times else 0.0

    def layer_host_s(self, recipe: str, block: str = DEFAULT_BLOCK) -> tuple[float, float] | None:
        """(per layer, per step) seconds of the tiny-block stacks in ``recipe``: the slope
        and intercept over depth (the host's work per block and per step), None without. The
        stacks of ``block`` (ModelSpec.block_kind) where the table timed that kind, else the
        default kind's (a table from before session v13 timed only those)."""
        pts = [(float(t.layers), t.fwd_bwd_s) for t in self.layers if t.recipe == recipe and t.block == block]
        if block != DEFAULT_BLOCK and len({x for x, _ in pts}) < 2:
            return self.layer_host_s(recipe)
        if len({x for x, _ in pts}) < 2:
            return None
        slope, intercept = line_fit([x for x, _ in pts], [y for _, y in pts])
        return slope * self.time_scale, max(intercept, 0.0) * self.time_scale

    def optimizer_s(self, op: str) -> tuple[float, float] | None:
        """(per element, per tensor) seconds of an optimizer-step ``op``: per element from the
        run over the fewest tensors (GPU-bound: its per-tensor costs hide behind the
        streaming), per tensor from the slope between the two runs over the most tensors
        (the host's launches), None without two measured tensor counts."""
        pts = sorted((t for t in self.optimizer if t.op == op), key=lambda t: t.tensors)
        if len({t.tensors for t in pts}) < 2:
            return None
        a, b = pts[-2], pts[-1]
        per_tensor = max(b.seconds - a.seconds, 0.0) / (b.tensors - a.tensors)
        return pts[0].seconds / pts[0].elements * self.time_scale, per_tensor * self.time_scale

    def linear_seconds(self, m: int, n: int, k: int, recipe: str, torch_matmul: bool = False,
                       overhead_s: float = 0.0) -> float | None:
        """Forward + backward GPU seconds of an (m x k) @ (k x n) linear layer in ``recipe``:
        its per-call ``overhead_s`` plus its FLOPs at the rate the table's neighbours reach
        once their own overhead is taken off (None where the table has no measurement of
        that recipe)."""
        pts = self._points(recipe, torch_matmul, overhead_s)
        if not pts:
            return None
        rate = _idw((float(m) ** M_WEIGHT, float(n), float(k)), pts)
        seconds = 6.0 * m * n * k / rate + overhead_s
        if not torch_matmul:  # an isolated measurement of the shape bounds its GPU time
            seconds = min(seconds, self._measured_bound(m, n, k, recipe))
        return seconds * self.time_scale

    def _measured_bound(self, m: int, n: int, k: int, recipe: str) -> float:
        """The measured time of this (K, N) at M tokens, interpolated in log M between the
        measured token counts (above the largest: in proportion to M; below the smallest:
        the smallest's time); infinite where the shape was not measured."""
        own = sorted((t.m, t.fwd_bwd_s) for t in self.linears
                     if t.recipe == recipe and t.n == n and t.k == k)
        if not own:
            return math.inf
        if m >= own[-1][0]:
            return own[-1][1] * m / own[-1][0]
        if m <= own[0][0]:
            return own[0][1]
        for (m0, t0), (m1, t1) in zip(own, own[1:], strict=False):
            if m0 <= m <= m1:
                f = math.log(m / m0) / math.log(m1 / m0)
                return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
        return math.inf

    def attention_seconds(self, batch: int, seq: int, heads: int,
                          head_dim: int) -> tuple[float, float] | None:
        """(forward, backward) seconds of causal attention, None without measurements."""
        if not self.attention:
            return None
        flops = 2.0 * batch * seq * seq * heads * head_dim
        q = (float(seq), float(heads), float(head_dim))
        fwd = _idw(q, [((float(a.seq), float(a.heads), float(a.head_dim)), a.rates()[0])
                       for a in self.attention])
        bwd = _idw(q, [((float(a.seq), float(a.heads), float(a.head_dim)), a.rates()[1])
                       for a in self.attention])
        return flops / fwd * self.time_scale, flops / bwd * self.time_scale


def _linear(r: dict[str, Any]) -> LinearTiming | None:
    m = r.get("m", r.get("tokens"))
    if not (m and r.get("in_features") and r.get("out_features") and r.get("fwd_bwd_s")):
        return None
    return LinearTiming(int(m), int(r["out_features"]), int(r["in_features"]), str(r["recipe"]),
                        float(r["fwd_bwd_s"]), r.get("matmul_fwd_s"))


def _attention(r: dict[str, Any]) -> AttentionTiming | None:
    heads = r.get("num_heads", r.get("heads"))
    if not (r.get("seq_length") and r.get("head_dim") and heads):
        return None
    if r.get("fwd_s") and r.get("bwd_s"):
        fwd, bwd = float(r["fwd_s"]), float(r["bwd_s"])
    elif r.get("fwd_bwd_s"):  # parts.py: forward + backward together, split by FLOPs (1 : 2.5)
        fwd, bwd = float(r["fwd_bwd_s"]) / 3.5, float(r["fwd_bwd_s"]) * 2.5 / 3.5
    else:
        return None
    return AttentionTiming(int(r["seq_length"]), int(r["head_dim"]), int(heads),
                           int(r.get("batch_size", 1)), fwd, bwd)


def load(paths: list[Path], gpu: str) -> PartsTable:
    """A table from measurement files: records of either kind are picked out of each
    file's ``"results"`` (records of other kinds, and failed ones, are skipped)."""
    linears: list[LinearTiming] = []
    attention: list[AttentionTiming] = []
    layers: list[LayerTiming] = []
    optimizer: list[OptimizerTiming] = []
    sources = []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        sources.append(f"{Path(path).name} ({doc.get('machine', gpu)}, {doc.get('date', '?')}: "
                       f"{doc.get('command', '')})")
        records = doc.get("results", []) + doc.get("linear", []) + doc.get("attention", [])
        for r in records:
            if r.get("status", "ok") != "ok" or r.get("error"):
                continue
            lin = _linear(r)
            if lin:
                linears.append(lin)
            att = _attention(r)
            if att:
                attention.append(att)
        layers += [LayerTiming(str(r["recipe"]), int(r["layers"]), float(r["fwd_bwd_s"]),
                               str(r.get("block", DEFAULT_BLOCK)))
                   for r in doc.get("layer", []) if r.get("fwd_bwd_s")]
        optimizer += [OptimizerTiming(str(r["op"]), int(r["tensors"]), int(r["elements"]),
                                      float(r["seconds"])) for r in doc.get("optimizer", [])
                      if r.get("seconds")]
    return PartsTable(gpu, "; ".join(sources), tuple(linears), tuple(attention), tuple(layers),
                      tuple(optimizer))


def copy_in_rates(paths: list[Path]) -> dict[str, float] | None:
    """FSDP2's reduce-scatter copy-in on the host, seconds per parameter by unit ("block",
    "root"): the median over the presets of the files' ``copy_in`` records
    (``benchmarks/throughput/parts.py --sections copy_in``); None where a unit has none. The
    throughput model's ``cpu_reduce_copy_s_per_param`` is this of session v12's file."""
    per: dict[str, list[float]] = {"block": [], "root": []}
    for path in paths:
        for r in json.loads(Path(path).read_text()).get("copy_in", []):
            if r.get("unit") in per and r.get("host_s_per_element"):
                per[r["unit"]].append(float(r["host_s_per_element"]))
    if not all(per.values()):
        return None
    return {unit: statistics.median(v) for unit, v in per.items()}


def shipped(gpu: str) -> PartsTable | None:
    """The measured table shipped for ``gpu``: ``planning/measured/<gpu>_parts.json`` (every
    part, benchmarks/throughput/parts.py) where there is one, else its ``<gpu>_*.json``."""
    parts = MEASURED / f"{gpu.lower()}_parts.json"
    paths = [parts] if parts.exists() else sorted(MEASURED.glob(f"{gpu.lower()}_*.json"))
    return load(paths, gpu) if paths else None
