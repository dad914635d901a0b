"""Issue 12's bad inputs to the memory estimate and the convergence comparison.

Each exits non-zero (2: a user error) with a message naming the field, before any work.
"""

import subprocess
import sys

import pytest

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.catalog.spec import PRESETS
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.components.memory_estimate.__main__ import with_defaults
from kfp_sagemaker_blackwell.components.memory_estimate.launcher import run_component
from kfp_sagemaker_blackwell.planning import planner


def _estimate(*args):
    return subprocess.run([sys.executable, "-m", "kfp_sagemaker_blackwell.components.memory_estimate", *args],
                          capture_output=True, text=True, timeout=120)


BAD_ESTIMATES = [
    # (arguments, text the error must contain)
    (["--model-preset", "1b", "--gpu", "A100X"], "gpu"),  # was: silently an A100
    (["--model-preset", "1b", "--gpu", "L40"], "gpu"),  # was: silently an L4
    (["--model-preset", "1b", "--gpu", "H20"], "gpu"),
    (["--model-preset", "1b", "--gpu", "NVIDIA L40"], "gpu"),
    (["--model-preset", "1b", "--gpu", "H200", "--precisions", "mxfp8"], "precision"),
    (["--model-preset", "1b", "--gpu", "H200", "--precisions", "nvfp4"], "precision"),
    (["--model-preset", "1b", "--instance-type", "ml.p5.48xlarge", "--precisions", "nvfp4"],
     "precision"),
    (["--model-preset", "1b", "--gpu", "A100", "--precisions", "fp8"], "precision"),
]


@pytest.mark.parametrize(("args", "field"), BAD_ESTIMATES, ids=[" ".join(a) for a, _ in BAD_ESTIMATES])
def test_bad_estimate_inputs_exit_2_naming_the_field(args, field):
    out = _estimate(*args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"error: {field}" in out.stderr, out.stderr
    assert not out.stdout


def test_gpu_names_are_matched_exactly():
    for bad in ("A100X", "L40", "H1000", "B20", "nvidia", "NVIDIA L40", "xH100"):
        with pytest.raises(ValueError, match="unknown GPU"):
            hardware.gpu(bad)
    assert hardware.gpu("l40s").name == "L40S"
    assert hardware.gpu("NVIDIA H100 80GB HBM3").name == "H100"
    assert hardware.gpu("NVIDIA H200").name == "H200"
    assert hardware.gpu("NVIDIA A100-SXM4-40GB").name == "A100-40GB"


def test_an_unsupported_precision_in_a_sweep_is_a_row_not_an_error():
    out = _estimate("--model-preset", "1b", "--gpu", "H200", "--precisions", "bf16,mxfp8")
    assert out.returncode == 0, out.stderr
    assert "mxfp8 | no |" in out.stdout


def test_the_component_refuses_a_single_unsupported_precision():
    with pytest.raises(UserError, match="precision"):
        run_component(**with_defaults({"gpu": "H200", "model_preset": "1b", "precisions": "nvfp4"}))


def test_batch_zero_is_capped_and_the_plan_says_so():
    """Issue 12: the `small` preset at sequence 128 on a B200 chose 65,536."""
    request = planner.Request(model=PRESETS["small"], seq_length=128,
                              hardware=planner.resolve_hardware(instance_type="ml.p6-b200.48xlarge"),
                              precisions=("bf16",), batch_sizes=(0,))
    entry = planner.plan(request).plan.precisions["bf16"]
    assert entry.batch_size * 128 <= planner.MAX_TOKENS_PER_MICRO_BATCH
    assert entry.batch_size == planner.MAX_TOKENS_PER_MICRO_BATCH // 128
    assert "capped at 512" in entry.reason and "tokens per micro-batch" in entry.reason
    assert entry.max_batch_size_without_checkpointing > entry.batch_size  # still reported
    plan = planner.plan(request).plan
    assert plan.training["batch_size_zero_cap"] == 512


def test_batch_zero_cap_by_tokens_per_step_over_many_gpus():
    request = planner.Request(model=PRESETS["small"], seq_length=2048,
                              hardware=planner.resolve_hardware(
                                  instance_type="ml.p6-b200.48xlarge", instance_count=64),
                              precisions=("bf16",), batch_sizes=(0,))
    cap, why = planner.batch_cap(request)
    assert cap == planner.MAX_TOKENS_PER_STEP // (2048 * 512)
    assert "per optimizer step over 512 GPU(s)" in why
    assert planner.plan(request).plan.precisions["bf16"].batch_size == cap


def test_an_explicit_batch_is_not_capped():
    request = planner.Request(model=PRESETS["small"], seq_length=128,
                              hardware=planner.resolve_hardware(gpu="B200"),
                              precisions=("bf16",), batch_sizes=(2048,))
    entry = planner.plan(request).plan.precisions["bf16"]
    assert entry.batch_size == 2048 and "capped" not in entry.reason


# ---- compare_convergence ----

def test_a_series_file_with_one_huge_line_is_refused_in_bounded_memory(tmp_path):
    """Issue 12: one 200 MB line gave `_csv.Error: field larger than field limit` at 1.2 GB
    resident. 64 MB here: the old reader held it several times over."""
    huge = tmp_path / "huge.csv"
    with open(huge, "wb") as f:
        chunk = b"x" * (1 << 20)
        for _ in range(64):
            f.write(chunk)
    code = (
        "import resource, sys\n"
        "from kfp_sagemaker_blackwell.components.compare_convergence.launcher import load\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"series, problems, _ = load([{str(huge)!r}])\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(len(series), (after - before) // 1024, problems[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    count, grew_mib, problem = out.stdout.split(" ", 2)
    assert count == "0" and int(grew_mib) < 16, out.stdout
    assert "longer than 1 MiB" in problem and "huge.csv" in problem
    cli = subprocess.run([sys.executable, "-m", "kfp_sagemaker_blackwell.components.compare_convergence", str(huge)],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and "longer than 1 MiB" in cli.stderr


def test_rank_throughput_names_a_file_that_is_not_a_series(tmp_path):
    from kfp_sagemaker_blackwell.components.rank_throughput.launcher import load

    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"y" * ((1 << 20) + 10))
    with pytest.raises(UserError, match="bad.csv could not be read"):
        load([str(bad)])
