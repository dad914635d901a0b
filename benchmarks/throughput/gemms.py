"""Direct timings of the model's linear layers: TE ``te.Linear`` forward + backward, bf16 vs FP8 recipes.

For every width of benchmarks/throughput/measure.py's grid and each of its linear shapes
(fused QKV, attention output, MLP up (gated: 2 x FFN), MLP down, LM head), one
``te.Linear(in, out, bias=False, params_dtype=bf16)`` runs forward + backward on M tokens
inside ``te.autocast`` with each recipe (bf16: autocast disabled). That is the three GEMMs of
training (fprop, dgrad, wgrad: 6 M K N FLOPs) plus, for FP8, the recipe's quantisation work
(amax, scaling, casts, transposes), which is what the trainer pays per linear. Also a plain
``torch.matmul`` bf16 forward GEMM (2 M K N) as the library ceiling. Timed with CUDA events:
``--warmup`` untimed repetitions, then the median of ``--reps``; inputs rotate among 3 sets.

    python3 benchmarks/throughput/gemms.py --out gemms.json
    python3 benchmarks/throughput/gemms.py --out /dev/null --dry-run
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


def shapes(widths: list[str]) -> list[dict]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from measure import SHAPES

    from kfp_sagemaker_blackwell.catalog import spec as spec_mod

    out = []
    for w in widths:
        preset, _ = SHAPES[w]
        m = spec_mod.preset(preset)
        h, kv, f = m.hidden_size, m.kv_dim, m.ffn_hidden_size
        up = 2 * f if m.mlp == "swiglu" else f
        for name, k, n in (("qkv", h, h + 2 * kv), ("proj", h, h), ("fc1", h, up), ("fc2", f, h),
                           ("lm_head", h, m.vocab_size)):
            if n:
                out.append({"width": w, "preset": preset, "layer": name, "in_features": k, "out_features": n})
    return out


def time_linear(shape: dict, recipe_name: str, tokens: int, warmup: int, reps: int) -> dict:
    import torch
    import transformer_engine.pytorch as te

    from kfp_sagemaker_blackwell.trainer.precision import te_recipe

    k, n = shape["in_features"], shape["out_features"]
    lin = te.Linear(k, n, bias=False, params_dtype=torch.bfloat16, device="cuda")
    xs = [torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    gs = [torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    recipe = te_recipe(recipe_name, 1024) if recipe_name != "bf16" else None

    def once(i: int) -> None:
        with te.autocast(enabled=recipe is not None, recipe=recipe):
            y = lin(xs[i % 3])
        y.backward(gs[i % 3])

    def matmul(i: int) -> None:
        torch.matmul(xs[i % 3].detach(), lin.weight.detach().t())

    def timed(fn) -> list[float]:
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

    t = timed(once)
    rec = {**shape, "recipe": recipe_name, "tokens": tokens, "fwd_bwd_s": statistics.median(t),
           "fwd_bwd_tflops": 6 * tokens * k * n / statistics.median(t) / 1e12}
    if recipe_name == "bf16":
        tm = timed(matmul)
        rec.update(matmul_fwd_s=statistics.median(tm), matmul_fwd_tflops=2 * tokens * k * n / statistics.median(tm) / 1e12)
    return rec  # the layer and its inputs are freed with this frame


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, action="append")
    ap.add_argument("--widths", default="w2048,w4096,w8192")
    ap.add_argument("--tokens", default="8192", help="comma-separated M values (tokens per GPU step)")
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--time-budget", type=float, default=1e9)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    recipes = args.recipes.split(",")
    bad = set(recipes) - set(RECIPES)
    if bad:
        ap.error(f"--recipes: unknown {', '.join(sorted(bad))}; choose from {', '.join(RECIPES)}")
    todo = [(s, r, int(m)) for m in args.tokens.split(",") for s in shapes(args.widths.split(",")) for r in recipes]
    if args.dry_run:
        for s, r, m in todo:
            print(s["width"], s["layer"], s["in_features"], s["out_features"], r, m)
        print(f"{len(todo)} timings")
        return 0
    import torch
    import transformer_engine

    doc = {"command": "python3 benchmarks/throughput/gemms.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": torch.cuda.get_device_properties(0).name, "date": datetime.date.today().isoformat(),
           "torch": torch.__version__, "transformer_engine": transformer_engine.__version__,
           "what": __doc__.strip().splitlines()[0], "results": []}
    t0 = time.perf_counter()
    for s, r, m in todo:
        if time.perf_counter() - t0 > args.time_budget:
            print("time budget reached", flush=True)
            break
        try:
            rec = time_linear(s, r, m, args.warmup, args.reps)
        except Exception as exc:  # noqa: BLE001 - a recipe TE refuses is recorded, not fatal
            rec = {**s, "recipe": r, "tokens": m, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        torch.cuda.empty_cache()
        doc["results"].append(rec)
        print(json.dumps({k: (round(v, 5) if isinstance(v, float) else v) for k, v in rec.items()}), flush=True)
        for p in args.out:
            Path(p).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
