"""Collect the torch-backend step times already measured on an H200 into one results file.

    python benchmarks/throughput/torch_runs.py    # writes h200_torch_runs.json beside this file

The torch backend (plain torch.nn blocks, F.scaled_dot_product_attention) has no grid of its
own; its committed timings are the trainer's torch-backend runs in
``benchmarks/trainer/raw/like_for_like_h200.json`` and ``issue26_like_for_like_h200.json``
(te-fsdp-example, bf16, steady steps: the median over repeats is kept) and the boundary
search of ``benchmarks/memory/boundary_h200_torch.json`` (one steady step after one warm-up
per batch: noisier; every batch that ran). The output has h200_grid.json's record fields
(``model``, ``preset``, ``batch_size``, ``seq_length``, ``activation_checkpointing``,
``precision``, ``backend``, ``world_size``, ``status``, ``tokens_per_s_per_gpu``,
``loss_kernel``) and each record's ``source``.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kfp_sagemaker_blackwell.catalog.spec import preset  # noqa: E402

OUT = Path(__file__).with_name("h200_torch_runs.json")
TRAINER = ROOT / "benchmarks" / "trainer" / "raw"
BOUNDARY = ROOT / "benchmarks" / "memory" / "boundary_h200_torch.json"
# like_for_like keys of the trainer's torch backend: (batch, activation checkpointing)
LIKE_FOR_LIKE = {"b8-noac/trainer-torch/bf16": (8, False), "b16-ac/trainer-torch/bf16": (16, True)}


def _record(name: str, preset_name: str, model: dict, batch: int, seq: int, ac: bool,
            tokens_per_s: float, loss_kernel: str, source: str) -> dict:
    return {"name": name, "preset": preset_name, "model": model, "batch_size": batch,
            "seq_length": seq, "activation_checkpointing": ac, "precision": "bf16",
            "backend": "torch", "world_size": 1, "status": "ok",
            "tokens_per_s_per_gpu": tokens_per_s, "loss_kernel": loss_kernel, "source": source}


def like_for_like() -> list[dict]:
    seen: dict[str, list[float]] = {}
    for f in ("like_for_like_h200.json", "issue26_like_for_like_h200.json"):
        doc = json.loads((TRAINER / f).read_text())
        for key, run in doc.items():
            base = key.split("#")[0]
            if base in LIKE_FOR_LIKE and run.get("rc") == 0 and run.get("tokens_per_s"):
                seen.setdefault(base, []).append(float(run["tokens_per_s"]))
    model = dataclasses.asdict(preset("te-fsdp-example"))
    out = []
    for key, tps in sorted(seen.items()):
        batch, ac = LIKE_FOR_LIKE[key]
        out.append(_record(f"torch-te-fsdp-example-b{batch}-s8192-{'ac' if ac else 'noac'}-bf16",
                           "te-fsdp-example", model, batch, 8192, ac, statistics.median(tps),
                           "eager", f"benchmarks/trainer/raw like_for_like: {key}, median of "
                           f"{len(tps)} runs ({', '.join(f'{t:,.0f}' for t in tps)} tokens/s)"))
    return out


def boundary() -> list[dict]:
    doc = json.loads(BOUNDARY.read_text())
    out = []
    for r in doc["results"]:
        if r.get("status") != "ok" or not r.get("step_s"):
            continue
        tokens = r["batch_size"] * r["seq_length"]
        out.append(_record(
            f"torch-{r['preset']}-b{r['batch_size']}-s{r['seq_length']}-"
            f"{'ac' if r['activation_checkpointing'] else 'noac'}-bf16", r["preset"], r["model"],
            r["batch_size"], r["seq_length"], bool(r["activation_checkpointing"]),
            tokens / r["step_s"], r.get("loss_kernel", "compiled"),
            f"benchmarks/memory/boundary_h200_torch.json: step_s {r['step_s']} (steps {r['steps']})"))
    return out


def main() -> int:
    doc = {"what": "the torch backend's H200 step times, collected by "
                   "benchmarks/throughput/torch_runs.py from the committed raw results",
           "gpu": "H200", "machine": "1x NVIDIA H200 (lent GPU machine, Firecracker VM)",
           "results": like_for_like() + boundary()}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    for r in doc["results"]:
        print(r["name"], f"{r['tokens_per_s_per_gpu']:,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
