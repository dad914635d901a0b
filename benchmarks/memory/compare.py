"""Measured vs predicted peak memory: ``python benchmarks/memory/compare.py [GRID.json ...]``.

Reads grids in the schema of ``h200_grid.json`` (written by the trainer's
``measure_grid.py``)::

    {"machine", "gpu", "gpu_memory_bytes", "torch", "transformer_engine", "command", "date",
     "trainer_settings": {...},
     "results": [{"model": {ModelSpec fields}, "preset", "precision", "backend", "batch_size",
                  "seq_length", "activation_checkpointing", "world_size",
                  "status": "ok" | "oom", "peak_allocated_bytes", "peak_reserved_bytes"}]}

Also reads ``fsdp1_h200_grid.json`` (TE's fsdp.py, written by ``measure_fsdp1.py``:
rows name ``layers``, ``ac``, ``precision`` and the sizes; the setup is fsdp.py's, see
``fsdp1_setup``).

For every "ok" row it predicts ``torch.cuda.max_memory_allocated`` with the
estimator and reports the relative error; for every "oom" row it reports the
predicted device peak against the GPU's memory. Prints a Markdown table and the
summary (median and worst absolute error), the figures the accuracy test checks.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kfp_sagemaker_blackwell.catalog import hardware  # noqa: E402
from kfp_sagemaker_blackwell.catalog.spec import ModelSpec  # noqa: E402
from kfp_sagemaker_blackwell.planning import estimator, training_setup  # noqa: E402

HERE = Path(__file__).resolve().parent
GRID = HERE / "h200_grid.json"
# An OOM row is "near the limit" when the predicted device peak is within the
# estimator's worst-case error (8%) of the GPU's memory.
NEAR_LIMIT = 0.92
# trainer_settings keys that map onto TrainingSetup fields.
_SETTINGS = ("param_dtype", "master_weights", "optimizer_state_dtype", "fsdp_version",
             "reduce_dtype", "optimizer", "quantized_model_init", "gradient_accumulation_steps",
             "loss_kernel")


@dataclass(frozen=True)
class Row:
    label: str
    status: str
    measured_allocated: int
    measured_reserved: int
    predicted_allocated: int
    predicted_peak: int
    gpu_memory_bytes: int
    phase: str
    predicted_reserved: int = 0
    family: tuple = ()  # (preset, width, sequence, checkpointing): see ``family_of``
    reserve_features: tuple[float, ...] = ()
    predicted_binding: int = 0  # the allocated bytes the reserve is added to
    source: str = ""  # the grid file's name
    batch_size: int = 0
    context_bytes: int = 0  # CUDA context and NCCL (the estimate's cuda_context)

    @property
    def error(self) -> float:
        """Relative error of the predicted allocated peak (ok rows)."""
        return self.predicted_allocated / self.measured_allocated - 1.0

    @property
    def oom_predicted(self) -> bool:
        """An out-of-memory row is predicted when the device peak is at or near the GPU."""
        return self.predicted_peak >= NEAR_LIMIT * self.gpu_memory_bytes

    @property
    def fits_predicted(self) -> bool:
        """The planner's verdict at zero headroom."""
        return self.predicted_peak <= self.gpu_memory_bytes


_VALID = {
    "param_dtype": training_setup.PARAM_DTYPES,
    "optimizer_state_dtype": training_setup.OPTIMIZER_STATE_DTYPES,
    "fsdp_version": training_setup.FSDP_VERSIONS,
    "reduce_dtype": training_setup.REDUCE_DTYPES,
    "optimizer": training_setup.OPTIMIZERS,
    "loss_kernel": training_setup.LOSS_KERNELS,
}


def _valid(key: str, value: Any) -> bool:
    if key in _VALID:
        return value in _VALID[key]
    if key == "gradient_accumulation_steps":
        return isinstance(value, int) and value > 0
    return isinstance(value, bool)


