"""Does each optimizer step change the weights the model computes with? By parameter kind.

Session v9 (one H100) ran ``--quantized-model-init`` (FP8 primary weights, TE's FusedAdam with
fp32 master copies) and its loss stayed flat over 12 steps (12.17 -> 12.16; 11.39 without the
flag). This wraps any training run, without editing it, and answers which parameters the
optimizer's step moves: global optimizer-step pre- and post-hooks
(``torch.optim.optimizer.register_optimizer_step_pre_hook`` / ``..._post_hook``, which every
``torch.optim.Optimizer`` subclass runs, TE's FusedAdam included) copy each parameter's local
values before the step (a DTensor's local shard; a TE quantised tensor dequantised) and compare
after it. One JSON line per checked step (rank 0), parameters grouped by kind (class and dtype,
e.g. ``Float8Tensor/float8_e4m3fn``, ``Parameter/float32``):

    update_check step=1 {"Parameter/float32": {"params": 290, "changed": 290, "median_rel_change": 0.0012, ...}}

    python3 -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/trainer/update_check.py \\
        --steps 2 -m kfp_sagemaker_blackwell.trainer -- --model-preset 1b --precision fp8 ...

A kind whose ``changed`` is 0 (or whose median relative change is orders below the others') does
not take the updates. Each kind also gets its gradients' norm before the step (``grad_norm``,
the local shards'), and, for an optimizer that keeps master copies (TE's FusedAdam with
``master_weights``: ``get_unscaled_state(p, "master_param")``), how the masters moved
(``master_changed``, ``master_median_rel_change``): session v10 saw FP8 primary weights move by
about one E4M3 step while the loss stayed flat, which the weights alone cannot tell from a
working optimizer. The copies cost one fp32 copy of the model's local parameters on its device
during a checked step. ``--steps N`` checks the first N steps, then removes the hooks.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import statistics
import sys
from typing import Any


def local_values(p: Any):
    """A parameter's local values as a float32 tensor: a DTensor's shard, dequantised when it is a
    TE quantised tensor (anything with ``dequantize``), detached and copied."""
    t = p._local_tensor if hasattr(p, "_local_tensor") else p
    if hasattr(t, "dequantize"):
        t = t.dequantize()
    return t.detach().float().clone()


def kind(p: Any) -> str:
    t = p._local_tensor if hasattr(p, "_local_tensor") else p
    dtype = getattr(t, "_fp8_dtype", None) or t.dtype
    return f"{type(t).__name__}/{str(dtype).replace('torch.', '').replace('DType.', '')}"


def local_grad_norm(p: Any) -> float:
    """The norm of a parameter's local gradient (0.0 without one)."""
    import torch

    g = p.grad
    if g is None:
        return 0.0
    g = g._local_tensor if hasattr(g, "_local_tensor") else g
    return float(torch.linalg.vector_norm(g.detach().float()))


def master(optimizer: Any, p: Any):
    """A parameter's master copy (fp32) where the optimizer keeps one, else None."""
    get = getattr(optimizer, "get_unscaled_state", None)
    if get is None or "master_param" not in optimizer.state.get(p, {}):
        return None
    return get(p, "master_param").detach().float().clone()


def _rel_change(old: Any, new: Any) -> float:
    import torch

    denom = float(torch.linalg.vector_norm(old)) or 1.0
    return float(torch.linalg.vector_norm(new - old)) / denom


class UpdateCheck:
    """The pre/post step hooks: ``before`` copies, ``after`` compares and summarises by kind."""

    def __init__(self, steps: int, out=None) -> None:
        self.steps, self.step, self.out = steps, 0, out or sys.stdout
        self.saved: list[tuple[Any, Any, float, Any]] = []
        self.handles: list[Any] = []
        self.results: list[dict[str, dict[str, float]]] = []

    def install(self) -> UpdateCheck:
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        self.handles = [register_optimizer_step_pre_hook(self.before),
                        register_optimizer_step_post_hook(self.after)]
        return self

    def before(self, optimizer, args, kwargs) -> None:
        self.saved = [(p, local_values(p), local_grad_norm(p), master(optimizer, p))
                      for g in optimizer.param_groups for p in g["params"]]

    def after(self, optimizer, args, kwargs) -> None:
        self.step += 1
        by: dict[str, list[float]] = {}
        grads: dict[str, float] = {}
        masters: dict[str, list[float]] = {}
        for p, old, grad, old_master in self.saved:
            k = kind(p)
            by.setdefault(k, []).append(_rel_change(old, local_values(p)))
            grads[k] = grads.get(k, 0.0) + grad ** 2
            new_master = master(optimizer, p) if old_master is not None else None
            if new_master is not None:
                masters.setdefault(k, []).append(_rel_change(old_master, new_master))
        self.saved = []
        summary: dict[str, dict[str, float]] = {}
        for k, v in sorted(by.items()):
            summary[k] = {"params": len(v), "changed": sum(x > 0 for x in v),
                          "median_rel_change": statistics.median(v), "max_rel_change": max(v),
                          "grad_norm": grads[k] ** 0.5}
            if k in masters:
                summary[k] |= {"master_changed": sum(x > 0 for x in masters[k]),
                               "master_median_rel_change": statistics.median(masters[k])}
        self.results.append(summary)
        if os.environ.get("RANK", "0") == "0":
            print(f"update_check step={self.step} {json.dumps(summary)}", file=self.out, flush=True)
        if self.step >= self.steps:
            for h in self.handles:
                h.remove()
            self.handles = []


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2, help="optimizer steps to check (default 2)")
    p.add_argument("-m", dest="module", default="", help="run this module (like python -m) instead of a script")
    p.add_argument("script", nargs="?", default="", help="the training script, then its arguments after --")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if a.steps < 1:
        p.error("--steps must be >= 1")
    if not a.module and not a.script:
        p.error("give a script or -m MODULE")
    UpdateCheck(a.steps).install()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    if a.module:
        sys.argv = [a.module, *([a.script] if a.script else []), *args]
        runpy.run_module(a.module, run_name="__main__", alter_sys=True)
        return
    sys.argv = [a.script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(a.script)))
    runpy.run_path(a.script, run_name="__main__")


if __name__ == "__main__":
    main()
