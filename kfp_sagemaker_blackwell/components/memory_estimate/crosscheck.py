"""Optional cross-check: PyTorch's FSDPMemTracker on the trainer's own model, on CPU.

``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`` counts every tensor
FSDP2, autograd and the optimizer allocate while a step runs under
``FakeTensorMode`` (no memory is really allocated) with a fake process group of
the requested world size. PyTorch tests it to within 10% of the real CUDA peak.
Here it runs ``kfp_sagemaker_blackwell.trainer.model.CausalLM`` sharded like ``trainer/parallel.py`` does,
with the trainer's loss and AdamW, on CPU, so it needs torch but no GPU.

Limits: CPU kernels stand in for CUDA ones (CPU flash attention saves the same
tensors), only 16-bit / fp32 precisions on the torch backend (no TransformerEngine),
no CUDA context or allocator reserve. It runs in a subprocess (it initialises a
global fake process group): ``python -m kfp_sagemaker_blackwell.components.memory_estimate.crosscheck
'<json setup>'`` prints ``{"peak_allocated_bytes": ...}``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from typing import Any

from kfp_sagemaker_blackwell.catalog.spec import ModelSpec
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.planning.training_setup import TrainingSetup


def check_supported(setup: TrainingSetup) -> None:
    if setup.precision not in ("bf16", "fp16", "fp32") or setup.fsdp_version != 2:
        raise UserError(
            "cross_check",
            f"covers the torch backend in bf16, fp16 or fp32 with FSDP2 (got precision="
            f"{setup.precision}, fsdp_version={setup.fsdp_version}).",
            "run it without --cross-check, or with one of those precisions.",
        )


def tracker_peak(setup: TrainingSetup, timeout: float = 600.0) -> int:
    """Peak bytes FSDPMemTracker counts for ``setup`` (in a subprocess)."""
    check_supported(setup)
    doc = asdict(setup)
    out = subprocess.run(
        [sys.executable, "-m", "kfp_sagemaker_blackwell.components.memory_estimate.crosscheck", json.dumps(doc)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if out.returncode != 0:
        raise RuntimeError(f"FSDPMemTracker cross-check failed:\n{out.stderr[-3000:]}")
    return int(json.loads(out.stdout.strip().splitlines()[-1])["peak_allocated_bytes"])


def _run(doc: dict[str, Any]) -> int:  # pragma: no cover - runs in the subprocess
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from kfp_sagemaker_blackwell.trainer import emulation
    from kfp_sagemaker_blackwell.trainer.model import CausalLM

    model_doc = doc.pop("model")
    s = TrainingSetup(model=ModelSpec(**model_doc), **doc)
    spec, w = s.model, s.world_size
    dist.init_process_group("fake", rank=0, world_size=w, store=FakeStore())
    mesh = init_device_mesh("cpu", (w,))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[s.precision]
    with FakeTensorMode():
        fp32 = emulation.numerics_for("fp32")  # trainer on GPU, 16-bit: plain F.linear
        model = CausalLM(spec, [fp32] * spec.num_layers, fp32)
        model.checkpoint_blocks = s.activation_checkpointing
        # As trainer/parallel.py apply_fsdp: a unit per block (the last one kept
        # gathered after forward) and the root; fp32 reduction.
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype else (
            MixedPrecisionPolicy()
        )
        n = len(model.blocks)
        for i, block in enumerate(model.blocks):
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=i < n - 1)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=s.optimizer == "adamw-foreach")
        b, t = s.batch_size, s.seq_length
        if spec.vocab_size:
            inputs = torch.randint(0, spec.vocab_size, (b, t))
            targets = torch.randint(0, spec.vocab_size, (b, t))
        else:
            inputs = torch.randn(b, t, spec.hidden_size, dtype=dtype or torch.float32)
            targets = None
        tracker = FSDPMemTracker(model, opt)
        tracker.track_inputs((inputs,))
        with tracker:
            for step in range(2):  # the second step has optimizer states: steady state
                out = model(inputs)
                if targets is None:
                    loss = out.float().pow(2).mean()
                else:
                    loss = F.cross_entropy(out.float().reshape(-1, out.shape[-1]), targets.reshape(-1))
                loss.backward()
                del out, loss
                opt.step()
                opt.zero_grad(set_to_none=True)
                if step == 0:
                    tracker.reset_mod_stats()
        peak = tracker.get_tracker_snapshot("peak")
    dist.destroy_process_group()
    return int(max(v.get("Total", 0) for v in peak.values()))


if __name__ == "__main__":  # pragma: no cover
    print(json.dumps({"peak_allocated_bytes": _run(json.loads(sys.argv[1]))}))