def setup_for(result: dict[str, Any], settings: dict[str, Any]) -> training_setup.TrainingSetup:
    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    model = ModelSpec(**{k: v for k, v in result["model"].items() if k in fields})
    # trainer_settings may describe the setup in words (measure_grid.py does); only
    # values the estimator understands override its defaults (this trainer's).
    extra = {k: settings[k] for k in _SETTINGS if k in settings and _valid(k, settings[k])}
    extra.update({k: result[k] for k in _SETTINGS if k in result and _valid(k, result[k])})
    # Grids measured before the trainer compiled its loss say nothing of it: eager then.
    extra.setdefault("loss_kernel", "eager")
    return training_setup.TrainingSetup(
        model=model,
        batch_size=int(result["batch_size"]),
        seq_length=int(result["seq_length"]),
        precision=result["precision"],
        activation_checkpointing=bool(result["activation_checkpointing"]),
        world_size=int(result.get("world_size", 1)),
        backend=result.get("backend", "te"),
        **extra,
    )


def fsdp1_setup(result: dict[str, Any]) -> training_setup.TrainingSetup:
    """TE's examples/pytorch/fsdp/fsdp.py as the estimator sees it: the te-fsdp-example
    block stack at ``layers`` depth; parameters, gradients and torch.optim.Adam's
    (foreach) moments in the parameter dtype (bf16, or fp16 for ``--precision fp16``;
    fp16 moments take bf16's 2 bytes); FSDP1 with an fp32 gradient reduction;
    te.TransformerLayer's default hidden dropout 0.1."""
    from kfp_sagemaker_blackwell.catalog.spec import preset

    dtype = "fp16" if result["precision"] == "fp16" else "bf16"
    return training_setup.TrainingSetup(
        model=preset("te-fsdp-example").replace(num_layers=int(result["layers"])),
        batch_size=int(result["batch_size"]), seq_length=int(result["seq_length"]),
        precision=result["precision"], activation_checkpointing=result["ac"] == "ckpt",
        world_size=int(result.get("world_size", 1)), param_dtype=dtype, master_weights=False,
        optimizer_state_dtype="bf16", fsdp_version=1, optimizer="adamw-foreach", dropout=0.1,
    )


def family_of(s: training_setup.TrainingSetup, preset: str) -> tuple:
    """The configuration family a run belongs to: preset x width x sequence x checkpointing
    (batch, depth, precision and world size vary inside a family). Held-out checks leave
    whole families out, never single rows (issue 25 item 5)."""
    return (preset, s.model.hidden_size, s.seq_length, s.activation_checkpointing)


def compare(path: Path, split: str | None = None) -> list[Row]:
    """Rows of a grid file; ``split`` keeps only rows of that split (calibration/validation)."""
    doc = json.loads(Path(path).read_text())
    gpu = hardware.gpu(doc["gpu"])
    if doc.get("gpu_memory_bytes"):
        gpu = dataclasses.replace(gpu, memory_bytes=int(doc["gpu_memory_bytes"]))
    settings = doc.get("trainer_settings") or {}
    rows = []
    fsdp_py = "fsdp_py" in doc
    for r in doc["results"]:
        if split and r.get("split") != split:
            continue
        s = fsdp1_setup(r) if fsdp_py else setup_for(r, settings)
        e = estimator.estimate(s, gpu)
        label = (
            f"{'fsdp.py L' + str(r['layers']) if fsdp_py else r.get('preset') or 'custom'} {s.precision} "
            f"{s.backend} b{s.batch_size} s{s.seq_length} "
            f"{r['ac'] if fsdp_py else 'ckpt' if s.activation_checkpointing else 'no-ckpt'} w{s.world_size}"
        )
        reserved = r.get("peak_reserved_bytes") or (r.get("child") or {}).get("max_reserved_bytes")
        preset = "fsdp.py" if fsdp_py else (r.get("preset") or "custom").split(" (")[0]
        rows.append(
            Row(label, r["status"], int(r.get("peak_allocated_bytes") or 0),
                int(reserved or 0), e.peak_allocated_bytes, e.peak_bytes,
                gpu.memory_bytes, e.phase, e.peak_reserved_bytes, family_of(s, preset),
                estimator.reserve_features(s, gpu), int(estimator.binding_allocated(s, gpu)),
                Path(path).name, s.batch_size, e.breakdown["cuda_context"])
        )
    return rows


