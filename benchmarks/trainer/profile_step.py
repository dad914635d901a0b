"""Where a steady step's GPU time goes: the trainer against TE's fsdp.py, side by side (issue 26).

    python3 benchmarks/trainer/profile_step.py --time-budget 200 [--iters 4] [--precisions bf16,fp8]
        [--trainer-flags '--no-single-gpu-fsdp'] [--dry-run]
    python3 benchmarks/trainer/profile_step.py --analyse TRACE.json[.gz] --wall-s 3.4 --iters 4

Each side runs once per precision at te-fsdp-example batch 8, seq 8192, no checkpointing
(``b8-noac`` of ``like_for_like.py``, whose ``Run`` builds the commands: the same wrapper, the
same dropout-0 fsdp.py in ``.baselines/``), with ``steady_timer.py --profile-iters`` tracing
``--iters`` iterations after its warm-up and writing the window's Chrome trace to /tmp. This
script reads each trace and attributes every GPU kernel to a category by the kernel's name and
by the CPU ranges open when it was launched (its ancestors: the op that launched it, the
``record_function`` ranges around it, the autograd node in backward):

- ``loss``: under the trainer's ``trainer.loss`` range, a loss node's backward, or a reduction
  that is a step's outermost op (fsdp.py's ``y.sum()``);
- ``optimizer``: under ``Optimizer.step`` / ``zero_grad`` (or an Adam / multi-tensor kernel);
- ``grad_clip``: under the trainer's ``trainer.clip_grad_norm``;
- ``fsdp_copies_collectives``: NCCL kernels, and whatever FSDP2 (``FSDP::*``) or FSDP1
  (``FullyShardedDataParallel._*``) hooks launch: all-gather copy-in/out, casts, reduce copies;
- then by name: ``memcpy_memset``, ``attention``, ``gemm``, ``fp8_cast_transpose_amax``,
  ``normalization``, ``elementwise``, ``other``.

It writes ``profile_step.json`` (each side: ms per iteration per category, the GPU idle fraction
= 1 - the union of kernel intervals / the window's wall time, the top kernels per category) and
``profile_step.md`` (the table per precision: fsdp.py, trainer, trainer - fsdp.py) to
``--out-dir`` (default $OUT): two small files; the traces stay in /tmp. Resumable: a run already
in the out-dir's JSON with its analysis is kept, not profiled again, and a call whose budget
left runs unprofiled ends with ``[profile] time budget reached: N runs left (...)``, which the
session drivers' ``step`` reads as "resume in the next call".
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import like_for_like as lfl  # noqa: E402  (this folder's harness; not a package)
from kernel_names import BY_KERNEL  # noqa: E402  (kernel name -> category, one table)

CATEGORIES = ("gemm", "attention", "normalization", "elementwise", "fp8_cast_transpose_amax",
              "fsdp_copies_collectives", "memcpy_memset", "optimizer", "grad_clip", "loss", "other")
# The loss's own backward nodes (ToCopy: the bare stack's fp32 upcast of the output; at
# te-fsdp-example the only cast autograd records outside TE's own functions).
LOSS_ROOT = re.compile(r"^(trainer\.loss|aten::(sum|mean|pow)|autograd::engine::evaluate_function: "
                       r"(Sum|Mean|Pow|ToCopy|NllLoss\w*|LogSoftmax|CrossEntropy\w*|CompiledFunction)"
                       r"Backward\d*)$")
BY_ANCESTOR = (
    ("optimizer", re.compile(r"^Optimizer\.(step|zero_grad)")),
    ("grad_clip", re.compile(r"^trainer\.clip_grad_norm$")),
    ("fsdp_copies_collectives", re.compile(r"^(FSDP::|FullyShardedDataParallel\._)")),
)
KERNEL_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RANGE_CATS = ("cpu_op", "user_annotation")


def classify(kernel: str, ancestors: list[str]) -> str:
    """A kernel's category from its name and the CPU ranges open at its launch (outermost first)."""
    if ancestors and LOSS_ROOT.match(ancestors[0]) or any(a == "trainer.loss" for a in ancestors):
        return "loss"
    for label, pattern in BY_ANCESTOR:
        if any(pattern.match(a) for a in ancestors):
            return label
    for label, pattern in BY_KERNEL:
        if pattern.search(kernel):
            return label
    return "other"


