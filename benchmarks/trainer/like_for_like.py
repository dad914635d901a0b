"""Issue 16's like-for-like trainer benchmark on one H200, in stages that fit device calls.

    python3 benchmarks/trainer/like_for_like.py --time-budget 560 [--stages profile,table-b8,...]

Every run is timed by the same wrapper, ``steady_timer.py`` (a global optimizer-step hook that
synchronises CUDA and timestamps each iteration; 16 iterations, the first 4 left out), whatever
the script: TE's fsdp.py, the plain PyTorch stack or the trainer. Each run's figure is its
median iteration, beside the spread of its timed iterations ((max - min) / median); the
ratios are of medians (issue 26: one slow iteration moved the 6-iteration means by up to 4%).
The ``stall`` stage runs the trainer for 30 steps per preset, with Python's automatic garbage
collection (``--gc-every 0``) and with the trainer's schedule (the default), and records every
step's time and the collector's pauses. The baselines are run with dropout 0, like the trainer:

- fsdp.py is TE's ``examples/pytorch/fsdp/fsdp.py`` with ``fsdp_dropout0.patch`` (beside this
  file) applied: ``hidden_dropout=0.0`` and ``attention_dropout=0.0`` for ``te.TransformerLayer``;
- the plain PyTorch stack is ``shared/tools/torch_block_baseline.py --dropout 0``.

Both are carried to the GPU machine in the git-ignored ``.baselines/`` (not committed: they are
not ours). The trainer runs through ``levers.py`` so that a lever (a setting it has in code but
not as a flag) can be measured before it becomes an option.

The ``levers2`` and ``levers2-best`` stages (issue 26, second round) measure the trainer's lever
flags in one call: fsdp.py and the base trainer at b8-noac (bf16, fp8), each lever alone
(``--no-single-gpu-fsdp``, ``--cuda-graphs`` on top of it, fsdp.py's 32-long amax history,
``--late-sync``), the 1b preset
(batch 4, seq 4096) base and graphed, then the levers that won by more than 1% (each against the
run it adds to: the graphs against the unsharded path) together, the FP8
weight cache at 2 micro-batches and b16-ac while time remains (12 iterations, 4 left out; ids
``L2/...``; ``--dry-run`` prints each run's expected seconds):

    python3 benchmarks/trainer/like_for_like.py --time-budget 560 --stages levers2,levers2-best

A run starts only with 1.15x its expected seconds left in ``--time-budget`` (its timeout is
capped at what is left). Results are merged into ``--state`` after every run (a later call resumes and skips what is done)
and copied to ``--out``; the filtered output of every run is appended to ``--raw-log``.
``--table RESULTS.json`` prints the Markdown tables a results file has runs for (like for like,
stalls, the ``L2/`` like for like and levers, each row labelled by the trainer flags that ran).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
TIMER = HERE / "steady_timer.py"
LEVERS = HERE / "levers.py"
FSDP = Path(".baselines/fsdp_dropout0.py")
TORCH_REF = Path(".baselines/torch_block_baseline.py")
ITERS, WARMUP = 16, 4
STALL_ITERS, STALL_WARMUP = 30, 3  # the criterion: no step over 1.3x the median after warm-up
SEQ = 8192
FLOPS_TE_SHAPE = 10.875e9  # model FLOPs per token of the te-fsdp-example blocks (6N + attention)


@dataclass
class Run:
    id: str
    kind: str  # fsdp | torch_ref | trainer
    batch: int
    ac: bool
    precision: str = "bf16"
    backend: str = "te"
    preset: str = "te-fsdp-example"
    seq: int = SEQ
    levers: str = ""
    flags: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    profile: bool = False
    timeout: int = 150
    iters: int = ITERS
    warmup: int = WARMUP
    accum: int = 1  # the trainer's --grad-accum-steps (micro-batches per iteration)
    trace: str = ""  # steady_timer --profile-trace: the profiled window's Chrome trace
    profile_window: tuple[int, int] | None = None  # steady_timer --profile-iters A:B (default: 4 after warm-up)
    expect_s: float = 0.0  # the wall seconds it is expected to take (from the last H200 round)

    def tokens(self) -> int:
        return self.batch * self.seq * self.accum

    def command(self) -> list[str]:
        timer = [sys.executable, str(TIMER), "--warmup", str(self.warmup), "--tokens-per-iter", str(self.tokens())]
        if self.preset == "te-fsdp-example":
            timer += ["--flops-per-token", str(FLOPS_TE_SHAPE), "--peak-tflops", "989"]
        if self.profile or self.profile_window:
            lo, hi = self.profile_window or (self.warmup + 1, self.warmup + 5)
            timer += ["--profile-iters", f"{lo}:{hi}"]
        if self.trace:
            timer += ["--profile-trace", self.trace]
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
        if self.kind == "fsdp":
            prec = ["--dtype", "bf16", "--no-fp8"] if self.precision == "bf16" else ["--precision", self.precision]
            ac = ["--checkpoint-layer", "transformerlayer"] if self.ac else []
            return [*torchrun, *timer[1:], "--", str(FSDP), "-k", "24", "-b", str(self.batch), "-s", str(self.seq),
                    "-n", "16", "-d", "128", "-i", str(self.iters), *ac, *prec]
        if self.kind == "torch_ref":
            ac = ["--ac"] if self.ac else []
            return [*timer, "--", str(TORCH_REF), "-k", "24", "-b", str(self.batch), "-s", str(self.seq),
                    "-i", str(self.iters), "--dropout", "0", *ac]
        ac = "--activation-checkpointing" if self.ac else "--no-activation-checkpointing"
        return [*torchrun, *timer[1:], str(LEVERS), "--", "--levers", self.levers, "--",
                "--model-preset", self.preset, "--seq-length", str(self.seq), "--batch-size", str(self.batch), ac,
                "--precision", self.precision, "--backend", self.backend, "--max-steps", str(self.iters),
                "--timing-warmup-steps", str(self.warmup), "--log-every", "1", "--checkpoint-dir", "",
                "--model-dir", "", "--output-data-dir", "", "--output-dir", "/tmp/lfl_out",
                *(["--grad-accum-steps", str(self.accum)] if self.accum > 1 else []), *self.flags]


def te_shape(batch: int, ac: bool) -> str:
    return f"b{batch}-{'ac' if ac else 'noac'}"


def table(batch: int, ac: bool) -> list[Run]:
    c = te_shape(batch, ac)
    t = 240 if ac else 150
    return [
        Run(f"{c}/fsdp.py/bf16", "fsdp", batch, ac, "bf16", timeout=t),
        Run(f"{c}/fsdp.py/fp8", "fsdp", batch, ac, "fp8", timeout=t),
        Run(f"{c}/torch-stack/bf16", "torch_ref", batch, ac, "bf16", timeout=t),
        Run(f"{c}/trainer-te/bf16", "trainer", batch, ac, "bf16", "te", timeout=t),
        Run(f"{c}/trainer-te/fp8", "trainer", batch, ac, "fp8", "te", timeout=t),
        Run(f"{c}/trainer-torch/bf16", "trainer", batch, ac, "bf16", "torch", timeout=t),
    ]


CANDIDATES = ("sbhd", "keep-params", "sbhd,keep-params")


def best_levers(results: dict) -> str:
    """The lever set that made te fp8 at batch 8 fastest, if by more than 1%; else none."""
    base = results.get("b8-noac/trainer-te/fp8", {}).get("s_per_iter")
    best, best_s = "", base
    for lv in CANDIDATES:
        s = results.get(f"b8-noac/trainer-te/fp8+{lv}", {}).get("s_per_iter")
        if s and best_s and s < best_s:
            best, best_s = lv, s
    if base and best_s and best_s > base / 1.01:
        return ""
    return best


# Issue 26's second round of levers, now trainer flags: each alone against the base trainer and
# fsdp.py in one call (12 iterations, the first 4 left out), the winners together after.
L2_ITERS, L2_WARMUP = 12, 4
L2_LEVERS = {
    "unsharded": ["--no-single-gpu-fsdp"],
    "graphs": ["--no-single-gpu-fsdp", "--cuda-graphs"],  # the graphs need the unsharded model
    # fsdp.py's DelayedScaling keeps 32 amaxes, the trainer's default 1024 (TE's): like for like
    "amax32": ["--fp8-amax-history-len", "32"],
    "late-sync": ["--late-sync"],
}
L2_WIN = 1.01  # a lever wins when the base's median is more than 1% slower than its own
# The short name of each lever flag (a row's label says exactly which flags ran).
FLAG_NAMES = {"--no-single-gpu-fsdp": "unsharded", "--cuda-graphs": "graphs", "--late-sync": "late-sync",
              "--fp8-weight-cache": "weight-cache", "--fp8-amax-history-len": "amax"}


def _l2(rid: str, kind: str, batch: int, ac: bool, prec: str, expect: float, flags=(), **kw) -> Run:
    kw.setdefault("timeout", 240 if ac else 150)
    return Run(f"L2/{rid}", kind, batch, ac, prec, "te", flags=list(flags), iters=L2_ITERS,
               warmup=L2_WARMUP, expect_s=expect, **kw)


def l2_parent(name: str) -> str | None:
    """The lever whose flags ``name``'s flags extend (graphs: unsharded), None for the base run."""
    own = L2_LEVERS[name]
    subsets = [n for n, f in L2_LEVERS.items() if n != name and len(f) < len(own) and own[:len(f)] == f]
    return max(subsets, key=lambda n: len(L2_LEVERS[n])) if subsets else None