# Every grid that records the peak reserved memory of runs that ran, and the out-of-memory
# boundaries measured on an H200 (benchmarks/memory/boundary.py).
BOUNDARY = HERE / "boundary_h200.json"
RESERVED_GRIDS = (GRID, HERE / "spot_checks_h200.json", HERE / "fsdp1_h200_grid.json",
                  ROOT / "benchmarks" / "throughput" / "h200_grid.json", BOUNDARY)
# A run whose peak reserved memory came within this of the GPU's usable memory was squeezed:
# the allocator gave cached blocks back and retried, so its reserve is not what the step holds
# with memory to spare; it is a constraint of the fit (it fitted), not a data point.
SQUEEZED_BYTES = 3 * 2**30
# The least a configuration measured to run out of memory must be predicted over the GPU.
NO_FIT_MARGIN_BYTES = 2**29
RESERVE_TERMS = ("fixed", "FSDP2", "eager loss fp32 logits", "FSDP transients", "Adam moments",
                 "logits gradient (no checkpointing)", "checkpointed spill")


def _room(r: Row) -> float:
    """Bytes the reserve may take at the binding phase: the GPU less context and allocations."""
    return r.gpu_memory_bytes - r.context_bytes - r.predicted_binding


def _squeezed(r: Row) -> bool:
    return r.measured_reserved > r.gpu_memory_bytes - r.context_bytes - SQUEEZED_BYTES


def _reserved_rows(rows: list[Row]) -> list[Row]:
    """Runs that ran with memory to spare and recorded their peak reserved memory."""
    return [r for r in rows if r.status == "ok" and r.measured_reserved and not _squeezed(r)]


def _design(r: Row) -> list[float]:
    return [1.0, *r.reserve_features]


def _target(r: Row) -> float:
    """The measured reserve above the binding allocation (the measured allocated peak less the
    predicted allocations past the binding phase)."""
    return r.measured_reserved - (r.measured_allocated - (r.predicted_allocated - r.predicted_binding))


def fit_constraints(rows: list[Row]) -> list[tuple[list[float], float, bool]]:
    """(design, room, fits) per run whose outcome the reserve must reproduce: runs that ran fit
    (reserve <= room), runs that ran out of memory do not (reserve > room + margin), except the
    largest batch that ran at a measured boundary, which may be refused (the issue's bar: the
    answer is the largest that ran or one below). Boundary configurations also require the
    batch one below the largest that ran to fit (``boundary_constraints``)."""
    out = []
    for fam in {(r.source, r.family) for r in rows}:
        runs = [r for r in rows if (r.source, r.family) == fam and r.status in ("ok", "oom")]
        first_oom = min((r.batch_size for r in runs if r.status == "oom"), default=None)
        for r in runs:
            at_limit = first_oom is not None and r.status == "ok" and r.batch_size == first_oom - 1
            if r.source != BOUNDARY.name and not at_limit:
                out.append((_design(r), _room(r), r.status == "ok"))
    return out + boundary_constraints(rows)


def boundary_constraints(rows: list[Row]) -> list[tuple[list[float], float, bool]]:
    """For each measured boundary (the largest batch m that ran, m+1 ran out of memory): m-1
    fits and m+1 does not, predicted at the configuration of the runs."""
    doc = json.loads(BOUNDARY.read_text())
    gpu = dataclasses.replace(hardware.gpu(doc["gpu"]), memory_bytes=int(doc["gpu_memory_bytes"]))
    out = []
    for b in doc["boundaries"]:
        m = b["measured_largest"]
        if not m:
            continue
        for batch, fits in ((m - 1, True), (m + 1, False)):
            s = boundary_setup(b, batch)
            e = estimator.estimate(s, gpu)
            room = gpu.memory_bytes - e.breakdown["cuda_context"] - estimator.binding_allocated(s, gpu)
            out.append(([1.0, *estimator.reserve_features(s, gpu)], room, fits))
    return out


def boundary_setup(b: dict[str, Any], batch: int) -> training_setup.TrainingSetup:
    """The trainer's setup of a boundary_h200.json configuration at ``batch``."""
    from kfp_sagemaker_blackwell.catalog.spec import preset

    model = preset(b["preset"])
    if b.get("num_layers"):
        model = model.replace(num_layers=int(b["num_layers"]))
    return training_setup.TrainingSetup(model, batch, int(b["seq_length"]), b["precision"],
                                        activation_checkpointing=bool(b["activation_checkpointing"]))