def _ancestors_of_launches(events: list[dict]) -> dict[int, list[str]]:
    """correlation id -> the names of the CPU ranges (ops, record_function) open on the
    launching thread at the launch, outermost first."""
    ranges: dict[tuple, list[tuple[float, float, str]]] = {}
    launches: dict[tuple, list[tuple[float, int]]] = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        key = (e.get("pid"), e.get("tid"))
        if e.get("cat") in RANGE_CATS:
            ranges.setdefault(key, []).append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e["name"]))
        elif e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launches.setdefault(key, []).append((float(e["ts"]), int(e["args"]["correlation"])))
    out: dict[int, list[str]] = {}
    for key, items in launches.items():
        spans = sorted(ranges.get(key, []), key=lambda r: (r[0], -r[1]))
        stack: list[tuple[float, float, str]] = []
        i = 0
        for ts, corr in sorted(items):
            while i < len(spans) and spans[i][0] <= ts:
                while stack and stack[-1][1] < spans[i][0]:
                    stack.pop()
                stack.append(spans[i])
                i += 1
            while stack and stack[-1][1] < ts:
                stack.pop()
            out[corr] = [s[2] for s in stack if s[1] >= ts]
    return out


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -1.0
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def analyse(trace: dict, wall_s: float, iters: int) -> dict:
    """A Chrome trace (``export_chrome_trace``) of ``iters`` iterations lasting ``wall_s``:
    ms per iteration per category, the GPU idle fraction and the top kernels per category."""
    events = trace.get("traceEvents", trace if isinstance(trace, list) else [])
    parents = _ancestors_of_launches(events)
    per_cat: dict[str, float] = dict.fromkeys(CATEGORIES, 0.0)
    per_kernel: dict[tuple[str, str], float] = {}
    spans: list[tuple[float, float]] = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in KERNEL_CATS:
            continue
        name, dur = e.get("name", ""), float(e.get("dur", 0))
        cat = classify(name, parents.get(int(e.get("args", {}).get("correlation", -1)), []))
        per_cat[cat] += dur
        per_kernel[(cat, name)] = per_kernel.get((cat, name), 0.0) + dur
        spans.append((float(e["ts"]), float(e["ts"]) + dur))
    ms = 1e-3 / max(1, iters)
    busy = _union_us(spans)
    host = host_time(events, iters)
    idle = idle_gaps(events, parents, iters)
    top: dict[str, list] = {}
    for (cat, name), t in sorted(per_kernel.items(), key=lambda kv: -kv[1]):
        if len(top.setdefault(cat, [])) < 3:
            top[cat].append({"name": name[:120], "ms_per_iter": round(t * ms, 3)})
    return {
        "iters": iters, "wall_ms_per_iter": round(wall_s * 1e3 / max(1, iters), 2),
        "kernel_ms_per_iter": round(sum(per_cat.values()) * ms, 3),
        "busy_ms_per_iter": round(busy * ms, 3),
        "gpu_idle_fraction": round(1 - busy * 1e-6 / wall_s, 4) if wall_s > 0 else None,
        "ms_per_iter": {k: round(v * ms, 3) for k, v in per_cat.items()},
        "top_kernels": top,
        **host,
        **idle,
        **fsdp_copy_in_host(events, iters),
    }


# A gap in the GPU's timeline at least this long (us) is one the host caused, not launch spacing.
IDLE_GAP_US = 500.0


