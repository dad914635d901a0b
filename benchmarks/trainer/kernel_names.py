"""GPU kernel name -> category, first match wins (cuBLAS/CUTLASS/cuDNN/TE/NCCL/PyTorch
kernel names): the one table profile_step.py and steady_timer.py --profile-trace classify by."""

from __future__ import annotations

import re

BY_KERNEL = (
    ("fsdp_copies_collectives", re.compile(r"nccl", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor_apply", re.I)),
    ("memcpy_memset", re.compile(r"memcpy|memset", re.I)),
    ("attention", re.compile(r"fmha|flash|attn|attention|cudnn|sdpa", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|sm90_|sm100_|matmul", re.I)),
    # not "nocast": PyTorch's non-vectorised TensorIterator path (gpu_kernel_impl_nocast<...>)
    # runs plain copies and adds, which issue 26's first profile counted as FP8 casts
    ("fp8_cast_transpose_amax", re.compile(r"(?<!no)cast|transpose|quantiz|amax|fp8|scal", re.I)),
    ("normalization", re.compile(r"norm", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|gelu|silu|swiglu|reduce|add|mul|copy|fill|"
                               r"unrolled|triton", re.I)),
)


def kernel_category(name: str) -> str:
    for label, pattern in BY_KERNEL:
        if pattern.search(name):
            return label
    return "other"
