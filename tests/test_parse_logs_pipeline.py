"""parse_logs and compare_convergence as KFP components, run by kfp.local: parse_logs per
precision in a ParallelFor reading CloudWatch on the local backend, the series collected
with dsl.Collected into compare_convergence (Input[list[Dataset]])."""

import json
import math
import random
import time
from pathlib import Path

import pytest

from kfp_sagemaker_blackwell.catalog import logformat as lf
from kfp_sagemaker_blackwell.catalog.spec import PRESETS
from kfp_sagemaker_blackwell.common.cloudwatch import TRAINING_JOBS_LOG_GROUP
from kfp_sagemaker_blackwell.local_backend import LocalBackend

pytestmark = pytest.mark.slow


def _log(precision: str, offset: float, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    # The run's configuration (an 8B-shaped model at sequence 8192) is what the throughput
    # model predicts the emulated runs' speed-up on the target GPU from.
    lines = [lf.format_json("config", {"seed": seed, "batch_size": 1, "seq_length": 8192,
                                       "grad_accum_steps": 1, "model": PRESETS["8b"].to_dict()}),
             lf.format_recipe(lf.RecipeRecord(precision, "x", "torch", True)),
             lf.format_json("world", {"world_size": 1}),
             lf.format_json("data", {"entropy_floor": 1.2})]
    for s in range(1, 101):
        loss = 1.5 + 3 * math.exp(-s / 20) + rng.gauss(0, 0.01) + offset
        lines.append(lf.format_step(lf.StepRecord(s, loss, 1e-3, 1.0, 900.0, 900.0, 0.1,
                                                  math.nan, math.nan, math.nan, precision, True)))
        if s % 30 == 0:
            lines.append("[W1129] some torch warning about nothing")
    lines.append(lf.format_json("summary", {"status": "completed", "steps": 100}))
    return lines


@pytest.fixture
def cloudwatch_jobs(monkeypatch):
    with LocalBackend() as backend:
        for key, value in backend.env().items():
            monkeypatch.setenv(key, value)
        logs = backend.client("logs")
        logs.create_log_group(logGroupName=TRAINING_JOBS_LOG_GROUP)
        now = int(time.time() * 1000)
        jobs = {}
        for precision, offset in (("bf16", 0.0), ("fp8", 0.002), ("nvfp4", 0.2)):
            job = f"sweep-{precision}-0001"
            stream = f"{job}/algo-1-1764400000"
            logs.create_log_stream(logGroupName=TRAINING_JOBS_LOG_GROUP, logStreamName=stream)
            logs.put_log_events(logGroupName=TRAINING_JOBS_LOG_GROUP, logStreamName=stream,
                                logEvents=[{"timestamp": now + i, "message": m}
                                           for i, m in enumerate(_log(precision, offset))])
            jobs[precision] = job
        yield jobs


def test_sweep_parses_cloudwatch_per_precision_and_compares_the_collected_series(
        cloudwatch_jobs, tmp_path):
    from kfp import dsl, local

    from kfp_sagemaker_blackwell.components.compare_convergence import compare_convergence
    from kfp_sagemaker_blackwell.components.parse_logs import parse_logs

    items = [{"job": job, "precision": p} for p, job in cloudwatch_jobs.items()]

    @dsl.pipeline
    def sweep(runs: list = items) -> str:  # noqa: B006 (KFP default)
        with dsl.ParallelFor(runs, parallelism=1) as run:
            parsed = parse_logs(job_name=run.job, requested_precision=run.precision)
        cmp = compare_convergence(series=dsl.Collected(parsed.outputs["series"]),
                                  baseline="bf16")
        return cmp.outputs["recommended_precision"]

    root = tmp_path / "root"
    local.init(local.SubprocessRunner(use_venv=False), pipeline_root=str(root),
               raise_on_error=True)
    task = sweep()
    assert task.output == "fp8"
    run_dir = next(root.iterdir())
    html = (run_dir / "compare-convergence" / "report").read_text()
    # loss curves, difference, speed-up; no memory figure: nothing measured GPU memory
    assert html.count("data:image/png;base64,") == 3 and "No memory figure" in html
    assert "All runs used emulated numerics" in html and "(emulated)" not in html
    assert "<td>nvfp4</td><td class='fail'>FAIL</td>" in html
    summaries = sorted(Path(run_dir).glob("for-loop-*/parse-logs/summary"))
    assert len(summaries) == 3 and "confirmed by the log" in summaries[0].read_text()
    series = sorted(Path(run_dir).glob("for-loop-*/parse-logs/series"))
    assert all(s.read_text().startswith("# kfp-sagemaker/step-series/v1") for s in series)
    executor_output = json.loads((run_dir / "compare-convergence" /
                                  "executor_output.json").read_text())
    assert executor_output["parameterValues"]["passed"] is True