def idle_gaps(events: list[dict], parents: dict[int, list[str]], iters: int, top: int = 6) -> dict:
    """Where the GPU waits for the host (issue 36's small-step floor, issue 40 item 1): the gaps
    between kernels inside the window, per iteration, (a) by the CPU ranges that launched the
    kernel ending each gap (the outermost two: what the GPU was waiting for), and (b) for gaps of
    at least ``IDLE_GAP_US``, by the outermost CPU ranges on the launching thread that overlap them
    (what the host was doing meanwhile: data generation, a hook, a sync)."""
    kernels = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)),
                      int(e.get("args", {}).get("correlation", -1)))
                     for e in events if e.get("ph") == "X" and e.get("cat") in KERNEL_CATS)
    if len(kernels) < 2:
        return {}
    by_launch: dict[str, float] = {}
    big: list[tuple[float, float]] = []
    end = kernels[0][1]
    for start, stop, corr in kernels[1:]:
        if start > end:
            key = " > ".join(a[:60] for a in parents.get(corr, [])[:2]) or "(no CPU range)"
            by_launch[key] = by_launch.get(key, 0.0) + (start - end)
            if start - end >= IDLE_GAP_US:
                big.append((end, start))
        end = max(end, stop)
    launches, _ = _runtime_by_thread(events)
    main = max(launches, key=lambda k: launches[k]) if launches else None
    outer = _outermost_ranges(events, main)
    during: dict[str, float] = {}
    for g0, g1 in big:
        covered = 0.0
        for a, b, name in outer:
            o = min(b, g1) - max(a, g0)
            if o > 0:
                during[name[:60]] = during.get(name[:60], 0.0) + o
                covered += o
        during["(no CPU range: Python, syncs)"] = during.get("(no CPU range: Python, syncs)", 0.0) + (g1 - g0 - covered)
    ms = 1e-3 / max(1, iters)

    def ranked(d: dict[str, float]) -> list[dict[str, Any]]:
        return [{"name": n, "ms_per_iter": round(t * ms, 3)}
                for n, t in sorted(d.items(), key=lambda kv: -kv[1])[:top] if t * ms >= 0.01]

    return {"idle": {"inside_window_ms_per_iter": round(sum(by_launch.values()) * ms, 3),
                     "in_gaps_over_ms_per_iter": round(sum(b - a for a, b in big) * ms, 3),
                     "by_next_launch": ranked(by_launch), "host_during_long_gaps": ranked(during)}}


HOST_MODULE = re.compile(r"^(?:nn\.Module: )?(\w+)(?:_\d+)?$")


def _runtime_by_thread(events: list[dict]) -> tuple[dict[Any, int], dict[Any, float]]:
    """Per (pid, tid): the kernel launches and the microseconds in CUDA runtime calls."""
    launches: dict[Any, int] = {}
    runtime_us: dict[Any, float] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cuda_runtime":
            key = (e.get("pid"), e.get("tid"))
            runtime_us[key] = runtime_us.get(key, 0.0) + float(e.get("dur", 0))
            if "Launch" in e.get("name", ""):
                launches[key] = launches.get(key, 0) + 1
    return launches, runtime_us


def _outermost_ranges(events: list[dict], thread: Any) -> list[tuple[float, float, str]]:
    """The CPU ranges (ops, ``record_function`` ranges) on ``thread`` that no other range there
    contains, in time order: (start, stop, name), microseconds."""
    out: list[tuple[float, float, str]] = []
    end = -1.0
    for start, stop, name in sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e.get("name", ""))
                                    for e in events if e.get("ph") == "X" and e.get("cat") in RANGE_CATS
                                    and (e.get("pid"), e.get("tid")) == thread):
        if start >= end:
            out.append((start, stop, name))
            end = stop
    return out


def host_time(events: list[dict], iters: int) -> dict:
    """Where the host's time goes (issue 40 item 1): on the thread that launches the most
    kernels, the outermost CPU ranges (ops and ``record_function`` ranges) summed by name, the
    time in CUDA runtime calls, and the kernel launches, all per iteration."""
    launches, runtime_us = _runtime_by_thread(events)
    if not launches:
        return {}
    main = max(launches, key=lambda k: launches[k])
    outer: dict[str, float] = {}
    for start, stop, name in _outermost_ranges(events, main):
        outer[name] = outer.get(name, 0.0) + (stop - start)
    ms = 1e-3 / max(1, iters)
    top = sorted(outer.items(), key=lambda kv: -kv[1])[:25]
    return {"host": {"launches_per_iter": round(launches[main] / max(1, iters), 1),
                     "cuda_runtime_ms_per_iter": round(runtime_us[main] * ms, 3),
                     "outer_ranges_ms_per_iter": round(sum(outer.values()) * ms, 3),
                     "top_outer_ranges": [{"name": n[:120], "ms_per_iter": round(t * ms, 3)} for n, t in top]}}


