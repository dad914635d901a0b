"""Measure the trainer's steady-state step time over a grid of configurations, on one GPU, in one process.

Writes the data the throughput model is calibrated and checked against
(benchmarks/throughput/h200_grid.json). For each configuration ``kfp_sagemaker_blackwell.trainer.train.run`` (TE
backend) trains ``--steps`` steps on synthetic tokens; a global optimizer-step post-hook
(``torch.optim.optimizer.register_optimizer_step_post_hook``, as in
benchmarks/trainer/steady_timer.py) synchronises CUDA and time-stamps every step, and the
median of the step intervals after the first ``--warmup`` steps is the step time. Model,
optimizer and caches are freed between configurations (as in benchmarks/memory/measure_grid.py),
and dynamo's compile caches emptied (each configuration compiles its own loss, as a user's job
does: ``gpu_record.fresh_compile_state``).

    # the calibration grid, then the validation configurations, stopping after 540 s
    python3 benchmarks/throughput/measure.py --out grid.json --split all --time-budget 540
    # skip what an earlier (partial) file already holds, e.g. in a later call
    python3 benchmarks/throughput/measure.py --out grid2.json --resume grid.json
    # print the configurations (and the memory estimate of each) without a GPU
    python3 benchmarks/throughput/measure.py --out /dev/null --dry-run
    # issue 25's held-out families (never in h200_grid.json), TE backend; then the torch
    # backend's own set (never imports transformer_engine: it can run while TE installs)
    python3 benchmarks/throughput/measure.py --out heldout.json --split heldout --time-budget 280
    python3 benchmarks/throughput/measure.py --out torch.json --split torch --time-budget 170
    # the torch path end to end on a CPU (tiny preset; a check of the code, not a timing)
    python3 benchmarks/throughput/measure.py --out /tmp/smoke.json --split smoke --device cpu

JSON document: {"command", "machine", "gpu", "gpu_memory_bytes", "torch", "transformer_engine",
"date", "trainer_settings", "schema", "results": [record, ...]}; each record (see SCHEMA below)
is shaped like benchmarks/memory/h200_grid.json's, plus the unrounded timings.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_record  # noqa: E402
from benchmarks.gpu_record import failed, released  # noqa: E402

SCHEMA = {
    "name": "unique label of the configuration",
    "split": "calibration (fit the model on these), validation (outside the calibration grid), "
             "heldout (issue 25: families absent from h200_grid.json; never fitted), "
             "calibration-torch / heldout-torch (the torch backend's own runs, the same roles), "
             "smoke (tiny CPU check of the code path, not a measurement)",
    "model": "the trainer's ModelSpec (catalog/spec.py) as a dict",
    "preset": "the preset the shape comes from (num_layers may be overridden)",
    "precision / backend / batch_size / seq_length / activation_checkpointing / world_size":
        "the trainer's flags",
    "status": "ok | oom | error",
    "step_s": "median seconds per optimizer step over the steady-state steps (host clock, CUDA "
              "synchronised after every optimizer.step)",
    "step_times_s": "every steady-state step interval, seconds",
    "step_s_mean_trainer": "the trainer's own steady-state mean (steady_state_step_s)",
    "tokens_per_step": "batch_size x seq_length (one GPU)",
    "tokens_per_s_per_gpu": "tokens_per_step / step_s",
    "flops_per_token": "ModelSpec.flops_per_token(seq, include_lm_head=True): 6N + 12 L H T",
    "tflops_per_gpu": "flops_per_token x tokens_per_s_per_gpu / 1e12",
    "peak_tflops": "the GPU's dense peak for the precision's GEMM dtype (catalog/hardware.py)",
    "mfu": "tflops_per_gpu / peak_tflops (fp8 precisions against the fp8 peak)",
    "mfu_bf16_peak": "tflops_per_gpu / the bf16 peak (comparable across precisions)",
    "peak_allocated_bytes / peak_reserved_bytes": "torch.cuda.max_memory_allocated / reserved over the run",
    "seconds": "wall time of the configuration, model build included",
    "compile_state": "'fresh': dynamo's caches were emptied before the configuration (since session "
                     "v22), so it ran the trainer's compiled loss as a user's job does; absent in "
                     "older files, whose runs benchmarks/throughput/loss_kernels.py labels from the logs",
}

TRAINER_SETTINGS = {
    "backend": "te (te.TransformerLayer blocks, fused attention, RMSNorm/SwiGLU or the preset's)",
    "param_dtype": "fp32 master, bf16 compute (FSDP2 MixedPrecisionPolicy), world size 1",
    "optimizer": "the trainer's default (fused AdamW, fp32 states)",
    "lm_head": "high precision (bf16) even for FP8 recipes",
    "fp8_recipes": "fp8: DelayedScaling(HYBRID, amax history 1024, max); fp8-current: "
                   "Float8CurrentScaling(); fp8-block: Float8BlockScaling() (trainer/precision.py)",
    "data": "synthetic token ids",
    "timing": "steps per configuration and the warm-up steps left out are in the command",
}

# Shapes: the presets' widths; depth overridden so that one configuration takes seconds.
# name -> (preset, num_layers)
SHAPES = {
    "w2048": ("1b", 8),     # hidden 2048, 32 heads (8 kv), FFN 8192, vocab 128256 tied
    "w3072": ("3b", 4),     # hidden 3072, 24 heads (8 kv), FFN 8192, vocab 128256 tied
    "w4096": ("8b", 4),     # hidden 4096, 32 heads (8 kv), FFN 14336, vocab 128256
    "w5120": ("14b", 3),    # hidden 5120, 40 heads (8 kv), FFN 13824, vocab 152064
    "w8192": ("64b", 2),    # hidden 8192, 64 heads (8 kv), FFN 24576, vocab 128256
}
PRECISIONS = ("bf16", "fp8", "fp8-current", "fp8-block")


def _cfg(name, split, preset, layers, batch, seq, ac, prec, backend="te", overrides=None) -> dict:
    out = {"name": name, "split": split, "preset": preset, "num_layers": layers, "batch_size": batch,
           "seq_length": seq, "activation_checkpointing": ac, "precision": prec, "backend": backend}
    if overrides:  # model fields beyond the depth (width, heads, KV heads, FFN): ModelSpec's names
        out["overrides"] = dict(overrides)
    return out


def _named(prefix: str, split: str, rows, backend: str = "te") -> list[dict]:
    """(preset, layers, batch, seq, checkpointing, precision) rows as configurations."""
    return [_cfg(f"{prefix}-{p}-L{n}-b{b}-s{s}-{'ac' if ac else 'noac'}-{prec}", split, p, n, b, s, ac,
                 prec, backend) for p, n, b, s, ac, prec in rows]


def calibration() -> list[dict]:
    """Widths 2048/4096/8192 x 4 precisions x checkpointing on/off x (batch 1, seq 8192) and
    (batch 4, seq 2048), plus depth and token-count variants at width 2048."""
    out = []
    for tokens in ((1, 8192), (4, 2048)):
        for prec in PRECISIONS:
            for ac in (False, True):
                for shape in ("w2048", "w4096", "w8192"):
                    preset, layers = SHAPES[shape]
                    b, s = tokens
                    out.append(_cfg(f"cal-{shape}-L{layers}-b{b}-s{s}-{'ac' if ac else 'noac'}-{prec}",
                                    "calibration", preset, layers, b, s, ac, prec))
    for prec in ("bf16", "fp8"):
        out.append(_cfg(f"cal-w2048-L16-b2-s4096-noac-{prec}", "calibration", "1b", 16, 2, 4096, False, prec))
        out.append(_cfg(f"cal-w2048-L8-b8-s4096-ac-{prec}", "calibration", "1b", 8, 8, 4096, True, prec))
    out += small_step_calibration()
    return out


# Session v10 (benchmarks/throughput/README.md): at 1-2k tokens per step the fit cannot tell a
# per-parameter cost (optimizer, FSDP copies) from the host's per-layer and per-step costs,
# because the grid moves width, depth and tokens together; wide models with few layers are
# then predicted too fast and narrow ones with more layers too slow. These families hold the
# tokens (1 x 1536) and vary the width at two depths each, so the fit sees the two apart.
# Sequence 1536 without checkpointing: a family no held-out set has (heldout2's 1536 is
# checkpointed). (shape, depths)
SMALL_STEP_SHAPES = (("w2048", (2, 6)), ("w4096", (2, 6)), ("w8192", (1, 2)))


def small_step_calibration() -> list[dict]:
    out = []
    for shape, depths in SMALL_STEP_SHAPES:
        preset = SHAPES[shape][0]
        for layers in depths:
            for prec in ("bf16", "fp8"):
                out.append(_cfg(f"cal-{shape}-L{layers}-b1-s1536-noac-{prec}", "calibration", preset,
                                layers, 1, 1536, False, prec))
    return out


def validation() -> list[dict]:
    """Configurations outside the calibration grid: other widths (3072, 5120), depths, batches,
    sequences (1024, 16384), the full 1b preset and TE fsdp.py's block stack."""
    v = [
        ("1b", 16, 4, 4096, False, "bf16"), ("1b", 16, 4, 4096, False, "fp8"),
        ("1b", 16, 4, 4096, True, "fp8-current"), ("1b", 16, 4, 4096, False, "fp8-block"),
        ("te-fsdp-example", 24, 8, 8192, False, "bf16"), ("te-fsdp-example", 24, 8, 8192, False, "fp8"),
        ("te-fsdp-example", 24, 16, 8192, True, "bf16"), ("te-fsdp-example", 24, 16, 8192, True, "fp8"),
        ("3b", 4, 2, 4096, False, "bf16"), ("3b", 4, 2, 4096, True, "fp8-block"),
        ("14b", 3, 1, 4096, False, "fp8"), ("14b", 3, 4, 4096, True, "fp8-current"),
        ("8b", 4, 2, 2048, True, "bf16"), ("64b", 2, 2, 4096, False, "fp8"),
        ("1b", 8, 8, 1024, False, "fp8-block"), ("8b", 6, 1, 16384, False, "bf16"),
        ("14b", 3, 2, 8192, True, "bf16"), ("3b", 8, 4, 2048, False, "fp8-current"),
    ]
    return _named("val", "validation", v)


