"""The throughput model against the trainer's measured H200 grid.

    python benchmarks/throughput/model_accuracy.py              # tables (Markdown)
    python benchmarks/throughput/model_accuracy.py --json       # the numbers
    python benchmarks/throughput/model_accuracy.py --fit        # refit the H200 constants on
                                                                #   the calibration split
    python benchmarks/throughput/model_accuracy.py --leave-one-family-out --out lofo_h200.json
        # refit once per configuration family (preset x width x sequence x checkpointing) on
        # every other family, predict the family left out (the held-out numbers of the README)

Reads ``h200_grid.json`` beside this file (records with the configuration, ``status``,
``tokens_per_s_per_gpu`` and ``split``: ``calibration`` or ``validation``), predicts each
with ``kfp_sagemaker_blackwell.planning.throughput`` and reports, per split, the error of the
predicted tokens/s per GPU (predicted / measured - 1) and of the predicted speed-up of
each low precision over bf16 in the same configuration (predicted - measured).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kfp_sagemaker_blackwell.catalog import hardware  # noqa: E402
from kfp_sagemaker_blackwell.catalog.spec import ModelSpec  # noqa: E402
from kfp_sagemaker_blackwell.planning import throughput  # noqa: E402
from kfp_sagemaker_blackwell.planning.training_setup import TrainingSetup  # noqa: E402

GRID = Path(__file__).with_name("h200_grid.json")

# Published end-to-end speed-ups over bf16 for a Llama-3-8B-shaped model at sequence 8192
# on 8 Blackwell GPUs (FSDP / data parallel), per recipe: (low, high, sources). The model's
# B200 predictions are checked against these (tests/test_throughput_model.py).
PUBLISHED_B200_LLAMA3_8B: dict[str, tuple[float, float, str]] = {
    "fp8": (1.15, 1.35, "torchao mx_formats README / torchtitan docs/mxfp8.md: float8 "
                        "tensorwise +25.4% (8x B200, batch 1, seq 8192, FSDP2, torch.compile); "
                        "1.15-1.35x across public 8B-class FP8 reports (issue 13)"),
    "fp8-current": (1.15, 1.35, "no separate public B200 figure for current scaling on an 8B "
                                "model was found; it runs the same FP8 GEMMs as fp8, so fp8's "
                                "range is used"),
    "mxfp8": (1.15, 1.30, "torchao mx_formats README: mxfp8_cublas +20.0%, mxfp8_cublas_rceil "
                          "+16.1% (8x B200, Llama3-8B, seq 8192); PyTorch blog 'Accelerating "
                          "2K+ scale pre-training up to 1.28x with TorchAO MXFP8' (B200)"),
    "nvfp4": (1.35, 1.75, "NVIDIA technical blog (Feb 2026): NVFP4 1,850 vs BF16 1,165 TFLOP/s "
                          "per GPU = 1.59x, Llama 3 8B on GB200 NVL72; NVIDIA MaxText NVFP4 blog: "
                          "1.35x over FP8 on GB200 (Llama 3 8B); both well under 2x"),
}
NO_PUBLIC_B200 = {"fp8-block": "no public B200 end-to-end figure for TE's Float8BlockScaling "
                               "was found (torchao's rowwise float8, the nearest recipe, gained "
                               "+4.0% in the same torchtitan table)"}


def blackwell_rows(gpu: str = "B200") -> list[tuple[str, str, float, float, float]]:
    """(configuration, precision, predicted tokens/s per GPU, predicted speed-up, MFU) for
    the Llama-3-8B shape at sequence 8192 on 8 GPUs: batch 1 with activation checkpointing
    (the published torchtitan setting) and the memory plan's choice (batch 3, none)."""
    from kfp_sagemaker_blackwell.catalog.spec import PRESETS

    out = []
    for batch, ac in ((1, True), (3, False)):
        base = None
        for p in ("bf16", "fp8", "fp8-current", "fp8-block", "mxfp8", "nvfp4"):
            s = TrainingSetup(PRESETS["8b"], batch, 8192, p, ac, 8)
            pr = throughput.predict(s, gpu, instance_type="ml.p6-b200.48xlarge"
                                    if gpu == "B200" else "ml.p6-b300.48xlarge")
            base = base or pr
            out.append((f"batch {batch}, checkpointing {'on' if ac else 'off'}", p,
                        pr.tokens_per_s_per_gpu, pr.speedup_over(base), pr.mfu))
    return out