def l2_winners(results: dict, base: str = "L2/b8-noac/trainer-te/fp8") -> list[str]:
    """The levers whose fp8 batch-8 median beat, by more than 1% (same call), the run they add
    to: the base trainer, or for a lever that needs another (graphs) that lever's run."""
    won = []
    for name in L2_LEVERS:
        parent = l2_parent(name)
        ref = results.get(f"{base}+{parent}" if parent else base, {}).get("median_s")
        m = results.get(f"{base}+{name}", {}).get("median_s")
        if ref and m and ref / m > L2_WIN:
            won.append(name)
    return won


def l2_flags(names: list[str]) -> list[str]:
    return list(dict.fromkeys(f for n in names for f in L2_LEVERS[n]))


def levers2(results: dict) -> list[Run]:
    """fsdp.py and the base trainer at b8-noac, bf16 and fp8; each lever alone on fp8 (and the
    unsharded path on bf16); the 1b preset (batch 4, seq 4096) bf16 and fp8, base and graphed.
    ``expect`` is each run's wall seconds, from raw/issue26_like_for_like_h200.json (its wall
    less the iterations this stage does not run; + ~8 s for a graph capture)."""
    b1 = dict(preset="1b", seq=4096)
    runs = [
        _l2("b8-noac/fsdp.py/bf16", "fsdp", 8, False, "bf16", 41),
        _l2("b8-noac/fsdp.py/fp8", "fsdp", 8, False, "fp8", 30),
        _l2("b8-noac/trainer-te/bf16", "trainer", 8, False, "bf16", 46),
        _l2("b8-noac/trainer-te/fp8", "trainer", 8, False, "fp8", 38),
        *(_l2(f"b8-noac/trainer-te/fp8+{name}", "trainer", 8, False, "fp8", 46 if name == "graphs" else 38,
              flags) for name, flags in L2_LEVERS.items() if name != "late-sync"),
        _l2("1b-b4/trainer-te/fp8", "trainer", 4, False, "fp8", 31, **b1),
        _l2("1b-b4/trainer-te/fp8+graphs", "trainer", 4, False, "fp8", 38, L2_LEVERS["graphs"], **b1),
        _l2("1b-b4/trainer-te/bf16", "trainer", 4, False, "bf16", 29, **b1),
        _l2("1b-b4/trainer-te/bf16+graphs", "trainer", 4, False, "bf16", 36, L2_LEVERS["graphs"], **b1),
        _l2("b8-noac/trainer-te/bf16+unsharded", "trainer", 8, False, "bf16", 46, L2_LEVERS["unsharded"]),
        # last: a GPU-bound step hides a host read before the update (the first cut if time is short)
        _l2("b8-noac/trainer-te/fp8+late-sync", "trainer", 8, False, "fp8", 38, L2_LEVERS["late-sync"]),
    ]
    return runs


