"""Real trainer logs (python -m kfp_sagemaker_blackwell.trainer on the CPU) round-trip through the parser, including a
stop-and-resume that looks like a spot restart (a second log stream)."""

import subprocess
import sys

import pytest

from kfp_sagemaker_blackwell.common.step_series import read_series
from kfp_sagemaker_blackwell.components.parse_logs.analysis import analyse
from kfp_sagemaker_blackwell.components.parse_logs.parser import LogParser
from kfp_sagemaker_blackwell.components.parse_logs.report import write_outputs

pytestmark = pytest.mark.slow


def _train(tmp_path, *extra):
    cmd = [sys.executable, "-m", "trainer", "--model-preset", "tiny", "--precision", "fp8",
           "--log-every", "1", "--seed", "11", "--checkpoint-dir", str(tmp_path / "ckpt"),
           "--checkpoint-every", "3", "--no-save-model", *extra]
    out = subprocess.run(cmd, capture_output=True, timeout=300)
    assert out.returncode == 0, out.stdout.decode()[-2000:] + out.stderr.decode()[-2000:]
    return out.stdout + out.stderr


@pytest.fixture(scope="module")
def trainer_logs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trainer")
    first = _train(tmp, "--max-steps", "4")
    second = _train(tmp, "--max-steps", "6", "--resume")
    return first, second


def test_trainer_output_round_trips_through_the_parser(trainer_logs, tmp_path):
    first, _ = trainer_logs
    parser = LogParser()
    parser.feed(first, "job/algo-1-1764400000")
    parsed = parser.result()
    assert parsed.series["step"] == [1, 2, 3, 4]
    assert parsed.stats["unparsed_trainer_records"] == 0
    report = analyse(parsed, requested_precision="fp8", run="job")
    assert report["status"] == "completed" and not report["failed"]
    assert report["precision"] == "fp8" and report["precision_confirmed"]
    assert report["recipe"] == "DelayedScaling" and report["emulated"] is True
    assert report["seed"] == 11 and report["entropy_floor"] > 0
    assert report["metrics"]["final_loss"] == pytest.approx(parsed.summary["final_loss"],
                                                            rel=1e-5)
    assert report["counts"]["checkpoint_saved"] >= 1
    assert not [w for w in report["warnings"] if "mismatch" in w or "unparsed" in w]
    path = tmp_path / "series.csv"
    write_outputs(parsed, requested_precision="fp8", run="job", series_path=path)
    s = read_series(path)
    assert s.columns["step"] == [1, 2, 3, 4] and s.meta["emulated"] is True
    assert s.columns["tokens"][0] > 0  # tokens per step from the summary
    # the run's settings travel with its numbers (batch tuning ranks candidates by them)
    assert s.meta["training"]["batch_size"] == parsed.records["config"]["batch_size"]
    assert s.meta["training"]["activation_checkpointing"] is False


def test_a_resumed_run_in_a_new_stream_reads_as_a_restart(trainer_logs):
    first, second = trainer_logs
    parser = LogParser()
    parser.feed(first, "job/algo-1-1764400000")
    parser.feed(second, "job/algo-1-1764403600")
    parsed = parser.result()
    assert parsed.series["step"] == [1, 2, 3, 4, 5, 6]
    assert parsed.event_counts["checkpoint_resumed"] == 1
    assert parsed.event_counts["restart"] >= 1
    assert parsed.summary["status"] == "completed"
