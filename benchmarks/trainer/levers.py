"""Runs the trainer with named performance levers applied, for A/B runs in one process each.

    python3 benchmarks/trainer/steady_timer.py ... benchmarks/trainer/levers.py -- \\
        --levers sbhd,keep-params -- <trainer flags>

A lever is a setting the trainer has in code but does not (yet) offer as a flag; this harness sets
it before ``kfp_sagemaker_blackwell.trainer.train.main`` runs, so a lever that pays can be measured before it becomes an
option or a default, and one that does not leaves nothing behind. Levers:

- ``sbhd``: TE blocks on a sequence-first residual stream (``te_backend.INPUT_FORMAT``), as fsdp.py.
- ``keep-params``: FSDP2 keeps each block's gathered bf16 parameters from forward to backward
  (``reshard_after_forward=False``): no second all-gather/cast in backward, 2 bytes/parameter more.
- ``bf16-masters``: TE parameters in bf16 with no fp32 master copy (``te_backend.MASTER_DTYPE``),
  fsdp.py's arrangement: prices what the trainer's fp32 masters cost. Diagnostic only.
- ``compiled-loss`` / ``eager-loss``: the cross-entropy through ``torch.compile`` or eager
  (now the trainer's ``--loss-kernel compiled|eager``; compiled is its default).
"""

from __future__ import annotations

import argparse
import functools
import sys

import torch

LEVERS = ("sbhd", "keep-params", "bf16-masters", "compiled-loss", "eager-loss")


def apply(levers: list[str]) -> list[str]:
    """Sets the levers; returns the trainer flags they stand for (if any)."""
    from kfp_sagemaker_blackwell.trainer import parallel, te_backend

    unknown = [x for x in levers if x not in LEVERS]
    if unknown:
        raise SystemExit(f"--levers: unknown {', '.join(unknown)}; choose from {', '.join(LEVERS)}")
    if "sbhd" in levers:
        te_backend.INPUT_FORMAT = "sbhd"
    if "keep-params" in levers:
        parallel.apply_fsdp = functools.partial(parallel.apply_fsdp, reshard_after_forward=False)
    if "bf16-masters" in levers:
        te_backend.MASTER_DTYPE = torch.bfloat16
    flags = []
    if "compiled-loss" in levers:
        flags += ["--loss-kernel", "compiled"]
    if "eager-loss" in levers:
        flags += ["--loss-kernel", "eager"]
    return flags


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levers", default="", help="comma-separated levers (none: the trainer as it is)")
    p.add_argument("trainer_args", nargs=argparse.REMAINDER, help="-- then the trainer's flags")
    a = p.parse_args(argv)
    levers = [x for x in a.levers.split(",") if x]
    flags = apply(levers)
    print(f"[levers] applied: {','.join(levers) or 'none'}", flush=True)
    rest = a.trainer_args[1:] if a.trainer_args[:1] == ["--"] else a.trainer_args
    from kfp_sagemaker_blackwell.trainer.train import main as train_main

    return train_main([*rest, *flags])


if __name__ == "__main__":
    sys.exit(main())
