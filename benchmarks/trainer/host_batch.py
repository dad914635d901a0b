"""How long the trainer's synthetic batch takes on the host, by intra-op thread count.

The trainer makes each micro-batch on the host (``trainer/data.py`` ``SyntheticMarkov.batch``:
randint, rand, bucketize, cumsum, index) between GPU steps, while the host otherwise waits on the
GPU. Session v9's profiles (one H100, benchmarks/throughput/README.md) found it took 4.8-21.4 ms
there with PyTorch's pool of one thread per core and 0.15-0.65 ms with one thread. This times it
the same way on any machine: ``--gap-ms`` of sleep between batches stands for the GPU step (the
pool's threads go idle, as they do in training), then one batch is timed; medians, p90 and
maxima per thread count and shape.

    python3 benchmarks/trainer/host_batch.py                        # threads 1 and this machine's cores
    python3 benchmarks/trainer/host_batch.py --threads 1,2,16 --gap-ms 50 --iters 60

No GPU, no network. Each thread count runs in its own process (``torch.set_num_threads`` once,
before any op, as the trainer does).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def measure(threads: int, shapes: list[tuple[int, int]], iters: int, gap_s: float) -> list[dict]:
    """In this process: ``threads`` intra-op threads, then per shape ``iters`` timed batches,
    each after ``gap_s`` idle seconds (3 untimed first)."""
    import torch

    from kfp_sagemaker_blackwell.trainer.data import SyntheticMarkov

    torch.set_num_threads(threads)
    src = SyntheticMarkov(128256, seed=0)  # the 1b/8b presets' vocabulary
    rows = []
    for batch, seq in shapes:
        times = []
        for i in range(iters + 3):
            time.sleep(gap_s)
            t = time.perf_counter()
            src.batch(i, 0, 0, batch, seq)
            if i >= 3:
                times.append((time.perf_counter() - t) * 1e3)
        times.sort()
        rows.append({"threads": threads, "batch_size": batch, "seq_length": seq, "iters": iters,
                     "median_ms": round(statistics.median(times), 3),
                     "p90_ms": round(times[int(0.9 * (len(times) - 1))], 3), "max_ms": round(times[-1], 3)})
    return rows


def _shapes(text: str) -> list[tuple[int, int]]:
    try:
        out = [(int(b), int(s)) for b, s in (x.split("x") for x in text.split(","))]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shapes {text!r}: BATCHxSEQ[,BATCHxSEQ...], e.g. 1x2048,4x4096") from None
    if any(b < 1 or s < 1 for b, s in out):
        raise argparse.ArgumentTypeError(f"--shapes {text!r}: batch and sequence must be >= 1")
    return out


def _threads(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--threads {text!r}: counts separated by commas, e.g. 1,16") from None
    if any(n < 1 for n in out):
        raise argparse.ArgumentTypeError(f"--threads {text!r}: each count must be >= 1")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=_threads, default=[1, os.cpu_count() or 1],
                   help="intra-op thread counts, one process each (default: 1 and this machine's cores)")
    p.add_argument("--shapes", type=_shapes, default=[(1, 2048), (1, 4096), (4, 4096)],
                   help="micro-batch shapes BATCHxSEQ (default 1x2048,1x4096,4x4096)")
    p.add_argument("--iters", type=int, default=40, help="timed batches per shape (default 40)")
    p.add_argument("--gap-ms", type=float, default=20.0,
                   help="idle milliseconds before each batch, standing for the GPU step (default 20)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON, not a table")
    p.add_argument("--one", type=int, default=0, help=argparse.SUPPRESS)  # the child process
    a = p.parse_args(argv)
    if a.iters < 1 or a.gap_ms < 0:
        p.error("--iters must be >= 1 and --gap-ms >= 0")
    if a.one:
        print(json.dumps(measure(a.one, a.shapes, a.iters, a.gap_ms / 1e3)))
        return 0
    rows = []
    for n in a.threads:
        env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
        env.pop("OMP_NUM_THREADS", None)
        cmd = [sys.executable, os.path.abspath(__file__), "--one", str(n), "--iters", str(a.iters),
               "--gap-ms", str(a.gap_ms), "--shapes", ",".join(f"{b}x{s}" for b, s in a.shapes)]
        rows += json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"host: {os.cpu_count()} CPUs; {a.iters} batches per shape, {a.gap_ms:g} ms idle before each")
    print("| threads | batch x seq | median ms | p90 ms | max ms |\n|---:|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['threads']} | {r['batch_size']} x {r['seq_length']} | {r['median_ms']:.2f} | "
              f"{r['p90_ms']:.2f} | {r['max_ms']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