def fit_reserve(rows: list[Row], constraints: list[tuple[list[float], float, bool]] | None = None,
                ) -> tuple[float, ...]:
    """The reserve's coefficients (``estimator.RESERVE_COEFFICIENTS``' order): least absolute
    error of the reserve above the binding allocation over the runs with memory to spare, every
    coefficient >= 0 (each term adds cached memory), subject to ``constraints`` (default: those
    of ``rows``, ``fit_constraints``). A linear program (scipy's HiGHS)."""
    import numpy as np
    from scipy.optimize import linprog

    use = _reserved_rows(rows)
    cons = fit_constraints(rows) if constraints is None else constraints
    gib = 2**30  # solved in GiB: the byte-sized features are badly scaled otherwise
    x = np.array([_design(r) for r in use]) / gib
    x[:, 0] = 1.0
    y = np.array([_target(r) for r in use]) / gib
    n, m = x.shape[1], len(y)
    a_ub = [np.c_[x, -np.eye(m)], np.c_[-x, -np.eye(m)]]
    b_ub = [y, -y]
    for design, room, fits in cons:
        d = np.array(design) / gib
        d[0] = 1.0
        sign = 1.0 if fits else -1.0
        a_ub.append(sign * np.r_[d, np.zeros(m)][None])
        b_ub.append([sign * room / gib - (0.0 if fits else NO_FIT_MARGIN_BYTES / gib)])
    res = linprog(np.r_[np.zeros(n), np.ones(m)], A_ub=np.vstack(a_ub), b_ub=np.concatenate(b_ub),
                  bounds=[(0, None)] * (n + m), method="highs")
    if res.status != 0:
        raise ValueError(f"no reserve of these terms meets the measured outcomes: {res.message}")
    coef = res.x[:n]
    return (float(coef[0] * gib), *(float(c) for c in coef[1:]))


def predicted_reserve(r: Row, coef: tuple[float, ...]) -> int:
    """Peak reserved memory a reserve of ``coef`` predicts for ``r``."""
    extra = estimator.allocator_reserve(tuple(r.reserve_features), coef)
    # A run that ran: shifted by the allocated estimate's error, so that only the reserve's
    # error shows (an out-of-memory run's allocated bytes are those at the failure).
    shift = r.measured_allocated - r.predicted_allocated if r.status == "ok" else 0
    return int(max(r.predicted_binding + extra, r.predicted_allocated) + shift)


def held_out_reserved(rows: list[Row]) -> list[tuple[Row, int]]:
    """Each run's peak reserved memory predicted by a fit that never saw its family: neither
    its runs nor its constraints (leave-one-family-out)."""
    out = []
    for fam in sorted({r.family for r in _reserved_rows(rows)}, key=str):
        coef = fit_reserve([r for r in rows if r.family != fam], _constraints_without(rows, fam))
        out += [(r, predicted_reserve(r, coef)) for r in _reserved_rows(rows) if r.family == fam]
    return out


def _constraints_without(rows: list[Row], fam: tuple) -> list[tuple[list[float], float, bool]]:
    keep = [r for r in rows if r.family != fam]
    grid = fit_constraints(keep)
    doc = json.loads(BOUNDARY.read_text())
    held = [b for b in doc["boundaries"] if _boundary_family(b) == fam]
    if not held:
        return grid
    drop = {tuple(d) for d, _, _ in _boundary_constraints_of(held)}
    return [c for c in grid if tuple(c[0]) not in drop]


def _boundary_family(b: dict[str, Any]) -> tuple:
    return family_of(boundary_setup(b, 1), b["preset"])


def _boundary_constraints_of(bs: list[dict[str, Any]]) -> list[tuple[list[float], float, bool]]:
    doc = json.loads(BOUNDARY.read_text())
    gpu = dataclasses.replace(hardware.gpu(doc["gpu"]), memory_bytes=int(doc["gpu_memory_bytes"]))
    return [([1.0, *estimator.reserve_features(boundary_setup(b, m), gpu)], 0.0, True)
            for b in bs for m in (b["measured_largest"] - 1, b["measured_largest"] + 1)]


