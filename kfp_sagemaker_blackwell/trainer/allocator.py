"""The CUDA caching allocator's settings: expandable segments unless the user chose otherwise.

Near the memory limit, PyTorch's default allocator fails by fragmentation, not by size
(issue 41, one H200, torch backend, 8b shape at 8 layers, sequence 4096, checkpointing on:
batch 39 and 40 ran out of memory with 84-85 GiB allocated and 119-137 GiB reserved, 41
completed). With ``expandable_segments:True`` the same batches and 44 completed. torchtitan
and other large-model trainers turn expandable segments on for this reason, and the memory
estimate (planning/estimator.py) models the reserve of the allocator in use.

The user's own ``PYTORCH_CUDA_ALLOC_CONF`` (the job's environment) always wins; the summary
line names what was in effect and where it came from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV = "PYTORCH_CUDA_ALLOC_CONF"
DEFAULT = "expandable_segments:True"


@dataclass(frozen=True)
class Settings:
    conf: str  # the PYTORCH_CUDA_ALLOC_CONF in effect ("" = PyTorch's defaults)
    source: str  # "trainer default" or "user (PYTORCH_CUDA_ALLOC_CONF)"

    @property
    def expandable_segments(self) -> bool:
        return expandable(self.conf)

    def to_dict(self) -> dict[str, object]:
        return {"cuda_alloc_conf": self.conf, "cuda_alloc_conf_source": self.source,
                "expandable_segments": self.expandable_segments}


def expandable(conf: str) -> bool:
    """Whether a PYTORCH_CUDA_ALLOC_CONF string turns expandable segments on (the last setting
    wins, as in c10's parser; keys and values are case-sensitive there, ``True`` only)."""
    on = False
    for item in conf.split(","):
        key, _, value = item.partition(":")
        if key.strip() == "expandable_segments":
            on = value.strip() == "True"
    return on


def configure(environ: os._Environ[str] | dict[str, str] | None = None) -> Settings:
    """Sets the trainer's default allocator configuration unless the environment has one.

    Must run before the first CUDA allocation: the allocator reads ``PYTORCH_CUDA_ALLOC_CONF``
    once, at its first use. A process that already allocated (several runs in one process, as
    the benchmarks do) gets the setting through ``torch.cuda.memory._set_allocator_settings``,
    which applies it to segments allocated from then on."""
    global _set_here
    env = os.environ if environ is None else environ
    if ENV in env and not (environ is None and _set_here and env[ENV] == DEFAULT):
        return Settings(env[ENV], f"user ({ENV})")
    env[ENV] = DEFAULT
    if environ is None:  # this process's own environment: an earlier run's setting is ours
        _set_here = True
        _apply_if_initialised(DEFAULT)
    return Settings(DEFAULT, "trainer default")


_set_here = False  # this module set os.environ[ENV] (a second run in the process is not a user's choice)


def _apply_if_initialised(conf: str) -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.memory._set_allocator_settings(conf)
