"""Direct timings of the model's linear layers: TE ``te.Linear`` forward + backward, bf16 vs FP8 recipes.

For every width of benchmarks/throughput/measure.py's grid and each of its linear shapes
(fused QKV, attention output, MLP up (gated: 2 x FFN), MLP down, LM head), one
``te.Linear(in, out, bias=False, params_dtype=bf16)`` runs forward + backward on M tokens
inside ``te.autocast`` with each recipe (bf16: autocast disabled). That is the three GEMMs of
training (fprop, dgrad, wgrad: 6 M K N FLOPs) plus, for FP8, the recipe's quantisation work
(amax, scaling, casts, transposes), which is what the trainer pays per linear. Also a plain
``torch.matmul`` bf16 forward GEMM (2 M K N) as the library ceiling. Timed with CUDA events
(``cuda_time``, which benchmarks/throughput/parts.py shares): ``--warmup`` untimed repetitions,
then the median of ``--reps``; inputs rotate among 3 sets (1 when a set exceeds 1 GiB).
``--presets`` takes the shapes of whole presets instead of the grid's widths (each distinct
(K, N) once); ``--target-ms`` caps the repetitions of long timings (at least 3 are kept).

    python3 benchmarks/throughput/gemms.py --out gemms.json
    python3 benchmarks/throughput/gemms.py --out /dev/null --dry-run
    python3 benchmarks/throughput/gemms.py --out g.json --presets 1b,8b --tokens 2048,65536 --target-ms 40
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

RECIPES = ("bf16", "fp8", "fp8-current", "fp8-block")


def preset_shapes(preset: str, width: str | None = None) -> list[dict]:
    """The linear layers of one preset's block and its LM head: (in_features K, out_features N)."""
    from kfp_sagemaker_blackwell.catalog import spec as spec_mod

    m = spec_mod.preset(preset)
    h, kv, f = m.hidden_size, m.kv_dim, m.ffn_hidden_size
    up = 2 * f if m.mlp == "swiglu" else f
    out = []
    for name, k, n in (("qkv", h, h + 2 * kv), ("proj", h, h), ("fc1", h, up), ("fc2", f, h),
                       ("lm_head", h, m.vocab_size)):
        if n:
            out.append({"width": width or f"w{h}", "preset": preset, "layer": name, "in_features": k,
                        "out_features": n})
    return out


def shapes(widths: list[str]) -> list[dict]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from measure import SHAPES

    return [s for w in widths for s in preset_shapes(SHAPES[w][0], w)]


def distinct_shapes(presets: list[str]) -> list[dict]:
    """The presets' linear shapes, each (K, N) once (the first preset that has it names it)."""
    seen: set[tuple[int, int]] = set()
    out = []
    for p in presets:
        for s in preset_shapes(p):
            if (s["in_features"], s["out_features"]) not in seen:
                seen.add((s["in_features"], s["out_features"]))
                out.append(s)
    return out


def estimated_seconds(k: int, n: int, tokens: int, recipe: str) -> float:
    """A rough H200 time of one te.Linear forward + backward (for --dry-run and repetition
    counts): 6 M K N at 450 TFLOP/s in bf16, 650 in FP8 (h200_gemms.json's 8k-token rates),
    plus 60 us of launches."""
    return 6 * tokens * k * n / (450e12 if recipe == "bf16" else 650e12) + 60e-6