# Issue 25's held-out families: (preset, width, sequence, checkpointing) that h200_grid.json
# holds in neither split (tests/test_benchmark_grids.py checks it against the file). Each
# family has a bf16 run and at least one FP8 run of the same shape (the speed-up pairs); a few
# steps hold few tokens for their width (1-2k tokens at width 4096-8192: FP8's fixed costs).
HELDOUT_TE = [
    ("3b", 4, 1, 8192, False, "bf16"), ("3b", 4, 1, 8192, False, "fp8"),
    ("3b", 4, 1, 8192, False, "fp8-current"),
    ("3b", 6, 2, 1024, False, "bf16"), ("3b", 6, 2, 1024, False, "fp8"),
    ("3b", 4, 1, 16384, False, "bf16"), ("3b", 4, 1, 16384, False, "fp8"),
    ("14b", 3, 8, 2048, True, "bf16"), ("14b", 3, 8, 2048, True, "fp8"),
    ("14b", 3, 8, 2048, True, "fp8-block"),
    ("14b", 2, 1, 2048, False, "bf16"), ("14b", 2, 1, 2048, False, "fp8"),
    ("14b", 2, 1, 16384, False, "bf16"), ("14b", 2, 1, 16384, False, "fp8"),
    ("8b", 4, 4, 4096, False, "bf16"), ("8b", 4, 4, 4096, False, "fp8"),
    ("8b", 4, 4, 4096, False, "fp8-current"),
    ("8b", 4, 1, 1024, False, "bf16"), ("8b", 4, 1, 1024, False, "fp8"),
    ("8b", 8, 2, 16384, True, "bf16"), ("8b", 8, 2, 16384, True, "fp8"),
    ("8b", 6, 8, 4096, True, "bf16"), ("8b", 6, 8, 4096, True, "fp8-block"),
    ("1b", 8, 1, 16384, False, "bf16"), ("1b", 8, 1, 16384, False, "fp8"),
    ("1b", 16, 16, 1024, True, "bf16"), ("1b", 16, 16, 1024, True, "fp8"),
    ("64b", 2, 2, 1024, False, "bf16"), ("64b", 2, 2, 1024, False, "fp8"),
    ("64b", 3, 4, 4096, True, "bf16"), ("64b", 3, 4, 4096, True, "fp8-current"),
    ("32b", 2, 2, 4096, False, "bf16"), ("32b", 2, 2, 4096, False, "fp8"),
    ("te-fsdp-example", 8, 4, 4096, False, "bf16"), ("te-fsdp-example", 8, 4, 4096, False, "fp8"),
    ("3b", 4, 4, 8192, True, "bf16"), ("3b", 4, 4, 8192, True, "fp8"),
    ("14b", 2, 4, 1024, False, "bf16"), ("14b", 2, 4, 1024, False, "fp8-block"),
    ("8b", 4, 16, 1024, True, "bf16"), ("8b", 4, 16, 1024, True, "fp8-current"),
]
# The torch backend (bf16: its FP8 is emulated, never a speed): calibration runs in the
# calibration families of h200_grid.json (the same shapes as cal-*, so the torch/TE ratio is
# measured directly), and held-out runs in families of HELDOUT_TE.
CALIBRATION_TORCH = [
    ("1b", 8, 1, 8192, False, "bf16"), ("8b", 4, 1, 8192, False, "bf16"),
    ("64b", 2, 1, 8192, True, "bf16"), ("1b", 8, 4, 2048, True, "bf16"),
    ("8b", 4, 4, 2048, False, "bf16"), ("64b", 2, 4, 2048, False, "bf16"),
]
HELDOUT_TORCH = [
    ("3b", 4, 1, 8192, False, "bf16"), ("3b", 6, 2, 1024, False, "bf16"),
    ("14b", 3, 8, 2048, True, "bf16"), ("8b", 4, 4, 4096, False, "bf16"),
    ("8b", 4, 1, 1024, False, "bf16"), ("1b", 8, 1, 16384, False, "bf16"),
    ("64b", 2, 2, 1024, False, "bf16"), ("32b", 2, 2, 4096, False, "bf16"),
    ("8b", 8, 2, 16384, True, "bf16"), ("1b", 16, 16, 1024, True, "bf16"),
]
# Issue 36's new held-out families, measured in the same session as the parts and the grid:
# families (preset x width x sequence x checkpointing) in neither h200_grid.json nor HELDOUT_TE,
# with widths no preset has (6144), GQA ratios 16:1 and 1:1, sequences 1536-12288 and
# micro-batches up to 32. (preset, layers, batch, seq, checkpointing, precision, overrides, tag)
W6144 = {"hidden_size": 6144, "num_heads": 48, "num_kv_heads": 8, "ffn_hidden_size": 16384}
KV2 = {"num_kv_heads": 2}
MHA32 = {"num_kv_heads": 32}
HELDOUT2_TE = [
    ("8b", 3, 2, 4096, False, "bf16", W6144, "w6144"), ("8b", 3, 2, 4096, False, "fp8", W6144, "w6144"),
    ("8b", 4, 1, 12288, True, "bf16", KV2, "kv2"), ("8b", 4, 1, 12288, True, "fp8-current", KV2, "kv2"),
    ("1b", 8, 1, 12288, False, "bf16", MHA32, "kv32"), ("1b", 8, 1, 12288, False, "fp8", MHA32, "kv32"),
    ("1b", 12, 32, 1536, True, "bf16", None, ""), ("1b", 12, 32, 1536, True, "fp8", None, ""),
    ("14b", 2, 1, 12288, False, "bf16", None, ""), ("14b", 2, 1, 12288, False, "fp8-block", None, ""),
    ("3b", 5, 3, 6144, True, "bf16", None, ""), ("3b", 5, 3, 6144, True, "fp8", None, ""),
    ("te-fsdp-example", 12, 2, 2048, False, "bf16", None, ""),
    ("te-fsdp-example", 12, 2, 2048, False, "fp8", None, ""),
    ("32b", 2, 8, 2048, True, "bf16", None, ""), ("32b", 2, 8, 2048, True, "fp8-current", None, ""),
    ("3b", 4, 6, 3072, False, "bf16", None, ""), ("3b", 4, 6, 3072, False, "fp8-current", None, ""),
]
# A fixed configuration timed at the start and at the end of a session's TE block: the drift
# between the two says how far the machine moved while the grid and the held-out set ran.
REFERENCE = [("8b", 4, 1, 8192, False, "bf16"), ("8b", 4, 1, 8192, False, "fp8")]
# The code path on a CPU, in seconds (tiny preset; times mean nothing).
SMOKE = [("tiny", 2, 2, 64, False, "bf16"), ("tiny", 2, 2, 64, True, "bf16")]
# The trainer's host time per block of each block kind, from its own steps (session v21: the
# tiny-block stacks of parts.py put te-fsdp-example's block at 1.41x and then 0.86x the Llama
# block's, two minutes apart). At 512 tokens a step is host-bound at every depth here, so the
# slope of the step time over the depth is the host's time per block: te-fsdp-example's kind
# (LayerNorm, GELU MLP, biases) and the Llama kind at two widths (1b, 8b: the host's work per
# block should not depend on the width). Run with more steps than the grid (--steps 24
# --warmup 4): these steps are 20-120 ms, and their spread is the host's.
LADDER_DEPTHS = {"te-fsdp-example": (2, 6, 12), "1b": (2, 6, 12), "8b": (2, 4, 6)}
LADDER = [(p, n, 1, 512, False, prec) for p, depths in LADDER_DEPTHS.items() for n in depths
          for prec in ("bf16", "fp8")]


