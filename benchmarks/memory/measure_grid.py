"""Measure the trainer's peak GPU memory over a grid of configurations (one process per world size).

Writes the data the memory estimator is checked against (benchmarks/memory/h200_grid.json):
for each configuration, ``kfp_sagemaker_blackwell.trainer.train.run`` trains a few steps and the peak of
``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` over those steps is recorded
(status "oom" when it ran out of memory). Model, optimizer and caches are freed between
configurations (the trainer drops its references; gc + empty_cache here), and the peak counters
are reset at the start of each run.

    # one GPU
    python benchmarks/memory/measure_grid.py --out grid_w1.json
    # two GPUs (FSDP2 across them)
    torchrun --nproc-per-node 2 benchmarks/memory/measure_grid.py --out grid_w2.json
    # merge the per-world-size files into the committed document
    python benchmarks/memory/measure_grid.py --merge grid_w1.json grid_w2.json --out benchmarks/memory/h200_grid.json
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_record  # noqa: E402
from benchmarks.gpu_record import failed, released  # noqa: E402

TRAINER_SETTINGS = {
    "param_dtype": "fp32 master, bf16 compute (FSDP2 MixedPrecisionPolicy)",
    "optimizer": "AdamW fp32 states",
    "optimizer_impl": "torch.optim.AdamW(fused=True), two moments per parameter, fp32",
    "reduce_dtype": "fp32 (gradients reduce-scattered in fp32)",
    "fsdp": "FSDP2 fully_shard per transformer block and at the root; reshard_after_forward=True "
            "except the last block; no CPU offload",
    "activation_checkpointing": "per block: te.distributed.checkpoint on the TE backend "
                                "(torch.utils.checkpoint non-reentrant on the torch backend)",
    "logits": "LM head output (bf16) upcast to fp32 for the cross-entropy, full vocabulary, not chunked",
    "lm_head": "high precision (bf16) even for FP8 recipes (--high-precision-lm-head default)",
    "te_layers": "te.TransformerLayer(fuse_qkv_params=True, attn_input_format='bshd'), fused attention, "
                 "RMSNorm, SwiGLU; rotary embeddings",
    "fp8_weights": "no quantized_model_init: FP8 copies of weights are made inside te.autocast "
                   "(DelayedScaling, amax history 1024)",
    "steps_measured": 3,
    "data": "synthetic token ids (CPU-generated, copied per step)",
}


def grid(models: list[str], precisions: list[str], batches: list[int], seqs: list[int]) -> list[dict]:
    combos = []
    for model, prec, ac, seq, batch in itertools.product(models, precisions, (True, False), seqs, batches):
        combos.append({"preset": model, "precision": prec, "activation_checkpointing": ac,
                       "seq_length": seq, "batch_size": batch})
    # Interleave so that a time-boxed run still covers every model/precision/checkpointing mix.
    combos.sort(key=lambda c: (c["batch_size"] * c["seq_length"], c["preset"], c["precision"],
                               not c["activation_checkpointing"]))
    return combos


def measure(combo: dict, num_layers: int | None, steps: int) -> dict:
    import torch

    from kfp_sagemaker_blackwell.catalog import flags as config
    from kfp_sagemaker_blackwell.trainer import train

    overrides = {"num_layers": num_layers} if num_layers else {}
    backend = combo.get("backend", "te")
    cfg = config.make(combo["preset"], precision=combo["precision"], backend=backend,
                      batch_size=combo["batch_size"], seq_length=combo["seq_length"],
                      activation_checkpointing=combo["activation_checkpointing"], max_steps=steps,
                      log_every=steps, timing_warmup_steps=1, save_model=False, **overrides)
    gpu_record.fresh_compile_state()  # the compiled loss of this shape, not eager after 8 shapes
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    record = {"model": cfg.model.to_dict(), "preset": combo["preset"], "precision": combo["precision"],
              "backend": backend, "batch_size": combo["batch_size"], "seq_length": combo["seq_length"],
              "activation_checkpointing": combo["activation_checkpointing"],
              "world_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1}
    t0 = time.perf_counter()
    try:
        summary = train.run(cfg, log_out=io.StringIO())
        record.update(status="ok", peak_allocated_bytes=int(summary["peak_allocated_bytes"]),
                      peak_reserved_bytes=int(summary["peak_reserved_bytes"]),
                      step_s=summary.get("steady_state_step_s"))
    except train.TrainingFailed as exc:
        failed(record, exc)
        del exc
    return released(record, t0)


def header(command: str) -> dict:
    return gpu_record.header(command, TRAINER_SETTINGS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="1b,3b")
    ap.add_argument("--precisions", default="bf16,fp8")
    ap.add_argument("--batches", default="1,2,4")
    ap.add_argument("--seqs", default="2048,4096")
    ap.add_argument("--num-layers", type=int, default=None, help="override the presets' depth")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--time-budget", type=float, default=1e9, help="seconds: start no config after this")
    ap.add_argument("--merge", nargs="*", help="merge these per-world-size files into --out")
    args = ap.parse_args()
    if args.merge:
        docs = [json.loads(Path(p).read_text()) for p in args.merge]
        out = docs[0]
        out["command"] = " ; ".join(d["command"] for d in docs)
        out["machine"] = docs[-1]["machine"]
        out["results"] = [r for d in docs for r in d["results"]]
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        return 0

    import datetime as _dt

    import torch
    import torch.distributed as dist

    if "RANK" in os.environ and not dist.is_initialized():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("cpu:gloo,cuda:nccl", timeout=_dt.timedelta(seconds=120))
    rank = dist.get_rank() if dist.is_initialized() else 0
    ws = os.environ.get("WORLD_SIZE", "1")
    command = f"torchrun --nproc-per-node {ws} " if "RANK" in os.environ else "python "
    command += "benchmarks/memory/measure_grid.py " + " ".join(sys.argv[1:])
    doc = header(command)
    combos = grid(args.models.split(","), args.precisions.split(","),
                  [int(b) for b in args.batches.split(",")], [int(s) for s in args.seqs.split(",")])
    t_start = time.perf_counter()
    for i, combo in enumerate(combos):
        over = torch.tensor([1.0 if time.perf_counter() - t_start > args.time_budget else 0.0], device="cuda")
        if dist.is_initialized():  # every rank stops at the same configuration
            dist.broadcast(over, 0)
        if over.item() > 0:
            if rank == 0:
                print(f"time budget reached after {i} of {len(combos)} configurations", flush=True)
            break
        rec = measure(combo, args.num_layers, args.steps)
        if rank == 0:
            doc["results"].append(rec)
            print(json.dumps(rec), flush=True)
            Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")  # after each: a timeout keeps data
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