def repetitions(est_s: float, warmup: int, reps: int, target_ms: float) -> tuple[int, int]:
    """(warm-up, timed) repetitions: at most ``target_ms`` of timed work, at least 3 timed."""
    if target_ms <= 0:
        return warmup, reps
    timed = max(3, min(reps, int(target_ms / 1e3 / est_s)))
    return min(warmup, max(1, timed // 2)), timed


def cuda_time(fn, warmup: int, reps: int) -> list[float]:
    """Seconds of each of ``reps`` calls ``fn(i)`` after ``warmup`` untimed ones (CUDA events
    around each call, synchronised on the end event)."""
    import torch

    for i in range(warmup):
        fn(i)
    times = []
    for i in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(i)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return times


def time_linear(shape: dict, recipe_name: str, tokens: int, warmup: int, reps: int, matmul_too: bool = True) -> dict:
    import torch
    import transformer_engine.pytorch as te

    from kfp_sagemaker_blackwell.trainer.precision import te_recipe

    k, n = shape["in_features"], shape["out_features"]
    sets = 3 if tokens * (k + n) * 2 <= 2**30 else 1
    lin = te.Linear(k, n, bias=False, params_dtype=torch.bfloat16, device="cuda")
    xs = [torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(sets)]
    gs = [torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    recipe = te_recipe(recipe_name, 1024) if recipe_name != "bf16" else None

    def once(i: int) -> None:
        with te.autocast(enabled=recipe is not None, recipe=recipe):
            y = lin(xs[i % sets])
        y.backward(gs[i % sets])
        xs[i % sets].grad = lin.weight.grad = None  # each step's gradients are fresh

    def matmul(i: int) -> None:
        torch.matmul(xs[i % sets].detach(), lin.weight.detach().t())

    t = cuda_time(once, warmup, reps)
    rec = {**shape, "recipe": recipe_name, "tokens": tokens, "fwd_bwd_s": statistics.median(t),
           "fwd_bwd_tflops": 6 * tokens * k * n / statistics.median(t) / 1e12, "reps": reps}
    if recipe_name == "bf16" and matmul_too:
        tm = cuda_time(matmul, warmup, reps)
        rec.update(matmul_fwd_s=statistics.median(tm), matmul_fwd_tflops=2 * tokens * k * n / statistics.median(tm) / 1e12)
    return rec  # the layer and its inputs are freed with this frame


def todo(args: argparse.Namespace) -> list[tuple[dict, str, int]]:
    """(shape, recipe, tokens) timings the arguments ask for, in that order per token count."""
    recipes = args.recipes.split(",")
    bad = set(recipes) - set(RECIPES)
    if bad:
        raise SystemExit(f"--recipes: unknown {', '.join(sorted(bad))}; choose from {', '.join(RECIPES)}")
    sh = distinct_shapes(args.presets.split(",")) if args.presets else shapes(args.widths.split(","))
    items = [(s, r, int(m)) for m in args.tokens.split(",") for s in sh for r in recipes]
    return [(s, r, m) for s, r, m in items
            if estimated_seconds(s["in_features"], s["out_features"], m, "bf16") <= args.max_op_s]


def planned_seconds(items: list[tuple[dict, str, int]], args: argparse.Namespace) -> float:
    """The expected GPU seconds of ``items`` (estimated_seconds x repetitions, matmul included)."""
    total = 0.0
    for s, r, m in items:
        est = estimated_seconds(s["in_features"], s["out_features"], m, r)
        w, n = repetitions(est, args.warmup, args.reps, args.target_ms)
        total += (w + n) * est * (1.4 if r == "bf16" and not args.skip_matmul else 1.0) + 0.02  # + set-up
    return total


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--widths", default="w2048,w4096,w8192", help="measure.py SHAPES widths (default)")
    ap.add_argument("--presets", default="", help="comma-separated presets: their shapes instead of --widths")
    ap.add_argument("--tokens", default="8192", help="comma-separated M values (tokens per GPU step)")
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--target-ms", type=float, default=0.0,
                    help="at most this many ms of timed repetitions per timing (0: always --reps)")
    ap.add_argument("--max-op-s", type=float, default=1e9,
                    help="leave out shapes whose bf16 forward + backward is estimated above this many "
                         "seconds (large GEMMs at large M: efficiency has flattened by then)")
    ap.add_argument("--skip-matmul", action="store_true", help="no plain torch.matmul ceiling for bf16")


def run(items: list[tuple[dict, str, int]], args: argparse.Namespace, doc: dict, paths: list[str],
        budget_s: float, key: str = "results") -> None:
    """Times ``items`` into doc[key], writing ``paths`` after each; stops after ``budget_s``."""
    import torch

    t0 = time.perf_counter()
    for s, r, m in items:
        if time.perf_counter() - t0 > budget_s:
            print("time budget reached", flush=True)
            break
        w, n = repetitions(estimated_seconds(s["in_features"], s["out_features"], m, r), args.warmup,
                           args.reps, args.target_ms)
        try:
            rec = time_linear(s, r, m, w, n, not args.skip_matmul)
        except Exception as exc:  # noqa: BLE001 - a recipe TE refuses is recorded, not fatal
            rec = {**s, "recipe": r, "tokens": m, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        torch.cuda.empty_cache()
        doc[key].append(rec)
        print(json.dumps({k: (round(v, 5) if isinstance(v, float) else v) for k, v in rec.items()}), flush=True)
        for p in paths:
            Path(p).write_text(json.dumps(doc, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, action="append")
    add_arguments(ap)
    ap.add_argument("--time-budget", type=float, default=1e9)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    items = todo(args)
    if args.dry_run:
        for s, r, m in items:
            print(s["width"], s["layer"], s["in_features"], s["out_features"], r, m)
        print(f"{len(items)} timings, about {planned_seconds(items, args):.0f} s")
        return 0
    import torch
    import transformer_engine

    doc = {"command": "python3 benchmarks/throughput/gemms.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": torch.cuda.get_device_properties(0).name, "date": datetime.date.today().isoformat(),
           "torch": torch.__version__, "transformer_engine": transformer_engine.__version__,
           "what": (__doc__ or "").strip().splitlines()[0], "results": []}
    run(items, args, doc, args.out, args.time_budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
