"""Batch-size tuning: candidates ranked by tokens/s per GPU, failures listed, never ranked."""

import json
from html.parser import HTMLParser

import pytest

from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.common.step_series import COLUMN_NAMES, SERIES_SCHEMA
from kfp_sagemaker_blackwell.components.rank_throughput.launcher import (
    html_report,
    load,
    markdown,
    rank,
)


def _series(tmp_path, run, *, batch, ac, tps, mem, status="completed", emulated=False,
            reason=""):
    meta = {
        "run": run, "precision": "fp8", "status": status, "emulated": emulated,
        "failure_reason": reason,
        "training": {"batch_size": batch, "activation_checkpointing": ac},
        "metrics": {"mean_tokens_per_s_per_gpu": tps, "peak_memory_gib": mem},
    }
    path = tmp_path / f"{run}.csv"
    path.write_text(f"# {SERIES_SCHEMA} {json.dumps(meta)}\n" + ",".join(COLUMN_NAMES) + "\n")
    return str(path)


def test_fastest_completed_candidate_wins_and_failures_are_listed_last(tmp_path):
    paths = [
        _series(tmp_path, "b4", batch=4, ac=False, tps=9000.0, mem=60.0),
        _series(tmp_path, "b16", batch=16, ac=True, tps=12000.0, mem=70.0),
        _series(tmp_path, "b32", batch=32, ac=False, tps=None, mem=None, status="oom",
                reason="CUDA out of memory. Tried to allocate 8.00 GiB"),
        _series(tmp_path, "b8", batch=8, ac=False, tps=11000.0, mem=90.0),
    ]
    r = rank(load(paths))
    assert r.best is not None and r.best.run == "b16" and r.best.activation_checkpointing
    assert [c.run for c in r.candidates] == ["b16", "b8", "b4", "b32"]
    text = markdown(r)
    assert "**Best: batch 16, checkpointing on**" in text
    assert "| - | b32 | fp8 | batch 32, checkpointing off | oom: CUDA out of memory" in text


def test_no_completed_candidate_recommends_nothing(tmp_path):
    r = rank(load([_series(tmp_path, "b8", batch=8, ac=False, tps=None, mem=None,
                           status="failed", reason="boom")]))
    assert r.best is None
    assert "No candidate completed" in markdown(r)


def test_emulated_runs_are_labelled(tmp_path):
    r = rank(load([_series(tmp_path, "b2", batch=2, ac=False, tps=500.0, mem=None,
                           emulated=True)]))
    assert "EMULATED" in markdown(r) and "(emulated)" in markdown(r)


def test_empty_input_is_a_user_error():
    with pytest.raises(UserError, match="series"):
        load([])


def test_html_report_embeds_a_png_per_chart_and_no_empty_memory_chart(tmp_path):
    r = rank(load([_series(tmp_path, "b2", batch=2, ac=False, tps=500.0, mem=3.0),
                   _series(tmp_path, "b4", batch=4, ac=False, tps=900.0, mem=5.0)]))
    srcs: list[str] = []

    class Imgs(HTMLParser):
        def handle_starttag(self, tag, attrs):
            if tag == "img":
                srcs.append(dict(attrs)["src"])

    Imgs().feed(html_report(r))
    assert len(srcs) == 2 and all(s.startswith("data:image/png;base64,") for s in srcs)
    import base64

    png = base64.b64decode(srcs[0].split(",", 1)[1])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000
    # no run measured memory (CPU): the throughput chart only, and a sentence saying so
    srcs.clear()
    cpu = rank(load([_series(tmp_path, "c2", batch=2, ac=False, tps=500.0, mem=None,
                             emulated=True)]))
    page = html_report(cpu)
    Imgs().feed(page)
    assert len(srcs) == 1 and "No memory chart: no run measured GPU memory" in page


