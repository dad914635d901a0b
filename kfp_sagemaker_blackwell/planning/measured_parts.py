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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MEASURED = Path(__file__).with_name("measured")
# How many measured neighbours an interpolation weighs.
NEIGHBOURS = 4


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
    # every time multiplied by this (1.0 as measured; the model's "no dead constants" check
    # and sensitivity studies scale it)
    time_scale: float = 1.0
    _index: dict[tuple[str, bool, float], list[tuple[tuple[float, ...], float]]] = field(
        default_factory=dict, compare=False, repr=False)

    def __mul__(self, factor: float) -> PartsTable:
        return self.scaled(factor)

    def scaled(self, factor: float) -> PartsTable:
        return PartsTable(self.gpu, self.source, self.linears, self.attention,
                          self.time_scale * factor)

    def _points(self, recipe: str, torch_matmul: bool,
                overhead_s: float) -> list[tuple[tuple[float, ...], float]]:
        key = (recipe, torch_matmul, overhead_s)
        if key not in self._index:
            if len(self._index) > 256:
                self._index.clear()
            pts: list[tuple[tuple[float, ...], float]] = []
            for t in self.linears:
                if t.recipe == recipe:
                    r = t.rate(torch_matmul, overhead_s)
                    if r:
                        pts.append(((float(t.m), float(t.n), float(t.k)), r))
            self._index[key] = pts
        return self._index[key]

    def recipes(self) -> set[str]:
        return {t.recipe for t in self.linears}

    def linear_seconds(self, m: int, n: int, k: int, recipe: str, torch_matmul: bool = False,
                       overhead_s: float = 0.0) -> float | None:
        """Forward + backward GPU seconds of an (m x k) @ (k x n) linear layer in ``recipe``:
        its per-call ``overhead_s`` plus its FLOPs at the rate the table's neighbours reach
        once their own overhead is taken off (None where the table has no measurement of
        that recipe)."""
        pts = self._points(recipe, torch_matmul, overhead_s)
        if not pts:
            return None
        rate = _idw((float(m), float(n), float(k)), pts)
        return (6.0 * m * n * k / rate + overhead_s) * self.time_scale

    def attention_seconds(self, batch: int, seq: int, heads: int,
                          head_dim: int) -> tuple[float, float] | None:
        """(forward, backward) seconds of causal attention, None without measurements."""
        if not self.attention:
            return None
        flops = 2.0 * batch * seq * seq * heads * head_dim
        fwd = _idw((float(seq), float(head_dim)),
                   [((float(a.seq), float(a.head_dim)), a.rates()[0]) for a in self.attention])
        bwd = _idw((float(seq), float(head_dim)),
                   [((float(a.seq), float(a.head_dim)), a.rates()[1]) for a in self.attention])
        return flops / fwd * self.time_scale, flops / bwd * self.time_scale


def _linear(r: dict[str, Any]) -> LinearTiming | None:
    m = r.get("m", r.get("tokens"))
    if not (m and r.get("in_features") and r.get("out_features") and r.get("fwd_bwd_s")):
        return None
    return LinearTiming(int(m), int(r["out_features"]), int(r["in_features"]), str(r["recipe"]),
                        float(r["fwd_bwd_s"]), r.get("matmul_fwd_s"))


def _attention(r: dict[str, Any]) -> AttentionTiming | None:
    keys = ("seq_length", "head_dim", "num_heads", "fwd_s", "bwd_s")
    if not all(r.get(k) for k in keys):
        return None
    return AttentionTiming(int(r["seq_length"]), int(r["head_dim"]), int(r["num_heads"]),
                           int(r.get("batch_size", 1)), float(r["fwd_s"]), float(r["bwd_s"]))


def load(paths: list[Path], gpu: str) -> PartsTable:
    """A table from measurement files: records of either kind are picked out of each
    file's ``"results"`` (records of other kinds, and failed ones, are skipped)."""
    linears: list[LinearTiming] = []
    attention: list[AttentionTiming] = []
    sources = []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        sources.append(f"{Path(path).name} ({doc.get('machine', gpu)}, {doc.get('date', '?')}: "
                       f"{doc.get('command', '')})")
        for r in doc.get("results", []):
            if r.get("status", "ok") != "ok":
                continue
            lin = _linear(r)
            if lin:
                linears.append(lin)
            att = _attention(r)
            if att:
                attention.append(att)
    return PartsTable(gpu, "; ".join(sources), tuple(linears), tuple(attention))


def shipped(gpu: str) -> PartsTable | None:
    """The measured table shipped for ``gpu`` (``planning/measured/<gpu>_*.json``), if any."""
    paths = sorted(MEASURED.glob(f"{gpu.lower()}_*.json"))
    return load(paths, gpu) if paths else None
