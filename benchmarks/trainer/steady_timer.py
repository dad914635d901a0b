"""Steady-state timing of a baseline training script in its own process, without editing it.

TE's ``examples/pytorch/fsdp/fsdp.py`` and ``shared/tools/torch_block_baseline.py`` print one
average over all iterations, warm-up included. Differencing a short and a long run does not
cancel the warm-up (the second process reuses the kernel caches the first one filled), so this
wrapper times each iteration inside the one process instead: it registers a global
optimizer-step post-hook (``torch.optim.optimizer.register_optimizer_step_post_hook``) that
synchronises CUDA and records the time after every ``optimizer.step()``, runs the script with
``runpy`` as ``__main__``, and at exit prints the mean of the iterations after ``--warmup`` (the
trainer's own timer likewise synchronises once per step and skips its warm-up steps).

    python3 -m torch.distributed.run --standalone --nproc-per-node 1 steady_timer.py \\
        --warmup 2 --tokens-per-iter 131072 --flops-per-token 10.875e9 --peak-tflops 989 \\
        -- fsdp.py -k 24 -b 16 -s 8192 -i 8 ...

One line per rank 0 process:
    steady_timer script=fsdp.py iters=8 warmup=2 s_per_iter=2.9011 min=2.8990 max=2.9050
    tokens_per_s_per_gpu=45180 tflops_per_gpu=491.3 mfu=0.4968
"""

from __future__ import annotations

import argparse
import atexit
import os
import runpy
import statistics
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--warmup", type=int, default=2, help="iterations left out of the mean (default 2)")
    p.add_argument("--tokens-per-iter", type=float, default=0.0, help="tokens per GPU per iteration")
    p.add_argument("--flops-per-token", type=float, default=0.0, help="model FLOPs per token (6N + attention)")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="dense peak of the GPU for this precision")
    p.add_argument("script", help="the training script, then its arguments after --")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args()

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    stamps: list[float] = []

    def after_step(optimizer, args, kwargs) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())

    register_optimizer_step_post_hook(after_step)
    start = [0.0]

    def report() -> None:
        if os.environ.get("RANK", "0") != "0":
            return
        # Iteration i (1-based) lasts stamps[i-1] - stamps[i-2]; the first one from the start.
        edges = [start[0], *stamps]
        times = [b - e for e, b in zip(edges, edges[1:], strict=False)][a.warmup:]
        name = os.path.basename(a.script)
        if not times:
            print(f"steady_timer script={name} iters={len(stamps)} warmup={a.warmup} s_per_iter=nan "
                  f"(fewer iterations than warm-up + 1)", flush=True)
            return
        mean = statistics.fmean(times)
        line = (f"steady_timer script={name} iters={len(stamps)} warmup={a.warmup} s_per_iter={mean:.4f} "
                f"min={min(times):.4f} max={max(times):.4f}")
        if a.tokens_per_iter:
            tps = a.tokens_per_iter / mean
            line += f" tokens_per_s_per_gpu={tps:.0f}"
            if a.flops_per_token:
                tflops = tps * a.flops_per_token / 1e12
                line += f" tflops_per_gpu={tflops:.1f}"
                if a.peak_tflops:
                    line += f" mfu={tflops / a.peak_tflops:.4f}"
        print(line, flush=True)

    atexit.register(report)
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    sys.argv = [a.script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(a.script)))
    start[0] = time.perf_counter()
    runpy.run_path(a.script, run_name="__main__")


if __name__ == "__main__":
    main()
