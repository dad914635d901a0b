"""Peak GPU memory of TransformerEngine's examples/pytorch/fsdp/fsdp.py (FSDP1) over a grid, world size 1.

fsdp.py prints "Peak Memory Use: <torch.cuda.max_memory_allocated() * 1e-6>MBs" after its
iterations (the counter is reset after the model is built and FSDP-wrapped, so the sharded
parameters are in it). This script runs it unmodified (the path is given with --script; keep it
outside the repository, e.g. .baselines/fsdp.py from NVIDIA/TransformerEngine) over issue 18's
grid and stores benchmarks/memory/fsdp1_h200_grid.json with the exact command.

Memory is per process, so several fsdp.py processes run at once on the one GPU, packed by the
memory estimator's FSDP1 prediction (times --pack-margin) into --gpu-budget-gib. A run that
runs out of memory while others ran beside it is recorded as "oom_shared" and re-run alone at
the end (time permitting); one that runs out alone is "oom".

Each fsdp.py process runs under this script's --child mode, which (1) for the recipes fsdp.py
cannot select (fp8-current, fp8-block, fp8 attention) wraps ``te.autocast`` to pass that recipe
instead of fsdp.py's DelayedScaling, (2) records memory and a CUDA-synchronised time stamp after
every ``optimizer.step()`` (a global post-hook, as benchmarks/trainer/steady_timer.py), and (3)
prints one ``FSDP1_CHILD {json}`` line at exit. fsdp.py's own code is not changed.

    python3 benchmarks/memory/measure_fsdp1.py --script .baselines/fsdp.py --out grid.json --time-budget 500
    python3 benchmarks/memory/measure_fsdp1.py --script .baselines/fsdp.py --out /dev/null --dry-run
    # one process by hand (what the grid runs):
    python3 benchmarks/memory/measure_fsdp1.py --child --recipe fp8-current -- .baselines/fsdp.py -k 10 ...
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import runpy
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_record import machine  # noqa: E402

# fsdp.py's block: -n 16 heads x -d 128 = hidden 2048, TransformerLayer FFN 3 x hidden, LayerNorm,
# GELU, biases, dropout 0.1 (TE defaults): the te-fsdp-example preset (catalog/spec.py).
HEADS, HEAD_DIM = 16, 128
PRECISION_ARGS = {
    "bf16": ["--dtype", "bf16", "--no-fp8"],
    "fp16": ["--precision", "fp16"],
    "fp8": ["--precision", "fp8"],  # DelayedScaling(HYBRID, amax_history_len=32, "max")
    "fp8-current": ["--precision", "fp8"],  # recipe swapped by --child --recipe fp8-current
    "fp8-block": ["--precision", "fp8"],  # recipe swapped by --child --recipe fp8-block
}
AC_ARGS = {
    "off": [],  # prepare_te_modules_for_fsdp(model)
    "ckpt": ["--checkpoint-layer", "transformerlayer"],  # apply_fsdp_checkpointing, te.distributed.checkpoint
    "off-no-te-fsdp": ["--no-te-fsdp"],  # neither
}
CHILD_RECIPES = ("none", "fp8-current", "fp8-block", "fp8-dpa", "fp8-dpa-mha")
FIELDS = ("layers", "batch_size", "seq_length", "precision", "ac")
TAG = "FSDP1_CHILD "


# ---------------------------------------------------------------------------
# The grid
# ---------------------------------------------------------------------------

def _point(split, layers, batch, seq, prec, ac, heads=HEADS, head_dim=HEAD_DIM) -> dict:
    width = "" if (heads, head_dim) == (HEADS, HEAD_DIM) else f"-h{heads}x{head_dim}"
    p = {"name": f"{split[:3]}-L{layers}{width}-b{batch}-s{seq}-{ac}-{prec}", "split": split, "layers": layers,
         "batch_size": batch, "seq_length": seq, "precision": prec, "ac": ac}
    if width:  # only points off fsdp.py's default width carry these (older records have none)
        p.update(num_heads=heads, head_dim=head_dim)
    return p


def calibration() -> list[dict]:
    """5 precisions x checkpointing on/off x 4 sizes = 40 points."""
    sizes = ((24, 4, 4096), (10, 1, 8192), (10, 8, 2048), (24, 16, 2048))
    return [_point("calibration", L, b, s, prec, ac)
            for (L, b, s) in sizes for prec in PRECISION_ARGS for ac in ("off", "ckpt")]


def validation() -> list[dict]:
    """16 points at sizes outside the calibration set, every precision and all three paths."""
    v = [
        (24, 1, 8192, "fp8", "off"), (24, 1, 8192, "bf16", "ckpt"), (24, 1, 2048, "fp8-current", "ckpt"),
        (24, 8, 8192, "fp8", "ckpt"), (24, 16, 8192, "bf16", "ckpt"), (24, 16, 8192, "fp8-block", "ckpt"),
        (24, 8, 4096, "bf16", "off"), (24, 8, 4096, "fp8-current", "off"), (10, 16, 4096, "fp16", "off"),
        (10, 4, 8192, "fp8-block", "off"), (10, 1, 2048, "bf16", "ckpt"), (10, 16, 8192, "fp16", "ckpt"),
        (24, 4, 8192, "fp8", "off"), (10, 4, 4096, "bf16", "off-no-te-fsdp"),
        (24, 4, 2048, "fp8", "off-no-te-fsdp"), (24, 1, 4096, "fp8-block", "ckpt"),
    ]
    return [_point("validation", *p) for p in v]


def heldout() -> list[dict]:
    """Issue 36 item 5: families neither grid has, measured in one session with the trainer's
    parts: widths 1024 / 3072 / 4096 and head size 64 (fsdp.py's -n / -d; its FFN is 3 x hidden),
    depths 4-32, sequences 1024 and 16384, batches 1-32, checkpointing on and off, bf16 and
    the FP8 recipes. Sized for an 80 GB H100 as well as the H200 (predicted <= 50 GiB)."""
    v = [
        (16, 4, 4096, "bf16", "off", 24, 128), (16, 4, 4096, "fp8", "ckpt", 24, 128),
        (16, 2, 8192, "fp8-block", "ckpt", 24, 128), (8, 2, 8192, "bf16", "ckpt", 32, 128),
        (8, 2, 4096, "fp8", "off", 32, 128), (4, 8, 2048, "fp8-current", "off", 32, 128),
        (32, 8, 4096, "bf16", "off", 8, 128), (32, 16, 2048, "fp8", "ckpt", 8, 128),
        (24, 4, 4096, "bf16", "off", 32, 64), (24, 8, 2048, "fp8", "off", 32, 64),
        (12, 2, 16384, "bf16", "ckpt", 16, 128), (12, 1, 16384, "fp8", "off", 16, 128),
        (24, 32, 1024, "bf16", "off", 16, 128), (24, 16, 1024, "fp8-current", "ckpt", 16, 128),
        (24, 1, 8192, "fp8", "ckpt", 16, 128), (6, 4, 8192, "bf16", "off", 16, 128),
    ]
    return [_point("heldout", *p) for p in v]


def points(split: str) -> list[dict]:
    out = {"calibration": calibration(), "validation": validation(), "heldout": heldout(),
           "all": calibration() + validation()}[split]
    if len({p["name"] for p in out}) != len(out):
        raise SystemExit("measure_fsdp1.py: duplicate point names")
    return out


def fsdp_args(p: dict, iters: int) -> list[str]:
    return ["-k", str(p["layers"]), "-b", str(p["batch_size"]), "-s", str(p["seq_length"]),
            "-n", str(p.get("num_heads", HEADS)), "-d", str(p.get("head_dim", HEAD_DIM)), "-i", str(iters),
            *PRECISION_ARGS[p["precision"]], *AC_ARGS[p["ac"]]]


def child_recipe(p: dict) -> str:
    return p["precision"] if p["precision"] in ("fp8-current", "fp8-block") else "none"


def predicted(p: dict) -> dict:
    """The estimator's FSDP1 prediction (fsdp.py's settings), for packing and for the record."""
    from benchmarks.memory.compare import fsdp1_setup
    from kfp_sagemaker_blackwell.planning import estimator

    e = estimator.estimate(fsdp1_setup(p), "H200")
    return {"peak_allocated_bytes": e.peak_allocated_bytes, "peak_bytes": e.peak_bytes}


# ---------------------------------------------------------------------------
# --child: one fsdp.py process
# ---------------------------------------------------------------------------

def make_recipe(name: str):
    from transformer_engine.common.recipe import (
        DelayedScaling,
        Float8BlockScaling,
        Float8CurrentScaling,
        Format,
    )

    if name == "fp8-current":
        return Float8CurrentScaling()
    if name == "fp8-block":
        return Float8BlockScaling()
    if name in ("fp8-dpa", "fp8-dpa-mha"):  # fsdp.py's DelayedScaling plus FP8 attention
        return DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=32, amax_compute_algo="max",
                              fp8_dpa=True, fp8_mha=name == "fp8-dpa-mha")
    raise ValueError(f"--recipe {name!r}: choose one of {', '.join(CHILD_RECIPES)}")


def child(recipe_name: str, warmup: int, script: str, script_args: list[str]) -> None:
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    if recipe_name != "none":
        import transformer_engine.pytorch as te

        recipe = make_recipe(recipe_name)
        original = te.autocast

        def autocast(*args, **kwargs):
            if kwargs.get("enabled", True):
                kwargs["recipe"] = recipe
            return original(*args, **kwargs)

        te.autocast = autocast  # fsdp.py calls te.autocast(...) through the module attribute

    steps: list[dict] = []
    start = [time.perf_counter()]

    def after_step(optimizer, args, kwargs) -> None:
        torch.cuda.synchronize()
        steps.append({"t": time.perf_counter(), "allocated": torch.cuda.memory_allocated(),
                      "max_allocated": torch.cuda.max_memory_allocated(),
                      "max_reserved": torch.cuda.max_memory_reserved()})

    register_optimizer_step_post_hook(after_step)

    def report() -> None:
        edges = [start[0]] + [s["t"] for s in steps]
        times = [b - a for a, b in zip(edges, edges[1:], strict=False)][warmup:]
        out = {"recipe": recipe_name, "iterations": len(steps),
               "max_allocated_bytes": torch.cuda.max_memory_allocated() if torch.cuda.is_initialized() else None,
               "max_reserved_bytes": torch.cuda.max_memory_reserved() if torch.cuda.is_initialized() else None,
               "after_step": [{k: v for k, v in s.items() if k != "t"} for s in steps],
               "step_times_s": times, "step_s": statistics.median(times) if times else None}
        print(TAG + json.dumps(out), flush=True)

    atexit.register(report)
    sys.argv = [script, *script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    start[0] = time.perf_counter()
    runpy.run_path(script, run_name="__main__")


# ---------------------------------------------------------------------------
# The grid runner
# ---------------------------------------------------------------------------

def parse_output(text: str) -> dict:
    """fsdp.py's "Peak Memory Use" and the child's JSON line; the status."""
    rec: dict = {}
    m = re.findall(r"Peak Memory Use: ([0-9.eE+-]+)MBs", text)
    if m:
        rec["reported_peak_mb"] = float(m[-1])
    m = re.findall(r"Avg\. Iter\. Time: ([0-9.eE+-]+)s", text)
    if m:
        rec["reported_avg_iter_s"] = float(m[-1])
    for line in text.splitlines():
        if line.startswith(TAG):
            rec["child"] = json.loads(line[len(TAG):])
    low = text.lower()
    if "reported_peak_mb" in rec:
        rec["status"] = "ok"
    elif "out of memory" in low or "outofmemoryerror" in low:
        rec["status"] = "oom"
    else:
        rec["status"] = "error"
        lines = text.strip().splitlines()
        errs = [ln for ln in lines if "Error" in ln or "error" in ln]
        rec["error"] = (errs[-1] if errs else lines[-1] if lines else "no output")[:300]
    if rec["status"] == "ok":
        child_out = rec.get("child") or {}
        exact = child_out.get("max_allocated_bytes")
        # fsdp.py prints max_memory_allocated * 1e-6; the child reads the same counter at exit.
        rec["peak_allocated_bytes"] = int(exact) if exact else int(round(rec["reported_peak_mb"] * 1e6))
    return rec


def log_excerpt(text: str, keep_tail: int = 25) -> str:
    """fsdp.py prints the whole wrapped model; keep the informative lines and the tail."""
    lines = text.splitlines()
    pick = [ln for ln in lines[:-keep_tail] if re.search(r"Peak|Iter|memory|WORLD|configuration|Warning|Error", ln)]
    return "\n".join(pick + lines[-keep_tail:])


class Runner:
    def __init__(self, args, command: str) -> None:
        self.args = args
        self.command = command
        self.logdir = Path(args.log_dir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.port = 29600 + (os.getpid() % 200) * 10

    def launch(self, p: dict):
        self.port += 1
        env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(self.port), PYTHONUNBUFFERED="1",
                   NCCL_NVLS_ENABLE="0")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--recipe", child_recipe(p),
               "--warmup", str(self.args.warmup), "--", self.args.script, *fsdp_args(p, self.args.iters)]
        log = open(self.logdir / f"{p['name']}.log", "w")  # noqa: SIM115 - closed in finish()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        return proc, log, cmd

    def finish(self, p: dict, log, cmd, rc: int | None, shared_with: int, seconds: float) -> dict:
        log.close()
        text = (self.logdir / f"{p['name']}.log").read_text(errors="replace")
        rec = {**p, "fsdp_args": " ".join(fsdp_args(p, self.args.iters)), "child_recipe": child_recipe(p),
               "returncode": rc, "concurrent_processes": shared_with, "seconds": round(seconds, 1),
               **parse_output(text)}
        if rc is None:
            rec["status"] = "timeout"
        if rec["status"] == "oom" and shared_with > 1:
            rec["status"] = "oom_shared"
        with open(self.args.raw_log, "a") as f:
            f.write(f"### {p['name']} rc={rc} status={rec['status']} concurrent={shared_with}\n"
                    f"$ {' '.join(cmd[1:])}\n{log_excerpt(text)}\n\n")
        return rec


def run_grid(args, todo: list[dict], doc: dict) -> None:
    runner = Runner(args, doc["command"])
    budget = args.gpu_budget_gib * 2**30
    need = {p["name"]: max(args.pack_margin * predicted(p)["peak_bytes"], predicted(p)["peak_bytes"] + 2 * 2**30)
            for p in todo}
    pending = sorted(todo, key=lambda p: -need[p["name"]])
    alone: list[dict] = []
    running: list[tuple] = []  # (point, proc, log, cmd, t0, peers)
    t_start = time.perf_counter()

    def elapsed() -> float:
        return time.perf_counter() - t_start

    def save(rec: dict) -> None:
        doc["results"] = [r for r in doc["results"] if r["name"] != rec["name"]] + [rec]
        text = json.dumps(doc, indent=1) + "\n"
        for path in args.out:
            Path(path).write_text(text)
        brief = {k: rec.get(k) for k in ("name", "status", "peak_allocated_bytes", "concurrent_processes", "seconds")}
        print(json.dumps(brief), flush=True)

    while pending or alone or running:
        over = elapsed() > args.time_budget
        # Launch what fits (largest first); re-runs only on an empty GPU.
        if not over:
            used = sum(need[r[0]["name"]] for r in running)
            queue = pending if pending else (alone if not running else [])
            for p in list(queue):
                if len(running) >= args.max_procs:
                    break
                if used + need[p["name"]] <= budget or not running:
                    proc, log, cmd = runner.launch(p)
                    running.append([p, proc, log, cmd, time.perf_counter(), 1])
                    used += need[p["name"]]
                    queue.remove(p)
                    if queue is alone:
                        break
        for r in running:  # the most processes each one shared the GPU with
            r[5] = max(r[5], len(running))
        time.sleep(0.5)
        for r in list(running):
            p, proc, log, cmd, t0, peers = r
            rc = proc.poll()
            late = time.perf_counter() - t0 > args.child_timeout or elapsed() > args.time_budget + args.grace
            if rc is None and not late:
                continue
            if rc is None:
                proc.kill()
                proc.wait()
            running.remove(r)
            rec = runner.finish(p, log, cmd, rc, peers, time.perf_counter() - t0)
            if rec["status"] == "oom_shared":
                alone.append(p)
            save(rec)
        if over and not running:
            break
    left = [p["name"] for p in pending + alone]
    if left:
        print(f"time budget reached; not run: {', '.join(left)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        cp = argparse.ArgumentParser(prog="measure_fsdp1.py --child")
        cp.add_argument("--child", action="store_true")
        cp.add_argument("--recipe", choices=CHILD_RECIPES, default="none")
        cp.add_argument("--warmup", type=int, default=2)
        cp.add_argument("script")
        cp.add_argument("script_args", nargs=argparse.REMAINDER)
        a = cp.parse_args(argv)
        rest = a.script_args[1:] if a.script_args[:1] == ["--"] else a.script_args
        if a.script == "--":
            a.script, rest = rest[0], rest[1:]
        child(a.recipe, a.warmup, a.script, rest)
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--script", required=True, help="path of TE's examples/pytorch/fsdp/fsdp.py (not in the repo)")
    ap.add_argument("--out", required=True, action="append", help="results file (repeat for copies)")
    ap.add_argument("--raw-log", default="/dev/null", help="append every process's output excerpt here")
    ap.add_argument("--log-dir", default="/tmp/fsdp1_logs", help="full per-process logs")
    ap.add_argument("--split", choices=("calibration", "validation", "heldout", "all"), default="all")
    ap.add_argument("--only", default="", help="comma-separated point names")
    ap.add_argument("--resume", action="append", default=[],
                    help="an earlier results file: its points with status ok/oom are kept (not re-run)")
    ap.add_argument("--iters", type=int, default=3, help="fsdp.py -i (default 3: the peak is reached by step 2)")
    ap.add_argument("--warmup", type=int, default=2, help="child's step-time median leaves these out")
    ap.add_argument("--gpu-budget-gib", type=float, default=128.0, help="memory the concurrent runs may take")
    ap.add_argument("--pack-margin", type=float, default=1.25, help="predicted peak x this = a run's share")
    ap.add_argument("--max-procs", type=int, default=8)
    ap.add_argument("--time-budget", type=float, default=1e9, help="seconds: launch nothing after this")
    ap.add_argument("--grace", type=float, default=60.0, help="seconds after the budget before runs are killed")
    ap.add_argument("--child-timeout", type=float, default=300.0)
    ap.add_argument("--dry-run", action="store_true", help="list the points and predictions; no GPU")
    args = ap.parse_args(argv)
    todo = points(args.split)
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {p["name"] for p in todo}
        if unknown:
            ap.error(f"--only: unknown point(s) {', '.join(sorted(unknown))}")
        todo = [p for p in todo if p["name"] in wanted]
    prior: list[dict] = []
    prior_commands: list[str] = []
    for path in args.resume:
        if Path(path).exists():
            old = json.loads(Path(path).read_text())
            prior += [r for r in old["results"] if r.get("status") in ("ok", "oom")]
            prior_commands.append(old["command"])
    done = {r["name"] for r in prior}
    todo = [p for p in todo if p["name"] not in done]
    if args.dry_run:
        for p in todo:
            pr = predicted(p)
            print(f"{p['name']:40s} predicted {pr['peak_allocated_bytes'] / 2**30:6.1f} GiB allocated  "
                  f"fsdp.py {' '.join(fsdp_args(p, args.iters))}  child-recipe {child_recipe(p)}")
        print(f"{len(todo)} points ({len(done)} done in --resume files)")
        return 0
    if not Path(args.script).is_file():
        ap.error(f"--script {args.script}: no such file (fetch NVIDIA/TransformerEngine's "
                 "examples/pytorch/fsdp/fsdp.py and pass its path)")
    command = "python3 benchmarks/memory/measure_fsdp1.py " + " ".join(argv)
    doc = {"command": " ; ".join([*prior_commands, command]),
           "fsdp_py": "NVIDIA/TransformerEngine examples/pytorch/fsdp/fsdp.py, unmodified; run as "
                      "measure_fsdp1.py --child --recipe R -- fsdp.py <fsdp_args> (env RANK=0 WORLD_SIZE=1)",
           **machine(),
           "settings": {"world_size": 1, "model": "te-fsdp-example block stack: -n 16 -d 128 (hidden 2048, "
                        "FFN 6144, LayerNorm, GELU, bias, dropout 0.1); -k layers",
                        "optimizer": "torch.optim.Adam (foreach), states in the parameter dtype",
                        "fsdp": "FullyShardedDataParallel(use_orig_params=True, MixedPrecision(param_dtype, "
                                "reduce_dtype=float32), transformer_auto_wrap_policy(te.TransformerLayer))",
                        "ac": "off: prepare_te_modules_for_fsdp; ckpt: --checkpoint-layer transformerlayer "
                              "(apply_fsdp_checkpointing); off-no-te-fsdp: --no-te-fsdp",
                        "peak": "peak_allocated_bytes = torch.cuda.max_memory_allocated() at exit (fsdp.py "
                                "prints the same counter x 1e-6 as reported_peak_mb)"},
           "results": list(prior)}
    run_grid(args, todo, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
