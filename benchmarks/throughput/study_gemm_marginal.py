"""A study of session v21 (issue 36), not the shipped model: the block GEMMs priced at each
te.Linear shape's marginal rate instead of its isolated timings' rate.

``parts.py`` times each te.Linear forward + backward alone, CUDA events around each call: the
host's issue time before and between the call's kernels is inside every timing. The shipped
model (``PartsTable.linear_seconds``) reads rates from those timings where they are at least
``GPU_BOUND`` times the host's per-call time; a host-bound timing just above that floor
(H100, te-fsdp-example's fused QKV at 2,048 tokens: 1.06 ms, 146 TFLOP/s) then sets the rate of
the same shape at 4,096 tokens. The variant here prices each shape at its marginal rate (the
FLOPs between its two largest measured token counts over the time between them: what the GPU
adds per token once the call's fixed cost is paid), the same at every token count, and leaves
the rest of the model as shipped. Run any ``model_accuracy.py`` command through it:

    python benchmarks/throughput/study_gemm_marginal.py --profile \\
        benchmarks/trainer/raw/session_v21_h100/profile_shapes.json --gpu H100
    python benchmarks/throughput/study_gemm_marginal.py --union-lofo \\
        --union-out benchmarks/throughput/raw/lofo_all_h200_gemm_marginal.json
    python benchmarks/throughput/study_gemm_marginal.py --session \\
        benchmarks/throughput/raw/session_v21_h100 --session-out /tmp/v21_marginal.json

Session v21's verdict (benchmarks/throughput/README.md): the profiled GEMM kernels agree
better (te-fsdp-example L12 b2 s2048 bf16 on the H100: 16.2 ms measured, 25.8 shipped, 15.5
here), the whole model held out does not (H200 union leave-one-family-out worst 24.9% ->
28.6%, fp8/bf16 speed-up median 0.021 -> 0.033), so nothing of it ships.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any

from kfp_sagemaker_blackwell.planning import measured_parts as mp

ISOLATED = mp.PartsTable.linear_seconds


def marginal_rates(table: mp.PartsTable, recipe: str) -> list[tuple[tuple[float, ...], float]]:
    """((N, K), FLOP/s) per te.Linear shape of ``recipe`` timed at two or more token counts: 6 N K
    FLOPs per token over the time per token between its two largest token counts."""
    by_shape: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for t in table.linears:
        if t.recipe == recipe:
            by_shape.setdefault((t.n, t.k), []).append((t.m, t.fwd_bwd_s))
    out: list[tuple[tuple[float, ...], float]] = []
    for (n, k), pts in sorted(by_shape.items()):
        (m1, t1), (m2, t2) = sorted(pts)[-2:] if len(pts) >= 2 else ((0, 0.0), (0, 0.0))
        if m2 > m1 and t2 > t1:
            out.append(((float(n), float(k)), 6.0 * n * k * (m2 - m1) / (t2 - t1)))
    return out


def linear_seconds(self: mp.PartsTable, m: int, n: int, k: int, recipe: str,
                   torch_matmul: bool = False, overhead_s: float = 0.0) -> Any:
    """The variant's te.Linear GPU seconds (the torch backend's plain matmuls as shipped)."""
    if torch_matmul:
        return ISOLATED(self, m, n, k, recipe, torch_matmul, overhead_s)
    rates = marginal_rates(self, recipe)
    if not rates:
        return None
    return 6.0 * m * n * k / mp._idw((float(n), float(k)), rates) * self.time_scale


def main(argv: list[str]) -> None:
    mp.PartsTable.linear_seconds = linear_seconds  # type: ignore[method-assign]
    script = Path(__file__).with_name("model_accuracy.py")
    sys.argv = [str(script), *argv]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
