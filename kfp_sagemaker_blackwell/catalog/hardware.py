"""GPUs, SageMaker instance types with their prices, and which precisions they run.

Torch-free: the planner (memory estimate, training component validation) uses
this table to refuse a precision before any AWS call, the trainer uses the
same table at start-up against the real device, and the price book
(planning/pricing.py) falls back to each instance type's shipped price.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kfp_sagemaker_blackwell.catalog.bounds import UnknownName
from kfp_sagemaker_blackwell.catalog.errors import FieldError
from kfp_sagemaker_blackwell.catalog.precisions import ALL_PRECISIONS, Precision, parse_precision

# The instance type every component and pipeline defaults to.
DEFAULT_INSTANCE_TYPE = "ml.p6-b200.48xlarge"

@dataclass(frozen=True)
class GPU:
    name: str
    compute_capability: tuple[int, int]
    memory_bytes: int  # as reported by torch.cuda.get_device_properties().total_memory
    # Dense tensor-core peak per GPU in TFLOP/s by compute dtype (vendor datasheets).
    peak_tflops: dict[str, float] = field(default_factory=dict)
    # HBM bandwidth in TB/s and NVLink bandwidth per direction in GB/s (datasheets, see
    # GPUS); 0 where the GPU has no NVLink (PCIe cards talk over the host).
    hbm_tb_s: float = 0.0
    nvlink_gb_s: float = 0.0

    def supports(self, precision: Precision | str) -> bool:
        """Whether this GPU runs ``precision`` (a parsed one is not checked again)."""
        return parse_precision(precision).supported_on(self.compute_capability)

    def supported_precisions(self) -> list[Precision]:
        return [p for p in ALL_PRECISIONS if p.supported_on(self.compute_capability)]

    def peak_for(self, precision: str) -> float | None:
        """Dense peak TFLOP/s for the GEMM dtype a precision uses (None if unknown)."""
        key = {
            "fp32": "tf32",
            "bf16": "bf16",
            "fp16": "bf16",
            "nvfp4": "fp4",
        }.get(precision, "fp8")
        return self.peak_tflops.get(key)


_MiB = 2**20
# Memory: nvidia-smi totals (MiB) of the SXM parts. Peaks: NVIDIA datasheets, dense
# (no sparsity): H100/H200 989 bf16 / 1979 fp8; HGX B200 2250 / 4500 / 9000 fp4; HGX
# B300 2250 / 4500 and dense FP4 ~13-15 PFLOP/s (14000 taken). Bandwidths (datasheets):
# HBM A100-40GB 1.555, A100-80GB 2.039, A10G 0.6, L4 0.3, L40S 0.864, H100 SXM 3.35,
# H200 4.8, B200 8.0, B300 8.0 TB/s; NVLink 3 (A100) 600 GB/s, NVLink 4 (H100/H200)
# 900 GB/s and NVLink 5 (B200/B300) 1800 GB/s in total, i.e. half of it per direction.
GPUS: dict[str, GPU] = {
    "A100-40GB": GPU("A100-40GB", (8, 0), 40960 * _MiB, {"tf32": 156, "bf16": 312}, 1.555, 300),
    "A100": GPU("A100", (8, 0), 81920 * _MiB, {"tf32": 156, "bf16": 312}, 2.039, 300),
    "A10G": GPU("A10G", (8, 6), 23028 * _MiB, {"tf32": 35, "bf16": 70}, 0.6, 0),
    "L4": GPU("L4", (8, 9), 23034 * _MiB, {"tf32": 60, "bf16": 121, "fp8": 242}, 0.3, 0),
    "L40S": GPU("L40S", (8, 9), 46068 * _MiB, {"tf32": 183, "bf16": 362, "fp8": 733}, 0.864, 0),
    "H100": GPU("H100", (9, 0), 81559 * _MiB, {"tf32": 494, "bf16": 989, "fp8": 1979}, 3.35, 450),
    "H200": GPU("H200", (9, 0), 143771 * _MiB, {"tf32": 494, "bf16": 989, "fp8": 1979}, 4.8, 450),
    "B200": GPU(
        "B200", (10, 0), 183359 * _MiB, {"tf32": 1100, "bf16": 2250, "fp8": 4500, "fp4": 9000},
        8.0, 900,
    ),
    # B300: ~268-288 GB per GPU.
    "B300": GPU(
        "B300", (10, 3), 275040 * _MiB, {"tf32": 1100, "bf16": 2250, "fp8": 4500, "fp4": 14000},
        8.0, 900,
    ),
}

_GPU_ALIASES = {
    "a100-80gb": "A100",
    "h100-80gb": "H100",
    "nvidia h100 80gb hbm3": "H100",
    "nvidia h200": "H200",
    "nvidia b200": "B200",
    "nvidia b300": "B300",
    "nvidia a100-sxm4-80gb": "A100",
    "nvidia a100-sxm4-40gb": "A100-40GB",
    "nvidia a10g": "A10G",
    "nvidia l4": "L4",
    "nvidia l40s": "L40S",
}


# When the shipped prices below were last checked.
PRICES_CHECKED = "2026-12-01"


@dataclass(frozen=True)
class ShippedPrice:
    """SageMaker training's on-demand price of an instance type, USD per instance-hour, and
    where it comes from (shown with every cost priced from it)."""

    usd_per_hour: float | None  # None: no on-demand price (training plans only)
    source: str


# SageMaker training, on-demand, USD per instance-hour, us-west-2 / us-east-1. SageMaker's
# rate has been 1.15x the EC2 on-demand rate for every pair checked (p4d and p5, before
# and after the June 2025 price cut); prices derived that way say "derived: verify".
_RATIO = 1.15


def _derived(ec2_type: str, ec2_usd: float) -> ShippedPrice:
    return ShippedPrice(round(_RATIO * ec2_usd, 4),
                        f"derived: 1.15 x EC2 {ec2_type} on-demand {ec2_usd}")


_CUT = "SageMaker training on-demand after the June 2025 price cut"
_UNCONFIRMED = "not confirmed against the AWS price list"


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpu: str
    gpus_per_node: int
    # Network bandwidth between instances in Gbit/s (EFA where the type has it; AWS
    # instance-type pages: p5/p5e/p5en/p6-b200 3200, p6-b300 6400, p4d/p4de 400).
    network_gbps: float = 0.0
    # The shipped on-demand price (None: none shipped; the Price List API may know it).
    price: ShippedPrice | None = None

    @property
    def gpu_spec(self) -> GPU:
        return GPUS[self.gpu]


INSTANCE_TYPES: dict[str, InstanceType] = {
    it.name: it
    for it in (
        InstanceType("ml.p6-b200.48xlarge", "B200", 8, 3200,
                     _derived("p6-b200.48xlarge", 113.9328)),
        InstanceType("ml.p6-b300.48xlarge", "B300", 8, 6400,
                     _derived("p6-b300.48xlarge", 142.416)),
        InstanceType("ml.p5.48xlarge", "H100", 8, 3200,
                     ShippedPrice(63.296, f"{_CUT} (113.07 before)")),
        InstanceType("ml.p5e.48xlarge", "H200", 8, 3200,
                     ShippedPrice(None, "no on-demand price: sold through training plans only")),
        InstanceType("ml.p5en.48xlarge", "H200", 8, 3200, _derived("p5en.48xlarge", 63.296)),
        InstanceType("ml.p4d.24xlarge", "A100-40GB", 8, 400,
                     ShippedPrice(25.25, f"{_CUT} (37.69 before)")),
        InstanceType("ml.p4de.24xlarge", "A100", 8, 400,
                     ShippedPrice(47.11, "the table from before the June 2025 price cut, "
                                  "not re-checked")),
        InstanceType("ml.g6e.48xlarge", "L40S", 8, 400),
        InstanceType("ml.g6e.12xlarge", "L40S", 4, 100),
        InstanceType("ml.g6e.xlarge", "L40S", 1, 20),
        InstanceType("ml.g6.48xlarge", "L4", 8, 100),
        InstanceType("ml.g6.xlarge", "L4", 1, 10),
        InstanceType("ml.g5.48xlarge", "A10G", 8, 100, ShippedPrice(20.36, _UNCONFIRMED)),
        InstanceType("ml.g5.xlarge", "A10G", 1, 10, ShippedPrice(1.41, _UNCONFIRMED)),
    )
}


def gpu(name: str) -> GPU:
    """Looks up a GPU by short name (``B200``, any case) or by the name torch reports for
    the device (``NVIDIA H200``, ``NVIDIA H100 80GB HBM3``). Names are matched exactly,
    word for word: ``A100X`` or ``L40`` are unknown, not an A100 or an L4."""
    key = " ".join(name.split())
    lowered = key.lower()
    for short, spec in GPUS.items():
        if short.lower() == lowered:
            return spec
    if lowered in _GPU_ALIASES:
        return GPUS[_GPU_ALIASES[lowered]]
    # A device name: "NVIDIA <model> [memory / form-factor words]", e.g.
    # "NVIDIA H100 80GB HBM3": the model word must equal a short name.
    words = lowered.split()
    if len(words) >= 2 and words[0] == "nvidia":
        for short in GPUS:
            if words[1] == short.lower():
                return GPUS[short]
    raise FieldError("gpu", f"{name!r}: unknown GPU.", f"choose one of {', '.join(GPUS)}.",
                     text=f"gpu={name!r}: unknown GPU; choose one of {', '.join(GPUS)}")


def instance_type(name: str) -> InstanceType:
    try:
        return INSTANCE_TYPES[name]
    except KeyError:
        raise UnknownName("instance_type", name, INSTANCE_TYPES) from None


def check_precision_for_gpu(precision: Precision | str, gpu_name: str, *,
                            where: str = "") -> None:
    """Refuses a precision the GPU cannot run, naming what would work."""
    spec = gpu(gpu_name)
    precision = parse_precision(precision)
    if precision.supported_on(spec.compute_capability):
        return
    cc = ".".join(map(str, spec.compute_capability))
    need = ".".join(map(str, precision.min_cc))
    on = f" ({where})" if where else ""
    hint = ""
    if precision in ("mxfp8", "nvfp4"):
        hint = " MXFP8 and NVFP4 need Blackwell (B200/B300, e.g. ml.p6-b200.48xlarge)."
    raise UnsupportedPrecisionError(
        f"precision={precision!r} is not supported on {spec.name}{on} (compute capability {cc}; "
        f"{precision} needs {need}+).{hint} Precisions {spec.name} runs: "
        f"{', '.join(spec.supported_precisions())}."
    )


def check_precision_for_instance(precision: str, instance: str) -> None:
    it = instance_type(instance)
    check_precision_for_gpu(precision, it.gpu, where=instance)


class UnsupportedPrecisionError(ValueError):
    """A precision the hardware cannot run (a user error, raised before any work)."""
