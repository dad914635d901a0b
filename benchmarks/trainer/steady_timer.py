"""Steady-state timing of a baseline training script in its own process, without editing it.

TE's ``examples/pytorch/fsdp/fsdp.py`` and ``shared/tools/torch_block_baseline.py`` print one
average over all iterations, warm-up included. Differencing a short and a long run does not
cancel the warm-up (the second process reuses the kernel caches the first one filled), so this
wrapper times each iteration inside the one process instead: it registers a global
optimizer-step post-hook (``torch.optim.optimizer.register_optimizer_step_post_hook``) that
synchronises CUDA and records the time after every ``optimizer.step()``, runs the script with
``runpy`` as ``__main__``, and at exit prints the mean, median, p90 and every time of the
iterations after ``--warmup`` (the trainer's own timer likewise synchronises once per step and
skips its warm-up steps); tokens/s, TFLOP/s and MFU are of the median iteration.

    python3 -m torch.distributed.run --standalone --nproc-per-node 1 steady_timer.py \\
        --warmup 2 --tokens-per-iter 131072 --flops-per-token 10.875e9 --peak-tflops 989 \\
        -- fsdp.py -k 24 -b 16 -s 8192 -i 8 ...

``-m MODULE`` runs a module instead of a script (``-m kfp_sagemaker_blackwell.trainer`` for the trainer, so that every
figure of a comparison comes from this one timer). ``--profile-iters A:B`` also records a
``torch.profiler`` trace of iterations A+1..B (1-based, after warm-up) and prints where the GPU
time goes: one ``steady_profile`` JSON line with the share of each kernel category (GEMM,
attention, normalisation, FP8 cast/transpose, elementwise, NCCL/copies, optimizer, other), the GPU
busy fraction of the wall time, and the top kernels; ``--profile-out F`` writes the same JSON to F.

One line per rank 0 process:
    steady_timer script=fsdp.py iters=8 warmup=2 s_per_iter=2.9011 min=2.8990 max=2.9050
    median=2.9008 p90=2.9041 times=2.9010,... tokens_per_s_per_gpu=45180 tflops_per_gpu=491.3 mfu=0.4968
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import runpy
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_names import kernel_category  # noqa: E402  (one kernel-name table, beside this file)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--warmup", type=int, default=2, help="iterations left out of the mean (default 2)")
    p.add_argument("--tokens-per-iter", type=float, default=0.0, help="tokens per GPU per iteration")
    p.add_argument("--flops-per-token", type=float, default=0.0, help="model FLOPs per token (6N + attention)")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="dense peak of the GPU for this precision")
    p.add_argument("--profile-iters", default="", metavar="A:B",
                   help="profile iterations A+1..B (e.g. 3:6) and print a kernel-time breakdown")
    p.add_argument("--profile-out", default="", help="also write the breakdown JSON here")
    p.add_argument("--profile-trace", default="", help="also write the profiled window's Chrome trace here "
                   "(benchmarks/trainer/profile_step.py reads it)")
    p.add_argument("-m", dest="module", default="", help="run this module (like python -m) instead of a script")
    p.add_argument("script", nargs="?", default="", help="the training script, then its arguments after --")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args()

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    stamps: list[float] = []
    window = _window(a.profile_iters)
    prof: list = []

    def after_step(optimizer, args, kwargs) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())
        if window and len(stamps) == window[0]:
            prof.append(_start_profiler())
        elif window and len(stamps) == window[1] and prof:
            prof[0].stop()
            wall = stamps[window[1] - 1] - stamps[window[0] - 1]
            summary = breakdown(prof[0], wall, window[1] - window[0])
            if a.profile_trace and os.environ.get("RANK", "0") == "0":
                prof[0].export_chrome_trace(a.profile_trace)
                print(f"steady_trace path={a.profile_trace} wall_s={wall:.6f} iters={window[1] - window[0]}",
                      flush=True)
            summary["script"] = a.module or os.path.basename(a.script)
            if os.environ.get("RANK", "0") == "0":
                print("steady_profile " + json.dumps(summary), flush=True)
                if a.profile_out:
                    with open(a.profile_out, "w") as fh:
                        json.dump(summary, fh, indent=1)

    register_optimizer_step_post_hook(after_step)
    start = [0.0]

    def report() -> None:
        if os.environ.get("RANK", "0") != "0":
            return
        # Iteration i (1-based) lasts stamps[i-1] - stamps[i-2]; the first one from the start.
        edges = [start[0], *stamps]
        times = [b - e for e, b in zip(edges, edges[1:], strict=False)][a.warmup:]
        name = a.module or os.path.basename(a.script)
        if not times:
            print(f"steady_timer script={name} iters={len(stamps)} warmup={a.warmup} s_per_iter=nan "
                  f"(fewer iterations than warm-up + 1)", flush=True)
            return
        mean = statistics.fmean(times)
        median = statistics.median(times)
        line = (f"steady_timer script={name} iters={len(stamps)} warmup={a.warmup} s_per_iter={mean:.4f} "
                f"min={min(times):.4f} max={max(times):.4f} median={median:.4f} p90={_p90(times):.4f} "
                f"times={','.join(f'{t:.4f}' for t in times)}")
        if a.tokens_per_iter:
            tps = a.tokens_per_iter / median  # the median iteration: one stall does not move it
            line += f" tokens_per_s_per_gpu={tps:.0f}"
            if a.flops_per_token:
                tflops = tps * a.flops_per_token / 1e12
                line += f" tflops_per_gpu={tflops:.1f}"
                if a.peak_tflops:
                    line += f" mfu={tflops / a.peak_tflops:.4f}"
        print(line, flush=True)

    atexit.register(report)
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    if a.module:
        if a.script:
            args = [a.script, *args]
        sys.argv = [a.module, *args]
        start[0] = time.perf_counter()
        runpy.run_module(a.module, run_name="__main__", alter_sys=True)
        return
    if not a.script:
        p.error("give a script or -m MODULE")
    sys.argv = [a.script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(a.script)))
    start[0] = time.perf_counter()
    runpy.run_path(a.script, run_name="__main__")


def _p90(times: list[float]) -> float:
    ordered = sorted(times)
    pos = 0.9 * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _window(text: str) -> tuple[int, int] | None:
    if not text:
        return None
    first, _, last = text.partition(":")
    lo, hi = int(first), int(last)
    if not 0 < lo < hi:
        raise SystemExit(f"--profile-iters {text!r}: need A:B with 0 < A < B (iterations, 1-based)")
    return lo, hi


def _start_profiler():
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=False)
    prof.start()
    return prof


CROSS_ENTROPY = re.compile(r"SoftMax|log_softmax|nll_loss|cross_entropy", re.I)

# Ranges that torch.optim and FSDP1 annotate (they carry the device time of what they enclose).
ANNOTATION = re.compile(r"^(Optimizer\.|FullyShardedDataParallel\.|FSDP::|ProfilerStep|## )")


def category(name: str) -> str:
    """profile_step.py's kernel categories, plus the cross-entropy by kernel name (this
    timer sees no CPU ranges)."""
    if CROSS_ENTROPY.search(name):
        return "loss"
    return kernel_category(name)


def breakdown(prof, wall_s: float, iters: int) -> dict:
    """Kernel time per category (ms per iteration and share of kernel time), the GPU busy
    fraction (kernel time summed over streams / wall time: above 1 means streams overlapped)
    and the 12 kernels with the most time."""
    kernels: dict[str, float] = {}
    for evt in prof.key_averages():
        t = getattr(evt, "self_device_time_total", None)
        if t is None:
            t = getattr(evt, "self_cuda_time_total", 0.0)
        if getattr(evt, "is_user_annotation", False) or ANNOTATION.match(evt.key):
            continue  # a record_function range drawn on the GPU timeline, not a kernel
        if t and getattr(evt, "device_type", None) is not None and "CUDA" in str(evt.device_type):
            kernels[evt.key] = kernels.get(evt.key, 0.0) + t
    total_us = sum(kernels.values())
    per_cat: dict[str, float] = {}
    for name, t in kernels.items():
        per_cat[category(name)] = per_cat.get(category(name), 0.0) + t
    ms = 1e-3 / max(1, iters)
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:12]
    return {
        "iters": iters, "wall_ms_per_iter": round(wall_s * 1e3 / max(1, iters), 2),
        "kernel_ms_per_iter": round(total_us * ms, 2),
        "gpu_busy_fraction": round(total_us * 1e-6 / wall_s, 4) if wall_s > 0 else None,
        "ms_per_iter": {k: round(v * ms, 2) for k, v in sorted(per_cat.items(), key=lambda kv: -kv[1])},
        "share": {k: round(v / total_us, 4) for k, v in sorted(per_cat.items(), key=lambda kv: -kv[1])} if total_us else {},
        "top_kernels": [{"name": n[:160], "category": category(n), "ms_per_iter": round(t * ms, 2)} for n, t in top],
    }


if __name__ == "__main__":
    main()