def levers2_best(results: dict) -> list[Run]:
    """After ``levers2``: the winning levers together (bf16 and fp8, batch 8; skipped where the
    set is one lever already measured alone), the FP8 weight cache at 2 micro-batches, then the
    b16-ac configuration (fsdp.py, base trainer, winners) as long as time remains."""
    won = l2_winners(results)
    tag, flags = "+".join(won), l2_flags(won)
    runs = []
    if won:
        if len(won) > 1:
            runs.append(_l2(f"b8-noac/trainer-te/fp8+{tag}", "trainer", 8, False, "fp8", 46, flags))
        if won != ["unsharded"]:
            runs.append(_l2(f"b8-noac/trainer-te/bf16+{tag}", "trainer", 8, False, "bf16", 50, flags))
    runs += [
        # 42 and 43 s in call 8 of 2026-12-02 (call 7 started the first with 45 s left and cut it)
        _l2("b4x2-noac/trainer-te/fp8", "trainer", 4, False, "fp8", 44, accum=2),
        _l2("b4x2-noac/trainer-te/fp8+weight-cache", "trainer", 4, False, "fp8", 44, ["--fp8-weight-cache"],
            accum=2),
        _l2("b16-ac/fsdp.py/bf16", "fsdp", 16, True, "bf16", 57),
        _l2("b16-ac/fsdp.py/fp8", "fsdp", 16, True, "fp8", 45),
        _l2("b16-ac/trainer-te/bf16", "trainer", 16, True, "bf16", 62),
        _l2("b16-ac/trainer-te/fp8", "trainer", 16, True, "fp8", 55),
    ]
    ac_flags = [f for f in flags if f != "--cuda-graphs"]  # graphs refuse checkpointing
    if ac_flags:
        runs += [_l2(f"b16-ac/trainer-te/{p}+{'+'.join(n for n in won if n != 'graphs') or 'unsharded'}",
                     "trainer", 16, True, p, 62, ac_flags) for p in ("fp8", "bf16")]
    return runs


# Issue 40: the step time at small steps, before and after each lever, bf16 and fp8, one call
# block. (shape id, preset, batch, seq, expected wall s per run from the 2026-12-02 1b runs)
SMALL_SHAPES = (("1b-b4-s4096", "1b", 4, 4096, 31), ("1b-b1-s2048", "1b", 1, 2048, 26),
                ("1b-b2-s4096", "1b", 2, 4096, 28), ("1b-b4-s2048", "1b", 4, 2048, 28),
                ("te-b1-s2048", "te-fsdp-example", 1, 2048, 30), ("te-b2-s2048", "te-fsdp-example", 2, 2048, 32),
                ("te-b4-s2048", "te-fsdp-example", 4, 2048, 34), ("1b-b2-s8192", "1b", 2, 8192, 32))
SMALL_LEVERS = {  # name: (trainer flags, environment)
    "graphs": (["--no-single-gpu-fsdp", "--cuda-graphs"], {}),
    "unsharded": (["--no-single-gpu-fsdp"], {}),
    "fp8-head": (["--no-high-precision-lm-head"], {}),
    "qinit": (["--quantized-model-init"], {}),
    # the next batch made while the GPU runs the update (session v8's profiles: the GPU waited
    # 4.6-24.6 ms a step for the host's synthetic batch; session v9: no gain with one host thread)
    "prefetch": (["--data-prefetch"], {}),
    # PyTorch's pool of one host thread per core, what a one-GPU run had before the trainer's one
    # thread per GPU process (session v9, one H100: the pool's runs up to 10% slower and noisier)
    "pool": ([], {"OMP_NUM_THREADS": str(os.cpu_count() or 1)}),
}