def fsdp_copy_in_host(events: list[dict], iters: int) -> dict:
    """FSDP2's reduce-scatter copy-in on the host (session v11, issue 36): ``aten::_chunk_cat``
    builds its kernel's metadata on the CPU (an int64 per 2 KiB of the unsharded gradients)
    before its one launch. Per iteration: the ms inside each ``FSDP::post_backward_reduce``
    range, the blocks' ("FSDP::post_backward_reduce (blocks.N)") apart from the root's (the
    range without a module name: embedding, LM head, final norm), the backward's last host work."""
    reduces = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
               and str(e.get("name", "")).startswith("FSDP::post_backward_reduce")]
    if not reduces:
        return {}
    blocks = root = 0.0
    for e in events:
        if e.get("ph") != "X" or e.get("name") != "aten::_chunk_cat":
            continue
        ts = float(e["ts"])
        inside = [r for r in reduces if r.get("tid") == e.get("tid")
                  and float(r["ts"]) <= ts <= float(r["ts"]) + float(r.get("dur", 0))]
        if not inside:
            continue
        if "(" in min(inside, key=lambda r: float(r.get("dur", 0)))["name"]:
            blocks += float(e.get("dur", 0))
        else:
            root += float(e.get("dur", 0))
    ms = 1e-3 / max(1, iters)
    return {"fsdp_copy_in_host": {"root_ms_per_iter": round(root * ms, 3),
                                  "blocks_ms_per_iter": round(blocks * ms, 3)}}


def table(results: dict) -> str:
    """Markdown: per precision, each category's ms per iteration for fsdp.py and the trainer,
    and the trainer's excess."""
    out: list[str] = []
    for prec in ("bf16", "fp8"):
        ref, mine = results.get(f"fsdp.py/{prec}"), results.get(f"trainer/{prec}")
        if not ref and not mine:
            continue
        out += [f"### b8-noac, {prec} (ms per iteration)", "",
                "| category | fsdp.py | trainer | trainer - fsdp.py |", "|---|---|---|---|"]
        rows = [*CATEGORIES, "kernel total", "GPU busy (union)", "wall", "GPU idle fraction"]
        for row in rows:
            a, b = _value(ref, row), _value(mine, row)
            diff = "n/a" if a is None or b is None else f"{b - a:+.2f}"
            out.append(f"| {row} | {_fmt(a)} | {_fmt(b)} | {diff} |")
        out.append("")
    return "\n".join(out)


def shapes_table(results: dict) -> str:
    """Markdown for ``--shapes``: per run, ms per iteration per category, the wall, the GPU idle
    fraction, the host's launches and its five largest outermost ranges."""
    if not results:
        return ""
    ids = list(results)
    rows = [*CATEGORIES, "kernel total", "GPU busy (union)", "wall", "GPU idle fraction"]
    out = ["| category | " + " | ".join(ids) + " |", "|---|" + "---|" * len(ids)]
    for row in rows:
        out.append(f"| {row} | " + " | ".join(_fmt(_value(results[i], row)) for i in ids) + " |")
    out.append("| kernel launches / iter | " + " | ".join(
        str(results[i].get("host", {}).get("launches_per_iter", "n/a")) for i in ids) + " |")
    out.append("| CUDA runtime calls, ms / iter | " + " | ".join(
        _fmt(results[i].get("host", {}).get("cuda_runtime_ms_per_iter")) for i in ids) + " |")
    out.append("")
    for i in ids:
        top = results[i].get("host", {}).get("top_outer_ranges", [])[:5]
        if top:
            out.append(f"- {i}: host's largest outermost ranges (ms/iter): "
                       + "; ".join(f"{t['name']} {t['ms_per_iter']:.2f}" for t in top))
        copy_in = results[i].get("fsdp_copy_in_host")
        if copy_in:
            out.append(f"- {i}: FSDP2 reduce-scatter copy-in on the host (aten::_chunk_cat, ms/iter): "
                       f"root {copy_in['root_ms_per_iter']:.2f}, blocks {copy_in['blocks_ms_per_iter']:.2f}")
        idle = results[i].get("idle")
        if idle:
            out.append(f"- {i}: GPU idle between kernels {idle['inside_window_ms_per_iter']:.2f} ms/iter, "
                       f"{idle['in_gaps_over_ms_per_iter']:.2f} in gaps >= {IDLE_GAP_US / 1e3:g} ms; the host "
                       "meanwhile (ms/iter): " + "; ".join(f"{t['name']} {t['ms_per_iter']:.2f}"
                                                          for t in idle["host_during_long_gaps"][:4]))
    return "\n".join(out)