def heldout() -> list[dict]:
    return _named("ho", "heldout", HELDOUT_TE)


def heldout2() -> list[dict]:
    return [_cfg(f"ho2-{p}{'-' + tag if tag else ''}-L{n}-b{b}-s{s}-{'ac' if ac else 'noac'}-{prec}", "heldout2",
                 p, n, b, s, ac, prec, overrides=o) for p, n, b, s, ac, prec, o, tag in HELDOUT2_TE]


def reference(when: str) -> list[dict]:
    return _named(f"ref-{when}", "reference", REFERENCE)


def ladder() -> list[dict]:
    return _named("ladder", "ladder", LADDER)


def torch_sets() -> list[dict]:
    ho2 = [_cfg(f"torch-ho2-{p}{'-' + tag if tag else ''}-L{n}-b{b}-s{s}-{'ac' if ac else 'noac'}-bf16",
                "heldout2-torch", p, n, b, s, ac, "bf16", "torch", o)
           for p, n, b, s, ac, prec, o, tag in HELDOUT2_TE if prec == "bf16"]
    return (_named("torch-cal", "calibration-torch", CALIBRATION_TORCH, "torch")
            + _named("torch-ho", "heldout-torch", HELDOUT_TORCH, "torch") + ho2)


SPLITS = ("calibration", "validation", "all", "heldout", "heldout2", "reference-start", "reference-end",
          "small-steps", "ladder", "torch", "smoke")


