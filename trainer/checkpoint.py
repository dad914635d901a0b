"""Checkpoints with torch.distributed.checkpoint (DCP), written atomically.

Layout under the checkpoint directory (SageMaker syncs it to the job's
CheckpointConfig S3 URI, and restores it on a spot restart)::

    step_00000100/            a complete checkpoint (renamed from .tmp when done)
        .metadata, __*.distcp DCP shards of model + optimizer (fp32 masters, Adam states)
        rng_rank00000.pt     each rank's RNG states
        meta.json            step (= the data position), loss scale, config fingerprint
    step_00000200.tmp/       being written; never resumed from, removed on the next save

Only the ``keep`` newest complete checkpoints are kept. The trainer resumes
from the newest complete one automatically.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

PREFIX = "step_"


def _name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def complete_checkpoints(root: str | Path) -> list[Path]:
    r = Path(root)
    if not r.is_dir():
        return []
    found = []
    for p in r.iterdir():
        if p.is_dir() and p.name.startswith(PREFIX) and not p.name.endswith(".tmp") and (p / "meta.json").is_file():
            found.append(p)
    return sorted(found, key=lambda p: p.name)


def latest(root: str | Path) -> Path | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def _portable(model_sd: dict[str, Any]) -> dict[str, Any]:
    """Drops TransformerEngine's ``_extra_state`` entries (pickled FP8 scaling metadata whose
    size changes once training has started, so DCP cannot load it into a fresh model: seen as a
    CheckpointException on the H200 at resume). TE rebuilds that state in the first steps after
    a resume; on the PyTorch backend there is none and resume stays exact."""
    return {k: v for k, v in model_sd.items() if not k.endswith("_extra_state")}


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def save(root: str | Path, step: int, model, optimizer, meta: dict[str, Any], keep: int,
         local_rank: int, rank: int) -> Path:
    """Collective: every rank calls it. Returns the final path."""
    root = Path(root)
    tmp = root / (_name(step) + ".tmp")
    final = root / _name(step)
    if local_rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": _portable(model_sd), "optim": optim_sd}, checkpoint_id=str(tmp))
    torch.save(_rng_state(), tmp / f"rng_rank{rank:05d}.pt")
    _barrier()
    # One writer per node: on SageMaker each node has its own /opt/ml/checkpoints.
    if local_rank == 0 and tmp.exists():
        (tmp / "meta.json").write_text(json.dumps({**meta, "step": step}, sort_keys=True, default=str))
        if final.exists():
            shutil.rmtree(final)
        try:
            os.replace(tmp, final)
        except FileNotFoundError:  # a shared filesystem: another node renamed it
            pass
        for old in complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in root.glob(f"{PREFIX}*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
    _barrier()
    return final


def load(path: str | Path, model, optimizer, rank: int) -> dict[str, Any]:
    """Collective: loads model, optimizer and RNG state in place; returns meta.json."""
    path = Path(path)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    full = _portable(model_sd)
    state: dict[str, Any] = {"model": full, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path))
    strict = len(full) == len(model_sd)  # TE's extra state is not in the checkpoint
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=StateDictOptions(strict=strict))
    rng = path / f"rng_rank{rank:05d}.pt"
    if rng.is_file():
        saved = torch.load(rng, weights_only=True)
        torch.set_rng_state(saved["cpu"])
        if "cuda" in saved and torch.cuda.is_available():
            torch.cuda.set_rng_state(saved["cuda"])
    return json.loads((path / "meta.json").read_text())


def save_final_model(model, directory: str | Path, dtype: torch.dtype, extra: dict[str, Any],
                     rank: int) -> Path | None:
    """Gathers the full (unsharded) weights to rank 0 and writes model.pt + config.json."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    full: dict[str, Any] = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank != 0:
        return None
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: (v.to(dtype) if v.is_floating_point() and "amax" not in k else v) for k, v in full.items()}
    torch.save(tensors, out / "model.pt")
    (out / "config.json").write_text(json.dumps(extra, indent=2, sort_keys=True, default=str))
    return out