def test_the_models_prediction_stands_beside_each_measured_run(tmp_path):
    from kfp_sagemaker_blackwell.catalog.spec import PRESETS
    from kfp_sagemaker_blackwell.planning import throughput
    from kfp_sagemaker_blackwell.planning.training_setup import TrainingSetup

    def gpu_run(run, batch, tps):
        meta = {"run": run, "precision": "fp8", "status": "completed", "emulated": False,
                "gpu": "NVIDIA H200", "world_size": 1,
                "training": {"batch_size": batch, "activation_checkpointing": False,
                             "seq_length": 4096, "model": PRESETS["1b"].to_dict()},
                "metrics": {"mean_tokens_per_s_per_gpu": tps, "peak_memory_gib": 50.0}}
        path = tmp_path / f"{run}.csv"
        path.write_text(f"# {SERIES_SCHEMA} {json.dumps(meta)}\n" + ",".join(COLUMN_NAMES) + "\n")
        return str(path)

    r = rank(load([gpu_run("b4", 4, 60000.0), gpu_run("b1", 1, 30000.0)]))
    expect = throughput.predict(TrainingSetup(PRESETS["1b"], 4, 4096, "fp8", False),
                                "H200").tokens_per_s_per_gpu
    assert r.best.predicted_tokens_per_s_per_gpu == pytest.approx(expect)
    assert r.best.measured_over_predicted == pytest.approx(60000.0 / expect)
    text = markdown(r)
    assert "tokens/s/GPU (predicted on the run's GPU)" in text and "measured / predicted" in text
    assert f"{expect:,.0f}" in text
    # CPU (emulated) runs get no prediction: n/a, not a number for another machine
    cpu = rank(load([_series(tmp_path, "cpu", batch=2, ac=False, tps=10.0, mem=0.0,
                             emulated=True)]))
    assert cpu.best.predicted_tokens_per_s_per_gpu is None
    assert "predicted" not in markdown(cpu) and "n/a" not in markdown(cpu)  # no empty column


def test_the_plans_prediction_fills_the_predicted_column(tmp_path):
    """Issue 29.6: emulated runs have no prediction of their own; the plan's stands beside."""
    paths = [_series(tmp_path, "b2", batch=2, ac=False, tps=500.0, mem=None, emulated=True),
             _series(tmp_path, "b4", batch=4, ac=True, tps=800.0, mem=None, emulated=True)]
    plan = [{"precision": "fp8", "batch_size": 4, "activation_checkpointing": True,
             "predicted_tokens_per_s_per_gpu": 23456.7},
            {"precision": "fp8", "batch_size": 2, "activation_checkpointing": False,
             "predicted_tokens_per_s_per_gpu": 12345.6},
            {"precision": "fp8", "batch_size": 4, "activation_checkpointing": False,
             "predicted_tokens_per_s_per_gpu": 99999.0}]
    r = rank(load(paths, plan))
    assert [c.planned_tokens_per_s_per_gpu for c in r.candidates] == [23456.7, 12345.6]
    context = {"instance_type": "ml.p6-b200.48xlarge", "pipeline": "batch-tuning"}
    text = markdown(r, context)
    assert "tokens/s/GPU (predicted for ml.p6-b200.48xlarge by the plan)" in text
    assert "| 23,457 |" in text and "| 12,346 |" in text and "n/a" not in text
    assert "measured / predicted" not in text  # a CPU rate over a B200 prediction means nothing
    assert "rank this machine, not the target GPU" in text and "- pipeline: batch-tuning" in text
    page = html_report(r, context)
    assert "predicted for ml.p6-b200.48xlarge by the plan" in page
    assert "ranks this machine, not the target GPU" in page


def test_chart_labels_name_each_candidate_and_do_not_overlap(tmp_path, monkeypatch):
    from kfp_sagemaker_blackwell.components.rank_throughput import launcher as module

    paths = [_series(tmp_path, f"b{b}-{ac}", batch=b, ac=ac, tps=100.0 * b, mem=b + 1.0)
             for b in (1, 2, 4, 8) for ac in (False, True)]
    r = rank(load(paths))
    drawn = []
    import matplotlib.pyplot as plt

    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig: drawn.append(fig))
    html_report(r)
    assert len(drawn) == 2  # throughput and memory
    for fig in drawn:
        fig.canvas.draw()
        (ax,) = fig.axes
        labels = [t for t in ax.get_xticklabels() if t.get_text()]
        assert sorted(t.get_text() for t in labels) == sorted(
            module.candidate_label(c) for c in r.candidates)
        boxes = [t.get_window_extent() for t in labels]
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert not a.overlaps(b), "x tick labels overlap"
        real_close(fig)


# ---- issue 28.10: the series contract, checked on read ------------------------------------

def _hostile(tmp_path, name, meta_changes, rows=""):
    path = tmp_path / f"{name}.csv"
    good = _series(tmp_path, name, batch=8, ac=False, tps=1000.0, mem=10.0)
    first, _, _ = open(good).read().partition("\n")
    meta = json.loads(first.split(" ", 2)[2])
    meta.update(meta_changes)
    path.write_text(f"# {SERIES_SCHEMA} {json.dumps(meta)}\n" + ",".join(COLUMN_NAMES) + "\n"
                    + rows)
    return str(path)