def configurations(split: str) -> list[dict]:
    if split == "smoke":
        return _named("smoke", "smoke", SMOKE, "torch")
    cal, val = calibration(), validation()
    combos = {"calibration": cal, "validation": val, "all": cal + val, "heldout": heldout(),
              "heldout2": heldout2(), "reference-start": reference("start"),
              "reference-end": reference("end"), "small-steps": small_step_calibration(),
              "ladder": ladder(), "torch": torch_sets()}[split]
    names = [c["name"] for c in combos]
    if len(names) != len(set(names)):
        raise SystemExit("measure.py: duplicate configuration names")
    return combos


def spec_of(combo: dict):
    from kfp_sagemaker_blackwell.catalog import spec as spec_mod

    return spec_mod.spec_from_values(combo["preset"], num_layers=combo["num_layers"],
                                     **combo.get("overrides", {}))


def predicted_peak_bytes(combo: dict) -> int:
    """The memory estimator's device peak for the configuration (to keep the grid on the GPU)."""
    from kfp_sagemaker_blackwell.planning import estimator

    return estimator.estimate(setup_of(combo), "H200").peak_bytes


def setup_of(combo: dict):
    from kfp_sagemaker_blackwell.planning import training_setup

    return training_setup.TrainingSetup(model=spec_of(combo), batch_size=combo["batch_size"],
                                        seq_length=combo["seq_length"], precision=combo["precision"],
                                        activation_checkpointing=combo["activation_checkpointing"],
                                        backend=combo.get("backend", "te"))


