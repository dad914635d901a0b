"""The memory estimate's ``probe``: a short measured run corrects the full run's prediction."""

import json

import pytest

from kfp_sagemaker_blackwell.common.errors import USER_ERROR_EXIT_CODE, UserError
from kfp_sagemaker_blackwell.components.memory_estimate import __main__ as cli
from kfp_sagemaker_blackwell.components.memory_estimate.launcher import run_component
from kfp_sagemaker_blackwell.planning import estimator

GiB = 2**30
# (the plan's and metrics' tokens/s are rounded to 0.1: compared to 1e-5)
REL = 1e-5
# 8B on 8 H200s, fp8, micro-batch 2, no checkpointing (fits: the estimate's configuration)
CONFIG = {"instance_type": "", "gpu": "H200", "world_size": 8, "model_preset": "8b",
          "seq_length": 2048, "batch_size": 2, "precisions": ["fp8"],
          "activation_checkpointing": "off"}


def _run(**given):
    return run_component(**cli.with_defaults({**CONFIG, **given}))


def _probe(**changes):
    return {"precision": "fp8", "batch_size": 2, "activation_checkpointing": False,
            "tokens_per_s_per_gpu": 1000.0, "gpu": "H200", "world_size": 1,
            "source": "probe-job-7", **changes}


@pytest.fixture(scope="module")
def predicted():
    """The throughput model and memory estimate for the full run and at one GPU."""
    full, one = _run().metrics, _run(world_size=1).metrics
    return {"full": full["fp8_predicted_tokens_per_s_per_gpu"],
            "one": one["fp8_predicted_tokens_per_s_per_gpu"],
            "peak_one_gib": one["fp8_peak_gib"]}


def test_a_probe_scales_the_full_runs_prediction_by_measured_over_predicted_at_its_size(
        predicted):
    # the probe on 1 GPU measured 0.8x what the model predicts on 1 GPU: the 8-GPU
    # prediction is scaled by 0.8, not replaced by the 1-GPU measurement
    probe = _probe(tokens_per_s_per_gpu=0.8 * predicted["one"], peak_memory_bytes=40 * GiB)
    out = _run(probe=json.dumps(probe))
    m = out.metrics
    assert m["fp8_predicted_tokens_per_s_per_gpu"] == predicted["full"]  # the plan keeps it
    assert m["fp8_probed_tokens_per_s_per_gpu"] == pytest.approx(0.8 * predicted["one"])
    assert m["fp8_probe_factor"] == pytest.approx(0.8, rel=REL)
    assert m["fp8_corrected_tokens_per_s_per_gpu"] == pytest.approx(0.8 * predicted["full"], rel=REL)
    # like for like: the probe's peak is the allocator's (peak reserved, no CUDA context)
    assert m["fp8_probed_peak_reserved_gib"] == 40.0
    context_gib = (estimator.CUDA_CONTEXT_BYTES + estimator.NCCL_BUFFER_BYTES[1]) / GiB
    assert m["fp8_predicted_peak_reserved_gib_at_probe"] == pytest.approx(
        predicted["peak_one_gib"] - context_gib, abs=0.01)
    md = out.markdown
    assert "#### Probe, then extrapolate (fp8, batch 2, checkpointing off)" in md
    assert f"| predicted, full run (8 GPUs) | {predicted['full']:,.0f} |" in md
    assert f"| probed: probe-job-7 (1 x H200) | {0.8 * predicted['one']:,.0f} | 40.0 GiB reserved |" in md
    assert f"| corrected by the probe, full run (8 GPUs) | {0.8 * predicted['full']:,.0f} |" in md
    assert "probed: probe-job-7 on 1 H200 GPU(s), x0.800" in md


def test_a_probe_that_cannot_fit_where_it_ran_is_reported_as_contradicting_the_memory_model():
    # 14B fp8 batch 2 fits on 8 H200s, not on the probe's one (fp32 master weights and
    # AdamW states alone are 16 bytes per parameter, 224 GB): a record that says it ran there is
    # evidence against the model, reported, not refused. (8B, 128 GB of states, fits on one
    # H200 under expandable segments, the trainer's allocator: issue 41.)
    one = _run(model_preset="14b", world_size=1).metrics
    predicted = {"peak_one_gib": one["fp8_peak_gib"]}
    out = _run(model_preset="14b", probe=json.dumps(_probe(
        tokens_per_s_per_gpu=0.9 * one["fp8_predicted_tokens_per_s_per_gpu"],
        peak_memory_bytes=40 * GiB)))
    warning = next(line for line in out.markdown.splitlines() if line.startswith("**Warning:**"))
    assert warning.startswith(
        "**Warning:** probe: fp8 batch 2, checkpointing off, sequence 2048 on 1 x H200 is "
        f"predicted by the memory estimate at {predicted['peak_one_gib']:.1f} GiB per GPU, "
        "more than the H200's 140.4 GiB, yet this record says it ran there")
    assert predicted["peak_one_gib"] > 140.4
    assert "peak 40.0 GiB measured): the probe contradicts the memory model" in warning
    # on one H200 no batch fits in either mode: the fix is more GPUs, the fewest that fit
    assert warning.endswith("fits on 1 x H200: world_size 2 (the same configuration on 2 GPUs).")
    assert out.metrics["fp8_probe_fits_predicted"] == 0.0
    assert out.metrics["fp8_probe_factor"] == pytest.approx(0.9, rel=REL)  # still corrects


