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


def expandable_of(doc: dict[str, Any]) -> bool:
    """Whether a document's runs had expandable segments: files written since the trainer sets
    them (issue 41) record ``cuda_alloc_conf``, the environment's PYTORCH_CUDA_ALLOC_CONF (None:
    unset, so the trainer's default applied); older files ran PyTorch's default allocator."""
    if "cuda_alloc_conf" not in doc:
        return False
    from kfp_sagemaker_blackwell.trainer import allocator

    conf = doc["cuda_alloc_conf"]
    return allocator.expandable(allocator.DEFAULT if conf is None else str(conf))


def setup_for(result: dict[str, Any], settings: dict[str, Any],
              expandable: bool = False) -> training_setup.TrainingSetup:
    """The setup of one grid row; ``expandable``: its document's allocator (``expandable_of``)."""
    fields = {f.name for f in dataclasses.fields(ModelSpec)}
    model = ModelSpec(**{k: v for k, v in result["model"].items() if k in fields})
    # trainer_settings may describe the setup in words (measure_grid.py does); only
    # values the estimator understands override its defaults (this trainer's).
    extra = {k: settings[k] for k in _SETTINGS if k in settings and _valid(k, settings[k])}
    extra.update({k: result[k] for k in _SETTINGS if k in result and _valid(k, result[k])})
    # Grids measured before the trainer compiled its loss say nothing of it: eager then; the
    # files that record the allocator were measured by the trainer that compiles it.
    extra.setdefault("loss_kernel", "compiled" if expandable else "eager")
    return training_setup.TrainingSetup(
        model=model,
        batch_size=int(result["batch_size"]),
        seq_length=int(result["seq_length"]),
        precision=result["precision"],
        activation_checkpointing=bool(result["activation_checkpointing"]),
        world_size=int(result.get("world_size", 1)),
        backend=result.get("backend", "te"),
        expandable_segments=expandable,
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
    model = preset("te-fsdp-example").replace(num_layers=int(result["layers"]))
    if "num_heads" in result:  # fsdp.py's -n / -d off its default width; its FFN is 3 x hidden
        hidden = int(result["num_heads"]) * int(result["head_dim"])
        model = model.replace(hidden_size=hidden, num_heads=int(result["num_heads"]),
                              num_kv_heads=int(result["num_heads"]), ffn_hidden_size=3 * hidden)
    return training_setup.TrainingSetup(
        model=model,
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
    expandable = expandable_of(doc)
    for r in doc["results"]:
        if split and r.get("split") != split:
            continue
        s = fsdp1_setup(r) if fsdp_py else setup_for(r, settings, expandable)
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


# The trainer's one-GPU rows of issue 40 (benchmarks/trainer/like_for_like.py's small-step
# stages, one per timed run): the levers the estimator has settings for. Other levers
# (prefetch, the host pool, an FP8 head...) are left out.
SMALL_STEPS = ROOT / "benchmarks" / "trainer" / "small_steps.json"
SMALL_STEP_LEVERS = frozenset({"unsharded", "qinit", "graphs"})


def small_step_setup(row: dict[str, Any]) -> training_setup.TrainingSetup | None:
    """The setup of a ``small_steps.json`` row (the trainer's defaults, checkpointing off as
    like_for_like.py runs it), or None where a lever is not an estimator setting.
    ``--cuda-graphs`` runs on the unsharded module (``--no-single-gpu-fsdp``)."""
    from kfp_sagemaker_blackwell.catalog.spec import preset

    levers = set(row["levers"])
    if levers - SMALL_STEP_LEVERS:
        return None
    return training_setup.TrainingSetup(
        model=preset(row["model_preset"]), batch_size=int(row["batch_size"]),
        seq_length=int(row["seq_length"]), precision=row["precision"], activation_checkpointing=False,
        quantized_model_init="qinit" in levers, single_gpu_fsdp=not levers & {"unsharded", "graphs"},
        cuda_graphs="graphs" in levers)


def small_steps(path: Path = SMALL_STEPS) -> list[Row]:
    """The rows of ``small_steps.json`` the estimator describes, measured against predicted.
    A graphed step's replays write into the graphs' private pool, which the allocated peak
    leaves out: its measure is the footprint, the allocated peak plus the pool's free part (rows
    that did not record the pool, before session v15, are left out)."""
    out = []
    for r in json.loads(Path(path).read_text()):
        s = small_step_setup(r)
        if s is None or not r.get("peak_allocated_gib"):
            continue
        graphs = s.cuda_graphs
        if graphs and r.get("graph_pool_free_gib") is None:
            continue
        gpu = hardware.gpu(r["gpu"])
        e = estimator.estimate(s, gpu)
        measured = (r["peak_allocated_gib"] + (r["graph_pool_free_gib"] if graphs else 0)) * 2**30
        levers = "+".join(sorted(r["levers"])) or "FSDP2"
        label = (f"{r['model_preset']} {s.precision} b{s.batch_size} s{s.seq_length} {levers} "
                 f"{gpu.name} {r.get('session_id', '')}".rstrip())
        out.append(Row(label, "ok", int(measured), int((r.get("peak_reserved_gib") or 0) * 2**30),
                       e.peak_allocated_bytes, e.peak_bytes, gpu.memory_bytes, e.phase,
                       e.peak_reserved_bytes, family_of(s, r["model_preset"]),
                       source=Path(path).name, batch_size=s.batch_size,
                       context_bytes=e.breakdown["cuda_context"]))
    return out


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


def boundary_setup(b: dict[str, Any], batch: int,
                   expandable: bool = False) -> training_setup.TrainingSetup:
    """The trainer's setup of a boundary file's configuration (boundary.py) at ``batch``;
    ``expandable``: the file's allocator (``expandable_of``)."""
    from kfp_sagemaker_blackwell.catalog.spec import preset

    model = preset(b["preset"])
    if b.get("num_layers"):
        model = model.replace(num_layers=int(b["num_layers"]))
    return training_setup.TrainingSetup(model, batch, int(b["seq_length"]), b["precision"],
                                        activation_checkpointing=bool(b["activation_checkpointing"]),
                                        backend=b.get("backend") or "te",
                                        expandable_segments=expandable)


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


# ---------------------------------------------------------------------------
# Expandable segments (issue 41): the trainer's default allocator since 2026-12-06
# ---------------------------------------------------------------------------

# Runs under expandable segments on one H100 (torch's 79.18 GiB), 2026-12-06: the boundary
# searches (boundary.py, TE and torch backends) and the throughput runs far from the limit.
EXPANDABLE_BOUNDARY_TE = HERE / "boundary_h100_te.json"
EXPANDABLE_BOUNDARY_TORCH = HERE / "boundary_h100_torch.json"
EXPANDABLE_BOUNDARIES = (EXPANDABLE_BOUNDARY_TE, EXPANDABLE_BOUNDARY_TORCH)
# Held out (issue 41's check; no constant was fitted on them): four shapes per backend searched in
# session v7 on one H100 (2026-12-07), each planner answer then run twice more in fresh processes.
HELD_OUT_BOUNDARIES = (HERE / "boundary_h100_v7_te.json", HERE / "boundary_h100_v7_torch.json",
                       HERE / "boundary_h100_v8_torch.json", HERE / "boundary_h100_v9_torch.json")
_H100_SESSION = ROOT / "benchmarks" / "throughput" / "raw" / "session_v6_h100"
EXPANDABLE_GRIDS = tuple(_H100_SESSION / f"{n}.json" for n in ("grid", "heldout", "heldout2", "torch"))
# A run whose allocated peak the estimate misses by more than this is not the step it models
# (heldout/torch runs late in one process: their compiled loss fell back to eager, ~10 B per
# logit more); its cache says nothing about the modelled step.
CACHE_FIT_MAX_ERROR = 0.05
# A boundary run is slow when its time per token exceeds its configuration's fastest by this.
SLOW_PER_TOKEN = 0.05


@dataclass(frozen=True)
class BoundaryRun:
    configuration: str
    backend: str
    batch_size: int
    status: str
    room: float  # the GPU's bytes less the CUDA context and the predicted allocated peak
    full_speed_room: float  # room less the cache the allocator keeps with memory to spare
    seconds_per_sequence: float | None  # step_s / batch (runs that ran)


def boundary_runs(path: Path) -> list[BoundaryRun]:
    """Every run of a boundary file with what the estimate says of it at the file's GPU memory."""
    doc = json.loads(Path(path).read_text())
    gpu = dataclasses.replace(hardware.gpu(doc["gpu"]), memory_bytes=int(doc["gpu_memory_bytes"]))
    expandable = expandable_of(doc)
    out = []
    for r in doc["results"]:
        if r["status"] not in ("ok", "oom"):
            continue
        e = estimator.estimate(boundary_setup(r, int(r["batch_size"]), expandable), gpu)
        room = gpu.memory_bytes - e.breakdown["cuda_context"] - e.peak_allocated_bytes
        full = gpu.memory_bytes - e.full_speed_bytes
        conf = (f"{r['preset']} L{r.get('num_layers') or '-'} s{r['seq_length']} "
                f"{'ckpt' if r['activation_checkpointing'] else 'no-ckpt'} {r['precision']}")
        step = r.get("step_s")
        out.append(BoundaryRun(conf, r.get("backend") or "te", int(r["batch_size"]), r["status"],
                               float(room), float(full),
                               step / r["batch_size"] if step and r["status"] == "ok" else None))
    return sorted(out, key=lambda b: (b.configuration, b.batch_size))


def fit_expandable_reserve(paths: tuple[Path, ...]) -> tuple[float, float]:
    """(the reserve, the bound it must stay above), bytes: under expandable segments the fit
    decision is the allocated peak + CUDA context + a constant reserve; every run that ran must
    fit (reserve <= its room) and every run that ran out of memory must not (reserve > its
    room). The reserve returned is the largest the runs allow (the smallest room of a run that
    ran): the most cautious one with which each measured largest batch still fits."""
    runs = [b for p in paths for b in boundary_runs(p)]
    hi = min(b.room for b in runs if b.status == "ok")
    lo = max(b.room for b in runs if b.status == "oom")
    if hi <= lo:
        raise ValueError(f"no constant reserve separates these runs: a run that ran had "
                         f"{hi / 2**30:.2f} GiB of room, one that ran out of memory {lo / 2**30:.2f}")
    return hi, lo


def expandable_cache_rows(paths: tuple[Path, ...] = EXPANDABLE_GRIDS) -> list[Row]:
    """Runs under expandable segments that ran with memory to spare and whose allocated peak the
    estimate predicts (``CACHE_FIT_MAX_ERROR``): the cache the allocator keeps when unsqueezed."""
    rows = [r for p in paths for r in compare(p)]
    return [r for r in _reserved_rows(rows) if abs(r.error) <= CACHE_FIT_MAX_ERROR]


def fit_expandable_cache(rows: list[Row]) -> tuple[float, ...]:
    """The cache kept above the allocated peak under expandable segments with memory to spare
    (``estimator.EXPANDABLE_CACHE_COEFFICIENTS``' order, the FSDP2 term 0: every run is FSDP2),
    least absolute error, coefficients >= 0 (scipy's HiGHS)."""
    import numpy as np
    from scipy.optimize import linprog

    gib = 2**30
    x = np.array([[1.0, *r.reserve_features[1:]] for r in rows]) / gib
    x[:, 0] = 1.0
    y = np.array([(r.measured_reserved - r.measured_allocated) / gib for r in rows])
    n, m = x.shape[1], len(y)
    res = linprog(np.r_[np.zeros(n), np.ones(m)],
                  A_ub=np.vstack([np.c_[x, -np.eye(m)], np.c_[-x, -np.eye(m)]]),
                  b_ub=np.r_[y, -y], bounds=[(0, None)] * (n + m), method="highs")
    if res.status != 0:
        raise ValueError(res.message)
    c = res.x[:n]
    return (float(c[0] * gib), 0.0, *(float(v) for v in c[1:]))


def edge_speed(path: Path) -> list[dict[str, Any]]:
    """Per run that ran: its time per sequence against its configuration's fastest, slow or not
    (``SLOW_PER_TOKEN``), and whether the estimate says it runs at full speed (the allocator's
    unsqueezed cache fits: ``Estimate.full_speed_bytes``)."""
    runs = [b for b in boundary_runs(path) if b.seconds_per_sequence]
    out = []
    for b in runs:
        best = min(o.seconds_per_sequence or 0.0 for o in runs if o.configuration == b.configuration)
        slower = (b.seconds_per_sequence or 0.0) / best - 1
        out.append({"configuration": f"{b.backend} {b.configuration}", "batch_size": b.batch_size,
                    "slower": slower, "slow": slower > SLOW_PER_TOKEN,
                    "full_speed_predicted": b.full_speed_room >= 0, "room": b.room,
                    "full_speed_room": b.full_speed_room})
    return out


def expandable_report() -> str:
    """``--fit-expandable``: the reserve fitted on each backend's boundaries and checked on the
    other's, the unsqueezed cache fitted on the throughput runs, and the speed at the edge."""
    gib = 2**30
    out = []
    for name, fit, check in (("TE", EXPANDABLE_BOUNDARY_TE, EXPANDABLE_BOUNDARY_TORCH),
                             ("torch", EXPANDABLE_BOUNDARY_TORCH, EXPANDABLE_BOUNDARY_TE)):
        hi, lo = fit_expandable_reserve((fit,))
        held = [b for b in boundary_runs(check)]
        wrong = [f"{b.configuration} b{b.batch_size} {b.status}" for b in held
                 if (b.status == "ok") != (b.room >= hi)]
        out.append(f"fit on {name}: reserve <= {hi / gib:.2f} GiB (smallest room of a run that ran) "
                   f"and > {lo / gib:.2f} GiB (largest room of a run out of memory); with "
                   f"{hi / gib:.2f} the other backend's runs decided wrongly: {', '.join(wrong) or 'none'}")
    out.append(f"shipped: {estimator.ALLOCATOR_RESERVE_EXPANDABLE / gib:.2f} GiB")
    rows = expandable_cache_rows()
    coef = fit_expandable_cache(rows)
    err = [(estimator.allocator_reserve(tuple(r.reserve_features), estimator.EXPANDABLE_CACHE_COEFFICIENTS)
            - (r.measured_reserved - r.measured_allocated)) / gib for r in rows]
    terms = ", ".join(f"{n} {c / gib if i == 0 else c:.3f}{' GiB' if i == 0 else ''}"
                      for i, (n, c) in enumerate(zip(RESERVE_TERMS, coef, strict=True)))
    out += [f"unsqueezed cache fitted on {len(rows)} throughput runs: {terms}; shipped constants: "
            f"median |error| {statistics.median(abs(e) for e in err):.2f} GiB, worst "
            f"{min(err):+.2f} / {max(err):+.2f} GiB", "",
            "| backend, configuration | batch | room GiB | room beyond the cache GiB | per token vs fastest | predicted full speed |",
            "|---|---:|---:|---:|---:|---|"]
    for p in EXPANDABLE_BOUNDARIES:
        for s in edge_speed(p):
            out.append(f"| {s['configuration']} | {s['batch_size']} | {s['room'] / gib:.2f} | "
                       f"{s['full_speed_room'] / gib:+.2f} | {s['slower']:+.1%} | "
                       f"{'yes' if s['full_speed_predicted'] else 'no'} |")
    return "\n".join(out) + "\n"


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
    ap.add_argument("--fit-expandable", action="store_true",
                    help="fit the reserve under expandable segments on the H100 boundaries (each "
                    "backend held out in turn), the unsqueezed cache, and the speed at the edge")
    ap.add_argument("--small-steps", nargs="?", type=Path, const=SMALL_STEPS, metavar="JSON",
                    help="the trainer's one-GPU rows (issue 40: FSDP2, the unsharded module, "
                    "qinit, CUDA graphs as their footprint) against the estimate; default "
                    f"benchmarks/trainer/{SMALL_STEPS.name}")
    args = ap.parse_args(argv)
    if args.small_steps:
        print(f"### {args.small_steps.name}\n")
        print(markdown(small_steps(args.small_steps)), end="")
        return 0
    if args.fit_expandable:
        print(expandable_report(), end="")
        return 0
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
