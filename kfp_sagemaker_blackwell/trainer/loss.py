"""The training loss, in one place for both backends.

A language model's loss is the mean cross-entropy of its logits against the next tokens; a bare
block stack (``vocab_size=0``, TE fsdp.py's shape) has no targets and uses the mean square of its
output, a throughput workload only.

``kernel`` (the trainer's ``--loss-kernel``) picks how the cross-entropy runs:

- ``"eager"``: ``F.cross_entropy(logits.float(), targets)``. The fp32 copy of the logits and
  log_softmax's fp32 output are materialised (the memory estimator's ``_loss_bytes`` models
  exactly these tensors, measured on an H200).
- ``"compiled"`` (the default): the same function through ``torch.compile`` (on a GPU; a CPU
  runs it eager), which fuses the upcast into the softmax reductions and saves a log-sum-exp
  per token instead of fp32 copies. At vocabulary 128,256 the logits are the largest tensors
  of the step: on an H200 (1b preset, batch 4, seq 4096) it is 1.08x (bf16) and 1.16x (fp8)
  the eager step and needs 18.5 GiB less (benchmarks/trainer/README.md); the estimator's
  ``loss_kernel`` models both.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from kfp_sagemaker_blackwell.catalog.flags import LOSS_KERNELS as KERNELS


def _cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


@functools.cache
def _compiled():
    return torch.compile(_cross_entropy, dynamic=False)


def lm_loss(out: torch.Tensor, targets: torch.Tensor | None, kernel: str = "compiled") -> torch.Tensor:
    """The step's loss: cross-entropy for a language model, mean square for a bare stack."""
    if targets is None:
        return out.float().pow(2).mean()
    if kernel not in KERNELS:
        raise ValueError(f"loss kernel {kernel!r}: choose one of {', '.join(KERNELS)}")
    if kernel == "compiled" and out.is_cuda:
        return _compiled()(out, targets)
    return _cross_entropy(out, targets)
