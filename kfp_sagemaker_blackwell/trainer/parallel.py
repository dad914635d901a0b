"""Process group, device and FSDP2, applied to a plain model.

Activation checkpointing is not applied here: it is the models' ``checkpoint_blocks``
flag, read in their ``forward`` (``kfp_sagemaker_blackwell.trainer.model``, ``kfp_sagemaker_blackwell.trainer.te_backend``).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    host_threads: int = 0  # the intra-op threads of this process's host work (0: not set up by init)
    host_threads_source: str = ""  # why: configure_host_threads

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(choice: str) -> str:
    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        from kfp_sagemaker_blackwell.catalog.flags import ConfigError

        raise ConfigError("device='cuda': no CUDA GPU is visible to PyTorch; use device=cpu or auto")
    return choice


def configure_host_threads(device_type: str, environ: Mapping[str, str] = os.environ) -> tuple[int, str]:
    """Gives a GPU process one intra-op thread for its host work unless ``OMP_NUM_THREADS`` is set;
    returns the thread count in effect and where it came from.

    A GPU process's own tensor work on the host is small: the data's next batch, a few scalars.
    torchrun gives every process of a multi-GPU job one thread (it sets ``OMP_NUM_THREADS=1``
    when ``nproc_per_node`` > 1: every P6 job) but leaves a one-GPU job PyTorch's pool of one
    thread per core. On the lent 16-core GPU hosts that pool made the synthetic batch's small
    ops (bucketize, index) take 4-20 ms a step where one thread takes 0.1-0.4 ms, and the GPU
    waited for them: in one H100 lease (2026-12-07) the torch backend's profiled steps idled
    8.8-29.3 ms with the pool and 4.3-8.3 ms with one thread, and took 4.5-12.7% less time
    (benchmarks/throughput/README.md, "Session v9"; the pool's wake-up after an idle GPU step
    reproduces on a CPU: benchmarks/trainer/host_batch.py). So a one-GPU run, each measurement the
    planner is calibrated on among them, runs its host work as an 8-GPU job does. CPU training
    keeps PyTorch's pool (its compute is on the host)."""
    if "OMP_NUM_THREADS" in environ:
        return torch.get_num_threads(), "OMP_NUM_THREADS"
    if device_type == "cuda":
        torch.set_num_threads(1)
        return 1, "trainer: one per GPU process, as torchrun gives a multi-GPU job"
    return torch.get_num_threads(), "PyTorch default (CPU training)"


def init(device_type: str) -> World:
    """Joins the torchrun process group (env://), or makes a one-process group when run in-process.

    An existing group is reused, so ``kfp_sagemaker_blackwell.trainer.train.run`` can be called repeatedly."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"
        if "MASTER_ADDR" in os.environ and "RANK" in os.environ:
            dist.init_process_group(backend)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    threads, source = configure_host_threads(device_type)
    return World(dist.get_rank(), local_rank, dist.get_world_size(), local_world, device, threads, source)


def mesh(world: World):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(world.device.type, (world.world_size,))


def apply_fsdp(model, blocks, world: World, param_dtype: torch.dtype | None, reshard_after_forward: bool = True,
               keep_last_block: bool = True):
    """FSDP2: one unit per block and one at the root; fp32 master weights, ``param_dtype``
    compute copies (None = compute in fp32), gradients reduced in fp32. ``keep_last_block``:
    the last block stays gathered from its forward to its backward (it is needed again at
    once); off, every block is resharded after its forward, as TE's FP8-primary-weight
    example shards them (``prepare``)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    m = mesh(world)
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else MixedPrecisionPolicy()
    # Blocks do not cast their inputs: the root already casts the model's input and the
    # residual stream stays in param_dtype, so the only float inputs a cast would touch are the
    # rotary tables, which stay fp32. It also keeps activation checkpointing consistent: before
    # torch 2.13, FSDP2 skipped the cast when a block was recomputed in backward, so the forward
    # saw bf16 tables and the recomputation fp32 ones (CheckpointError on the torch backend).
    block_mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32,
                                    cast_forward_inputs=False) if param_dtype else mp
    n = len(blocks)
    for i, block in enumerate(blocks):
        # The last block's parameters are needed again at once by backward: keep them.
        keep = keep_last_block and i == n - 1
        fully_shard(block, mesh=m, mp_policy=block_mp, reshard_after_forward=reshard_after_forward and not keep)
    fully_shard(model, mesh=m, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    return model


def shards(world: World, single_gpu_fsdp: bool) -> bool:
    """Whether the model is wrapped in FSDP2: always on more than one GPU; on one, unless
    ``single_gpu_fsdp`` (the trainer's ``--single-gpu-fsdp``) is off."""
    return world.world_size > 1 or single_gpu_fsdp


def prepare(model, blocks, world: World, param_dtype: torch.dtype | None, single_gpu_fsdp: bool,
            keep_last_block: bool = True):
    """FSDP2 (``apply_fsdp``) where ``shards`` says so; else the plain module, whose numerics
    ``compute_autocast`` keeps: fp32 weights and gradients, ``param_dtype`` compute."""
    if shards(world, single_gpu_fsdp):
        return apply_fsdp(model, blocks, world, param_dtype, keep_last_block=keep_last_block)
    return model


def compute_autocast(world: World, param_dtype: torch.dtype | None, sharded: bool):
    """The context the forward runs in for the 16-bit compute FSDP2's mixed precision gives a
    sharded model: for an unsharded one, ``torch.autocast`` to ``param_dtype`` over fp32
    weights (TE's modules take their compute dtype from it). Its weight-cast cache is off, as
    ``te.make_graphed_callables`` requires: TE casts its weights itself."""
    if sharded or param_dtype is None or world.device.type != "cuda":
        return contextlib.nullcontext
    return functools.partial(torch.autocast, world.device.type, dtype=param_dtype, cache_enabled=False)


def cast_to_compute(h: torch.Tensor) -> torch.Tensor:
    """An fp32 activation (the embedding's output over fp32 weights) cast to autocast's dtype,
    as FSDP2's bf16 embedding weight gives it: the residual stream then has the sharded
    model's dtype. A no-op outside autocast."""
    kind = h.device.type
    if h.is_floating_point() and torch.is_autocast_enabled(kind):
        return h.to(torch.get_autocast_dtype(kind))
    return h