def family(combo: dict) -> tuple:
    """The configuration's family as benchmarks/throughput/model_accuracy.py groups runs."""
    from benchmarks.throughput import model_accuracy

    return model_accuracy.family({**combo, "model": spec_of(combo).to_dict()})


# Wall seconds of a configuration beyond its timed steps, from h200_grid.json (seconds - 8 x
# step_s: median 0.9 s, 2.2 s at the 95th percentile), and the one-offs of a process: the
# first configuration 13-16 s (CUDA, cuBLAS, torch.compile of the loss), the first of each
# FP8 recipe 4-6 s. Since session v22 every configuration compiles its loss (and TE's warm-ups)
# again after gpu_record.fresh_compile_state, not in these: the loss about 1.5 s (the committed
# logs: a new loss shape 2.3 s beyond the steps, a cached one 0.9 s, medians), TE's warm-ups
# not timed.
OVERHEAD_S, FIRST_S, FIRST_RECIPE_S = 1.5, 16.0, 6.0


def estimated_seconds(combos: list[dict], steps: int) -> list[float]:
    """Each configuration's expected wall time: the throughput model's step time (x 1.25 on
    the torch backend, which it predicts about 18% fast) x steps, plus the overheads above."""
    from kfp_sagemaker_blackwell.planning import throughput

    out, seen = [], set()
    for i, c in enumerate(combos):
        step = throughput.predict(setup_of(c), "H200").step_seconds
        step *= 1.25 if c.get("backend") == "torch" else 1.0
        extra = FIRST_S if i == 0 else 0.0
        if c["precision"] != "bf16" and c["precision"] not in seen:
            extra += FIRST_RECIPE_S
        seen.add(c["precision"])
        out.append(OVERHEAD_S + steps * step + extra)
    return out