def largest_batch(b: dict[str, Any], coef: tuple[float, ...], limit: int = 512) -> int:
    """The largest batch of a boundary configuration that a reserve of ``coef`` lets fit."""
    doc = json.loads(BOUNDARY.read_text())
    gpu = dataclasses.replace(hardware.gpu(doc["gpu"]), memory_bytes=int(doc["gpu_memory_bytes"]))
    best = 0
    for batch in range(1, limit):
        s = boundary_setup(b, batch)
        e = estimator.estimate(s, gpu)
        need = max(estimator.binding_allocated(s, gpu)
                   + estimator.allocator_reserve(estimator.reserve_features(s, gpu), coef),
                   e.peak_allocated_bytes) + e.breakdown["cuda_context"]
        if need > gpu.memory_bytes:
            break
        best = batch
    return best


def held_out_boundaries(rows: list[Row]) -> list[dict[str, Any]]:
    """Each measured boundary answered by a fit that never saw its family (its runs in any grid
    and its boundary constraints), and by the shipped constants."""
    doc = json.loads(BOUNDARY.read_text())
    out = []
    for b in doc["boundaries"]:
        fam = _boundary_family(b)
        coef = fit_reserve([r for r in rows if r.family != fam], _constraints_without(rows, fam))
        out.append({"configuration": f"{b['preset']}{' L' + str(b['num_layers']) if b.get('num_layers') else ''} "
                    f"s{b['seq_length']} {'ckpt' if b['activation_checkpointing'] else 'no-ckpt'} {b['precision']}",
                    "measured_largest": b["measured_largest"],
                    "shipped": largest_batch(b, estimator.RESERVE_COEFFICIENTS),
                    "held_out": largest_batch(b, coef)})
    return out


def reserved_summary(pairs: list[tuple[Row, int]]) -> dict[str, Any]:
    """Errors of predicted vs measured peak reserved memory (GiB and relative)."""
    gib = 2**30
    err = [(p - r.measured_reserved) / gib for r, p in pairs]
    rel = [p / r.measured_reserved - 1 for r, p in pairs]
    return {"rows": len(pairs), "families": len({r.family for r, _ in pairs}),
            "median_abs_gib": statistics.median(abs(e) for e in err),
            "worst_under_gib": min(err), "worst_over_gib": max(err),
            "median_abs_rel": statistics.median(abs(e) for e in rel),
            "worst_abs_rel": max(abs(e) for e in rel)}


def reserve_report() -> str:
    """``--fit-reserve``: the reserve's constants fitted on every grid, the errors of fits that
    leave each configuration family out, and the boundaries answered by held-out fits."""
    rows = [r for p in RESERVED_GRIDS for r in compare(p)]
    gib = 2**30
    coef = fit_reserve(rows)
    held = held_out_reserved(rows)
    in_sample = [(r, predicted_reserve(r, estimator.RESERVE_COEFFICIENTS)) for r in _reserved_rows(rows)]
    terms = ", ".join(f"{name} {c / gib if i == 0 else c:.3f}{' GiB' if i == 0 else ''}"
                      for i, (name, c) in enumerate(zip(RESERVE_TERMS, coef, strict=True)))
    out = [f"fit on {len(in_sample)} runs with memory to spare, {len(fit_constraints(rows))} "
           f"outcomes as constraints: {terms}",
           f"shipped constants (estimator): {_fmt_summary(reserved_summary(in_sample))}",
           f"leave-one-family-out: {_fmt_summary(reserved_summary(held))}", "",
           "| boundary configuration | largest that ran | shipped constants | fit without its family |",
           "|---|---:|---:|---:|"]
    out += [f"| {v['configuration']} | {v['measured_largest']} | {v['shipped']} | {v['held_out']} |"
            for v in held_out_boundaries(rows)]
    out += ["", "| family (preset, width, seq, checkpointing) | runs | held-out median error GiB | worst GiB |",
            "|---|---:|---:|---:|"]
    by_fam: dict[tuple, list[float]] = {}
    for r, p in held:
        by_fam.setdefault(r.family, []).append((p - r.measured_reserved) / gib)
    for fam, errs in sorted(by_fam.items(), key=lambda kv: str(kv[0])):
        worst = max(errs, key=abs)
        out.append(f"| {fam} | {len(errs)} | {statistics.median(errs):+.2f} | {worst:+.2f} |")
    return "\n".join(out) + "\n"