@pytest.mark.parametrize("changes, match", [
    ({"emulated": "no"}, "'emulated' is \"no\""),
    ({"precision": "fp4"}, "'precision' is \"fp4\""),
    ({"precision": 8}, "'precision' is 8"),
    ({"metrics": [1, 2]}, "'metrics' is [1, 2]"),
    ({"metrics": {"mean_tokens_per_s_per_gpu": "fast"}}, "'metrics' is"),
    ({"training": "batch 8"}, "'training' is \"batch 8\""),
    ({"training": {"batch_size": 8.5, "activation_checkpointing": "yes"}}, "'training' is"),
    ({"status": "completed", "failed": True}, "status 'completed' but failed true"),
])
def test_a_series_that_breaks_the_contract_is_a_user_error_naming_it(tmp_path, changes, match):
    path = _hostile(tmp_path, "bad", changes)
    good = _series(tmp_path, "good", batch=4, ac=False, tps=900.0, mem=5.0)
    with pytest.raises(UserError) as err:
        load([good, path])
    text = str(err.value)
    assert "bad.csv could not be read" in text and match in text and "Fix:" in text, text


def test_rows_that_contradict_the_metadata_are_a_user_error_naming_the_row(tmp_path):
    row = ("1,4096.0,2.0,0.001,1.0,100.0,100.0,1.0,0.1,1.0,2.0,bf16,0,,nan,bad\n")
    path = _hostile(tmp_path, "bad", {"tokens_per_step": 4096.0}, rows=row)
    with pytest.raises(UserError, match=r"step 1 says precision 'bf16' but the metadata says "
                                        r"'fp8'.*bad.csv:3"):
        load([path])


def test_batch_tuning_progress_lines_name_each_candidate(monkeypatch):
    """Issue 29.6: eight candidates read as eight settings, not eight times ``[fp8]``."""
    from kfp_sagemaker_blackwell.catalog import logformat as lf
    from kfp_sagemaker_blackwell.pipelines import batch_tuning
    from kfp_sagemaker_blackwell.pipelines._progress import Progress

    keys = ()
    import kfp_sagemaker_blackwell.pipelines._cli as cli

    def capture(argv, **kwargs):
        nonlocal keys
        keys = kwargs["progress_label_keys"]
        return 0

    monkeypatch.setattr(cli, "main", capture)
    batch_tuning.main([])
    out: list[str] = []
    progress = Progress(out.append, tty=False, label_keys=keys)
    for batch, ac in ((4, False), (4, True)):
        progress.feed(f"    created training job fp8-sagemaker-training-b{batch}{ac}")
        progress.feed("    [algo-1-1] " + lf.format_json("config", {
            "max_steps": 2, "batch_size": batch, "activation_checkpointing": ac,
            "precision": "fp8"}))
        progress.feed("    [algo-1-1] " + lf.format_step(lf.StepRecord(
            1, 2.0, 1e-3, 1.0, 100.0, 100.0, 0.1, float("nan"), float("nan"), float("nan"),
            "fp8", True)))
    assert [o.split("]")[0] + "]" for o in out] == ["[fp8 batch 4 AC off]", "[fp8 batch 4 AC on]"]


def test_a_count_passed_through_the_pipeline_json_reads_as_a_count(tmp_path):
    r = rank(load([_series(tmp_path, "b2", batch=2, ac=False, tps=5.0, mem=None)]))
    text = markdown(r, {"instance_type": "ml.p6-b200.48xlarge", "instance_count": 1.0})
    assert "- instances: 1 x ml.p6-b200.48xlarge" in text


def test_a_probe_corrected_prediction_stands_beside_the_measured_with_its_label(tmp_path):
    """Batch tuning with a probe: prerank_candidates' trials carry the corrected figure."""
    paths = [_series(tmp_path, "b4", batch=4, ac=True, tps=800.0, mem=None, emulated=True)]
    trials = [{"precision": "fp8", "batch_size": 4, "activation_checkpointing": True,
               "predicted_tokens_per_s_per_gpu": 23456.7,
               "corrected_tokens_per_s_per_gpu": 21111.0, "throughput_kind": "probe-corrected"}]
    r = rank(load(paths, trials))
    assert r.best.corrected_tokens_per_s_per_gpu == 21111.0
    context = {"instance_type": "ml.p6-b200.48xlarge"}
    text = markdown(r, context)
    assert "tokens/s/GPU (predicted for ml.p6-b200.48xlarge, probe-corrected)" in text
    assert "| 23,457 | 21,111 |" in text and "Probe-corrected: the plan's prediction x" in text
    assert "probe-corrected" in html_report(r, context)
    # without a probe's correction: no such column
    plain = markdown(rank(load(paths, [dict(trials[0], corrected_tokens_per_s_per_gpu=None)])))
    assert "probe-corrected" not in plain