def _value(rec: dict | None, row: str) -> float | None:
    if not rec or "ms_per_iter" not in rec:
        return None
    special = {"kernel total": "kernel_ms_per_iter", "GPU busy (union)": "busy_ms_per_iter",
               "wall": "wall_ms_per_iter", "GPU idle fraction": "gpu_idle_fraction"}
    if row in special:
        return rec.get(special[row])
    return rec["ms_per_iter"].get(row)


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}" if x >= 1 or x == 0 else f"{x:.3f}"


# Wall seconds per run at --iters 4, from raw/issue26_like_for_like_h200.json (start-up and
# 9 iterations) plus ~10 s to write and read the trace.
EXPECT_S = {("fsdp", "bf16"): 47, ("fsdp", "fp8"): 37, ("trainer", "bf16"): 53, ("trainer", "fp8"): 46}


def shape_runs(shapes: str, iters: int, precisions: list[str], trainer_flags: list[str],
               backend: str = "te") -> list[lfl.Run]:
    """``--shapes PRESET:BATCH:SEQ[:LAYERS],...``: the trainer alone at each shape (issue 40's 1b
    step; issue 36's small fp8 step on a wide model), its trace kept for the host-time table.
    ``backend`` torch: the trainer's torch backend (no TransformerEngine; its run ids say so)."""
    out = []
    for item in filter(None, shapes.split(",")):
        parts = item.split(":")
        if len(parts) not in (3, 4):
            raise SystemExit(f"--shapes: {item!r} is not PRESET:BATCH:SEQ[:LAYERS] (e.g. 1b:4:4096, 8b:1:1024:4)")
        preset, batch, seq = parts[0], int(parts[1]), int(parts[2])
        layers = ["--num-layers", parts[3]] if len(parts) == 4 else []
        sid = item.replace(":", "-")
        # a lever's flags name the run (bf16+data-prefetch), so its profile sits beside the plain one's
        tag = "".join(f"+{f[2:]}" for f in trainer_flags if f.startswith("--"))
        for prec in precisions:
            side = "trainer" if backend == "te" else f"trainer-{backend}"
            run = lfl.Run(f"{sid}/{side}/{prec}{tag}", "trainer", batch, False, prec, backend, preset=preset, seq=seq,
                          iters=lfl.WARMUP + iters + 1, flags=[*layers, *trainer_flags], timeout=150,
                          expect_s=40 + 1.2 * max(0, iters - 4))
            run.profile_window = (lfl.WARMUP + 1, lfl.WARMUP + 1 + iters)
            run.trace = f"/tmp/profile_step_{sid}_{side}_{prec}{tag.replace('+', '_')}.json"
            out.append(run)
    return out


def runs(iters: int, precisions: list[str], trainer_flags: list[str]) -> list[lfl.Run]:
    out = []
    for prec in precisions:
        for kind, side in (("fsdp", "fsdp.py"), ("trainer", "trainer")):
            run = lfl.Run(f"{side}/{prec}", kind, 8, False, prec, "te", iters=lfl.WARMUP + iters + 1,
                          flags=list(trainer_flags) if kind == "trainer" else [], timeout=150,
                          expect_s=EXPECT_S.get((kind, prec), 50) + 1.2 * max(0, iters - 4))
            run.profile_window = (lfl.WARMUP + 1, lfl.WARMUP + 1 + iters)
            run.trace = f"/tmp/profile_step_{side.replace('.', '_')}_{prec}.json"
            out.append(run)
    return out