def _fmt_summary(s: dict[str, Any]) -> str:
    return (f"{s['rows']} runs in {s['families']} families, median |error| {s['median_abs_gib']:.2f} GiB "
            f"({s['median_abs_rel']:.1%}), worst under {s['worst_under_gib']:+.2f} GiB, worst over "
            f"{s['worst_over_gib']:+.2f} GiB (worst {s['worst_abs_rel']:.1%})")


def summary(rows: list[Row]) -> dict[str, Any]:
    ok = [r for r in rows if r.status == "ok"]
    errs = [abs(r.error) for r in ok]
    reserve = [r.measured_reserved / r.measured_allocated - 1 for r in ok if r.measured_reserved]
    oom = [r for r in rows if r.status == "oom"]
    return {
        "ok_rows": len(ok),
        "median_abs_error": statistics.median(errs) if errs else None,
        "worst_abs_error": max(errs) if errs else None,
        "worst_under_prediction": min((r.error for r in ok), default=None),
        "oom_rows": len(oom),
        "oom_rows_predicted": sum(r.oom_predicted for r in oom),
        "oom_rows_predicted_not_to_fit": sum(not r.fits_predicted for r in oom),
        "ok_rows_predicted_to_fit": sum(r.fits_predicted for r in ok),
        "median_reserved_over_allocated": statistics.median(reserve) if reserve else None,
    }


def markdown(rows: list[Row]) -> str:
    gib = 2**30
    out = [
        "| configuration | status | measured allocated GiB | predicted GiB | error | "
        "measured reserved GiB | predicted reserved GiB | predicted device peak GiB | "
        "predicted to fit | peak during |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.status == "ok":
            err = f"{r.error:+.1%}"
            meas = f"{r.measured_allocated / gib:.2f}"
        else:
            err = "-"
            meas = "out of memory"
        fit = "yes" if r.fits_predicted else "no"
        res = f"{r.measured_reserved / gib:.2f}" if r.measured_reserved and r.status == "ok" else "-"
        out.append(
            f"| {r.label} | {r.status} | {meas} | {r.predicted_allocated / gib:.2f} | {err} | "
            f"{res} | {r.predicted_reserved / gib:.2f} | "
            f"{r.predicted_peak / gib:.2f} of {r.gpu_memory_bytes / gib:.1f} | {fit} | {r.phase} |"
        )
    s = summary(rows)
    if s["ok_rows"]:
        out += [
            "",
            f"{s['ok_rows']} measured rows: median absolute error {s['median_abs_error']:.1%}, "
            f"worst {s['worst_abs_error']:.1%}; {s['ok_rows_predicted_to_fit']} of them predicted "
            f"to fit at zero headroom; {s['oom_rows_predicted_not_to_fit']} of {s['oom_rows']} "
            f"out-of-memory rows predicted not to fit ({s['oom_rows_predicted']} at or near the "
            f"limit, device peak >= {NEAR_LIMIT:.0%} of the GPU).",
        ]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("grids", nargs="*", type=Path, help=f"grid files (default: {GRID.name})")
    ap.add_argument("--fit-reserve", action="store_true",
                    help="fit the allocator reserve on every grid recording peak reserved memory "
                    "and print its leave-one-family-out errors")
    args = ap.parse_args(argv)
    if args.fit_reserve:
        print(reserve_report(), end="")
        return 0
    paths = args.grids or [GRID]
    missing = [p for p in paths if not p.exists()]
    if missing:
        print(f"compare.py: {', '.join(map(str, missing))} does not exist yet (the trainer's "
              "measure_grid.py writes it on a GPU).", file=sys.stderr)
        return 1
    for p in paths:
        rows = compare(p)
        print(f"### {p.name}\n")
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
