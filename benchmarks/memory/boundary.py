"""The out-of-memory boundary: increase the batch until the trainer runs out of memory, and
check the planner's largest batch against it (issue 25 item 3; needs one GPU).

For each configuration (six by default: 1b, 3b, a depth-reduced 8b and te-fsdp-example, with
and without activation checkpointing, the trainer's defaults: TE backend, compiled loss, one
GPU) the planner's largest batch at zero headroom is computed for this GPU's memory; the
trainer then runs batches from one below it upward until one runs out of memory (each run in
its own process, ``measure_grid.py``'s harness, so an out-of-memory run leaves nothing
behind). The record says, per configuration, the largest batch that ran and whether the
planner's answer equals it or is one below (the issue's bar; never above).

    python benchmarks/memory/boundary.py --out benchmarks/memory/boundary_h200.json
    python benchmarks/memory/boundary.py --dry-run        # the plan, no GPU
    python benchmarks/memory/compare.py benchmarks/memory/boundary_h200.json   # allocated/reserved
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# (preset, num_layers (None: the preset's), seq_length, activation_checkpointing, precision)
CONFIGURATIONS: tuple[tuple[str, int | None, int, bool, str], ...] = (
    ("1b", None, 2048, False, "bf16"),
    ("1b", None, 4096, True, "bf16"),
    ("3b", None, 2048, False, "fp8"),
    ("3b", None, 4096, True, "bf16"),
    ("8b", 8, 4096, False, "bf16"),
    ("te-fsdp-example", None, 8192, False, "fp8"),
)
# Batches tried above the planner's answer before giving up on finding the boundary.
MAX_ABOVE = 8


def predicted_largest(preset: str, num_layers: int | None, seq: int, ac: bool, precision: str,
                      gpu_memory_bytes: int, gpu: str = "H200") -> int:
    """The planner's largest batch at zero headroom on a GPU of ``gpu_memory_bytes``."""
    from catalog import hardware
    from catalog.spec import preset as get_preset
    from components.memory_estimate import planner

    model = get_preset(preset)
    if num_layers:
        model = model.replace(num_layers=num_layers)
    g = dataclasses.replace(hardware.gpu(gpu), memory_bytes=gpu_memory_bytes)
    req = planner.Request(model, seq, planner.Hardware(g, "", 1, 1), (precision,), (0,),
                          "on" if ac else "off", 0.0, {})
    return planner.largest_batch(req, precision, ac)


def verdict(predicted: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The boundary found by ``runs`` (ascending batches) and the planner's answer against it."""
    ok = [r["batch_size"] for r in runs if r["status"] == "ok"]
    oom = [r["batch_size"] for r in runs if r["status"] == "oom"]
    largest_ok = max(ok) if ok else 0
    found = bool(oom) and min(oom) == largest_ok + 1
    return {"predicted_largest": predicted, "measured_largest": largest_ok if found else None,
            "boundary_found": found,
            "within_bar": found and predicted in (largest_ok - 1, largest_ok),
            "above": found and predicted > largest_ok}


def _one(spec: dict[str, Any]) -> dict[str, Any]:
    """One trainer run in this process (the child of ``_run``)."""
    from benchmarks.memory.measure_grid import measure

    combo = {k: spec[k] for k in ("preset", "precision", "activation_checkpointing", "seq_length",
                                  "batch_size")}
    return measure(combo, spec.get("num_layers"), spec.get("steps", 3))


def _run(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--one", json.dumps(spec)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {**spec, "status": "timeout"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return {**spec, "status": "error", "error": (p.stderr or p.stdout)[-300:]}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("boundary_h200.json"))
    ap.add_argument("--dry-run", action="store_true", help="print the planned runs (no GPU)")
    ap.add_argument("--gpu-memory-bytes", type=int, default=150_109_880_320,
                    help="with --dry-run: the GPU's memory (default: the H200 lent here)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--run-timeout", type=float, default=300.0, help="seconds per trainer run")
    ap.add_argument("--time-budget", type=float, default=1e9, help="seconds: start no run after")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(_one(json.loads(args.one))), flush=True)
        return 0
    if args.dry_run:
        for preset, layers, seq, ac, prec in CONFIGURATIONS:
            b = predicted_largest(preset, layers, seq, ac, prec, args.gpu_memory_bytes)
            print(f"{preset} L{layers or '-'} s{seq} {'ckpt' if ac else 'no-ckpt'} {prec}: "
                  f"planner {b}; runs {max(1, b - 1)}.. until out of memory (at most {b + MAX_ABOVE})")
        return 0
    from benchmarks import gpu_record

    doc = gpu_record.header("python benchmarks/memory/boundary.py " + " ".join(argv or sys.argv[1:]),
                            {"backend": "te", "loss_kernel": "compiled (the trainer's default)",
                             "world_size": 1, "steps": args.steps}, boundaries=[])
    t0 = time.perf_counter()
    for preset, layers, seq, ac, prec in CONFIGURATIONS:
        predicted = predicted_largest(preset, layers, seq, ac, prec, doc["gpu_memory_bytes"])
        runs: list[dict[str, Any]] = []
        for batch in range(max(1, predicted - 1), predicted + MAX_ABOVE + 1):
            if time.perf_counter() - t0 > args.time_budget:
                break
            spec = {"preset": preset, "num_layers": layers, "seq_length": seq,
                    "activation_checkpointing": ac, "precision": prec, "batch_size": batch,
                    "steps": args.steps}
            rec = _run(spec, args.run_timeout)
            rec["loss_kernel"] = "compiled"
            runs.append(rec)
            doc["results"].append(rec)
            print(json.dumps(rec), flush=True)
            if rec["status"] != "ok":
                break
        doc["boundaries"].append({"preset": preset, "num_layers": layers, "seq_length": seq,
                                  "activation_checkpointing": ac, "precision": prec,
                                  **verdict(predicted, runs)})
        print(json.dumps(doc["boundaries"][-1]), flush=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")  # after each: a timeout keeps data
    return 0


if __name__ == "__main__":
    sys.exit(main())
