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
from collections.abc import Callable
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
# The search stops after this many batches above the planner's answer without running out of
# memory (the boundary is then reported as not found).
MAX_ABOVE = 64
# Statuses a search can use; anything else (error, timeout) ends that configuration's search.
FINAL = ("ok", "oom")


class OutOfTime(Exception):
    """The time budget ends before the next run could finish: the search stops, unrecorded."""


def search(predicted: int, probe: Callable[[int], str], max_batch: int) -> None:
    """Find the out-of-memory boundary around ``predicted`` with few runs: ``probe(batch)``
    returns a run's status. Gallop from the planner's answer (up +1, +2, +4, ... while it runs;
    down -1, -2, -4, ... while it runs out of memory), then bisect between the largest batch
    that ran and the smallest that did not. The planner right or one below costs 2-3 runs
    (p ok, p+1 oom; or p, p+1 ok, p+3 oom, p+2), where a linear search from p-1 cost 3-4.
    Returns when the boundary is bracketed, a run ends otherwise (error, timeout) or the
    batches pass ``max_batch``; ``probe`` may raise OutOfTime."""
    lo, hi = 0, None  # largest batch known to run / smallest known to run out of memory
    status = probe(predicted)
    if status not in FINAL:
        return
    if status == "ok":
        lo, step = predicted, 1
        while hi is None:
            if lo + step > max_batch:
                return
            status = probe(lo + step)
            if status not in FINAL:
                return
            if status == "ok":
                lo, step = lo + step, step * 2
            else:
                hi = lo + step
    else:
        hi, step = predicted, 1
        while hi - step >= 1:
            status = probe(hi - step)
            if status not in FINAL:
                return
            if status == "ok":
                lo = hi - step
                break
            hi, step = hi - step, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        status = probe(mid)
        if status not in FINAL:
            return
        lo, hi = (mid, hi) if status == "ok" else (lo, mid)


def parse_configurations(text: str) -> tuple[tuple[str, int | None, int, bool, str], ...]:
    """``--configs``: comma-separated PRESET[:LAYERS]/SEQ/ckpt|no-ckpt/PRECISION."""
    out = []
    for item in text.split(","):
        try:
            model, seq, mode, precision = item.strip().split("/")
            preset, _, layers = model.partition(":")
            if mode not in ("ckpt", "no-ckpt"):
                raise ValueError(mode)
            out.append((preset, int(layers) if layers else None, int(seq), mode == "ckpt", precision))
        except ValueError:
            raise SystemExit(f"--configs: {item!r} is not PRESET[:LAYERS]/SEQ/ckpt|no-ckpt/PRECISION "
                             "(e.g. 1b/8192/ckpt/bf16)") from None
    return tuple(out)


def predicted_largest(preset: str, num_layers: int | None, seq: int, ac: bool, precision: str,
                      gpu_memory_bytes: int, gpu: str = "H200", backend: str = "te",
                      expandable_segments: bool = True) -> int:
    """The planner's largest batch at zero headroom on a GPU of ``gpu_memory_bytes`` under the
    allocator the runs use (expandable segments: the trainer's default; files measured before
    it, ``compare.expandable_of``, ran PyTorch's default allocator)."""
    from kfp_sagemaker_blackwell.catalog import hardware
    from kfp_sagemaker_blackwell.catalog.spec import preset as get_preset
    from kfp_sagemaker_blackwell.planning import planner

    model = get_preset(preset)
    if num_layers:
        model = model.replace(num_layers=num_layers)
    g = dataclasses.replace(hardware.gpu(gpu), memory_bytes=gpu_memory_bytes)
    training: dict[str, Any] = {"expandable_segments": expandable_segments}
    if backend != "te":
        training["backend"] = backend
    req = planner.Request(model, seq, planner.Hardware(g, "", 1, 1), (precision,), (0,),
                          "on" if ac else "off", 0.0, training)
    return planner.largest_batch(req, precision, ac)


def _expandable(doc: dict[str, Any]) -> bool:
    from benchmarks.memory.compare import expandable_of

    return expandable_of(doc)


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
    combo["backend"] = spec.get("backend", "te")
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