def blackwell_markdown(gpu: str = "B200") -> str:
    lines = ["| configuration | precision | predicted tokens/s/GPU | predicted speed-up | MFU "
             "(precision's peak) | published range | inside |", "|---|---|---:|---:|---:|---|---|"]
    for conf, p, tps, sp, mfu in blackwell_rows(gpu):
        if p in PUBLISHED_B200_LLAMA3_8B:
            lo, hi, _ = PUBLISHED_B200_LLAMA3_8B[p]
            rng, inside = f"{lo:.2f}-{hi:.2f}x", "yes" if lo <= sp <= hi else "NO"
        else:
            rng, inside = ("-" if p == "bf16" else "none published"), "-"
        lines.append(f"| {conf} | {p} | {tps:,.0f} | {sp:.2f}x | {mfu:.0%} | {rng} | {inside} |")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Row:
    record: dict[str, Any]
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0

    @property
    def key(self) -> tuple:
        r = self.record
        return (json.dumps(r["model"], sort_keys=True), r["batch_size"], r["seq_length"],
                bool(r["activation_checkpointing"]), r.get("world_size", 1))

    @property
    def label(self) -> str:
        r = self.record
        name = r.get("preset") or f"h{r['model']['hidden_size']}"
        return (f"{name} L{r['model']['num_layers']} {r['precision']} b{r['batch_size']} "
                f"s{r['seq_length']} ac={'on' if r['activation_checkpointing'] else 'off'} "
                f"w{r.get('world_size', 1)}")


def load(path: Path = GRID) -> dict[str, Any]:
    return json.loads(path.read_text())


def setup_of(r: dict[str, Any]) -> TrainingSetup:
    spec = ModelSpec(**{k: v for k, v in r["model"].items() if k in ModelSpec.__dataclass_fields__})
    extra = {k: r[k] for k in ("gradient_accumulation_steps",) if k in r}
    # The grid predates the compiled loss: its runs used the eager cross-entropy.
    return TrainingSetup(spec, r["batch_size"], r["seq_length"], r["precision"],
                         bool(r["activation_checkpointing"]), r.get("world_size", 1),
                         backend=r.get("backend", "te"), loss_kernel=r.get("loss_kernel", "eager"), **extra)


def rows(doc: dict[str, Any], split: str | None = None,
         constants: throughput.Constants = throughput.DEFAULT) -> list[Row]:
    gpu = hardware.gpu(doc.get("gpu", "H200"))
    out = []
    for r in doc["results"]:
        if r.get("status") != "ok" or not r.get("tokens_per_s_per_gpu"):
            continue
        if split and r.get("split") != split:
            continue
        p = throughput.predict(setup_of(r), gpu, constants=constants)
        out.append(Row(r, float(r["tokens_per_s_per_gpu"]), p.tokens_per_s_per_gpu))
    return out


def speedups(rs: list[Row]) -> list[tuple[str, float, float]]:
    """(label, measured, predicted) speed-up over bf16 for every low-precision row whose
    bf16 twin (same model, batch, sequence, checkpointing, world size) was measured."""
    bf16 = {r.key: r for r in rs if r.record["precision"] == "bf16"}
    out = []
    for r in rs:
        base = bf16.get(r.key)
        if r.record["precision"] != "bf16" and base is not None:
            out.append((r.label, r.measured / base.measured, r.predicted / base.predicted))
    return out


def summary(rs: list[Row]) -> dict[str, Any]:
    errs = [abs(r.error) for r in rs]
    sp = speedups(rs)
    sp_err = [abs(p - m) for _, m, p in sp]
    return {
        "rows": len(rs),
        "median_abs_error": statistics.median(errs) if errs else math.nan,
        "worst_abs_error": max(errs) if errs else math.nan,
        "speedup_pairs": len(sp),
        "worst_speedup_error": max(sp_err) if sp_err else math.nan,
        "median_speedup_error": statistics.median(sp_err) if sp_err else math.nan,
    }


def markdown(doc: dict[str, Any], constants: throughput.Constants = throughput.DEFAULT) -> str:
    lines = []
    for split in ("calibration", "validation"):
        rs = rows(doc, split, constants)
        if not rs:
            continue
        s = summary(rs)
        lines += [f"### {split.capitalize()} split: {s['rows']} runs", "",
                  f"tokens/s per GPU: median |error| {s['median_abs_error']:.1%}, worst "
                  f"{s['worst_abs_error']:.1%}; speed-up over bf16 ({s['speedup_pairs']} pairs): "
                  f"median |error| {s['median_speedup_error']:.3f}, worst "
                  f"{s['worst_speedup_error']:.3f}.", "",
                  "| run | measured tokens/s/GPU | predicted | error |", "|---|---:|---:|---:|"]
        lines += [f"| {r.label} | {r.measured:,.0f} | {r.predicted:,.0f} | {r.error:+.1%} |"
                  for r in rs]
        sp = speedups(rs)
        if sp:
            lines += ["", "| run | measured speed-up over bf16 | predicted | error |",
                      "|---|---:|---:|---:|"]
            lines += [f"| {label} | {m:.3f}x | {p:.3f}x | {p - m:+.3f} |" for label, m, p in sp]
        lines.append("")
    return "\n".join(lines)


