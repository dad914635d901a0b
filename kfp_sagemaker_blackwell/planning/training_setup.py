"""One training configuration, per GPU: what the memory estimator and the throughput model
are both asked about (``kfp_sagemaker_blackwell.planning.estimator``,
``kfp_sagemaker_blackwell.planning.throughput``), and what compare_convergence and rank_throughput build
from a run's series to ask the throughput model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kfp_sagemaker_blackwell.catalog.flags import (
    LOSS_KERNELS,  # the trainer's --loss-kernel choices
    flag_default,
    flag_fields,
)
from kfp_sagemaker_blackwell.catalog.precisions import (
    COMPUTE_DTYPE,
    LOW_PRECISIONS,
    PRECISIONS,
    parse_precision,
)
from kfp_sagemaker_blackwell.catalog.spec import ModelSpec
from kfp_sagemaker_blackwell.common.errors import FieldError, UserError

# Bytes per element of the dtypes a user can name.
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
PARAM_DTYPES = ("fp32", "bf16", "fp16")
OPTIMIZER_STATE_DTYPES = ("fp32", "bf16")
REDUCE_DTYPES = ("fp32", "bf16")
BACKENDS = ("te", "torch")
FSDP_VERSIONS = (1, 2)
# Fused AdamW (``torch.optim.AdamW(fused=True)``, this project's trainer on GPU)
# updates in place; the foreach implementation (torch.optim.Adam's default on
# CUDA, used by TE's fsdp.py) allocates one state-sized temporary
# (``torch._foreach_sqrt(exp_avg_sqs)`` in torch/optim/adam.py ``_multi_tensor_adam``).
OPTIMIZERS = ("adamw-fused", "adamw-foreach")
# The in-repo trainer's flag defaults (catalog/flags.py, the one declaration of its
# command line): what a setup that does not say otherwise trains with.
TRAINER_DEFAULTS: dict[str, Any] = {f.name: flag_default(f) for f in flag_fields()}


@dataclass(frozen=True)
class TrainingSetup:
    """One training configuration, per GPU.

    Defaults describe this project's trainer: FSDP2 with fp32 sharded master
    parameters and 16-bit compute, fused AdamW with fp32 moments, fp32 gradient
    reduction, TransformerEngine layers. TE's ``examples/pytorch/fsdp/fsdp.py`` is
    ``param_dtype="bf16", master_weights=False, optimizer_state_dtype="bf16",
    fsdp_version=1, optimizer="adamw-foreach", dropout=0.1`` with the ``te-fsdp-example``
    preset (benchmarks/memory/compare.py ``fsdp1_setup``).
    """

    model: ModelSpec
    batch_size: int  # micro-batch per GPU
    seq_length: int
    precision: str = TRAINER_DEFAULTS["precision"]
    activation_checkpointing: bool = TRAINER_DEFAULTS["activation_checkpointing"]
    world_size: int = 1  # ranks FSDP shards over (GPUs x nodes)
    backend: str = "te"
    param_dtype: str | None = None  # sharded parameter dtype; None: fp32 (this trainer)
    master_weights: bool = True  # fp32 master copy when parameters are 16-bit
    optimizer_state_dtype: str = "fp32"
    fsdp_version: int = 2
    reduce_dtype: str = "fp32"
    quantized_model_init: bool = TRAINER_DEFAULTS["quantized_model_init"]
    # One GPU (world size 1) with FSDP2 (the trainer's default) or, false, the plain module
    # (the trainer's --no-single-gpu-fsdp): fp32 weights cast under autocast, every block's
    # compute copy kept from its forward to its backward, no FSDP buffers (``unsharded``).
    single_gpu_fsdp: bool = TRAINER_DEFAULTS["single_gpu_fsdp"]
    # The trainer's --cuda-graphs (the unsharded model only, no checkpointing, TE): each
    # block's forward and backward replayed from CUDA graphs, whose static weight gradients
    # live through the whole step.
    cuda_graphs: bool = TRAINER_DEFAULTS["cuda_graphs"]
    optimizer: str = "adamw-fused"
    gradient_accumulation_steps: int = TRAINER_DEFAULTS["grad_accum_steps"]
    # Hidden dropout probability of the blocks (this trainer: none; TE's fsdp.py: 0.1,
    # te.TransformerLayer's default). Attention dropout costs no memory (fused attention
    # regenerates its mask from the RNG state), so only the hidden dropout counts.
    dropout: float = 0.0
    # How the trainer's cross-entropy runs (trainer/loss.py): "compiled" (torch.compile, the
    # trainer's default on a GPU) or "eager" (F.cross_entropy on an fp32 copy of the logits,
    # the trainer before it compiled the loss, and every grid measured before then).
    loss_kernel: str = TRAINER_DEFAULTS["loss_kernel"]
    # The CUDA caching allocator's expandable segments (``PYTORCH_CUDA_ALLOC_CONF``): on unless
    # the job's environment sets its own ``PYTORCH_CUDA_ALLOC_CONF`` without
    # ``expandable_segments:True`` (the trainer's rule, trainer/allocator.py ``configure`` and
    # ``expandable``). It decides the allocator reserve the estimate adds (planning/estimator.py).
    expandable_segments: bool = True

    @property
    def stored_param_dtype(self) -> str:
        return self.param_dtype or "fp32"

    @property
    def compute_dtype(self) -> str:
        """The dtype of the gathered weights and the activations (FSDP MixedPrecision)."""
        return COMPUTE_DTYPE.get(self.precision, "bf16")

    @property
    def unsharded(self) -> bool:
        """One GPU without FSDP2 (``single_gpu_fsdp`` off; more GPUs always shard)."""
        return self.world_size == 1 and self.fsdp_version == 2 and not self.single_gpu_fsdp

    @property
    def low_precision(self) -> bool:
        return self.precision in LOW_PRECISIONS

    def optimizer_settings(self) -> dict[str, Any]:
        """How parameters, gradients and optimizer states are kept (reports show these)."""
        return {
            "backend": self.backend,
            "param_dtype": self.stored_param_dtype,
            "master_weights": self.master_weights,
            "optimizer_state_dtype": self.optimizer_state_dtype,
            "fsdp_version": self.fsdp_version,
            "reduce_dtype": self.reduce_dtype,
            "quantized_model_init": self.quantized_model_init,
            "single_gpu_fsdp": self.single_gpu_fsdp,
            "cuda_graphs": self.cuda_graphs,
            "optimizer": self.optimizer,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "dropout": self.dropout,
            "expandable_segments": self.expandable_segments,
        }

    def validate(self) -> TrainingSetup:
        """Raises UserError naming the field and what would be valid."""
        try:
            self.model.validate()
        except FieldError as exc:  # ModelSpec names the field it refuses
            raise UserError(exc.field, str(exc), "fix the model dimensions.") from None
        for name in ("batch_size", "seq_length", "world_size", "gradient_accumulation_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise UserError(name, f"={value!r} must be a positive integer.", "")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise UserError("dropout", f"={self.dropout!r} must be a probability in [0, 1).", "use e.g. 0.1 or 0.")
        if not isinstance(self.single_gpu_fsdp, bool):
            raise UserError("single_gpu_fsdp", f"={self.single_gpu_fsdp!r} must be true or false.",
                            "true: FSDP2 on one GPU as on many (the trainer's default); false: "
                            "the plain module (--no-single-gpu-fsdp).")
        if not isinstance(self.cuda_graphs, bool):
            raise UserError("cuda_graphs", f"={self.cuda_graphs!r} must be true or false.",
                            "true: the trainer's --cuda-graphs; false: the blocks run eagerly.")
        if self.cuda_graphs:
            why = ("the trainer captures the blocks of the plain module on one GPU (world_size 1, "
                   "single_gpu_fsdp false, fsdp_version 2), on the te backend, without activation "
                   "checkpointing")
            for name, ok, fix in (
                ("world_size", self.world_size == 1, "plan one GPU (world_size 1)"),
                ("single_gpu_fsdp", not self.single_gpu_fsdp, "set single_gpu_fsdp false"),
                ("fsdp_version", self.fsdp_version == 2, "set fsdp_version 2"),
                ("backend", self.backend == "te", "use backend te"),
                ("activation_checkpointing", not self.activation_checkpointing,
                 "set activation_checkpointing off"),
            ):
                if not ok:
                    raise UserError(name, f"={getattr(self, name)!r} cannot run with cuda_graphs: {why}.",
                                    f"{fix}, or turn cuda_graphs off.")
        if not isinstance(self.expandable_segments, bool):
            raise UserError("expandable_segments", f"={self.expandable_segments!r} must be true or "
                            "false.", "true: the trainer's default allocator setting; false: the "
                            "job's PYTORCH_CUDA_ALLOC_CONF turns expandable segments off.")
        try:  # a parsed Precision (the planner's request, the launcher's) is not checked again
            parse_precision(self.precision)
        except ValueError:
            raise UserError("precision", f"={self.precision!r} is not one of "
                            f"{', '.join(PRECISIONS)}.", "") from None
        _choice("backend", self.backend, BACKENDS)
        _choice("param_dtype", self.stored_param_dtype, PARAM_DTYPES)
        _choice("optimizer_state_dtype", self.optimizer_state_dtype, OPTIMIZER_STATE_DTYPES)
        _choice("reduce_dtype", self.reduce_dtype, REDUCE_DTYPES)
        _choice("fsdp_version", self.fsdp_version, FSDP_VERSIONS)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("loss_kernel", self.loss_kernel, LOSS_KERNELS)
        if self.quantized_model_init and not (self.low_precision and self.backend == "te"):
            raise UserError(
                "quantized_model_init",
                f"needs a low precision ({', '.join(LOW_PRECISIONS)}) on the te "
                f"backend (got precision={self.precision}, backend={self.backend}).",
                "turn quantized_model_init off.",
            )
        if self.precision == "fp32" and self.stored_param_dtype != "fp32":
            raise UserError(
                "param_dtype",
                f"={self.stored_param_dtype} cannot train in fp32 precision.",
                "use param_dtype fp32 for precision fp32.",
            )
        return self


def _choice(name: str, value: Any, valid: tuple) -> None:
    if value not in valid:
        raise UserError(name, f"={value!r} is not one of {', '.join(map(str, valid))}.", "")
