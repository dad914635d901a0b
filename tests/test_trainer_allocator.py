"""The trainer turns on expandable segments unless the job's environment chose an allocator
configuration (issue 41): near the memory limit the default allocator fails by fragmentation."""

from __future__ import annotations

import pytest

from kfp_sagemaker_blackwell.trainer import allocator


def test_the_trainer_sets_expandable_segments_when_the_environment_has_none():
    env: dict[str, str] = {}
    got = allocator.configure(env)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert got.expandable_segments and got.source == "trainer default"
    assert got.to_dict() == {"cuda_alloc_conf": "expandable_segments:True",
                             "cuda_alloc_conf_source": "trainer default", "expandable_segments": True}


@pytest.mark.parametrize("conf, on", [
    ("", False),
    ("expandable_segments:False", False),
    ("max_split_size_mb:512", False),
    ("max_split_size_mb:512,expandable_segments:True", True),
    ("expandable_segments:True,expandable_segments:False", False),  # the last one wins, as in c10
])
def test_the_users_own_configuration_wins_and_is_named_as_theirs(conf, on):
    env = {"PYTORCH_CUDA_ALLOC_CONF": conf}
    got = allocator.configure(env)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == conf  # untouched
    assert got.conf == conf and got.source == "user (PYTORCH_CUDA_ALLOC_CONF)"
    assert got.expandable_segments is on