# The H200 constants --fit adjusts (Hopper entries of the tables, the host floor).
FIT = ("gemm_bf16", "gemm_fp8", "gemm_fp8_block", "attention_fwd", "attention_half_seq",
       "hbm_efficiency", "cpu_block_forward_s", "cpu_block_backward_s", "cpu_step_s",
       "cpu_fp8", "cpu_fp8_current", "cpu_fp8_block", "attention_half_head_dim",
       "host_overlap_exponent")


ATTENTION_BWD_OVER_FWD = 0.53 / 0.72


def current_values(c: throughput.Constants = throughput.DEFAULT) -> list[float]:
    g, r = c.gemm_efficiency["hopper"], c.cpu_recipe_factor
    return [g["bf16"], g["fp8"], g["fp8-block"], c.attention_efficiency["hopper"][0],
            c.attention_half_seq,
            c.hbm_efficiency, c.cpu_block_forward_s, c.cpu_block_backward_s, c.cpu_step_s,
            r["fp8"], r["fp8-current"], r["fp8-block"], c.attention_half_head_dim,
            c.host_overlap_exponent]


def with_values(x: list[float], c: throughput.Constants = throughput.DEFAULT) -> throughput.Constants:
    v = dict(zip(FIT, x, strict=True))
    gemm = {k: dict(t) for k, t in c.gemm_efficiency.items()}
    gemm["hopper"].update({"bf16": v["gemm_bf16"], "fp8": v["gemm_fp8"],
                           "fp8-block": v["gemm_fp8_block"]})
    # the backward/forward efficiency ratio stays FlashAttention-3's (0.53 / 0.72)
    att = dict(c.attention_efficiency,
               hopper=(v["attention_fwd"], v["attention_fwd"] * ATTENTION_BWD_OVER_FWD))
    cpu = dict(c.cpu_recipe_factor, **{"fp8": v["cpu_fp8"], "fp8-current": v["cpu_fp8_current"],
                                       "fp8-block": v["cpu_fp8_block"]})
    return dataclasses.replace(c, gemm_efficiency=gemm, attention_efficiency=att,
                               hbm_efficiency=v["hbm_efficiency"],
                               attention_half_seq=v["attention_half_seq"],
                               attention_half_head_dim=v["attention_half_head_dim"],
                               cpu_block_forward_s=v["cpu_block_forward_s"],
                               cpu_block_backward_s=v["cpu_block_backward_s"],
                               cpu_step_s=v["cpu_step_s"], cpu_recipe_factor=cpu,
                               host_overlap_exponent=v["host_overlap_exponent"])


def fit(doc: dict[str, Any]) -> dict[str, float]:
    """Least squares on log(predicted / measured) over the calibration split, plus the
    speed-ups over bf16 (so that recipes are fitted on what they gain)."""
    from scipy.optimize import minimize

    x0 = current_values()
    scale = [abs(v) for v in x0]

    def loss(z: list[float]) -> float:
        x = [zi * si for zi, si in zip(z, scale, strict=True)]
        if any(v <= 0 for v in x) or any(v > 0.95 for v in x[:4]) or x[5] > 0.95 or x[-1] < 1:
            return 1e9
        rs = rows(doc, "calibration", with_values(x))
        err = sum(math.log(1 + r.error) ** 2 for r in rs)
        return err + sum((p - m) ** 2 for _, m, p in speedups(rs))

    res = minimize(loss, [1.0] * len(x0), method="Nelder-Mead",
                   options={"maxiter": 6000, "xatol": 1e-4, "fatol": 1e-9, "adaptive": True})
    return dict(zip(FIT, [zi * si for zi, si in zip(res.x, scale, strict=True)], strict=True))


LOFO = Path(__file__).with_name("lofo_h200.json")


def family(r: dict[str, Any]) -> tuple:
    """A run's configuration family: preset x width x sequence x checkpointing (depth, batch,
    precision vary inside one). Held-out checks leave whole families out (issue 25 item 5)."""
    return (r.get("preset") or "custom", r["model"]["hidden_size"], r["seq_length"],
            bool(r["activation_checkpointing"]))


def _residuals(doc: dict[str, Any], keep, x: list[float]) -> list[float]:
    """The fit's residuals over the runs ``keep`` accepts: log(predicted / measured) per run
    and (predicted - measured) speed-up over bf16 per pair, as ``fit`` weighs them."""
    rs = [r for r in rows(doc, None, with_values(x)) if keep(r.record)]
    return [math.log(1 + r.error) for r in rs] + [p - m for _, m, p in speedups(rs)]