def forbid_transformer_engine() -> None:
    """Makes ``import transformer_engine`` fail as if it were not installed (the torch-backend
    sets run while TE is still being installed: a half-written package must not be read)."""
    import importlib.abc

    class _Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "transformer_engine" or name.startswith("transformer_engine."):
                raise ModuleNotFoundError(f"No module named {name!r} (refused by measure.py: torch backend)",
                                          name=name)
            return None

    if "transformer_engine" in sys.modules:
        raise SystemExit("measure.py: transformer_engine is already imported; the torch sets must not")
    sys.meta_path.insert(0, _Refuse())


class StepClock:
    """Time stamps after every optimizer step (CUDA synchronised), for all optimizers of the process."""

    def __init__(self) -> None:
        self.stamps: list[float] = []
        self.installed = False

    def install(self) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        def after_step(optimizer, args, kwargs) -> None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.stamps.append(time.perf_counter())

        register_optimizer_step_post_hook(after_step)
        self.installed = True

    def intervals(self, warmup: int) -> list[float]:
        """Durations of steps warmup+1 .. n (step i lasts stamps[i-1] - stamps[i-2])."""
        return [b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False)][max(warmup - 1, 0):]


def rates(combo: dict, step_s: float, flops_per_token: float, peak: float | None, bf16_peak: float) -> dict:
    tokens = combo["batch_size"] * combo["seq_length"]
    tps = tokens / step_s
    tflops = tps * flops_per_token / 1e12
    return {"tokens_per_step": tokens, "tokens_per_s_per_gpu": tps, "tflops_per_gpu": tflops,
            "peak_tflops": peak, "mfu": tflops / peak if peak else None, "mfu_bf16_peak": tflops / bf16_peak}