TRACE_RE = re.compile(r"steady_trace path=(\S+) wall_s=([\d.]+) iters=(\d+)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--time-budget", type=float, default=0.0, help="seconds this call may spend")
    p.add_argument("--iters", type=int, default=4, help="steady iterations profiled per run")
    p.add_argument("--precisions", default="bf16,fp8")
    p.add_argument("--trainer-flags", default="", help="extra trainer flags (a lever), one string")
    p.add_argument("--backend", choices=("te", "torch"), default="te",
                   help="with --shapes: the trainer's backend (torch: no TransformerEngine needed)")
    p.add_argument("--shapes", default="", help="PRESET:BATCH:SEQ[:LAYERS],...: profile the trainer alone at "
                   "these shapes (instead of fsdp.py and the trainer at b8-noac); each trace is kept gzipped")
    p.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    p.add_argument("--analyse", default="", metavar="TRACE", help="analyse one trace and print the JSON")
    p.add_argument("--wall-s", type=float, default=0.0, help="with --analyse: the window's wall time")
    a = p.parse_args()
    if a.analyse:
        opener = gzip.open if a.analyse.endswith(".gz") else open
        with opener(a.analyse, "rt") as f:
            print(json.dumps(analyse(json.load(f), a.wall_s, a.iters), indent=1))
        return 0
    todo = (shape_runs(a.shapes, a.iters, a.precisions.split(","), shlex.split(a.trainer_flags), a.backend) if a.shapes
            else runs(a.iters, a.precisions.split(","), shlex.split(a.trainer_flags)))
    if a.dry_run:
        total = 0.0
        for run in todo:
            total += run.expect_s
            print(run.id, f"expect={run.expect_s:.0f}s total={total:.0f}s", shlex.join(run.command()))
        return 0
    if a.time_budget <= 0:
        p.error("--time-budget SECONDS is required (or --dry-run / --analyse)")
    end = time.time() + a.time_budget
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = ("profile_shapes" + ("" if a.backend == "te" else f"_{a.backend}")) if a.shapes else "profile_step"
    # resumable: a run an earlier call of the same out-dir profiled (rc 0) is kept, not rerun
    earlier = out_dir / f"{name}.json"
    results: dict = json.loads(earlier.read_text()) if earlier.exists() else {}
    left_for_time = []
    for run in todo:
        if results.get(run.id, {}).get("rc") == 0 and "gpu_idle_fraction" in results[run.id]:
            print(f"[profile] {run.id}: profiled earlier", flush=True)
            continue
        left = end - time.time()
        if left < run.expect_s:
            print(f"[profile] {run.id}: skipped, {left:.0f} s left", flush=True)
            left_for_time.append(run.id)
            continue
        t0 = time.time()
        try:
            proc = subprocess.run(run.command(), env=lfl.run_env(run), capture_output=True, text=True,
                                  timeout=min(run.timeout, left))
            text, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired:
            text, rc = "", 124
        m = TRACE_RE.search(text)
        rec: dict = {"rc": rc, "wall_s": round(time.time() - t0, 1), "command": shlex.join(run.command())}
        if m and Path(m.group(1)).exists():
            rec.update(analyse(json.loads(Path(m.group(1)).read_text()), float(m.group(2)), int(m.group(3))))
            if a.shapes:  # keep the trace (host time per range can be re-read from it)
                with open(m.group(1), "rb") as src, gzip.open(out_dir / (Path(m.group(1)).name + ".gz"), "wb") as dst:
                    shutil.copyfileobj(src, dst)
        else:
            rec["error_tail"] = [ln[:300] for ln in text.splitlines() if lfl.KEEP.search(ln)][-15:]
        results[run.id] = rec
        (out_dir / f"{name}.json").write_text(json.dumps(results, indent=1))
        (out_dir / f"{name}.md").write_text(shapes_table(results) if a.shapes else table(results))
        print(f"[profile] {run.id}: rc={rc} wall={rec['wall_s']} s idle={rec.get('gpu_idle_fraction')}", flush=True)
    print(shapes_table(results) if a.shapes else table(results))
    if left_for_time:  # the session drivers' step() resumes a call whose log ends with this
        print(f"[profile] time budget reached: {len(left_for_time)} runs left ({', '.join(left_for_time)})",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
