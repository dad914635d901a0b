"""parse_logs' robust figures (issue 26): the median step's tokens/s beside the mean, MFU against
the bf16 peak beside the precision's own, and rank_throughput ranking by the median."""

import json

import pytest

from kfp_sagemaker_blackwell.catalog import logformat as lf
from kfp_sagemaker_blackwell.common.step_series import COLUMN_NAMES, SERIES_SCHEMA, read_series
from kfp_sagemaker_blackwell.components.parse_logs.analysis import analyse
from kfp_sagemaker_blackwell.components.parse_logs.parser import parse_bytes
from kfp_sagemaker_blackwell.components.parse_logs.report import markdown, write_outputs
from kfp_sagemaker_blackwell.components.rank_throughput.launcher import load, rank


def _log(tps_per_step, summary=None, gpu="NVIDIA H200"):
    lines = [lf.format_json("world", {"world_size": 1, "gpu": gpu})]
    for i, tps in enumerate(tps_per_step, start=1):
        rec = lf.StepRecord(i, 3.0 - 0.01 * i, 1e-3, 1.0, tps, tps, tps * 1e-5, tps * 1e-5 / 1979,
                            10.0, 12.0, "fp8", False)
        lines.append(lf.format_step(rec, lf.StepTiming(1.0, 1.0, 1.0, tps * 1e-5 / 989, 0.0)))
    if summary is not None:
        lines.append(lf.format_json("summary", {"status": "completed", **summary}))
    return ("\n".join(lines) + "\n").encode()


def test_one_slow_step_moves_the_mean_but_not_the_median():
    steady = [60000.0 + 100 * (i % 3) for i in range(12)]
    stalled = steady[:5] + [29000.0] + steady[6:]  # the step 6: 29k against 63k
    m = analyse(parse_bytes(_log(stalled)))["metrics"]
    calm = analyse(parse_bytes(_log(steady)))["metrics"]
    assert abs(m["median_tokens_per_s_per_gpu"] / calm["median_tokens_per_s_per_gpu"] - 1) < 0.01
    assert m["mean_tokens_per_s_per_gpu"] / calm["mean_tokens_per_s_per_gpu"] < 0.97


def test_the_trainer_summary_figure_wins_and_mfu_is_labelled_against_both_peaks():
    summary = {"tokens_per_s_per_gpu_median": 61234.0, "tokens_per_s_median": 61234.0,
               "mfu_bf16_peak_median": 0.6412, "mfu": 0.3205}
    report = analyse(parse_bytes(_log([60000.0] * 6, summary)))
    m = report["metrics"]
    assert m["median_tokens_per_s_per_gpu"] == 61234.0 and m["mfu_bf16_peak"] == 0.6412
    text = markdown(report)
    assert "MFU (against the GPU's dense bf16 peak, for every precision) | 64.1%" in text
    assert "MFU (against the precision's own dense peak)" in text


def test_an_older_log_gets_its_bf16_mfu_from_tflops_and_the_gpu():
    report = analyse(parse_bytes(_log([60000.0] * 6)))
    assert abs(report["metrics"]["mfu_bf16_peak"] - 0.6 / 989) < 1e-9


def _series(tmp_path, run, metrics):
    meta = {"run": run, "precision": "fp8", "status": "completed", "emulated": False,
            "training": {"batch_size": 4, "activation_checkpointing": False}, "metrics": metrics}
    path = tmp_path / f"{run}.csv"
    path.write_text(f"# {SERIES_SCHEMA} {json.dumps(meta)}\n" + ",".join(COLUMN_NAMES) + "\n")
    return str(path)


def test_rank_throughput_ranks_by_the_median_when_the_series_has_it(tmp_path):
    # b8's mean is pulled down by one stalled step; its median is the faster one.
    paths = [_series(tmp_path, "b8", {"mean_tokens_per_s_per_gpu": 55000.0,
                                      "median_tokens_per_s_per_gpu": 63000.0}),
             _series(tmp_path, "b4", {"mean_tokens_per_s_per_gpu": 60000.0,
                                      "median_tokens_per_s_per_gpu": 60100.0}),
             _series(tmp_path, "old", {"mean_tokens_per_s_per_gpu": 61000.0})]
    r = rank(load(paths))
    assert [c.run for c in r.candidates] == ["b8", "old", "b4"]
    assert r.best is not None and r.best.tokens_per_s_per_gpu == 63000.0


# Issue 44: a trainer record whose fields have the wrong types (hand-edited, another trainer's,
# damaged) is set aside with a warning naming it, instead of making parse_logs write series
# metadata its own readers refuse (it used to refuse `training.batch_size: [1]` itself).
WRONG_TYPES = [
    ("config", "batch_size", [1]),
    ("config", "seq_length", "32"),
    ("config", "grad_accum_steps", 0),
    ("config", "activation_checkpointing", "yes"),
    ("config", "model", "8b"),
    ("config", "seed", "s"),
    ("world", "world_size", "one"),
    ("world", "gpu", 5),
    ("summary", "precision", 7),
    ("summary", "gpu", ["H200"]),
    ("summary", "status", "weird"),
    ("data", "entropy_floor", "low"),
]


@pytest.mark.parametrize(("kind", "key", "value"), WRONG_TYPES,
                         ids=[f"{k}.{f}" for k, f, _ in WRONG_TYPES])
def test_a_record_of_the_wrong_types_is_set_aside_with_a_warning(tmp_path, kind, key, value):
    good = {"config": {"batch_size": 2, "seq_length": 32, "seed": 1, "model": {"vocab_size": 256}},
            "world": {"world_size": 1, "gpu": "NVIDIA H200"},
            "data": {"entropy_floor": 1.2},
            "summary": {"status": "completed", "precision": "fp8", "gpu": "NVIDIA H200"}}
    good[kind] = {**good[kind], key: value}
    log = (lf.format_json("config", good["config"]) + "\n" + lf.format_json("data", good["data"])
           + "\n").encode() + _log([60000.0] * 4, good["summary"]).replace(
        lf.format_json("world", {"world_size": 1, "gpu": "NVIDIA H200"}).encode(),
        lf.format_json("world", good["world"]).encode())
    series = tmp_path / "run.csv"
    out = write_outputs(parse_bytes(log), requested_precision="fp8", run="r",
                        series_path=str(series))
    warning = [w for w in out.report["warnings"] if f"trainer's {kind} record" in w]
    assert warning and f"its {key} is " in warning[0] and "set aside" in warning[0], \
        out.report["warnings"]
    assert read_series(series).meta["run"] == "r"  # the series it wrote reads back
