"""The parts of a training step, each timed on its own on one GPU (issue 25 item 1).

The throughput model (planning/throughput.py) is to be built from these rather than from
effective constants fitted to whole steps:

- ``linear``: TE ``te.Linear`` forward + backward at the (M, N, K) the presets' blocks and LM
  heads produce (M = tokens per step, 2k..64k), per recipe: benchmarks/throughput/gemms.py's
  ``time_linear``, the same records as h200_gemms.json;
- ``attention``: TE ``DotProductAttention`` (fused, causal, bf16, ``bshd`` as the trainer)
  forward + backward by sequence, heads, KV heads (GQA) and head size of the presets;
- ``layer``: a stack of 1, 4 and 16 tiny blocks of the trainer's own ``TECausalLM`` (hidden 256)
  forward + backward per recipe and block kind (``LAYER_BLOCKS``: the Llama presets' blocks and
  te-fsdp-example's): the slope over depth is the per-layer fixed cost (kernel launches, host
  work), the intercept the per-step one (for delayed scaling, the amax update);
- ``quantisation``: a te.Linear at M=128 tokens per recipe minus the same in bf16, over
  weights of 4M..201M elements: what a recipe adds per weight element and step (the weight's
  casts and transposes; the GEMMs at M=128 are negligible);
- ``optimizer``: ``torch.optim.AdamW(fused=True)`` step over fp32 parameters (the trainer's
  optimizer), ``clip_grad_norm_`` and the fp32 -> bf16 copy (FSDP2's compute copy at world size
  1), over 2^27 elements in 16, 256 and 4096 tensors (per element and per tensor costs).

Every timing is gemms.py's ``cuda_time``: CUDA events around each call, untimed warm-up calls,
the median of the timed ones.

    python3 benchmarks/throughput/parts.py --out parts.json --time-budget 150
    python3 benchmarks/throughput/parts.py --out /dev/null --dry-run     # the plan, no GPU
    python3 benchmarks/throughput/parts.py --out p.json --sections optimizer   # needs no TE
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_record  # noqa: E402
from benchmarks.throughput import gemms  # noqa: E402
from kfp_sagemaker_blackwell.planning.measured_parts import DEFAULT_BLOCK  # noqa: E402

SECTIONS = ("linear", "attention", "layer", "quantisation", "optimizer", "copy_in")
PRESETS = ("small", "1b", "3b", "8b", "14b", "32b", "64b", "te-fsdp-example")
LINEAR_TOKENS = "8192,32768,2048,65536,4096,16384"  # the in-between M last: a short budget cuts those
ATTENTION_SEQS = (1024, 2048, 4096, 8192, 16384)
ATTENTION_TOKENS = 16384  # batch = max(1, this // seq): the same tokens at every sequence
LAYER_DEPTHS = (1, 4, 16)
# The block kinds the presets use (ModelSpec.block_kind -> the ModelSpec fields that make it): the
# Llama presets' and te-fsdp-example's (LayerNorm, GELU, biases, no RoPE). Session v13 found
# te-fsdp-example L12 b2 s2048 host-bound at about 1.5x the Llama blocks' host time per block
# (predicted +25% too fast from the Llama stacks); since then the layer section times both.
LAYER_BLOCKS = {DEFAULT_BLOCK: {},
                "layernorm-gelu-bias-norope": {"norm": "layernorm", "mlp": "gelu", "bias": True, "rotary": False}}
LAYER_TOKENS = 256  # batch 1 x sequence 256
QUANT_WEIGHTS = ((2048, 2048), (4096, 4096), (8192, 8192), (8192, 24576))
QUANT_TOKENS = 128
OPT_ELEMENTS = 2**27
OPT_TENSORS = (16, 256, 4096)
# FSDP2's reduce-scatter copy-in (session v11): the root unit (embedding, LM head when untied,
# final norm) and one block of these presets, bf16 gradients into the fp32 reduce input
COPY_IN_PRESETS = ("1b", "8b", "64b")

SCHEMA = {
    "linear": "gemms.py records: width, preset, layer (qkv|proj|fc1|fc2|lm_head), in_features K, "
              "out_features N, recipe, tokens M, fwd_bwd_s (median), fwd_bwd_tflops (6 M K N / s), "
              "reps; or error. Each distinct (K, N) once; shapes whose bf16 time is estimated above "
              "--max-op-s at an M are left out at that M",
    "attention": "heads, kv_heads, head_dim, seq_length, batch_size, presets (which have the shape), "
                 "fwd_bwd_s (median seconds of forward + backward), flops (attention_flops: "
                 "7 b s^2 H d, causal), fwd_bwd_tflops (flops / fwd_bwd_s), reps",
    "layer": "recipe, layers (depth of the tiny block stack), block (ModelSpec.block_kind; absent "
             "before session v13: rmsnorm-swiglu), tokens, fwd_bwd_s; and per recipe (per "
             "recipe/block for the other kinds) in layer_fit: per_layer_s (least-squares slope over "
             "depth), per_step_s (intercept)",
    "quantisation": "recipe, in_features, out_features, elements (K N), tokens, fwd_bwd_s; and per "
                    "recipe in quantisation_fit: per_element_s (slope of fwd_bwd_s(recipe) - "
                    "fwd_bwd_s(bf16) over elements), intercept_s",
    "optimizer": "op (adamw_fused_step | clip_grad_norm | cast_fp32_to_bf16), tensors, elements "
                 "(total), seconds (median), per_element_s",
    "copy_in": "unit (root | block), preset, tensors, elements, host_s (median wall seconds the "
               "host spends in torch._chunk_cat(bf16 gradients, out=fp32), FSDP2's reduce-scatter "
               "copy-in at world size 1, GPU idle before each call), host_s_per_element",
    "seconds": "wall seconds of each section (sections_s)",
}


def attention_shapes() -> list[dict]:
    """The presets' distinct (heads, KV heads, head size), with the presets that have each."""
    from kfp_sagemaker_blackwell.catalog import spec as spec_mod

    out: dict[tuple, dict] = {}
    for p in PRESETS:
        if p == "small":
            continue
        m = spec_mod.preset(p)
        key = (m.num_heads, m.num_kv_heads, m.head_dim)
        out.setdefault(key, {"heads": key[0], "kv_heads": key[1], "head_dim": key[2], "presets": []})
        out[key]["presets"].append(p)
    return list(out.values())


