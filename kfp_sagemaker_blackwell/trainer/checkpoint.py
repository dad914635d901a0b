"""Checkpoints with torch.distributed.checkpoint (DCP) that count only when complete.

Layout under the checkpoint directory (SageMaker uploads it to the job's
CheckpointConfig S3 URI while the job runs, and downloads it on a restart)::

    step_00000100/            a checkpoint (renamed from .tmp when every file was written)
        .metadata, __*.distcp DCP shards of model + optimizer (fp32 masters, Adam states)
        rng_rank00000.pt     each rank's RNG states
        meta.json            step (= the data position), loss, loss scale
        manifest.json        written last: every other file with its size (and CRC-32 when
                             small), the run's fingerprint (model, world size, precision,
                             batch layout) and the step
    step_00000200.tmp/       being written; never resumed from, removed on the next save

A checkpoint is complete when its directory has its final name and every file its
manifest lists is there with that size and checksum. The rename alone is not enough:
SageMaker's upload copies files one by one as they appear, so a restart can download a
``step_*`` directory whose upload was cut (some files missing or short), and a disk can
be damaged later. Resume (``restore``) takes the newest complete checkpoint, logs why
each newer one was skipped, refuses one written by a different run (fingerprint), and
fails naming every checkpoint and the fix when none can be used.

Only the ``keep`` newest checkpoints are kept.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
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
TMP = ".tmp"
META = "meta.json"
MANIFEST = "manifest.json"
FORMAT = "kfp-sagemaker/checkpoint/v1"
# Files up to this size get a CRC-32 in the manifest: the RNG files, meta.json, DCP's
# .metadata and the shards of small models. zlib.crc32 ran at 3.8 GB/s on this project's
# CI machine, so 256 MiB costs ~70 ms; a 12 GB shard (8B model, 8 GPUs) would cost ~3 s
# per save and again per resume, inside SageMaker's 120 s stop grace period. Larger files
# are checked by size, which is what a cut upload, a kill mid-write or a full disk change.
CHECKSUM_MAX_BYTES = 256 << 20
FIX_START_OVER = ("start over with resume=false, or a new checkpoint-dir (on SageMaker a new "
                  "checkpoint_s3_uri)")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or resumed from; the message names it and the fix."""


def _name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def _step_of(path: Path) -> int:
    try:
        return int(path.name[len(PREFIX):].removesuffix(TMP))
    except ValueError:
        return -1


def _steps(root: Path) -> list[Path]:
    """The step_* and step_*.tmp directories, newest first (a .tmp before its final name)."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)
             and _step_of(p) >= 0]
    return sorted(found, key=lambda p: (_step_of(p), p.name.endswith(TMP)), reverse=True)


def _portable(model_sd: dict[str, Any]) -> dict[str, Any]:
    """Drops TransformerEngine's ``_extra_state`` entries (pickled FP8 scaling metadata whose
    size changes once training has started, so DCP cannot load it into a fresh model: seen as a
    CheckpointException on the H200 at resume). TE rebuilds that state in the first steps after
    a resume; on the PyTorch backend there is none and resume stays exact."""
    return {k: v for k, v in model_sd.items() if not k.endswith("_extra_state")}


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


# ---------------------------------------------------------------------------
# Agreement between ranks: every rank takes the same decision, or all raise
# ---------------------------------------------------------------------------

def _gather(obj: Any) -> list[Any]:
    """``obj`` from every rank (just ``[obj]`` in a one-process run)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _agree(error: str | None, remove: Path | None = None) -> None:
    """Raises CheckpointError on every rank when any rank had an error (the first one's),
    after removing ``remove`` (a half-written checkpoint: a full disk gets its space back)."""
    errors = [(r, e) for r, e in enumerate(_gather(error)) if e]
    if errors:
        if remove is not None:
            shutil.rmtree(remove, ignore_errors=True)
        rank, message = errors[0]
        raise CheckpointError(message if len(errors) == 1 or rank == 0 else
                              f"rank {rank}: {message}")


# ---------------------------------------------------------------------------
# Files and the manifest
# ---------------------------------------------------------------------------

def _crc32(path: Path) -> str:
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def _describe(path: Path) -> dict[str, Any]:
    size = path.stat().st_size
    return {"bytes": size, "crc32": _crc32(path) if size <= CHECKSUM_MAX_BYTES else None}


def _write_json(path: Path, payload: Any) -> None:
    """Whole or not at all: a reader never sees half a file (nodes sharing a directory
    write the same manifest)."""
    part = path.with_name(f"{path.name}.{os.getpid()}.part")
    part.write_text(json.dumps(payload, indent=1, sort_keys=True, default=str))
    os.replace(part, path)


def _state_bytes(obj: Any) -> int:
    """Bytes of the tensors this rank holds in a (nested) state dict: what DCP writes."""
    if isinstance(obj, dict):
        return sum(_state_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_state_bytes(v) for v in obj)
    local = getattr(obj, "_local_tensor", obj)  # a DTensor's shard
    if isinstance(local, torch.Tensor):
        return local.numel() * local.element_size()
    return 0


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, what caused it, and the per-rank failures a DCP CheckpointException carries."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        for failure in (getattr(e, "failures", None) or {}).values():
            todo.append(failure[0] if isinstance(failure, tuple) else failure)
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]