def measure(combo: dict, steps: int, warmup: int, clock: StepClock, device: str = "cuda",
            raw_log: str = "") -> dict:
    import torch

    from kfp_sagemaker_blackwell.catalog import flags as config
    from kfp_sagemaker_blackwell.catalog import hardware
    from kfp_sagemaker_blackwell.trainer import train

    spec = spec_of(combo)
    backend = combo.get("backend", "te")
    gpu_record.fresh_compile_state()
    cfg = config.make(combo["preset"], precision=combo["precision"], backend=backend, device=device,
                      batch_size=combo["batch_size"], seq_length=combo["seq_length"],
                      activation_checkpointing=combo["activation_checkpointing"], max_steps=steps,
                      log_every=steps, timing_warmup_steps=warmup, save_model=False,
                      num_layers=combo["num_layers"], **combo.get("overrides", {}))
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    record = {**combo, "model": spec.to_dict(), "backend": backend, "world_size": 1, "compile_state": "fresh",
              "flops_per_token": spec.flops_per_token(combo["seq_length"], include_lm_head=True)}
    clock.stamps.clear()
    t0 = time.perf_counter()
    log = io.StringIO()
    try:
        summary = train.run(cfg, log_out=log)
        record.update(status="ok", peak_allocated_bytes=int(summary.get("peak_allocated_bytes") or 0),
                      peak_reserved_bytes=int(summary.get("peak_reserved_bytes") or 0),
                      step_s_mean_trainer=summary.get("steady_state_step_s"))
        times = clock.intervals(warmup)
        if times:
            step_s = statistics.median(times)
            record["step_times_s"] = times
        else:  # no optimizer-step hook fired: fall back to the trainer's own mean
            step_s = summary["steady_state_step_s"]
        gpu = hardware.gpu("H200")
        record["step_s"] = step_s
        record.update(rates(combo, step_s, record["flops_per_token"], gpu.peak_for(combo["precision"]),
                            gpu.peak_tflops["bf16"]))
    except train.TrainingFailed as exc:
        failed(record, exc)
        del exc
    finally:
        if raw_log:  # the trainer's own log of the run, as it printed it
            with open(raw_log, "a") as f:
                f.write(f"### {combo['name']}\n{log.getvalue()}")
    return released(record, t0)


def header(command: str, device: str = "cuda") -> dict:
    if device == "cuda":
        return gpu_record.header(command, TRAINER_SETTINGS, schema=SCHEMA)
    import torch  # a CPU smoke: no GPU to describe

    return {"command": command, "machine": "CPU (smoke run: not a measurement)", "torch": torch.__version__,
            "trainer_settings": TRAINER_SETTINGS, "schema": SCHEMA, "results": []}


