"""Log parsing speed: lines per second on one core, for realistic training logs.

    .venv/bin/python benchmarks/parse_logs/bench.py                 # default mixes
    .venv/bin/python benchmarks/parse_logs/bench.py --lines 2000000 --step-fraction 0.25

Generates a deterministic synthetic SageMaker training log (seeded) of
``--lines`` lines: a start-up block (torchrun, NCCL INFO, TE's fsdp.py lines,
the trainer's config/recipe/world/data lines), then the training phase where a
fraction of the lines are the trainer's step lines and the rest is noise of the
kinds real jobs print (NCCL INFO from all ranks, torch/TE UserWarnings with
their continuation lines, rank-prefixed lines, tqdm progress bars with carriage
returns, SageMaker toolkit lines, the odd non-UTF-8 byte), checkpoints, and at
the end a traceback with a CUDA OOM and the summary. It writes the log to a
temporary file and times ``kfp_sagemaker_blackwell.components.parse_logs.launcher.parse_file`` on it
(read + parse + series + events, the work ``parse_logs`` does before writing
its outputs), best of ``--repeat`` runs, single process, single thread.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kfp_sagemaker_blackwell.catalog import logformat as lf  # noqa: E402
from kfp_sagemaker_blackwell.components.parse_logs.launcher import parse_file  # noqa: E402

NOISE = [
    "[default{r}]:algo-1:{pid}:{pid} [{r}] NCCL INFO Channel {c:02d}/0 : {r}[{r}] -> {n}[{n}] via P2P/CUMEM/read",
    "[default{r}]:algo-1:{pid}:{tid} [{r}] NCCL INFO Connected all rings, use ring PXN 0 GDR 1",
    "[default{r}]:/usr/local/lib/python3.12/site-packages/transformer_engine/pytorch/module/base.py:{c}: UserWarning: Quantized weights were not cached; recomputing FP8 transpose",
    "[default{r}]:  warnings.warn(",
    "W1129 12:{c:02d}:07.{pid} {tid} torch/distributed/run.py:793] Setting OMP_NUM_THREADS environment variable for each process to be 1 in default",
    "2026-11-29 12:{c:02d}:00,123 sagemaker-training-toolkit INFO     Reporting training SUCCESS",
    "[default{r}]:[rank{r}]:[W1129 12:00:{c:02d}.{pid} ProcessGroupNCCL.cpp:4715] [PG ID 0 PG GUID 0 Rank {r}] using GPU {r} as device used by this process is currently unknown.",
    "Training:  {c}%|\u2588\u2588\u2588\u258c      | {pid}/{tid} [00:{c:02d}<01:00, 3.21it/s]\rTraining:  {c}%|\u2588\u2588\u2588\u258c      | {pid}/{tid} [00:{c:02d}<01:00, 3.22it/s]",
    "[default{r}]:{{'loss_scale': 65536.0, 'grad_norm': 0.{pid}, 'samples/s': {tid}.5}}",
    "",
]
STARTUP = [
    "Invoking script with the following command: /bin/sh -c ./train.sh",
    "[GPU-0] WORLD_SIZE = 8",
    "[GPU-0] Using precision preset: fp8",
    "[GPU-0] Training configuration: dtype=torch.bfloat16, FP8=enabled",
    "[GPU-0] Using FP8 recipe: DelayedScaling",
    "[GPU-0] Pre-FSDP memory use = 3221.225472MiB",
    "[GPU-0] Post-FSDP memory use = 402.653184MiB",
]
ENDING = [
    "[default3]:Traceback (most recent call last):",
    '[default3]:  File "/opt/ml/code/trainer/train.py", line 371, in _run',
    "[default3]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 "
    "has a total capacity of 178.35 GiB of which 1.06 GiB is free.",
    "[GPU-0] Training Time: 812.5s",
    "[GPU-0] Avg. Iter. Time: 0.8125s",
    "[GPU-0] Peak Memory Use: 81234.5MBs",
]


def make_log(lines: int, step_fraction: float, seed: int = 0) -> bytes:
    rng = random.Random(seed)
    out: list[str] = list(STARTUP)
    out.append(lf.format_json("config", {"seed": 1234, "batch_size": 8, "seq_length": 2048,
                                         "grad_accum_steps": 1, "precision": "fp8"}))
    out.append(lf.format_recipe(lf.RecipeRecord("fp8", "DelayedScaling", "te", False)))
    out.append(lf.format_json("world", {"world_size": 8, "gpu": "NVIDIA B200"}))
    out.append(lf.format_json("data", {"source": "synthetic", "entropy_floor": 1.149}))
    step = 0
    body = lines - len(out) - len(ENDING) - 1
    for _ in range(body):
        if rng.random() < step_fraction:
            step += 1
            loss = 1.2 + 9.0 * math.exp(-step / 5000) + rng.gauss(0, 0.01)
            out.append("[default0]:" + lf.format_step(lf.StepRecord(
                step, loss, 3e-4, 0.9 + rng.random() * 0.1, 1.31e6 + rng.random() * 1e4,
                1.64e5 + rng.random() * 1e3, 1830.0 + rng.random() * 10, 0.4071, 81.234,
                90.0, "fp8", False)))
            if step % 1000 == 0:
                out.append(lf.format_json("checkpoint", {"action": "saved", "step": step,
                                                         "path": f"/opt/ml/checkpoints/{step}"}))
        else:
            r = rng.randrange(8)
            out.append(rng.choice(NOISE).format(r=r, n=(r + 1) % 8, c=rng.randrange(60),
                                                pid=rng.randrange(10**5), tid=rng.randrange(10**4)))
    out += ENDING
    out.append(lf.format_json("summary", {"status": "completed", "steps": step,
                                          "precision": "fp8", "tokens": step * 131072}))
    data = ("\n".join(out) + "\n").encode()
    # a few non-UTF-8 bytes, as a crashed process's binary garbage would leave
    return data.replace(b"NCCL INFO Connected", b"NCCL INFO \xff\xfeConnected", 3)


def bench(lines: int, step_fraction: float, repeat: int) -> dict[str, float]:
    data = make_log(lines, step_fraction)
    with tempfile.NamedTemporaryFile(suffix=".log", delete=False) as f:
        f.write(data)
        path = f.name
    try:
        best = math.inf
        parsed = None
        for _ in range(repeat):
            t0 = time.perf_counter()
            parsed = parse_file(path)
            best = min(best, time.perf_counter() - t0)
        assert parsed is not None
        n_lines = parsed.stats["lines"]
        return {"lines": n_lines, "MB": len(data) / 1e6, "step_lines": parsed.steps,
                "seconds": best, "lines_per_s": n_lines / best, "MB_per_s": len(data) / 1e6 / best,
                "oom_events": parsed.event_counts.get("oom", 0)}
    finally:
        os.unlink(path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=1_000_000)
    p.add_argument("--step-fraction", type=float, action="append",
                   help="fraction of step lines (repeatable; default 0.1, 0.25, 0.5, 1.0)")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    fractions = args.step_fraction or [0.1, 0.25, 0.5, 1.0]
    print(f"python {platform.python_version()} on {platform.machine()}, "
          f"{os.cpu_count()} CPUs visible; one process, one thread; best of {args.repeat}")
    print(f"{'step lines':>10} {'lines':>10} {'MB':>7} {'seconds':>8} {'lines/s':>11} {'MB/s':>7}")
    for frac in fractions:
        r = bench(args.lines, frac, args.repeat)
        print(f"{frac:>10.0%} {r['lines']:>10,} {r['MB']:>7.1f} {r['seconds']:>8.3f} "
              f"{r['lines_per_s']:>11,.0f} {r['MB_per_s']:>7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