def _disk_full(exc: BaseException) -> bool:
    return any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
               for e in _causes(exc))


def _first_line(exc: BaseException) -> str:
    """The failure in one line: a DCP CheckpointException's text is a traceback per rank,
    so its first rank's exception is told instead."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        return _first_line(first[0] if isinstance(first, tuple) else first)
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**26 else f"{n:,} bytes"


def _no_space(root: Path, name: str, need: int) -> str:
    free = shutil.disk_usage(root).free if root.exists() else 0
    return (f"checkpoint-dir={root}: no space left on its disk for checkpoint {name} (it needs "
            f"about {_gib(need)} on this node, {_gib(free)} free). Fix: give the job more disk "
            "(volume_size_gb), keep fewer checkpoints (keep-checkpoints), or point "
            "checkpoint-dir at a larger disk.")


# ---------------------------------------------------------------------------
# Save
# ---------------------------------------------------------------------------

def save(root: str | Path, step: int, model, optimizer, meta: dict[str, Any], keep: int,
         local_rank: int, rank: int, *, fingerprint: dict[str, Any] | None = None,
         local_world_size: int = 1) -> Path:
    """Collective: every rank calls it. Returns the final path; raises CheckpointError (on
    every rank) when it cannot be written, the disk being full named as such."""
    root = Path(root)
    name = _name(step)
    tmp, final = root / (name + TMP), root / name
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": _portable(model_sd), "optim": optim_sd}
    need = _state_bytes(state) * max(1, local_world_size)  # this node's share, about
    error = None
    if local_rank == 0:
        error = _prepare(root, tmp, name, need)
    _agree(error)
    try:
        dcp.save(state, checkpoint_id=str(tmp))
        torch.save(_rng_state(), tmp / f"rng_rank{rank:05d}.pt")
    except (Exception, dcp.CheckpointException) as exc:  # DCP's is a BaseException
        if local_rank == 0:  # the space it took is free again for the message (and the job)
            shutil.rmtree(tmp, ignore_errors=True)
        error = _no_space(root, name, need) if _disk_full(exc) else \
            f"checkpoint-dir={root}: writing checkpoint {name} failed: {_first_line(exc)}"
    _agree(error, remove=tmp if local_rank == 0 else None)
    # Each node lists what its ranks wrote; the manifest is the union (the same on every node).
    listed = {p.name: _describe(p) for p in tmp.iterdir()} if local_rank == 0 else {}
    files: dict[str, Any] = {}
    for part in _gather(listed):
        files.update(part)
    if local_rank == 0:
        error = _finish(root, tmp, final, step, keep, files,
                        {**meta, "step": step}, fingerprint or {}, need)
    _agree(error)
    return final


def _prepare(root: Path, tmp: Path, name: str, need: int) -> str | None:
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True, exist_ok=True)  # another node sharing the directory
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return _no_space(root, name, need)
        return f"checkpoint-dir={root}: cannot create {tmp.name}: {exc.strerror or exc}"
    if shutil.disk_usage(root).free < need:
        shutil.rmtree(tmp, ignore_errors=True)
        return _no_space(root, name, need)
    return None


def _finish(root: Path, tmp: Path, final: Path, step: int, keep: int, files: dict[str, Any],
            meta: dict[str, Any], fingerprint: dict[str, Any], need: int) -> str | None:
    """meta.json, then the manifest (last), then the rename; prunes older checkpoints."""
    try:
        _write_json(tmp / META, meta)
        files = {**files, META: _describe(tmp / META)}
        _write_json(tmp / MANIFEST, {"format": FORMAT, "step": step, "fingerprint": fingerprint,
                                     "files": dict(sorted(files.items()))})
        if final.exists():
            shutil.rmtree(final)
        try:
            os.replace(tmp, final)
        except FileNotFoundError:  # a shared filesystem: another node renamed it
            pass
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return _no_space(root, final.name, need)
        return f"checkpoint-dir={root}: finishing checkpoint {final.name} failed: {exc}"
    _prune(root, step, keep)
    return None


def _prune(root: Path, step: int, keep: int) -> None:
    """Keeps ``keep`` checkpoints up to ``step``; removes unfinished saves and any step after
    ``step`` (a run that resumed from an older checkpoint abandoned them)."""
    kept = 0
    for p in _steps(root):
        later, unfinished = _step_of(p) > step, p.name.endswith(TMP)
        if not (later or unfinished) and kept < keep and (p / MANIFEST).is_file():
            kept += 1
            continue
        shutil.rmtree(p, ignore_errors=True)


# ---------------------------------------------------------------------------
# Resume
# ---------------------------------------------------------------------------

def problem(path: str | Path) -> str | None:
    """Why the checkpoint at ``path`` is not complete, or None when it is."""
    path = Path(path)
    if path.name.endswith(TMP):
        return "an unfinished save (never renamed)"
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        return f"no {MANIFEST} (its save or upload did not finish, or an older trainer wrote it)"
    except (OSError, ValueError) as exc:
        return f"{MANIFEST} is unreadable ({exc}): cut short or damaged"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or manifest.get("format") != FORMAT or META not in files:
        return f"{MANIFEST} is not a {FORMAT} manifest"
    for fname, entry in sorted(files.items()):
        f = path / fname
        if os.sep in fname or fname in ("..", ".") or not isinstance(entry, dict):
            return f"{MANIFEST} lists {fname!r}, not a file of the checkpoint"
        if not f.is_file():
            return f"{fname} is missing"
        size = f.stat().st_size
        if size != entry.get("bytes"):
            return (f"{fname} has {size:,} bytes, the manifest says {entry.get('bytes'):,}: "
                    "truncated or cut short" if isinstance(entry.get("bytes"), int)
                    else f"{MANIFEST} gives no size for {fname}")
        if entry.get("crc32") and _crc32(f) != entry["crc32"]:
            return f"{fname} does not match its checksum: damaged"
    try:
        meta = json.loads((path / META).read_text())
        int(meta["step"])
    except (ValueError, KeyError, TypeError) as exc:
        return f"{META} is unreadable ({exc})"
    return None


def _survey(root: Path) -> list[tuple[str, str | None]]:
    """(name, problem) for every checkpoint directory, newest first, agreed by every rank:
    a checkpoint is complete only when it is complete on every node."""
    local = [(p.name, problem(p)) for p in _steps(root)]
    views = _gather(local)
    names = sorted({n for view in views for n, _ in view},
                   key=lambda n: (_step_of(Path(n)), n.endswith(TMP)), reverse=True)
    out: list[tuple[str, str | None]] = []
    for n in names:
        reasons = [(r, dict(view).get(n, "missing on this node")) for r, view in enumerate(views)
                   if n not in dict(view) or dict(view)[n]]
        if not reasons:
            out.append((n, None))
        elif len(reasons) == len(views) and len({r for _, r in reasons}) == 1:
            out.append((n, reasons[0][1]))  # every rank sees it the same way
        else:
            out.append((n, f"rank {reasons[0][0]}: {reasons[0][1]}"))
    return out


def _fingerprint_mismatch(root: Path, name: str, theirs: dict[str, Any],
                          ours: dict[str, Any]) -> str | None:
    diffs = []
    for key in sorted(set(theirs) | set(ours)):
        a, b = theirs.get(key), ours.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += [f"{key}.{k} {a.get(k)!r} there, {b.get(k)!r} here"
                      for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        else:
            diffs.append(f"{key} {a!r} there, {b!r} here")
    if not diffs:
        return None
    settings = ", ".join(f"{k}={theirs[k]}" for k in sorted(theirs)
                         if k != "model" and theirs.get(k) != ours.get(k))
    same = f"run with the checkpoint's settings ({settings}) to continue it, or " if settings \
        else "run the checkpoint's model to continue it, or "
    return (f"checkpoint-dir={root}: checkpoint {name} was written by a different run "
            f"({'; '.join(diffs)}), so it cannot be resumed. Fix: {same}{FIX_START_OVER}.")


@dataclass
class Restored:
    """What ``restore`` did: ``path`` and ``meta`` of the checkpoint loaded (None: a fresh
    start), and the (name, reason) of each newer checkpoint it skipped."""

    path: Path | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def restore(root: str | Path, fingerprint: dict[str, Any], model, optimizer,
            rank: int) -> Restored:
    """Collective: loads the newest complete checkpoint under ``root`` into ``model`` and
    ``optimizer`` (and this rank's RNG). Skips incomplete ones and any that fails to load,
    naming each; raises CheckpointError for one written by a different run, and when there
    are checkpoints but none is usable."""
    root = Path(root)
    done = Restored()
    for name, reason in _survey(root):
        if reason is None:
            manifest = json.loads((root / name / MANIFEST).read_text())
            _agree(_fingerprint_mismatch(root, name, manifest.get("fingerprint") or {},
                                         fingerprint))
            try:
                done.meta, error = load(root / name, model, optimizer, rank), None
            except (Exception, dcp.CheckpointException) as exc:  # DCP's is a BaseException
                error = f"could not be loaded: {_first_line(exc)}"
            errors = [e for e in _gather(error) if e]
            if not errors:
                done.path = root / name
                return done
            reason = errors[0]
        done.skipped.append((name, reason))
    if any(not n.endswith(TMP) for n, _ in done.skipped):
        listing = "; ".join(f"{n}: {r}" for n, r in done.skipped)
        raise CheckpointError(
            f"checkpoint-dir={root}: no checkpoint there can be resumed ({listing}). Fix: "
            f"delete the damaged checkpoints (their directories) or {FIX_START_OVER}.")
    return done


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
    saved = torch.load(path / f"rng_rank{rank:05d}.pt", weights_only=True)
    torch.set_rng_state(saved["cpu"])
    if "cuda" in saved and torch.cuda.is_available():
        torch.cuda.set_rng_state(saved["cuda"])
    return json.loads((path / META).read_text())  # type: ignore[no-any-return]


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