def _small(shape: str, prec: str, levers: tuple[str, ...] = (), tag: str = "") -> Run:
    sid, preset, batch, seq, expect = next(x for x in SMALL_SHAPES if x[0] == shape)
    flags = [f for lv in levers for f in SMALL_LEVERS[lv][0]]
    env = {k: v for lv in levers for k, v in SMALL_LEVERS[lv][1].items()}
    name = f"S/{sid}/{prec}" + "".join(f"+{lv}" for lv in levers) + tag
    return Run(name, "trainer", batch, False, prec, "te", preset=preset, seq=seq, flags=flags, env=env,
               iters=L2_ITERS, warmup=L2_WARMUP, timeout=150,
               expect_s=expect + (8 if "graphs" in levers else 0))


def small(results: dict) -> list[Run]:
    """Issue 40's table, most important first: the 1b batch-4 seq-4096 pair (the bar: fp8 >=
    1.30x bf16), each lever on it (qinit first: it ran 1.05x faster in session v9 but did not
    learn until session v12's fix; then with the unsharded model and the graphs; then the pool),
    the other small shapes (1b b1-b4 s2048-4096, te-fsdp-example b1-b4 s2048) bf16 and fp8 with
    the graphs on the smallest, then the bar's pair again."""
    key = "1b-b4-s4096"
    runs = [_small(key, "bf16"), _small(key, "fp8"),
            _small(key, "fp8", ("qinit",)),
            # qinit learns since session v12 (1.261x bf16 on an H100): with the one-GPU levers
            _small(key, "fp8", ("qinit", "unsharded")), _small(key, "fp8", ("qinit", "graphs")),
            _small(key, "fp8", ("pool",)), _small(key, "bf16", ("pool",)),
            _small(key, "fp8", ("graphs",)), _small(key, "bf16", ("graphs",)),
            _small(key, "fp8", ("fp8-head",)), _small(key, "fp8", ("unsharded",)),
            _small("1b-b1-s2048", "bf16"), _small("1b-b1-s2048", "fp8"),
            _small("1b-b1-s2048", "fp8", ("graphs",)), _small("1b-b1-s2048", "bf16", ("graphs",)),
            _small("1b-b2-s4096", "bf16"), _small("1b-b2-s4096", "fp8"),
            _small("te-b2-s2048", "bf16"), _small("te-b2-s2048", "fp8"),
            _small("te-b1-s2048", "bf16"), _small("te-b1-s2048", "fp8"),
            _small(key, "bf16", tag="#2"), _small(key, "fp8", tag="#2"),
            # while time remains
            _small("1b-b4-s2048", "bf16"), _small("1b-b4-s2048", "fp8"),
            _small("te-b4-s2048", "bf16"), _small("te-b4-s2048", "fp8"),
            _small("te-b2-s2048", "fp8", ("graphs",)), _small("te-b2-s2048", "bf16", ("graphs",)),
            _small(key, "bf16", ("unsharded",)),
            _small(key, "fp8", ("prefetch",)), _small(key, "bf16", ("prefetch",))]
    return runs


def small_memory(results: dict) -> list[Run]:
    """Issue 40's new modes' memory on shapes other than the bar's (the only one the unsharded
    estimate was checked on, session v15): the unsharded model and the graphs (whose private pool
    the allocated peak leaves out), bf16 and fp8, the plain FSDP2 pair where no session ran it
    (the new sequence length), qinit with both at one shape. Rows of ``small_steps.json``."""
    runs = []
    # the other model first (held out from the rows the terms were checked on), then 1b
    for shape in ("te-b2-s2048", "1b-b2-s4096", "te-b4-s2048", "1b-b1-s2048", "1b-b4-s2048", "1b-b2-s8192"):
        plain = [_small(shape, p) for p in ("bf16", "fp8")] if shape == "1b-b2-s8192" else []
        graphs = [] if shape == "1b-b1-s2048" else [_small(shape, p, ("graphs",)) for p in ("bf16", "fp8")]
        runs += [_small(shape, p, ("unsharded",)) for p in ("bf16", "fp8")] + graphs + plain
        if shape == "te-b4-s2048":  # qinit's unsharded estimate: +2.3% at the bar's shape
            runs += [_small("1b-b2-s4096", "fp8", ("qinit", lv)) for lv in ("unsharded", "graphs")]
    return runs


def small_steps_rows(results: dict, session: str = "", gpu: str = "") -> list[dict]:
    """``benchmarks/trainer/small_steps.json``'s rows (issue 40): one per ``S/`` run that timed.
    ``gpu`` names the card every row was timed on (the state file does not record it)."""
    rows = []
    for rid, rec in results.items():
        run = rec.get("run", {})
        if not rid.startswith("S/") or not rec.get("median_s"):
            continue
        tokens = run["batch"] * run["seq"] * run.get("accum", 1)
        p90 = rec.get("p90_s")
        levers = rid.split("/")[2].split("#")[0].split("+")[1:]
        rows.append({"id": rid, "gpu": gpu, "model_preset": run["preset"], "batch_size": run["batch"],
                     "seq_length": run["seq"], "precision": run["precision"], "levers": levers,
                     "trainer_flags": run.get("flags", []), "env": run.get("env", {}),
                     "session_id": rec.get("session_id") or session,
                     "tokens_per_s_per_gpu_median": round(tokens / rec["median_s"], 1),
                     "tokens_per_s_per_gpu_p90": round(tokens / p90, 1) if p90 else None,
                     "spread": rec.get("spread"), "mfu_bf16_peak": rec.get("mfu_bf16_peak"),
                     "mfu_precision_peak": (rec.get("trainer") or {}).get("mfu"),
                     "peak_allocated_gib": rec.get("peak_gib"),
                     **{k: rec[k] for k in ("peak_reserved_gib", "graph_pool_gib", "graph_pool_free_gib")
                        if k in rec},
                     "rc": rec.get("rc")})
    return rows