def test_a_probe_that_fits_where_it_ran_has_no_warning():
    out = _run(probe=json.dumps(_probe(world_size=8)))
    assert "**Warning:**" not in out.markdown
    assert out.metrics["fp8_probe_fits_predicted"] == 1.0


def test_the_warning_names_the_smaller_batch_and_checkpointing_that_fit_on_the_probes_gpus():
    # 3B bf16 batch 18 without checkpointing: 145.0 GiB on one H200, fits on 8
    config = {"model_preset": "3b", "batch_size": 18, "precisions": ["bf16"]}
    out = _run(**config, probe=json.dumps(_probe(precision="bf16", batch_size=18)))
    assert out.metrics["bf16_probe_fits_predicted"] == 0.0
    # (the probe's fit is against the GPU's whole memory: the planner's at headroom 0)
    one = _run(**{**config, "batch_size": 0}, world_size=1, activation_checkpointing="auto",
               headroom=0.0).metrics
    no, ac = (int(one[f"bf16_max_batch_{m}_checkpointing"]) for m in ("without", "with"))
    assert 1 <= no < 18 <= ac
    assert (f"to probe what the model says fits on 1 x H200: world_size 2 (the same "
            f"configuration on 2 GPUs) or a smaller probe batch (up to {no}) or activation "
            f"checkpointing on (batch up to {ac}).") in out.markdown


def test_without_a_probe_nothing_is_probed_or_corrected():
    out = _run()
    assert "Probe, then extrapolate" not in out.markdown
    assert not [k for k in out.metrics if "probe" in k or "corrected" in k]


@pytest.mark.parametrize("changes, says", [
    ({"batch_size": 4}, "batch 4"),
    ({"activation_checkpointing": True}, "checkpointing on"),
    ({"gpu": "B200"}, "on B200"),
    ({"precision": "bf16"}, "probed bf16, which is not planned"),
])
def test_a_probe_of_another_configuration_is_refused_naming_probe(changes, says):
    with pytest.raises(UserError, match="probe") as exc:
        _run(probe=json.dumps(_probe(**changes)))
    assert exc.value.field == "probe" and says in str(exc.value)


@pytest.mark.parametrize("text, says", [
    ("{not json", "is not JSON"),
    ('["fp8"]', "list ['fp8'], not a JSON object"),
    ('{"precision": "fp8", "speed": 3}', "unknown key(s) 'speed'"),
    ('{"precision": "fp8"}', "lacks 'batch_size'"),
    (json.dumps(_probe(tokens_per_s_per_gpu=0)), "is not a measurement"),
    (json.dumps(_probe(gpu="", instance_type="")), "instance_type or gpu"),
])
def test_a_malformed_probe_is_refused_naming_probe(text, says):
    with pytest.raises(UserError) as exc:
        _run(probe=text)
    assert exc.value.field == "probe" and says in str(exc.value)


def _argv(preset="8b"):
    return ["--model-preset", preset, "--gpu", "H200", "--world-size", "8", "--batch-size", "2",
            "--seq-length", "2048", "--precisions", "fp8", "--activation-checkpointing", "off"]


def test_cli_takes_the_probe_as_json_or_at_file(tmp_path, capsys):
    one, full = (_run(model_preset="14b", **w).metrics["fp8_predicted_tokens_per_s_per_gpu"]
                 for w in ({"world_size": 1}, {}))
    probe = _probe(tokens_per_s_per_gpu=1.25 * one)
    assert cli.main([*_argv("14b"), "--probe", json.dumps(probe), "--json"]) == 0
    printed = capsys.readouterr()
    doc = json.loads(printed.out)["probe"]
    assert doc["corrected_tokens_per_s_per_gpu"] == pytest.approx(1.25 * full, rel=REL)
    assert doc["predicted_tokens_per_s_per_gpu"] == pytest.approx(full)
    assert doc["probe"]["source"] == "probe-job-7" and doc["probed_peak_bytes"] is None
    assert doc["fits_at_probe_predicted"] is False  # 14B on one H200: see above
    assert doc["warning"].startswith("probe: fp8 batch 2, checkpointing off, sequence 2048")
    assert f"memory_estimate: warning: {doc['warning']}" in printed.err
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(probe))
    assert cli.main([*_argv("14b"), "--probe", f"@{path}"]) == 0
    assert "| corrected by the probe, full run (8 GPUs) |" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["@/nonexistent/probe.json", '{"precision": "fp8"}'])
def test_cli_bad_probe_exits_2_naming_it(value, capsys):
    assert cli.main([*_argv(), "--probe", value]) == USER_ERROR_EXIT_CODE
    assert "probe:" in capsys.readouterr().err


class _Out:
    def __init__(self, path):
        self.path, self.metrics = str(path), {}

    def log_metric(self, name, value):
        self.metrics[name] = value


def test_component_writes_the_probes_comparison_to_its_report_and_metrics(tmp_path, predicted):
    from kfp_sagemaker_blackwell.components.memory_estimate.component import memory_estimate

    report, metrics = _Out(tmp_path / "report.md"), _Out(tmp_path / "metrics")
    probe = _probe(tokens_per_s_per_gpu=0.5 * predicted["one"])
    memory_estimate.python_func(report=report, metrics=metrics, probe=json.dumps(probe),
                                **CONFIG)
    assert "| corrected by the probe, full run (8 GPUs) |" in (tmp_path / "report.md").read_text()
    assert metrics.metrics["fp8_corrected_tokens_per_s_per_gpu"] == pytest.approx(
        0.5 * predicted["full"], rel=REL)