def attention_flops(b: int, s: int, h: int, d: int) -> float:
    """Causal attention forward + backward: QK^T and PV are 2 x 2 b s^2 h d in full, half of
    it under the causal mask; the backward is 2.5 times the forward (5 GEMMs of that size)."""
    return 3.5 * 2 * b * s * s * h * d


def time_attention(shape: dict, seq: int, target_ms: float) -> dict:
    import torch
    import transformer_engine.pytorch as te

    h, kv, d = shape["heads"], shape["kv_heads"], shape["head_dim"]
    b = max(1, ATTENTION_TOKENS // seq)
    dpa = te.DotProductAttention(h, d, num_gqa_groups=kv, attention_dropout=0.0,
                                 attn_mask_type="causal", qkv_format="bshd")
    q = torch.randn(b, seq, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, seq, kv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, seq, kv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(b, seq, h * d, device="cuda", dtype=torch.bfloat16)

    def once(i: int) -> None:
        out = dpa(q, k, v)
        out.backward(g.view_as(out))
        q.grad = k.grad = v.grad = None

    flops = attention_flops(b, seq, h, d)
    warm, reps = gemms.repetitions(flops / 400e12 + 60e-6, 3, 10, target_ms)
    t = statistics.median(gemms.cuda_time(once, warm, reps))
    return {**shape, "seq_length": seq, "batch_size": b, "fwd_bwd_s": t, "flops": flops,
            "fwd_bwd_tflops": flops / t / 1e12, "reps": reps}


def _autocast_factory(recipe_name: str):
    """As the trainer's te_backend.autocast_factory at world size 1: one recipe object for
    every step (bf16: no autocast)."""
    import contextlib

    import transformer_engine.pytorch as te

    from kfp_sagemaker_blackwell.trainer.precision import te_recipe

    recipe = te_recipe(recipe_name, 1024) if recipe_name != "bf16" else None
    if recipe is None:
        return contextlib.nullcontext
    return lambda: te.autocast(enabled=True, recipe=recipe)


def layer_spec(layers: int, block: str):
    """The tiny block stack's ModelSpec (hidden 256, no vocabulary) of one LAYER_BLOCKS kind."""
    from kfp_sagemaker_blackwell.catalog.spec import ModelSpec

    spec = ModelSpec(layers, 256, 4, 2, 1024, 0, **LAYER_BLOCKS[block])
    assert spec.block_kind == block, (spec.block_kind, block)
    return spec


def time_layers(recipe_name: str, layers: int, block: str = DEFAULT_BLOCK) -> dict:
    """A stack of ``layers`` tiny blocks of the trainer's TECausalLM (bf16 block weights, no
    vocabulary) of one block kind (LAYER_BLOCKS), forward + backward under the recipe."""
    import torch

    from kfp_sagemaker_blackwell.catalog import flags as config
    from kfp_sagemaker_blackwell.trainer import te_backend

    spec = layer_spec(layers, block)
    cfg = config.make(model=spec, precision=recipe_name, backend="te", batch_size=1,
                      seq_length=LAYER_TOKENS, max_steps=1)
    model = te_backend.TECausalLM(cfg, set(), device="cuda")
    model.blocks.to(torch.bfloat16)  # FSDP2's bf16 compute copies; the RoPE buffer stays fp32
    x = torch.randn(1, LAYER_TOKENS, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(1, LAYER_TOKENS, 256, device="cuda", dtype=torch.bfloat16)
    autocast = _autocast_factory(recipe_name)

    def once(i: int) -> None:
        with autocast():
            y = model(x)
        y.backward(g.view_as(y))
        x.grad = None
        for p in model.parameters():
            p.grad = None

    t = statistics.median(gemms.cuda_time(once, 5, 20))
    return {"recipe": recipe_name, "layers": layers, "block": block, "tokens": LAYER_TOKENS,
            "hidden_size": 256, "fwd_bwd_s": t}


def time_quantisation(recipe_name: str, k: int, n: int) -> dict:
    rec = gemms.time_linear({"in_features": k, "out_features": n}, recipe_name, QUANT_TOKENS, 5, 20, False)
    return {"recipe": recipe_name, "in_features": k, "out_features": n, "elements": k * n,
            "tokens": QUANT_TOKENS, "fwd_bwd_s": rec["fwd_bwd_s"]}


def time_optimizer(tensors: int) -> list[dict]:
    import torch

    each = OPT_ELEMENTS // tensors
    ps = [torch.nn.Parameter(torch.randn(each, device="cuda")) for _ in range(tensors)]
    for p in ps:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.1, fused=True)
    out = []
    for op, fn in (("adamw_fused_step", lambda i: opt.step()),
                   ("clip_grad_norm", lambda i: torch.nn.utils.clip_grad_norm_(ps, 1.0)),
                   ("cast_fp32_to_bf16", lambda i: [p.detach().to(torch.bfloat16) for p in ps])):
        t = statistics.median(gemms.cuda_time(fn, 3, 10))
        out.append({"op": op, "tensors": tensors, "elements": each * tensors, "seconds": t,
                    "per_element_s": t / (each * tensors)})
    return out


def copy_in_shapes(preset: str) -> dict[str, list[tuple[int, ...]]]:
    """The gradient shapes of one FSDP2 unit of ``preset``: the root (embedding, the LM head when
    untied, the final norm) and one block (fused QKV, output projection, MLP, norms)."""
    from kfp_sagemaker_blackwell.catalog import spec as spec_mod

    m = spec_mod.preset(preset)
    h, kv, f = m.hidden_size, m.kv_dim, m.ffn_hidden_size
    root: list[tuple[int, ...]] = [(m.vocab_size, h)] * (1 if m.tie_embeddings else 2) + [(h,)]
    fc1 = 2 * f if m.mlp == "swiglu" else f
    block: list[tuple[int, ...]] = [(h + 2 * kv, h), (h, h), (fc1, h), (h, f)]
    block += [(h,)] * (2 * (2 if m.norm == "layernorm" else 1))
    return {"root": root, "block": block}


def time_copy_in(preset: str, unit: str, reps: int = 7) -> dict:
    """The host's seconds in FSDP2's reduce-scatter copy-in of one unit: torch._chunk_cat builds
    its kernel's metadata on the CPU before its one launch (the GPU idles meanwhile when it is
    the backward's last host work)."""
    import torch

    shapes = copy_in_shapes(preset)[unit]
    grads = [torch.randn(sh, device="cuda", dtype=torch.bfloat16) for sh in shapes]
    elements = sum(g.numel() for g in grads)
    out = torch.empty(elements, device="cuda", dtype=torch.float32).view(1, -1)
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch._chunk_cat(grads, 0, 1, out=out)
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    host = statistics.median(times[2:])
    return {"unit": unit, "preset": preset, "tensors": len(grads), "elements": elements,
            "host_s": host, "host_s_per_element": host / elements}


def line_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of ys over xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return slope, my - slope * mx


def layer_fit(records: list[dict]) -> dict:
    """Per recipe (the Llama blocks) and per "recipe/block kind" (the others): the slope and
    intercept over depth."""
    out = {}
    for r, k in {(x["recipe"], x.get("block", DEFAULT_BLOCK)) for x in records if "fwd_bwd_s" in x}:
        pts = [(x["layers"], x["fwd_bwd_s"]) for x in records
               if x["recipe"] == r and x.get("block", DEFAULT_BLOCK) == k and "fwd_bwd_s" in x]
        if len(pts) >= 2:
            slope, icpt = line_fit([p[0] for p in pts], [p[1] for p in pts])
            out[r if k == DEFAULT_BLOCK else f"{r}/{k}"] = {"per_layer_s": slope, "per_step_s": icpt}
    return out


def quantisation_fit(records: list[dict]) -> dict:
    base = {x["elements"]: x["fwd_bwd_s"] for x in records if x["recipe"] == "bf16" and "fwd_bwd_s" in x}
    out = {}
    for r in {x["recipe"] for x in records if x["recipe"] != "bf16" and "fwd_bwd_s" in x}:
        pts = [(x["elements"], x["fwd_bwd_s"] - base[x["elements"]]) for x in records
               if x["recipe"] == r and "fwd_bwd_s" in x and x["elements"] in base]
        if len(pts) >= 2:
            slope, icpt = line_fit([p[0] for p in pts], [p[1] for p in pts])
            out[r] = {"per_element_s": slope, "intercept_s": icpt}
    return out


def plan(sections: list[str]) -> list[tuple[str, str, object]]:
    """(section, label, thunk) in running order: the small fixed-cost parts first, the linear
    timings (the longest) last, so that a short budget cuts those."""
    items: list[tuple[str, str, object]] = []
    recipes = gemms.RECIPES
    if "layer" in sections:
        items += [("layer", f"{r} L{n} {k}", lambda r=r, n=n, k=k: [time_layers(r, n, k)])
                  for k in LAYER_BLOCKS for r in recipes for n in LAYER_DEPTHS]
    if "quantisation" in sections:
        items += [("quantisation", f"{r} {k}x{n}", lambda r=r, k=k, n=n: [time_quantisation(r, k, n)])
                  for k, n in QUANT_WEIGHTS for r in recipes]
    if "optimizer" in sections:
        items += [("optimizer", f"{t} tensors", lambda t=t: time_optimizer(t)) for t in OPT_TENSORS]
    if "copy_in" in sections:
        items += [("copy_in", f"{unit} {p}", lambda p=p, unit=unit: [time_copy_in(p, unit)])
                  for p in COPY_IN_PRESETS for unit in ("block", "root")]
    if "attention" in sections:
        items += [("attention", f"h{a['heads']} kv{a['kv_heads']} d{a['head_dim']} s{s}",
                   lambda a=a, s=s: [time_attention(a, s, 20)])
                  for a in attention_shapes() for s in ATTENTION_SEQS]
    return items


def linear_args(tokens: str, max_op_s: float) -> argparse.Namespace:
    """gemms.py's arguments for the preset shapes (the ``linear`` section)."""
    ap = argparse.ArgumentParser()
    gemms.add_arguments(ap)
    return ap.parse_args(["--presets", ",".join(PRESETS), "--tokens", tokens, "--target-ms", "20",
                          "--warmup", "3", "--reps", "10", "--max-op-s", str(max_op_s), "--skip-matmul"])


def write(doc: dict, paths: list[str]) -> None:
    doc["layer_fit"] = layer_fit(doc["layer"])
    doc["quantisation_fit"] = quantisation_fit(doc["quantisation"])
    gpu_record.write(doc, paths)


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, action="append", help="results file (repeat to write copies)")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    ap.add_argument("--linear-tokens", default=LINEAR_TOKENS, help="M values of the linear section")
    ap.add_argument("--max-op-s", type=float, default=0.12,
                    help="linear section: leave out timings whose bf16 time is estimated above this")
    ap.add_argument("--time-budget", type=float, default=1e9,
                    help="seconds: start nothing after this (the file is written after every timing)")
    ap.add_argument("--dry-run", action="store_true", help="the plan and its expected seconds; no GPU")
    args = ap.parse_args(argv)
    bad = set(args.sections.split(",")) - set(SECTIONS)
    if bad:
        ap.error(f"--sections: unknown {', '.join(sorted(bad))}; choose from {', '.join(SECTIONS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    sections = args.sections.split(",")
    items = plan(sections)
    lin = linear_args(args.linear_tokens, args.max_op_s)
    linear = gemms.todo(lin) if "linear" in sections else []
    if args.dry_run:
        for sec, label, _ in items:
            print(sec, label)
        print(f"{len(items)} part timings (about {0.4 * len(items):.0f} s) + {len(linear)} linear "
              f"timings (about {gemms.planned_seconds(linear, lin):.0f} s)")
        return 0
    from benchmarks import gpu_record

    command = "python3 benchmarks/throughput/parts.py " + " ".join(argv if argv is not None else sys.argv[1:])
    doc = {"command": command, **gpu_record.machine(), "what": (__doc__ or "").strip().splitlines()[0],
           "schema": SCHEMA, "sections_s": {}, **{s: [] for s in SECTIONS}}
    t0 = time.perf_counter()
    for sec, label, thunk in items:
        if time.perf_counter() - t0 > args.time_budget:
            print(f"time budget reached before {sec} {label}", flush=True)
            break
        t1 = time.perf_counter()
        try:
            recs = thunk()  # type: ignore[operator]
        except Exception as exc:  # noqa: BLE001 - a part TE refuses is recorded, not fatal
            recs = [{"label": label, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}]
        _release()
        doc[sec] += recs
        doc["sections_s"][sec] = doc["sections_s"].get(sec, 0.0) + time.perf_counter() - t1
        print(sec, json.dumps(recs), flush=True)
        write(doc, args.out)
    if linear:
        t1 = time.perf_counter()
        gemms.run(linear, lin, doc, args.out, args.time_budget - (t1 - t0), key="linear")
        doc["sections_s"]["linear"] = time.perf_counter() - t1
    write(doc, args.out)
    return 0


def _release() -> None:
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