def fit_families(doc: dict[str, Any], keep) -> list[float]:
    """The H200 constants fitted (bounded least squares, the loss of ``fit``) on the runs that
    ``keep`` accepts, from the shipped values."""
    from scipy.optimize import least_squares

    x0 = current_values()
    lo = [1e-6 * abs(v) for v in x0]
    hi = [math.inf] * len(x0)
    for i in (0, 1, 2, 3, 5):  # GEMM / attention / HBM efficiencies
        hi[i] = 0.95
    lo[-1] = 1.0  # the host-overlap exponent
    res = least_squares(lambda x: _residuals(doc, keep, list(x)), x0, bounds=(lo, hi),
                        x_scale=[abs(v) for v in x0], max_nfev=400)
    return [float(v) for v in res.x]


def leave_one_family_out(doc: dict[str, Any]) -> dict[str, Any]:
    """One fit per family on every other family; the left-out family's runs predicted."""
    fams = sorted({family(r) for r in doc["results"] if r.get("status") == "ok"}, key=str)
    folds = []
    for fam in fams:
        x = fit_families(doc, lambda r, fam=fam: family(r) != fam)
        held = [r for r in rows(doc, None, with_values(x)) if family(r.record) == fam]
        folds.append({"family": list(fam), "constants": dict(zip(FIT, x, strict=True)),
                      "runs": [{"name": r.record.get("name"), "measured": r.measured,
                                "predicted": r.predicted} for r in held]})
        print(f"{fam}: " + ", ".join(f"{r.error:+.1%}" for r in held), file=sys.stderr)
    return {"what": "leave-one-family-out refits of the H200 constants (model_accuracy.py "
                    "--leave-one-family-out); each fold never saw its family's runs",
            "grid": GRID.name, "fit": list(FIT), "folds": folds}


def held_out_rows(doc: dict[str, Any], lofo: dict[str, Any]) -> list[Row]:
    """Every run predicted by its fold's constants (a fit that never saw its family)."""
    out = []
    for fold in lofo["folds"]:
        c = with_values([fold["constants"][k] for k in FIT])
        fam = tuple(fold["family"])
        out += [r for r in rows(doc, None, c) if family(r.record) == fam]
    return out


def held_out_markdown(doc: dict[str, Any], lofo: dict[str, Any]) -> str:
    rs = held_out_rows(doc, lofo)
    s = summary(rs)
    by: dict[tuple, list[Row]] = {}
    for r in rs:
        by.setdefault(family(r.record), []).append(r)
    lines = [f"### Leave-one-family-out: {s['rows']} runs in {len(by)} families", "",
             f"tokens/s per GPU: median |error| {s['median_abs_error']:.1%}, worst "
             f"{s['worst_abs_error']:.1%}; speed-up over bf16 ({s['speedup_pairs']} pairs): median "
             f"|error| {s['median_speedup_error']:.3f}, worst {s['worst_speedup_error']:.3f}.", "",
             "| family (preset, width, seq, checkpointing) | runs | median error | worst |",
             "|---|---:|---:|---:|"]
    for fam, fr in sorted(by.items(), key=lambda kv: str(kv[0])):
        errs = [r.error for r in fr]
        lines.append(f"| {fam} | {len(fr)} | {statistics.median(errs):+.1%} | "
                     f"{max(errs, key=abs):+.1%} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", type=Path, default=GRID)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--leave-one-family-out", action="store_true",
                    help="refit per family (slow: minutes) and write --out; without it the "
                    "committed folds are read and their held-out table printed")
    ap.add_argument("--out", type=Path, default=LOFO)
    ap.add_argument("--blackwell", action="store_true",
                    help="the B200 predictions for the Llama-3-8B shape vs the published ranges")
    args = ap.parse_args(argv)
    if args.blackwell:
        print(blackwell_markdown())
        return 0
    doc = load(args.grid)
    if args.leave_one_family_out:
        lofo = leave_one_family_out(doc)
        args.out.write_text(json.dumps(lofo, indent=1) + "\n")
        print(held_out_markdown(doc, lofo))
        return 0
    if args.fit:
        values = fit(doc)
        print(json.dumps(values, indent=1))
        print(markdown(doc, with_values(list(values.values()))))
        return 0
    if args.json:
        print(json.dumps({s: summary(rows(doc, s)) for s in ("calibration", "validation")},
                         indent=1))
    else:
        print(markdown(doc))
        if LOFO.exists() and args.grid == GRID:
            print(held_out_markdown(doc, json.loads(LOFO.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
