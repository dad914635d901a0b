"""A GPU process runs its host work on one intra-op thread, as torchrun gives every process of a
multi-GPU job, unless OMP_NUM_THREADS says otherwise: with PyTorch's pool of one thread per core,
the lent GPU hosts' synthetic batches took 4-20 ms a step and the GPU waited (session v9)."""

from __future__ import annotations

import pytest
import torch

from kfp_sagemaker_blackwell.trainer import parallel


@pytest.fixture
def pool():
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield
    torch.set_num_threads(before)


def test_a_gpu_process_without_omp_num_threads_gets_one_host_thread(pool):
    assert parallel.configure_host_threads("cuda", {}) == (
        1, "trainer: one per GPU process, as torchrun gives a multi-GPU job")
    assert torch.get_num_threads() == 1


def test_the_jobs_omp_num_threads_wins_and_is_named(pool):
    assert parallel.configure_host_threads("cuda", {"OMP_NUM_THREADS": "3"}) == (3, "OMP_NUM_THREADS")
    assert torch.get_num_threads() == 3


def test_cpu_training_keeps_pytorchs_pool(pool):
    assert parallel.configure_host_threads("cpu", {}) == (3, "PyTorch default (CPU training)")
    assert torch.get_num_threads() == 3