def small_table(results: dict) -> str:
    """Issue 40's table: each small shape's bf16 and fp8 medians, the fp8/bf16 ratio, and each
    lever against the same shape and precision without it (same call block)."""
    rows = small_steps_rows(results)
    if not rows:
        return ""
    by = {r["id"]: r for r in rows}
    out = ["| run | median tokens/s/GPU (p90) | spread | MFU (bf16 peak) | peak GiB | / same precision, no lever | fp8 / bf16 (same levers) |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        sid, prec = r["id"].split("/")[1], r["precision"]
        tail = r["id"].split("/", 2)[2][len(prec):]
        base = by.get(f"S/{sid}/{prec}" + ("#2" if r["id"].endswith("#2") else ""))
        other = by.get(f"S/{sid}/bf16{tail}") if prec != "bf16" else None
        vs = f"{r['tokens_per_s_per_gpu_median'] / base['tokens_per_s_per_gpu_median']:.3f}" \
            if base and base is not r else ""
        ratio = f"**{r['tokens_per_s_per_gpu_median'] / other['tokens_per_s_per_gpu_median']:.3f}**" if other else ""
        p90 = r["tokens_per_s_per_gpu_p90"]
        out.append(f"| {r['id']} | {r['tokens_per_s_per_gpu_median']:,.0f} ({p90:,.0f}) | "
                   f"{_pct(r['spread'])} | {_pct(r['mfu_bf16_peak'])} | {r['peak_allocated_gib']} | {vs} | {ratio} |"
                   if p90 else f"| {r['id']} | {r['tokens_per_s_per_gpu_median']:,.0f} | {_pct(r['spread'])} | "
                   f"{_pct(r['mfu_bf16_peak'])} | {r['peak_allocated_gib']} | {vs} | {ratio} |")
    failed = [rid for rid, rec in results.items() if rid.startswith("S/") and not rec.get("median_s")]
    if failed:
        out.append("")
        out.append("Runs that did not time: " + ", ".join(f"{rid} (rc={results[rid].get('rc')})" for rid in failed))
    return "\n".join(out)


def run_flags(rec: dict) -> list[str]:
    """The trainer flags a recorded run added to the base command (grad accumulation included)."""
    run = rec.get("run", {})
    accum = run.get("accum", 1)
    return [*(["--grad-accum-steps", str(accum)] if accum > 1 else []), *run.get("flags", [])]


def flag_label(flags: list[str]) -> str:
    """``+name`` per lever flag, in the order given (``--fp8-amax-history-len 32``: ``+amax32``)."""
    out, it = [], iter(flags)
    for f in it:
        if f == "--grad-accum-steps":
            next(it, None)  # in the configuration's name already (b4x2)
        elif f == "--fp8-amax-history-len":
            out.append(f"amax{next(it, '')}")
        elif f.startswith("--"):
            out.append(FLAG_NAMES.get(f, f[2:]))
    return "".join(f"+{x}" for x in out)


def _l2_subset(results: dict, prefix: str, flags: list[str]) -> tuple[str, dict] | None:
    """The run of ``prefix`` (shape/side/precision) whose flags are the largest proper subset of
    ``flags``: what the row's last lever adds to (the base run has no flags)."""
    best = None
    for rid, rec in results.items():
        other = rec.get("run", {}).get("flags", [])
        if (rid.startswith("L2/") and rid[3:].split("+")[0] == prefix and set(other) < set(flags)
                and rec.get("tokens_per_s") and (best is None or len(other) > len(best[1]["run"]["flags"]))):
            best = (rid, rec)
    return best


def levers2_table(results: dict) -> str:
    """The ``L2/`` runs: median tokens/s (spread), against fsdp.py of the same configuration and
    precision, against the base trainer and against the run without the row's last lever. The
    label is built from the flags that ran, which the ``trainer flags`` column lists exactly."""
    out = ["| run | trainer flags | stage | median tokens/s (spread) | / fsdp.py | / base trainer "
           "| / without the last lever |", "|---|---|---|---|---|---|---|"]
    for rid, rec in results.items():
        if not rid.startswith("L2/"):
            continue
        shape, side, rest = rid[3:].split("/", 2)
        prec = rest.split("+")[0]
        flags, own = run_flags(rec), rec.get("run", {}).get("flags", [])
        ref = results.get(f"L2/{shape}/fsdp.py/{prec}", {}).get("tokens_per_s")
        base = results.get(f"L2/{shape}/trainer-te/{prec}", {}).get("tokens_per_s")
        tps = rec.get("tokens_per_s")
        r1 = f"{tps / ref:.3f}" if tps and ref and side != "fsdp.py" else ""
        r2 = f"{tps / base:.3f}" if tps and base and own else ""
        sub = _l2_subset(results, f"{shape}/{side}/{prec}", own) if tps and own else None
        r3 = f"{tps / sub[1]['tokens_per_s']:.3f} (vs {prec}{flag_label(sub[1]['run']['flags']) or ' base'})" \
            if sub and sub[1]["run"]["flags"] else ""
        shown = " ".join(flags) if side != "fsdp.py" else "(fsdp.py)"
        out.append(f"| {shape}/{side}/{prec}{flag_label(own)} | {shown or '(none)'} | {rec.get('stage', '')} "
                   f"| {_tps(rec)} rc={rec.get('rc')} | {r1} | {r2} | {r3} |")
    for tag in ("", "+graphs"):  # the 1b bar: fp8 >= 1.20x its bf16
        fp8, bf16 = (results.get(f"L2/1b-b4/trainer-te/{p}{tag}", {}) for p in ("fp8", "bf16"))
        if fp8.get("tokens_per_s") and bf16.get("tokens_per_s"):
            lf, lb = flag_label(fp8["run"]["flags"]), flag_label(bf16["run"]["flags"])
            out.append(f"\n1b-b4 fp8{lf} / bf16{lb}: **{fp8['tokens_per_s'] / bf16['tokens_per_s']:.3f}** (goal 1.20)")
    return "\n".join(out)


def stages(results: dict) -> dict[str, list[Run]]:
    best = best_levers(results)
    b1 = dict(preset="1b", seq=4096, timeout=150)
    return {
        "profile": [
            Run("profile/b8-noac/trainer-te/fp8", "trainer", 8, False, "fp8", "te", profile=True),
            Run("profile/b8-noac/fsdp.py/fp8", "fsdp", 8, False, "fp8", profile=True),
            Run("profile/1b-b4/trainer-te/bf16", "trainer", 4, False, "bf16", "te", profile=True, **b1),
            Run("profile/1b-b4/trainer-te/fp8", "trainer", 4, False, "fp8", "te", profile=True, **b1),
        ],
        "table-b8": table(8, False),
        "levers-b8": [
            *(Run(f"b8-noac/trainer-te/fp8+{lv}", "trainer", 8, False, "fp8", "te", levers=lv) for lv in CANDIDATES),
            Run("b8-noac/trainer-te/fp8+bf16-masters", "trainer", 8, False, "fp8", "te", levers="bf16-masters"),
            Run("b8-noac/trainer-torch/bf16+compile", "trainer", 8, False, "bf16", "torch",
                flags=["--compile"], timeout=300),
            Run("b8-noac/trainer-te/fp8+quantized-init", "trainer", 8, False, "fp8", "te",
                flags=["--quantized-model-init"]),
        ],
        "1b": [
            Run("1b-b4/trainer-te/bf16", "trainer", 4, False, "bf16", "te", **b1),
            Run("1b-b4/trainer-te/fp8", "trainer", 4, False, "fp8", "te", **b1),
            Run("1b-b4/trainer-te/bf16+compiled-loss", "trainer", 4, False, "bf16", "te",
                levers="compiled-loss", **b1),
            Run("1b-b4/trainer-te/fp8+compiled-loss", "trainer", 4, False, "fp8", "te",
                levers="compiled-loss", **b1),
            Run("1b-b4/trainer-te/fp8+fp8-lm-head", "trainer", 4, False, "fp8", "te",
                flags=["--no-high-precision-lm-head"], **b1),
            Run("1b-b4/trainer-te/fp8+compiled-loss+fp8-lm-head", "trainer", 4, False, "fp8", "te",
                levers="compiled-loss", flags=["--no-high-precision-lm-head"], **b1),
        ],
        "table-b16ac": table(16, True),
        "best": [
            *(Run(f"{te_shape(b, ac)}/trainer-te/{p}+{best}", "trainer", b, ac, p, "te", levers=best,
                  timeout=240 if ac else 150)
              for (b, ac) in ((8, False), (16, True)) for p in ("bf16", "fp8") if best),
            Run("b16-ac/trainer-torch/bf16+compile", "trainer", 16, True, "bf16", "torch",
                flags=["--compile"], timeout=360),
            *(Run(f"1b-b4/trainer-te/{p}+compiled-loss+{best}", "trainer", 4, False, p, "te",
                  levers=f"compiled-loss,{best}", **b1) for p in ("bf16", "fp8") if best),
        ],
        "repeat": [Run(r.id + "#2", r.kind, r.batch, r.ac, r.precision, r.backend, timeout=r.timeout)
                   for r in table(8, False)],
        "stall": stall_runs(),
        "levers2": levers2(results),
        "levers2-best": levers2_best(results),
        "small": small(results),
        "small-memory": small_memory(results),
    }


def stall_runs() -> list[Run]:
    """30-step runs with Python's automatic collector (gc-auto) and the trainer's schedule."""
    out: list[Run] = []
    shapes = (("te-fsdp-example", 4, 4096), ("1b", 4, 4096), ("small", 8, 1024))
    for preset, batch, seq in shapes:
        for prec in ("bf16", "fp8"):
            for gc_flag, label in ((["--gc-every", "0"], "gc-auto"), ([], "gc-scheduled")):
                if preset == "small" and label == "gc-auto":
                    continue
                out.append(Run(f"stall/{preset}-b{batch}-s{seq}/{prec}/{label}", "trainer", batch, False,
                               prec, "te", preset=preset, seq=seq, flags=gc_flag, iters=STALL_ITERS,
                               warmup=STALL_WARMUP, timeout=150))
    return out


TIMER_RE = re.compile(r"steady_timer script=\S+ iters=(\d+) warmup=\d+ s_per_iter=([\d.]+) min=([\d.]+) max=([\d.]+)"
                      r"(?: median=([\d.]+) p90=([\d.]+) times=([\d.,]+))?")
KEEP = re.compile(r"steady_timer|steady_profile|Peak Memory|torch_ref|\[trainer\] (step|summary|event|recipe)|\[levers\]|"
                  r"Error|error|Traceback|Killed|OutOfMemory|returned a view tensor")


TRAINER_KEYS = ("steady_state_step_s", "steady_state_step_s_median", "steady_state_step_s_p90",
                "steady_state_step_s_max", "tokens_per_s_per_gpu_median", "final_loss", "flops_per_token",
                "mfu", "mfu_bf16_peak", "mfu_bf16_peak_median", "peak_allocated_bytes", "recipe", "backend",
                "status")


def parse(out: str, run: Run) -> dict:
    rec: dict = {"run": asdict(run), "session_id": os.environ.get("GPU_SESSION_ID")}
    matches = list(TIMER_RE.finditer(out))
    m = matches[-1] if matches else None
    if m:
        rec.update(iters=int(m.group(1)), s_per_iter=float(m.group(2)), min_s=float(m.group(3)),
                   max_s=float(m.group(4)), tokens_per_s_mean=round(run.tokens() / float(m.group(2)), 1))
        median = float(m.group(5)) if m.group(5) else float(m.group(2))
        rec.update(median_s=median, tokens_per_s=round(run.tokens() / median, 1),
                   spread=round((rec["max_s"] - rec["min_s"]) / median, 4),
                   max_over_median=round(rec["max_s"] / median, 3))
        if m.group(6):
            rec.update(p90_s=float(m.group(6)), times=[float(t) for t in m.group(7).split(",") if t])
    for line in out.splitlines():
        if line.startswith("steady_profile "):
            rec["profile"] = json.loads(line.split(" ", 1)[1])
        elif "Peak Memory Use" in line:
            found = re.findall(r"([\d.]+)\s*MiB|([\d.]+)\s*MB", line)
            if found:
                rec["peak_gib"] = round(float(found[-1][0] or found[-1][1]) * 1e6 / 2**30, 2)
        elif line.startswith("torch_ref "):
            pk = re.search(r"peak_MB=([\d.]+)", line)
            if pk:
                rec["peak_gib"] = round(float(pk.group(1)) * 1e6 / 2**30, 2)
        elif line.startswith("[trainer] summary "):
            s = json.loads(line.split(" ", 2)[2])
            rec["trainer"] = {k: v for k, v in s.items() if k in TRAINER_KEYS or k.startswith("gc_")}
            if s.get("peak_allocated_bytes"):
                rec["peak_gib"] = round(s["peak_allocated_bytes"] / 2**30, 2)
            if s.get("peak_reserved_bytes"):
                rec["peak_reserved_gib"] = round(s["peak_reserved_bytes"] / 2**30, 2)
            if s.get("graph_pool_bytes") is not None:  # --cuda-graphs: the pools' free part is
                # where replays write activations, outside the allocated peak (metrics.graph_pool_bytes)
                rec["graph_pool_free_gib"] = round(s["graph_pool_free_bytes"] / 2**30, 2)
                rec["graph_pool_gib"] = round(s["graph_pool_bytes"] / 2**30, 2)
            if rec.get("s_per_iter") and s.get("flops_per_token"):
                rec["mfu_bf16_peak"] = round(rec["tokens_per_s"] * s["flops_per_token"] / 989e12, 4)
        elif line.startswith("[trainer] step ") and " gc_s=" in line:
            step, gc_s = re.search(r"step=(\d+)", line), re.search(r" gc_s=([\d.e+-]+|nan)", line)
            if step and gc_s:
                rec.setdefault("gc_s_per_step", {})[step.group(1)] = float(gc_s.group(1))
    if "mfu_bf16_peak" not in rec and rec.get("tokens_per_s") and run.preset == "te-fsdp-example":
        rec["mfu_bf16_peak"] = round(rec["tokens_per_s"] * FLOPS_TE_SHAPE / 989e12, 4)
    return rec


PAIRS = (("fsdp.py/bf16", "trainer-te/bf16", 1.02), ("fsdp.py/fp8", "trainer-te/fp8", 1.05),
         ("torch-stack/bf16", "trainer-torch/bf16", 1.05))


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _tps(rec: dict | None) -> str:
    if not rec or not rec.get("tokens_per_s"):
        return "n/a"
    return f"{rec['tokens_per_s']:,.0f} (spread {_pct(rec.get('spread'))})"


def _pause(tr: dict) -> str:
    pause = tr.get("gc_max_pause_s")
    return "n/a" if pause is None else f"{pause:.3f} s ({tr.get('gc_max_pause_step')})"


def like_table(results: dict, prefix: str = "") -> str:
    """Like for like (medians, spreads, ratios of medians) of the runs whose ids start with
    ``prefix`` ("": the ``table-*`` stages; "L2/": the ``levers2`` stage's base runs); "" if none."""
    out = ["| configuration | reference: median tokens/s (spread) | trainer: median tokens/s (spread) "
           "| ratio of medians | goal |", "|---|---|---|---|---|"]
    for shape, label in (("b8-noac", "batch 8, no checkpointing"), ("b16-ac", "batch 16, checkpointing")):
        for ref, mine, goal in PAIRS:
            r, t = results.get(f"{prefix}{shape}/{ref}"), results.get(f"{prefix}{shape}/{mine}")
            if not r and not t:
                continue
            ratio = (f"**{t['tokens_per_s'] / r['tokens_per_s']:.3f}**"
                     if r and t and r.get("tokens_per_s") and t.get("tokens_per_s") else "n/a")
            out.append(f"| {label}, {mine.split('/')[1]} | {ref.split('/')[0]} {_tps(r)} | "
                       f"{mine.split('/')[0]} {_tps(t)} | {ratio} | {goal:.2f} |")
    return "\n".join(out) if len(out) > 2 else ""


def stall_table(results: dict) -> str:
    """The 30-step ``stall`` runs: each step against the median; "" if none."""
    out = ["| 30-step run | median step s | slowest after warm-up / median | slowest step | "
           "automatic full collections | longest collection (step) | median tokens/s | MFU (bf16 peak) |",
           "|---|---|---|---|---|---|---|---|"]
    for rid, rec in results.items():
        if not rid.startswith("stall/") or not rec.get("times"):
            continue
        times = rec["times"]
        slowest = max(range(len(times)), key=times.__getitem__)
        tr = rec.get("trainer") or {}
        out.append(
            f"| {rid[6:]} | {rec['median_s']:.4f} | {rec['max_over_median']:.2f}x | "
            f"{slowest + 1 + rec['run']['warmup']} | {tr.get('gc_automatic_full', 'n/a')} | "
            f"{_pause(tr)} | "
            f"{rec['tokens_per_s']:,.0f} | {_pct(rec.get('mfu_bf16_peak'))} |")
    return "\n".join(out) if len(out) > 2 else ""


def tables(results: dict) -> str:
    """The Markdown tables of a results file that has runs for them: like for like, the 30-step
    stall runs, like for like of the ``levers2`` base runs and the ``levers2`` table."""
    has_l2 = any(rid.startswith("L2/") for rid in results)
    parts = [like_table(results), stall_table(results), like_table(results, "L2/"),
             levers2_table(results) if has_l2 else "", small_table(results)]
    return "\n\n".join(p for p in parts if p)


def run_env(run: Run) -> dict[str, str]:
    """The environment a run's process gets: this one's, the run's own, this checkout first on
    the path, unbuffered output, NVLink multicast off (the lent machines' rule)."""
    return {**os.environ, **run.env, "PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0",
            "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}


FIT_MARGIN = 1.15  # a run's wall wanders by ~10% between calls (the b4x2 run: 42 s, then cut at 45 s)


def fits(run: Run, left: float) -> bool:
    """Whether a run is started with ``left`` seconds of the call's budget (its timeout is then
    capped at ``left``): its expected wall with a margin, or 45 s (its timeout if shorter)."""
    return left >= FIT_MARGIN * (run.expect_s or min(run.timeout, 45))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--time-budget", type=float, default=0.0, help="seconds this call may spend")
    p.add_argument("--table", default="", metavar="RESULTS_JSON", help="print the Markdown tables and exit")
    p.add_argument("--stages", default="stall,table-b8,1b,table-b16ac,profile,levers-b8,best,repeat")
    p.add_argument("--state", default="/root/lfl_state.json")
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "like_for_like.json"))
    p.add_argument("--raw-log", default=os.path.join(os.environ.get("OUT", "/tmp"), "like_for_like_raw.log"))
    p.add_argument("--only", default="", help="run ids separated by ; : run only these (of the stages given)")
    p.add_argument("--dry-run", action="store_true", help="print the commands only")
    a = p.parse_args()
    if a.table:
        loaded = json.loads(Path(a.table).read_text())
        print(tables(loaded))
        return 0
    if a.time_budget <= 0 and not a.dry_run:
        p.error("--time-budget SECONDS is required (or --table RESULTS_JSON)")
    end = time.time() + a.time_budget
    state = Path(a.state)
    results: dict = json.loads(state.read_text()) if state.exists() else {}
    planned = 0.0
    for stage in a.stages.split(","):
        runs = stages(results).get(stage)
        if runs is None:
            raise SystemExit(f"--stages: unknown stage {stage!r}")
        for run in runs:
            if run.id in results and results[run.id].get("s_per_iter"):
                continue
            if a.only and run.id not in a.only.split(";"):
                continue
            cmd = run.command()
            if a.dry_run:
                planned += run.expect_s
                expect = f"expect={run.expect_s:.0f}s total={planned:.0f}s " if run.expect_s else ""
                print(run.id, expect + " ".join(shlex.quote(c) for c in cmd), run.env or "")
                continue
            left = end - time.time()
            if not fits(run, left):  # a run cut short measures nothing
                print(f"[lfl] {run.id}: skipped, {left:.0f} s left", flush=True)
                continue
            t0 = time.time()
            try:
                proc = subprocess.run(cmd, env=run_env(run), capture_output=True, text=True, timeout=min(run.timeout, left))
                out, rc = proc.stdout + proc.stderr, proc.returncode
            except subprocess.TimeoutExpired as exc:
                out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
                rc = 124
            rec = parse(out, run)
            rec.update(rc=rc, wall_s=round(time.time() - t0, 1), stage=stage)
            results[run.id] = rec
            state.write_text(json.dumps(results, indent=1))
            Path(a.out).write_text(json.dumps(results, indent=1))
            kept = [ln[:2000] for ln in out.splitlines() if KEEP.search(ln)]
            with open(a.raw_log, "a") as fh:
                fh.write(f"### {run.id} rc={rc} wall={rec['wall_s']}s env={run.env}\n$ {shlex.join(cmd)}\n")
                fh.write("\n".join(kept[-60:]) + "\n")
            print(f"[lfl] {run.id}: rc={rc} s/iter={rec.get('s_per_iter')} tokens/s={rec.get('tokens_per_s')} "
                  f"peak={rec.get('peak_gib')} GiB wall={rec['wall_s']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
