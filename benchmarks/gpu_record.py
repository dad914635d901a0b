"""What every GPU measurement of this project records: the machine it ran on, and for each
trainer run, how it ended and how long it took (the grids of benchmarks/memory and
benchmarks/throughput)."""

from __future__ import annotations

import datetime
import gc
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    """The GPU machine, torch and TransformerEngine versions and the date (needs a GPU)."""
    import torch

    try:
        import transformer_engine

        te_version = transformer_engine.__version__
    except ImportError:
        te_version = None
    props = torch.cuda.get_device_properties(0)
    return {
        "machine": f"{torch.cuda.device_count()}x {props.name} (lent GPU machine, Firecracker VM)",
        "gpu": props.name,
        "gpu_memory_bytes": int(props.total_memory),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformer_engine": te_version,
        "date": datetime.date.today().isoformat(),
        # one id per lent machine (the session script sets it): runs of one session share it
        "session": os.environ.get("GPU_SESSION_ID"),
        "nvidia_smi": nvidia_smi(),
        "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        # None: the trainer's one host thread per GPU process (since 2026-12-07; files before
        # that ran PyTorch's pool of one thread per core, benchmarks/throughput/README.md "Session v9")
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }


NVSMI_FIELDS = ("driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem",
                "power.draw", "power.limit", "temperature.gpu", "pstate")


def nvidia_smi() -> dict[str, str] | None:
    """The driver, clocks, power and temperature as nvidia-smi reads them now (None without it)."""
    try:
        p = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(NVSMI_FIELDS)}", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    values = [v.strip() for v in p.stdout.splitlines()[0].split(",")] if p.stdout.strip() else []
    return dict(zip(NVSMI_FIELDS, values, strict=False))


def header(command: str, trainer_settings: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A grid file's head: the command, the machine, the trainer settings every run shares,
    any ``extra`` keys (a schema), then the results list the runs are appended to."""
    return {"command": command, **machine(), "trainer_settings": trainer_settings, **extra, "results": []}


def write(doc: dict[str, Any], paths: list[str]) -> None:
    """Write a grid file to every path given (a state copy and the copy that comes back), whole
    each time, so a run cut off between configurations leaves a valid file."""
    text = json.dumps(doc, indent=1) + "\n"
    for p in paths:
        Path(p).write_text(text)


def fresh_compile_state() -> None:
    """Empty dynamo's caches before a configuration, as a user's job starts: each configuration
    compiles its own graphs. Without it, one process compiles a function at most
    ``torch._dynamo.config.recompile_limit`` (8) times and runs every later new shape eager:
    before session v22, from the ninth loss shape of a split on, the trainer's compiled
    cross-entropy ran eager (slower, and the fp32 logits in memory;
    benchmarks/throughput/loss_kernels.py labels those runs from the logs)."""
    import torch

    torch._dynamo.reset()


def failed(record: dict[str, Any], exc: Any) -> None:
    """A run the trainer ended with TrainingFailed: oom or error, its reason, the peaks so far.

    The caller drops ``exc`` afterwards (its traceback holds the run's tensors)."""
    import torch

    record.update(status="oom" if exc.kind == "oom" else "error", error=exc.reason[:300],
                  peak_allocated_bytes=int(torch.cuda.max_memory_allocated()),
                  peak_reserved_bytes=int(torch.cuda.max_memory_reserved()))


def released(record: dict[str, Any], t0: float) -> dict[str, Any]:
    """Frees what the run left on the GPU (the next configuration starts empty) and records
    the seconds since ``t0``."""
    import torch

    gc.collect()
    torch.cuda.empty_cache()
    record["seconds"] = round(time.perf_counter() - t0, 2)
    return record