write = gpu_record.write


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, action="append", help="results file (repeat to write copies)")
    ap.add_argument("--split", choices=SPLITS, default="all",
                    help="calibration, validation, all (both), heldout (issue 25, TE backend), "
                         "small-steps (the calibration's 12 small-step runs alone: a session that adds "
                         "them to an earlier grid), ladder (the host per block of each block kind: 512-token "
                         "steps at three depths; run with --steps 24 --warmup 4), torch "
                         "(the torch backend's calibration-torch + heldout-torch; never imports "
                         "transformer_engine), smoke (tiny, for --device cpu)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: only to check the code path (smoke split); default cuda")
    ap.add_argument("--steps", type=int, default=8, help="optimizer steps per configuration (default 8)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the median (default 2)")
    ap.add_argument("--time-budget", type=float, default=1e9,
                    help="seconds: start no configuration after this (results are written after each)")
    ap.add_argument("--max-predicted-gib", type=float, default=128.0,
                    help="skip configurations the memory estimator puts above this (default 128 GiB)")
    ap.add_argument("--resume", action="append", default=[],
                    help="an earlier results file: its configurations with status ok are kept (not re-run)")
    ap.add_argument("--only", default="", help="comma-separated configuration names (default: all of --split)")
    ap.add_argument("--raw-log", default="", help="append each run's trainer log to this file")
    ap.add_argument("--dry-run", action="store_true",
                    help="list the configurations, memory estimate and expected seconds; no GPU needed")
    args = ap.parse_args(argv)
    if args.steps < args.warmup + 2:
        ap.error("--steps must exceed --warmup by at least 2 (a median needs intervals)")
    combos = configurations(args.split)
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {c["name"] for c in combos}
        if unknown:
            ap.error(f"--only: unknown configuration(s) {', '.join(sorted(unknown))}")
    return args


def _todo(args: argparse.Namespace) -> tuple[list[dict], list[dict], list[str], list[dict], int]:
    """(to run, already done, earlier commands, too big, done count) for the parsed arguments."""
    combos = configurations(args.split)
    if args.only:
        combos = [c for c in combos if c["name"] in set(args.only.split(","))]
    prior: list[dict] = []
    prior_commands: list[str] = []
    for path in args.resume:
        if Path(path).exists():
            old = json.loads(Path(path).read_text())
            prior += [r for r in old["results"] if r.get("status") == "ok"]
            prior_commands.append(old["command"])
    done = {r["name"] for r in prior}
    combos = [c for c in combos if c["name"] not in done]
    too_big = [c for c in combos if predicted_peak_bytes(c) > args.max_predicted_gib * 2**30]
    combos = [c for c in combos if c not in too_big]
    return combos, prior, prior_commands, too_big, len(done)


def dry_run(combos: list[dict], too_big: list[dict], done: int, steps: int) -> None:
    secs = estimated_seconds(combos, steps)
    for c, t in zip(combos, secs, strict=True):
        print(f"{c['name']:48s} {c.get('backend', 'te'):5s} predicted {predicted_peak_bytes(c) / 2**30:6.1f} GiB"
              f"  ~{t:5.1f} s")
    for c in too_big:
        print(f"{c['name']:48s} SKIPPED: predicted {predicted_peak_bytes(c) / 2**30:6.1f} GiB")
    fams = {family(c) for c in combos}
    print(f"{len(combos)} configurations in {len(fams)} families ({done} already done, {len(too_big)} "
          f"too big); expected {sum(secs):.0f} s")


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.split in ("torch", "smoke"):
        forbid_transformer_engine()
    combos, prior, prior_commands, too_big, done = _todo(args)
    if args.dry_run:
        dry_run(combos, too_big, done, args.steps)
        return 0

    command = "python3 benchmarks/throughput/measure.py " + " ".join(argv if argv is not None else sys.argv[1:])
    doc = header(" ; ".join([*prior_commands, command]), args.device)
    doc["results"] = prior  # the earlier calls' results travel on: the last file is complete
    clock = StepClock()
    clock.install()
    t_start = time.perf_counter()
    for i, combo in enumerate(combos):
        if time.perf_counter() - t_start > args.time_budget:
            print(f"time budget reached after {i} of {len(combos)} configurations", flush=True)
            break
        rec = measure(combo, args.steps, args.warmup, clock, args.device, args.raw_log)
        doc["results"].append(rec)
        brief = {k: rec.get(k) for k in ("name", "status", "step_s", "tokens_per_s_per_gpu", "mfu", "seconds")}
        print(json.dumps(brief), flush=True)
        write(doc, args.out)  # after each configuration: a timeout keeps what ran
    write(doc, args.out)
    if args.split in ("torch", "smoke") and "transformer_engine" in sys.modules:
        raise SystemExit("measure.py: transformer_engine was imported on the torch path")
    return 0


if __name__ == "__main__":
    sys.exit(main())