def _header(command: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The document's head (machine, versions) read by a child process: a CUDA context in this
    process would hold about 0.5 GiB of the GPU through every run and move the boundary."""
    p = subprocess.run([sys.executable, __file__, "--header", json.dumps([command, settings])],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, check=True)
    return dict(json.loads(p.stdout.splitlines()[-1]))


_KEY = ("preset", "num_layers", "seq_length", "activation_checkpointing", "precision", "batch_size", "repeat")


def _key(rec: dict[str, Any]) -> tuple:
    return tuple(rec.get(k) for k in _KEY)


class Prober:
    """Runs one batch of one configuration, unless the document already holds its ok/oom result
    (a resumed call), within the time budget: a run is started only when the longest run so far
    still fits in what is left (``OutOfTime`` otherwise), and is cut at the budget's end; a run
    cut by the budget is not recorded, so the next call runs it again."""

    def __init__(self, doc: dict[str, Any], steps: int, run_timeout: float, budget: float,
                 runner: Callable[[dict[str, Any], float], dict[str, Any]] | None = None) -> None:
        self.doc, self.steps, self.run_timeout = doc, steps, run_timeout
        self.runner = runner or _run
        self.deadline = time.monotonic() + budget
        self.longest = 0.0
        self.done = {_key(r): r for r in doc["results"] if r.get("status") in FINAL}

    def runs(self, conf: dict[str, Any]) -> list[dict[str, Any]]:
        """This configuration's final results in the document, ascending batches (the search's
        runs; the repeats of ``repeat`` are left out)."""
        ck = _key({**conf, "batch_size": None})[:-2]
        return sorted((r for k, r in self.done.items() if k[:-2] == ck and k[-1] is None),
                      key=lambda r: r["batch_size"])

    def repeats(self, conf: dict[str, Any], batch: int) -> list[dict[str, Any]]:
        """The repeats of ``batch`` (``repeat`` 1, 2, ...) in the document, in order."""
        ck = _key({**conf, "batch_size": batch})[:-1]
        return sorted((r for k, r in self.done.items() if k[:-1] == ck and k[-1] is not None),
                      key=lambda r: r["repeat"])

    def __call__(self, conf: dict[str, Any], batch: int, repeat: int | None = None) -> str:
        spec = {**conf, "batch_size": batch, "steps": self.steps}
        if repeat is not None:
            spec["repeat"] = repeat
        if _key(spec) in self.done:
            return str(self.done[_key(spec)]["status"])
        left = self.deadline - time.monotonic()
        if left < min(self.longest, self.run_timeout):
            raise OutOfTime
        t0 = time.monotonic()
        rec = self.runner(spec, min(self.run_timeout, left))
        self.longest = max(self.longest, time.monotonic() - t0)
        if rec["status"] == "timeout" and left < self.run_timeout:
            raise OutOfTime  # cut by the budget, not by --run-timeout: run it again next call
        rec = {**spec, **rec, "loss_kernel": "compiled"}  # the trainer's record has no num_layers
        self.doc["results"] = [r for r in self.doc["results"] if _key(r) != _key(rec)] + [rec]
        if rec["status"] in FINAL:
            self.done[_key(rec)] = rec
        print(json.dumps(rec), flush=True)
        return str(rec["status"])


def measure_boundaries(doc: dict[str, Any], prober: Prober, out: Path,
                       configurations: tuple = CONFIGURATIONS, backend: str = "te",
                       repeat: int = 1) -> bool:
    """Every configuration's boundary search, the document written after each run and each
    configuration; True when all searches ended (False: the time budget ran out). With
    ``repeat`` N > 1 the planner's answer, when it ran, runs N - 1 more times, each in a fresh
    process (issue 41: "a batch that runs three times in a row")."""
    for preset, layers, seq, ac, prec in configurations:
        conf = {"preset": preset, "num_layers": layers, "seq_length": seq,
                "activation_checkpointing": ac, "precision": prec}
        if backend != "te":
            conf["backend"] = backend
        predicted = predicted_largest(preset, layers, seq, ac, prec, doc["gpu_memory_bytes"],
                                      gpu=doc.get("gpu") or "H200", backend=backend,
                                      expandable_segments=_expandable(doc))

        def probe(batch: int, conf: dict[str, Any] = conf) -> str:
            status = prober(conf, batch)
            out.write_text(json.dumps(doc, indent=1) + "\n")  # after each run: a kill keeps data
            return status

        finished = True
        try:
            search(predicted, probe, predicted + MAX_ABOVE)
            first = [r for r in prober.runs(conf) if r["batch_size"] == predicted]
            if first and first[0]["status"] == "ok":
                for k in range(1, repeat):
                    if prober(conf, predicted, repeat=k) != "ok":
                        break
                    out.write_text(json.dumps(doc, indent=1) + "\n")
        except OutOfTime:
            finished = False
        doc["boundaries"] = [b for b in doc["boundaries"] if _key({**b, "batch_size": None})
                             != _key({**conf, "batch_size": None})]
        found = verdict(predicted, prober.runs(conf))
        if repeat > 1:
            first = [r for r in prober.runs(conf) if r["batch_size"] == predicted]
            reps = [r["status"] for r in first + prober.repeats(conf, predicted)]
            found.update(planner_runs=reps, planner_ran_every_time=len(reps) >= repeat
                         and all(x == "ok" for x in reps[:repeat]))
        doc["boundaries"].append({**conf, **found})
        print(json.dumps(doc["boundaries"][-1]), flush=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")
        if not finished:
            print("time budget reached: run the same command with --resume to go on", flush=True)
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("boundary_h200.json"))
    ap.add_argument("--dry-run", action="store_true", help="print the planned runs (no GPU)")
    ap.add_argument("--gpu-memory-bytes", type=int, default=150_109_880_320,
                    help="with --dry-run: the GPU's memory (default: the H200 lent here)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--run-timeout", type=float, default=300.0, help="seconds per trainer run")
    ap.add_argument("--time-budget", type=float, default=1e9,
                    help="seconds: start no run that the longest run so far says cannot end in time")
    ap.add_argument("--resume", action="store_true",
                    help="keep --out's ok/oom results and run only the batches still needed")
    ap.add_argument("--backend", choices=("te", "torch"), default="te",
                    help="the trainer's backend (torch: no TransformerEngine needed)")
    ap.add_argument("--configs", type=parse_configurations, default=CONFIGURATIONS,
                    help="comma-separated PRESET[:LAYERS]/SEQ/ckpt|no-ckpt/PRECISION "
                    "(default: the six of boundary_h200.json)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the planner's answer this many times in all (each a fresh process) "
                    "when it ran the first time")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--header", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(_one(json.loads(args.one))), flush=True)
        return 0
    if args.header:
        from benchmarks import gpu_record

        command, settings = json.loads(args.header)
        print(json.dumps(gpu_record.header(command, settings, boundaries=[])), flush=True)
        return 0
    if args.dry_run:
        for preset, layers, seq, ac, prec in args.configs:
            b = predicted_largest(preset, layers, seq, ac, prec, args.gpu_memory_bytes,
                                  backend=args.backend)
            print(f"{preset} L{layers or '-'} s{seq} {'ckpt' if ac else 'no-ckpt'} {prec}: "
                  f"planner {b}; runs {b}, then up (+1, +2, +4...) while it runs or down while it "
                  f"does not, then bisection")
        return 0
    command = "python benchmarks/memory/boundary.py " + " ".join(argv or sys.argv[1:])
    if args.resume and args.out.exists():
        doc = json.loads(args.out.read_text())
        doc["command"] = doc["command"] + " ; " + command
    else:
        doc = _header(command, {"backend": args.backend,
                                "loss_kernel": "compiled (the trainer's default)",
                                "world_size": 1, "steps": args.steps})
    prober = Prober(doc, args.steps, args.run_timeout, args.time_budget)
    return 0 if measure_boundaries(doc, prober, args.out, args.configs, args.backend, args.repeat) else 3


if __name__ == "__main__":
    sys.exit(main())
