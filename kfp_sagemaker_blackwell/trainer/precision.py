"""Backend choice and the capability check that runs before any work."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.catalog.flags import ConfigError
from kfp_sagemaker_blackwell.catalog.precisions import (
    ALL_PRECISIONS,
    parse_precision,
)


@dataclass(frozen=True)
class Plan:
    precision: str
    backend: str  # te | torch
    emulated: bool  # numerics emulated on the PyTorch backend (never a speed measurement)
    recipe: str  # TE recipe class, or "none"
    param_dtype: torch.dtype | None  # FSDP2 compute dtype (None: fp32)
    gpu_name: str | None
    gpu: hardware.GPU | None  # the table entry, when the GPU is known


def high_precision_blocks(num_layers: int, high_precision_layers: int) -> frozenset[int]:
    """The blocks kept in 16-bit under a low precision: the first and the last ``high_precision_layers``."""
    k = high_precision_layers
    return frozenset(i for i in range(num_layers) if i < k or i >= num_layers - k)


def te_available() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def _te_check(precision: str) -> None:
    """TransformerEngine's own availability answers, raised in our words."""
    fn = {
        "fp8": "is_fp8_available",
        "fp8-current": "is_fp8_available",
        "fp8-block": "is_fp8_block_scaling_available",
        "mxfp8": "is_mxfp8_available",
        "nvfp4": "is_nvfp4_available",
    }.get(precision)
    if not fn:
        return
    import transformer_engine.pytorch as te

    if hasattr(te, fn):
        ok, reason = getattr(te, fn)(return_reason=True)
        if not ok:
            raise hardware.UnsupportedPrecisionError(
                f"precision={precision!r}: TransformerEngine refuses it on this GPU ({reason})."
            )


def plan(precision: str, backend: str, device_type: str) -> Plan:
    """Resolves ``auto``, checks the precision against the device, and refuses what cannot run."""
    precision = parse_precision(precision)  # TrainConfig's, parsed by the flag: not checked again
    gpu_name = gpu_spec = None
    cc = None
    if device_type == "cuda":
        gpu_name = torch.cuda.get_device_name()
        cc = torch.cuda.get_device_capability()
        try:
            gpu_spec = hardware.gpu(gpu_name)
        except ValueError:
            gpu_spec = None
    low = precision.low
    if backend == "auto":
        # On a GPU with TE, every precision uses the TE layers: runs of a precision sweep then
        # differ in the precision alone (same layers, same initialisation), and the measured
        # memory grid (benchmarks/memory/h200_grid.json) is the TE backend's.
        backend = "te" if (device_type == "cuda" and te_available()) else "torch"
    if backend == "te":
        if device_type != "cuda":
            raise ConfigError("backend='te': TransformerEngine needs a CUDA GPU; use backend=torch "
                              "(low precisions are then emulated) or device=cuda")
        if not te_available():
            raise ConfigError("backend='te': transformer_engine is not installed in this image; "
                              "install transformer_engine[pytorch] or use backend=torch")
    if device_type == "cuda" and (backend == "te" or not low):
        # Real numerics on a real GPU: the table first (the same check the planner runs).
        if gpu_spec is not None:
            hardware.check_precision_for_gpu(precision, gpu_spec.name)
        elif cc is not None and not precision.supported_on(cc):
            raise hardware.UnsupportedPrecisionError(
                f"precision={precision!r} is not supported on {gpu_name} (compute capability "
                f"{cc[0]}.{cc[1]}). Precisions it runs: "
                f"{', '.join(p for p in ALL_PRECISIONS if p.supported_on(cc))}."
            )
        if backend == "te":
            _te_check(precision)
    emulated = device_type == "cpu" and precision != "fp32" or (backend == "torch" and low)
    if device_type == "cuda" and not low:
        param_dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    elif device_type == "cuda":
        param_dtype = torch.bfloat16
    else:
        param_dtype = None  # CPU: fp32 compute, 16-bit and low-precision GEMMs emulated
    return Plan(precision, backend, emulated, precision.recipe or "none",
                param_dtype, gpu_name, gpu_spec)


def te_recipe(precision: str, amax_history_len: int):
    from transformer_engine.common import recipe as r

    if precision == "fp8":
        return r.DelayedScaling(fp8_format=r.Format.HYBRID, amax_history_len=amax_history_len,
                                amax_compute_algo="max")
    if precision == "fp8-current":
        return r.Float8CurrentScaling()
    if precision == "fp8-block":
        return r.Float8BlockScaling()
    if precision == "mxfp8":
        return r.MXFP8BlockScaling()
    if precision == "nvfp4":
        return r.NVFP4BlockScaling()
    return None


def check_levers(cfg, backend: str, world_size: int) -> None:
    """The speed levers that need the resolved backend or the world size (``TrainConfig.validate``
    checks the rest): refused before the model is built, with the fix."""
    if cfg.fp8_weight_cache and backend != "te":
        raise ConfigError("fp8-weight-cache: TE's FP8 weight cache needs backend=te, not "
                          f"{backend}", "fp8-weight-cache", "use backend=te on a GPU, or leave it off")
    if cfg.cuda_graphs and backend != "te":
        raise ConfigError(f"cuda-graphs: te.make_graphed_callables needs backend=te, not {backend}",
                          "cuda-graphs", "use backend=te on a GPU, or leave it off")
    if cfg.cuda_graphs and world_size > 1:
        raise ConfigError(f"cuda-graphs: one GPU only (world size {world_size} shards the model "
                          "with FSDP2, whose all-gathers the graphs cannot capture)", "cuda-graphs",
                          "run on one GPU, or leave it off")
