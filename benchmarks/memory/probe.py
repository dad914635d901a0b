"""Measures the per-tensor constants of the memory estimator on a CUDA GPU.

The estimator (planning/estimator.py) adds up tensors; this
probe measures the pieces it cannot take from a formula, one at a time, with
``torch.cuda.memory_allocated`` / ``max_memory_allocated`` and
``torch.cuda.mem_get_info``:

- ``context``: device memory held outside the caching allocator (CUDA context,
  loaded cuBLAS / flash-attention kernels), before and after NCCL initialisation;
- ``loss``: bytes per logit element of ``F.cross_entropy(logits.float(), t)`` (the
  trainer's loss) at the forward and backward peaks, with the logits held;
- ``block``: bytes per token one trainer block (``kfp_sagemaker_blackwell.trainer.model.Block``, 16-bit
  parameters as FSDP2's MixedPrecisionPolicy gives them) saves for backward, and
  the extra transient peak of its backward, with and without checkpointing;
- ``adamw``: transient bytes of a fused AdamW step.

Usage (one GPU): ``python benchmarks/memory/probe.py --out probe.json``; the NCCL part
alone on two GPUs: ``torchrun --nproc-per-node 2 benchmarks/memory/probe.py --out x.json``.
Results are recorded in benchmarks/memory/probe_h200.json and README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

MiB = 2**20


def _reset() -> int:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def context() -> dict:
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16, requires_grad=True)
    (a @ a).sum().backward()  # cuBLAS
    q = torch.randn(2, 8, 1024, 128, device=dev, dtype=torch.bfloat16, requires_grad=True)
    F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()  # flash
    torch.cuda.synchronize()
    del a, q
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    out = {"total_bytes": total, "non_allocator_bytes": total - free - torch.cuda.memory_reserved()}
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    x = torch.ones(64 * MiB, device=dev)
    dist.all_reduce(x)
    y = torch.empty(64 * MiB * world, device=dev)
    dist.all_gather_into_tensor(y, x)
    dist.reduce_scatter_tensor(x, y)
    torch.cuda.synchronize()
    del x, y
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    out[f"non_allocator_bytes_with_nccl_{world}_rank{'s' if world > 1 else ''}"] = (
        total - free - torch.cuda.memory_reserved()
    )
    dist.destroy_process_group()
    return out


def loss(tokens: int = 8192, vocab: int = 128256) -> dict:
    dev = torch.device("cuda")
    targets = torch.randint(0, vocab, (tokens,), device=dev)
    out = torch.randn(tokens, vocab, device=dev, dtype=torch.bfloat16, requires_grad=True)
    n = tokens * vocab
    base = _reset()
    lo = F.cross_entropy(out.float(), targets)
    fwd_peak = torch.cuda.max_memory_allocated() - base
    after_fwd = torch.cuda.memory_allocated() - base
    base2 = _reset()
    lo.backward()
    bwd_peak = torch.cuda.max_memory_allocated() - base2 + after_fwd
    return {
        "tokens": tokens,
        "vocab": vocab,
        "forward_peak_bytes_per_logit": fwd_peak / n,
        "held_after_forward_bytes_per_logit": after_fwd / n,
        "backward_peak_bytes_per_logit_above_held_logits": bwd_peak / n,
        "note": "bf16 logits (2 B/elt, held by the caller) not included",
    }


def block(preset: str, batch: int, seq: int, checkpoint: bool) -> dict:
    from kfp_sagemaker_blackwell.catalog.spec import preset as get_preset
    from kfp_sagemaker_blackwell.trainer import emulation
    from kfp_sagemaker_blackwell.trainer.model import Block, rotary_tables

    spec = get_preset(preset)
    dev = torch.device("cuda")
    numerics = emulation.numerics_for("bf16")
    blk = Block(spec, numerics).to(device=dev, dtype=torch.bfloat16)
    rope = rotary_tables(seq, spec.head_dim, spec.rope_theta, dev) if spec.rotary else None
    x = torch.randn(batch, seq, spec.hidden_size, device=dev, dtype=torch.bfloat16,
                    requires_grad=True)
    tokens = batch * seq

    def fwd():
        if checkpoint:
            from torch.utils.checkpoint import checkpoint as ckpt

            return ckpt(blk, x, rope, use_reentrant=False)
        return blk(x, rope)

    base = _reset()
    y = fwd()
    fwd_peak = torch.cuda.max_memory_allocated() - base
    out_bytes = y.numel() * y.element_size()
    saved = torch.cuda.memory_allocated() - base - out_bytes
    g = torch.randn_like(y)
    base2 = _reset()
    y.backward(g)
    bwd_peak = torch.cuda.max_memory_allocated() - base2
    return {
        "preset": preset,
        "batch_size": batch,
        "seq_length": seq,
        "activation_checkpointing": checkpoint,
        "saved_bytes_per_token": saved / tokens,
        "forward_transient_peak_bytes_per_token": (fwd_peak - saved - out_bytes) / tokens,
        "backward_peak_above_start_bytes_per_token": bwd_peak / tokens,
        "block_params": sum(p.numel() for p in blk.parameters()),
        "linear_emulated": True,
    }


def adamw() -> dict:
    dev = torch.device("cuda")
    params = [torch.nn.Parameter(torch.randn(4096, 4096, device=dev)) for _ in range(16)]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()  # creates the states
    base = _reset()
    opt.step()
    n = sum(p.numel() for p in params)
    return {"params": n, "step_transient_bytes_per_param": (torch.cuda.max_memory_allocated() - base) / n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    t0 = time.time()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun: only the NCCL context
        ctx = context()
        if int(os.environ.get("RANK", "0")) == 0:
            args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(),
                                            "torch": torch.__version__, "context": ctx}) + "\n")
            print(json.dumps(ctx))
        return 0
    res: dict = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "command": "python benchmarks/memory/probe.py --out probe.json",
    }
    res["context"] = context()
    res["loss"] = loss()
    res["adamw"] = adamw()
    res["blocks"] = [
        block("1b", 4, 2048, False),
        block("1b", 4, 2048, True),
        block("te-fsdp-example", 2, 4096, False),
        block("8b", 2, 2048, False),
    ]
    res["elapsed_s"] = round(time.time() - t0, 1)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
