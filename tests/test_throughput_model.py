"""The throughput and cost model (planning/throughput.py): its behaviour.

Its accuracy against the trainer's H200 measurements is in
tests/test_throughput_accuracy.py.
"""

import json
import math
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from kfp_sagemaker_blackwell.catalog.precisions import PRECISIONS
from kfp_sagemaker_blackwell.catalog.spec import PRESETS
from kfp_sagemaker_blackwell.planning import planner, pricing, throughput
from kfp_sagemaker_blackwell.planning.training_setup import TrainingSetup


def setup(preset="8b", precision="bf16", batch=1, seq=8192, ac=True, world=8, **kw):
    return TrainingSetup(PRESETS[preset], batch, seq, precision, ac, world, **kw)


def tps(s, gpu="B200", **kw):
    return throughput.predict(s, gpu, **kw).tokens_per_s_per_gpu


def test_parts_add_up_to_the_step_and_are_named():
    p = throughput.predict(setup(), "H200")
    assert set(p.parts) == set(throughput.PARTS)
    assert sum(p.parts.values()) == pytest.approx(p.step_seconds)
    assert all(v >= 0 for v in p.parts.values())
    assert p.tokens_per_s_per_gpu == pytest.approx(8192 / p.step_seconds)
    assert p.bound == "compute"


def test_bigger_models_are_slower_per_token():
    order = ["1b", "3b", "8b", "14b", "32b"]
    rates = [tps(setup(m, batch=1, seq=4096, world=8)) for m in order]
    assert rates == sorted(rates, reverse=True), dict(zip(order, rates, strict=True))
    # ... and so are longer sequences (attention grows with it) at equal tokens per step
    assert tps(setup("8b", batch=1, seq=16384)) < tps(setup("8b", batch=2, seq=8192))


def test_activation_checkpointing_costs_about_a_forward():
    on, off = tps(setup(ac=True)), tps(setup(ac=False))
    assert 1.15 < off / on < 1.40  # recomputing the forward: ~4/3 of the block work


def test_recipe_order_on_blackwell_for_a_large_model():
    """Per-tensor FP8 is the cheapest to quantise; current scaling adds an amax pass; block
    formats pay for scales; NVFP4's 4-bit GEMMs win on an 8B model despite its overheads."""
    r = {p: tps(setup(precision=p, batch=2)) for p in PRECISIONS if p not in
         ("fp32", "fp16")}
    assert r["nvfp4"] > r["fp8"] > r["fp8-current"] > r["bf16"]
    assert r["fp8"] > r["mxfp8"] > r["bf16"]
    assert r["fp8-current"] > r["fp8-block"]


def test_fp8_recipes_on_hopper_and_gains_vs_bf16():
    r = {p: tps(setup(precision=p), "H200") for p in ("bf16", "fp8", "fp8-current", "fp8-block")}
    assert r["fp8"] > r["fp8-current"] > r["fp8-block"] > r["bf16"]
    assert 1.15 < r["fp8"] / r["bf16"] < 1.6


def test_a_tiny_model_is_host_bound_and_gains_nothing_from_low_precision():
    """The overhead floor: a 4-layer hidden-128 model cannot use a B200's tensor cores;
    its step is the host's launch time, so a low precision gains nothing (or loses)."""
    base = throughput.predict(setup("small", batch=8, seq=128, world=1), "B200")
    assert base.bound == "host (CPU launch)"
    assert base.step_seconds >= throughput.DEFAULT.cpu_step_measured_s
    for p in ("fp8", "mxfp8", "nvfp4"):
        other = throughput.predict(setup("small", p, batch=8, seq=128, world=1), "B200")
        assert other.speedup_over(base) <= 1.0
    # doubling the batch of a host-bound step doubles tokens/s
    twice = throughput.predict(setup("small", batch=16, seq=128, world=1), "B200")
    assert twice.tokens_per_s_per_gpu == pytest.approx(2 * base.tokens_per_s_per_gpu, rel=0.05)


def test_mfu_follows_the_trainers_convention():
    s = setup(precision="fp8")
    p = throughput.predict(s, "H200")
    flops = PRESETS["8b"].flops_per_token(8192)
    assert p.mfu == pytest.approx(flops * p.tokens_per_s_per_gpu / 1979e12)
    assert 0 < p.mfu < 1


def test_nvlink_costs_a_few_percent_and_the_network_between_instances_more():
    two = throughput.predict(setup("1b", world=2, seq=4096, batch=4), "H200")
    one = throughput.predict(setup("1b", world=1, seq=4096, batch=4), "H200")
    compute = sum(v for k, v in one.parts.items() if k not in ("optimizer", "fsdp_copies"))
    extra = two.step_seconds - (compute + two.parts["optimizer"] + two.parts["fsdp_copies"])
    assert 0.02 < extra / compute < 0.08  # measured on 2 H200s: 95.6-95.8% scaling
    it = "ml.p5en.48xlarge"
    eight = throughput.predict(setup(world=8, batch=1), "H200", instance_type=it)
    sixteen = throughput.predict(setup(world=16, batch=1), "H200", instance_type=it)
    assert sixteen.tokens_per_s_per_gpu < eight.tokens_per_s_per_gpu
    assert sixteen.parts["communication_exposed"] > 10 * eight.parts["communication_exposed"]
    # a bigger micro-batch hides the all-gathers again
    bigger = throughput.predict(setup(world=16, batch=4), "H200", instance_type=it)
    assert bigger.parts["communication_exposed"] < sixteen.parts["communication_exposed"]


def test_cost_uses_the_pricing_table_and_the_instance_count():
    s = setup(world=16)
    p = throughput.predict(s, "B200", instance_type="ml.p6-b200.48xlarge")
    price = pricing.shipped_price("ml.p6-b200.48xlarge").per_instance_hour
    assert p.instance_count == 2
    expected = price * 2 / 3600 * 1e9 / (p.tokens_per_s_per_gpu * 16)
    assert p.cost_usd_per_billion_tokens == pytest.approx(expected)
    assert p.run_cost_usd(1000) == pytest.approx(p.step_seconds * 1000 / 3600 * price * 2)
    cheaper = throughput.predict(s, "B200", instance_type="ml.p6-b200.48xlarge",
                                 prices={"ml.p6-b200.48xlarge": 50.0})
    assert cheaper.cost_usd_per_billion_tokens < p.cost_usd_per_billion_tokens
    assert p.price_source.startswith("shipped table of") and \
        cheaper.price_source == "instance_hour_prices (yours)"
    # no price known (ml.p5e is sold through training plans only): no cost, not a made-up one
    none = throughput.predict(setup(world=8), "H200", instance_type="ml.p5e.48xlarge")
    assert none.cost_usd_per_billion_tokens is None and none.run_cost_usd(10) is None
    assert none.price_source == ""


def test_predictions_say_they_are_predicted_and_blackwell_unmeasured():
    assert "not measured" in throughput.predict(setup(), "B200").source
    assert "not measured" in throughput.predict(setup(), "B300").source
    assert "calibrated on H200" in throughput.predict(setup(), "H200").source
    assert "predicted" in throughput.predict(setup(), "H100").source


def test_prediction_is_fast():
    s = setup()
    start = time.thread_time()  # CPU time: the prediction's cost, not the machine's load
    for _ in range(50):
        throughput.predict(s, "B200", instance_type="ml.p6-b200.48xlarge")
    assert (time.thread_time() - start) / 50 < 0.005


def test_the_compiled_loss_moves_less_than_the_eager_one():
    eager = throughput.predict(setup("1b", batch=4, seq=4096, ac=False, world=1, loss_kernel="eager"), "H200")
    compiled = throughput.predict(setup("1b", batch=4, seq=4096, ac=False, world=1), "H200")
    assert compiled.step_seconds < eager.step_seconds
    # 28 of the eager path's 36 bytes per logit are gone: at 16,384 tokens x 128,256 logits
    # that is ~59 GB less HBM traffic, over 10 ms on an H200.
    assert eager.step_seconds - compiled.step_seconds > 0.010


def test_every_constant_is_used():
    """Changing any constant changes some prediction (no dead constants)."""
    cases = [(setup(precision=p, world=w, ac=ac), g, it)
             for p, g, it in (("bf16", "H200", "ml.p5en.48xlarge"),
                              ("fp8", "H200", "ml.p5en.48xlarge"),
                              ("fp8-current", "H200", "ml.p5en.48xlarge"),
                              ("fp8-block", "H200", "ml.p5en.48xlarge"),
                              ("mxfp8", "B200", "ml.p6-b200.48xlarge"),
                              ("nvfp4", "B200", "ml.p6-b200.48xlarge"),
                              ("bf16", "L40S", "ml.g6e.48xlarge"))
             for w in (1, 8, 16) for ac in (True, False)]
    cases += [(setup("small", p, batch=4, seq=128, world=1), "H200", "") for p in ("bf16", "fp8")]
    cases += [(setup("1b", "bf16", batch=4, seq=4096, ac=False, world=1, loss_kernel="eager"), "H200", "")]

    def steps(c):
        return [throughput.predict(s, g, instance_type=it, constants=c).step_seconds
                for s, g, it in cases]

    base = steps(throughput.DEFAULT)
    other = {"host_reference_gpu": "H100", "host_recipe_alias": {"mxfp8": "fp8", "nvfp4": "fp8"}}
    for name, value in vars(throughput.DEFAULT).items():
        if name in other:
            changed = other[name]
        elif isinstance(value, dict):
            changed = {k: ({kk: vv * 1.5 for kk, vv in v.items()} if isinstance(v, dict) else
                           tuple(x * 1.5 for x in v) if isinstance(v, tuple) else v * 1.5)
                       for k, v in value.items()}
        else:
            changed = value * 1.5
        after = steps(replace(throughput.DEFAULT, **{name: changed}))
        assert any(not math.isclose(a, b) for a, b in zip(after, base, strict=True)), name


def _plan(**kw):
    defaults = dict(model=PRESETS["8b"], seq_length=8192,
                    hardware=planner.resolve_hardware(instance_type="ml.p6-b200.48xlarge"),
                    precisions=("bf16", "fp8", "nvfp4"), batch_sizes=(2,))
    defaults.update(kw)
    return planner.plan(planner.Request(**defaults))


def test_plan_entries_carry_the_prediction():
    result = _plan()
    for p, e in result.plan.precisions.items():
        assert e.tokens_per_s_per_gpu and e.step_seconds and e.mfu
        assert e.cost_usd_per_billion_tokens and "not measured" in e.throughput_source
        s = TrainingSetup(PRESETS["8b"], e.batch_size, 8192, p, e.activation_checkpointing, 8)
        assert e.tokens_per_s_per_gpu == pytest.approx(
            throughput.predict(s, "B200").tokens_per_s_per_gpu, rel=1e-4)
    # the plan's JSON round-trips with the new keys
    from kfp_sagemaker_blackwell.planning.memory_plan import MemoryPlan

    again = MemoryPlan.from_json(result.plan.to_json())
    assert again.precisions["fp8"].step_seconds == result.plan.precisions["fp8"].step_seconds


def test_unsupported_precisions_carry_no_prediction():
    result = _plan(hardware=planner.resolve_hardware(gpu="H200"), precisions=("bf16", "nvfp4"))
    assert result.plan.precisions["nvfp4"].tokens_per_s_per_gpu is None
    assert result.plan.precisions["bf16"].tokens_per_s_per_gpu


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "kfp_sagemaker_blackwell.components.memory_estimate", *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_json_with_one_precision_and_batch_has_the_top_level_keys():
    out = _cli("--model-preset", "1b", "--instance-type", "ml.p5.48xlarge", "--batch-size", "2",
               "--seq-length", "4096", "--precisions", "fp8", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    for key in ("tokens_per_s_per_gpu", "step_seconds", "mfu", "cost_usd_per_billion_tokens"):
        assert isinstance(doc[key], float), key
    assert doc["throughput_source"].startswith("predicted")
    entry = doc["plan"]["precisions"]["fp8"]
    assert entry["tokens_per_s_per_gpu"] == doc["tokens_per_s_per_gpu"]


def test_markdown_shows_the_prediction_labelled():
    from kfp_sagemaker_blackwell.components.memory_estimate import report

    md = report.markdown(_plan())
    assert "Predicted speed and cost (throughput model; predicted, not measured)" in md
    assert "tokens/s per GPU" in md and "$ per billion tokens" in md
    metrics = report.metrics(_plan())
    assert metrics["fp8_predicted_tokens_per_s_per_gpu"] > metrics["bf16_predicted_tokens_per_s_per_gpu"]


def test_measured_table_interpolates_between_shapes_and_plugs_in_more_token_counts(tmp_path):
    """The linear-layer table (planning/measured_parts.py): a measured shape is returned as
    measured, a shape between measured ones lies between their rates, and a richer file
    (records with "m") plugs in without code change: the time at a measured M is that M's."""
    from kfp_sagemaker_blackwell.planning import measured_parts

    recs = [{"in_features": k, "out_features": n, "recipe": "bf16", "m": m,
             "fwd_bwd_s": 6.0 * m * n * k / rate}
            for (m, n, k, rate) in ((8192, 2048, 2048, 300e12), (8192, 8192, 8192, 600e12),
                                    (65536, 2048, 2048, 500e12))]
    path = tmp_path / "x200_gemms.json"
    path.write_text(json.dumps({"machine": "X200", "date": "today", "results": recs}))
    table = measured_parts.load([path], "X200")
    assert table.linear_seconds(8192, 2048, 2048, "bf16") == pytest.approx(recs[0]["fwd_bwd_s"])
    assert table.linear_seconds(65536, 2048, 2048, "bf16") == pytest.approx(recs[2]["fwd_bwd_s"])
    mid = 6.0 * 8192 * 4096 * 4096 / table.linear_seconds(8192, 4096, 4096, "bf16")
    assert 300e12 < mid < 600e12
    assert table.linear_seconds(8192, 2048, 2048, "fp8") is None  # not measured: the formula
    assert table.attention_seconds(1, 4096, 32, 128) is None


def test_h200_predictions_use_the_shipped_linear_timings():
    """The H200's GEMM part comes from the measured te.Linear table: scaling the table's
    times scales the GEMM part; the package's copy is the benchmark's file (the parts table
    v3 reads; the earlier M = 8192 table, h200_gemms.json, stays in benchmarks/ only)."""
    from kfp_sagemaker_blackwell.planning import measured_parts

    bench_dir = Path(__file__).resolve().parents[1] / "benchmarks" / "throughput"
    shipped = json.loads((measured_parts.MEASURED / "h200_parts.json").read_text())
    assert shipped == json.loads((bench_dir / "h200_parts.json").read_text())
    table = measured_parts.shipped("H200")
    assert table.source.startswith("h200_parts.json") and len(table.linears) >= 700
    assert len(table.attention) >= 30 and table.layer_host_s("fp8") and \
        table.optimizer_s("adamw_fused_step")
    s = setup("8b", "fp8", batch=1, seq=8192, ac=False, world=1)
    base = throughput.predict(s, "H200")
    table = throughput.DEFAULT.parts_tables["H200"]
    slower = replace(throughput.DEFAULT, parts_tables={"H200": table.scaled(2.0)})
    doubled = throughput.predict(s, "H200", constants=slower)
    both = base.parts["gemm"] + base.parts["quantization"]
    assert doubled.parts["gemm"] + doubled.parts["quantization"] > 1.8 * both
    # the H100 reads its own table (h100_parts.json), not the H200's
    h100 = throughput.constants_for("H100")
    h200_slower = replace(h100, parts_tables=dict(h100.parts_tables, H200=table.scaled(2.0)))
    assert throughput.predict(s, "H100", constants=h200_slower).step_seconds == pytest.approx(
        throughput.predict(s, "H100").step_seconds)


def test_torch_backend_has_its_own_constants():
    """The torch backend's GQA attention and per-block fixed time are its own constants
    (calibrated on its runs, benchmarks/throughput/h200_torch_grid.json): changing them
    moves torch-backend predictions only."""
    s_te = setup("1b", "bf16", batch=4, seq=8192, ac=True, world=1)
    s_torch = replace(s_te, backend="torch")
    c = replace(throughput.DEFAULT, attention_backend_factor=dict(
        throughput.DEFAULT.attention_backend_factor, **{"torch-gqa": 1.0}))
    assert throughput.predict(s_te, "H200", constants=c).step_seconds == pytest.approx(
        throughput.predict(s_te, "H200").step_seconds)
    assert throughput.predict(s_torch, "H200", constants=c).step_seconds < \
        throughput.predict(s_torch, "H200").step_seconds


def test_parts_table_reads_host_floor_layers_and_optimizer_from_a_parts_file(tmp_path):
    """v3's parts file (benchmarks/throughput/parts.py): the host's time per te.Linear call
    is the small layers' measured time, host-bound measurements do not set a GPU rate, the
    tiny-block stacks give the host's time per block (slope over depth) and per step, the
    optimizer ops their time per element and per tensor, attention records of forward +
    backward are split by FLOPs and interpolated by sequence, heads and head size."""
    from kfp_sagemaker_blackwell.planning import measured_parts

    host = 1e-3
    linear = [{"in_features": 128, "out_features": 128, "recipe": "bf16", "tokens": 8192,
               "fwd_bwd_s": host}]
    for m in (2048, 65536):  # 2048: host-bound (GPU 0.1 ms hidden under 1 ms); 65536: GPU
        gpu = 6.0 * m * 4096 * 4096 / 600e12
        linear.append({"in_features": 4096, "out_features": 4096, "recipe": "bf16",
                       "tokens": m, "fwd_bwd_s": max(gpu, host)})
    doc = {"machine": "X200", "linear": linear,
           "attention": [{"heads": h, "kv_heads": 8, "head_dim": 128, "seq_length": 4096,
                          "batch_size": 1, "fwd_bwd_s": 3.5e-3 * h / 32} for h in (32, 64)],
           "layer": [{"recipe": "bf16", "layers": n, "tokens": 256, "fwd_bwd_s": 0.002 + 0.003 * n}
                     for n in (1, 4, 16)],
           "optimizer": [{"op": "adamw_fused_step", "tensors": t, "elements": 2**27,
                          "seconds": 2**27 * 1e-11 + t * 4e-6} for t in (16, 256, 4096)]}
    path = tmp_path / "x200_parts.json"
    path.write_text(json.dumps(doc))
    table = measured_parts.load([path], "X200")
    assert table.linear_host_s("bf16") == pytest.approx(host)
    # the rate comes from the GPU-bound point only: 600 TFLOP/s at M = 2048 too
    assert table.linear_seconds(2048, 4096, 4096, "bf16") == pytest.approx(
        6.0 * 2048 * 4096 * 4096 / 600e12)
    assert table.layer_host_s("bf16") == pytest.approx((0.003, 0.002))
    per_element, per_tensor = table.optimizer_s("adamw_fused_step")
    assert per_tensor == pytest.approx(4e-6) and per_element == pytest.approx(1e-11, rel=0.01)
    fwd, bwd = table.attention_seconds(1, 4096, 48, 128)
    assert bwd == pytest.approx(2.5 * fwd) and 1e-3 / 3.5 * 32 / 32 < fwd + bwd
    assert table.layer_host_s("fp8") is None and table.optimizer_s("clip_grad_norm") is None


def test_parts_linear_scale_scales_only_the_measured_linear_layers():
    """v4's table-wide residual: the trainer's linear-layer time over the parts table's
    (the table and the trainer runs came from different sessions)."""
    s = setup("8b", "fp8", batch=2, seq=4096, ac=False, world=1)
    base = throughput.predict(s, "H200")
    c = replace(throughput.DEFAULT, parts_linear_scale=2 * throughput.DEFAULT.parts_linear_scale)
    scaled = throughput.predict(s, "H200", constants=c)
    assert scaled.parts["gemm"] + scaled.parts["quantization"] == pytest.approx(
        2 * (base.parts["gemm"] + base.parts["quantization"]), rel=0.02)
    assert scaled.parts["lm_head"] == pytest.approx(2 * base.parts["lm_head"])
    assert scaled.parts["attention"] == pytest.approx(base.parts["attention"])
    # B200 has no table: the scale does not touch it
    assert throughput.predict(s, "B200", constants=c).step_seconds == pytest.approx(
        throughput.predict(s, "B200").step_seconds)


def test_h100_predictions_use_the_h100_parts_measured_in_session_v6():
    """Issue 36: the H100's parts (benchmarks/throughput/h100_parts.json, parts.py on one H100
    80GB HBM3, 2026-12-06) are shipped beside the H200's and time the H100's linear layers,
    attention, host and optimizer; its source says so."""
    from kfp_sagemaker_blackwell.planning import measured_parts

    bench_dir = Path(__file__).resolve().parents[1] / "benchmarks" / "throughput"
    shipped = json.loads((measured_parts.MEASURED / "h100_parts.json").read_text())
    assert shipped == json.loads((bench_dir / "h100_parts.json").read_text())
    assert shipped["gpu"] == "NVIDIA H100 80GB HBM3" and shipped["date"] == "2026-12-06"
    table = throughput.DEFAULT.parts_tables["H100"]
    assert table.source.startswith("h100_parts.json") and len(table.linears) >= 700
    assert table.layer_host_s("fp8") and table.optimizer_s("adamw_fused_step")
    s = setup("8b", "fp8", batch=1, seq=8192, ac=False, world=1)
    base = throughput.predict(s, "H100")
    slower = replace(throughput.DEFAULT, parts_tables=dict(
        throughput.DEFAULT.parts_tables, H100=table.scaled(2.0)))
    doubled = throughput.predict(s, "H100", constants=slower)
    both = base.parts["gemm"] + base.parts["quantization"]
    assert 1.9 * both < doubled.parts["gemm"] + doubled.parts["quantization"] <= 2.0 * both
    assert "measured H100 parts" in base.source and "H200 parts" not in base.source


def test_the_calibration_data_gives_every_value_a_kind_and_a_source():
    """Issue 36 item 3: the constants live in planning/calibration/, one file per model version
    and GPU; every value names its kind (fitted / published / datasheet / derived / assumed)
    and its source; the H200 file has every Constants field (the measured parts are
    planning/measured/'s), a GPU's own file amends it and states its held-out accuracy; the
    installed package carries the files (setup.cfg package data)."""
    import configparser
    import dataclasses

    fields = {f.name for f in dataclasses.fields(throughput.Constants)} - {"parts_tables"}
    files = sorted(p.name for p in throughput.CALIBRATION.glob("*.json"))
    assert files == sorted(throughput.CALIBRATION_FILES.values()) == [
        "throughput_v5_h100.json", "throughput_v5_h200.json"]
    for gpu, name in throughput.CALIBRATION_FILES.items():
        doc = throughput.load_calibration(name)
        assert doc["gpu"] == gpu and doc["model"] == "throughput model v5"
        assert set(doc["values"]) <= fields and doc["values"]
        for field_name, v in doc["values"].items():
            assert v["kind"] in throughput.CALIBRATION_KINDS, (name, field_name)
            assert len(v["source"]) > 20, (name, field_name)
        held = doc["held_out"]
        assert held["source"] and (Path(__file__).resolve().parents[1] / "benchmarks" / "throughput"
                                   / held["record"]).exists()
        assert throughput.ACCURACY[gpu].median_error == held["median_error"]
    h200 = throughput.load_calibration("throughput_v5_h200.json")
    assert set(h200["values"]) == fields and "base" not in h200
    assert throughput.load_calibration("throughput_v5_h100.json")["base"] == "throughput_v5_h200.json"
    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    assert "calibration/*.json" in cfg["options.package_data"]["kfp_sagemaker_blackwell.planning"]


def test_the_data_driven_model_keeps_the_datasheet_gpus_gpu_bound_predictions_and_reads_its_data():
    """80 predictions (H200, H100, B200, L40S; TE and torch; 1-16 GPUs) recorded with the
    constants still in code (tests/data/throughput_v4_predictions.json, commit 061d2eb): the
    GPUs without measured parts (B200, L40S) are predicted as then where the GPU bounds the
    step (8-16 GPUs; every L40S row); session v14 replaced their host formula by the H200's
    measured host, so their small steps moved (test below); and a value changed in the data
    changes the predictions."""
    golden = json.loads((Path(__file__).parent / "data" / "throughput_v4_predictions.json").read_text())
    datasheet = [r for r in golden["predictions"] if r["gpu"] not in throughput.MEASURED_SOURCES
                 and r["backend"] == "te" and (r["world_size"] > 1 or r["gpu"] == "L40S")]
    assert len(datasheet) >= 16
    for r in datasheet:
        s = TrainingSetup(PRESETS[r["preset"]], r["batch_size"], r["seq_length"], r["precision"],
                          r["activation_checkpointing"], r["world_size"], backend=r["backend"])
        got = throughput.predict(s, r["gpu"], instance_type=r["instance_type"]).step_seconds
        assert got == pytest.approx(r["step_seconds"], rel=0.025), r
    doc = throughput.load_calibration("throughput_v5_h200.json")
    doc["values"]["cpu_step_measured_s"]["value"] *= 2
    changed = replace(throughput.DEFAULT, **throughput.calibration_values(doc))
    # a small step, where the per-step host time is not hidden under the root unit's GPU work
    s = TrainingSetup(PRESETS["1b"], 1, 1024, "fp8", False, 1)
    assert throughput.predict(s, "H200", constants=changed).step_seconds > \
        throughput.predict(s, "H200").step_seconds


def test_a_gpu_without_parts_takes_the_host_reference_gpus_measured_host():
    """Session v14: a GPU without measured parts (B200) takes the H200's measured host time per
    block, not v1's formula (fp8 4.28x bf16's: it priced the 1b preset's fp8 step at 0.52x
    bf16's on B200). A host-bound step runs little faster on a B200 than on the H200 whose host
    it takes, in bf16 as in fp8; Blackwell-only recipes take fp8-block's host time."""
    assert throughput.DEFAULT.host_reference_gpu == "H200"
    for p in ("bf16", "fp8"):
        s = TrainingSetup(PRESETS["3b"], 2, 1024, p, False, 1)
        b200, h200 = throughput.predict(s, "B200"), throughput.predict(s, "H200")
        assert b200.bound == h200.bound == "host (CPU launch)"
        # the B200's GPU is about twice as fast; its step is within 15% of the H200's
        assert 0.85 * h200.step_seconds < b200.step_seconds <= h200.step_seconds
    small = {p: throughput.predict(TrainingSetup(PRESETS["1b"], 8, 1024, p, False, 1), "B200")
             for p in ("bf16", "fp8", "fp8-block", "mxfp8", "nvfp4")}
    assert small["fp8"].speedup_over(small["bf16"]) > 0.75
    assert small["mxfp8"].step_seconds == pytest.approx(small["fp8-block"].step_seconds, rel=0.02)
    # no table and no reference: a clear error, not a silent formula
    lost = replace(throughput.DEFAULT, host_reference_gpu="B300")
    with pytest.raises(ValueError, match="host reference"):
        throughput.predict(TrainingSetup(PRESETS["1b"], 8, 1024, "bf16", False, 1), "B200", constants=lost)


def test_the_root_units_gradient_copy_in_is_host_time_of_a_small_step():
    """Model v5: FSDP2's reduce-scatter copy-in builds its metadata on the host, per parameter,
    once a step (planning/calibration: measured by parts.py --sections copy_in). At a small
    step of a wide model the root unit's (embedding, LM head) is exposed: without it the step
    is shorter by at most its own host time; at a large step it hides behind the GPU."""
    from dataclasses import replace as dc_replace

    c = throughput.constants_for("H100")
    none = dc_replace(c, cpu_reduce_copy_s_per_param={"block": 0.0, "root": 0.0})
    small = TrainingSetup(PRESETS["8b"].replace(num_layers=2), 1, 1536, "bf16", False, 1)
    m = small.model
    root = (m.total_params() - m.num_layers * m.block_params()) * c.cpu_reduce_copy_s_per_param["root"]
    assert root > 0.01  # 1.05 B root parameters: about 13.5 ms
    with_copy = throughput.predict(small, "H100", constants=c).step_seconds
    without = throughput.predict(small, "H100", constants=none).step_seconds
    assert 0.3 * root < with_copy - without <= root * 1.001 + m.num_layers * m.block_params() * 5e-12
    large = TrainingSetup(PRESETS["8b"].replace(num_layers=2), 8, 8192, "bf16", False, 1)
    assert throughput.predict(large, "H100", constants=c).step_seconds == pytest.approx(
        throughput.predict(large, "H100", constants=none).step_seconds, rel=1e-3)


def test_the_copy_in_rates_are_the_measured_parts_and_a_session_reads_its_own(tmp_path):
    """cpu_reduce_copy_s_per_param is, per GPU, the median over the presets of parts.py's
    copy_in records, rounded: the H200's from its shipped parts table (session v13), the H100's
    from session v12's copy-in part (its own calibration file keeps it). A session evaluated
    with its own parts.json takes its own copy-in rates where it measured them, and its GPU's
    shipped ones where it did not."""
    import importlib

    from kfp_sagemaker_blackwell.planning import measured_parts

    root = Path(__file__).resolve().parents[1]
    v12 = root / "benchmarks" / "throughput" / "raw" / "session_v12_h100" / "parts_copy_in.json"
    rates = measured_parts.copy_in_rates([v12])
    h200 = measured_parts.copy_in_rates([measured_parts.MEASURED / "h200_parts.json"])
    shipped = throughput.DEFAULT.cpu_reduce_copy_s_per_param
    assert shipped == pytest.approx(h200, rel=2e-3)
    h100 = throughput.constants_for("H100").cpu_reduce_copy_s_per_param
    assert h100 == pytest.approx(rates, rel=2e-3)
    assert h200["root"] > 1.3 * rates["root"]  # the H200's host copies slower (5.9 / 20 ps, H100 4.3 / 12.9)
    for name in ("throughput_v5_h200.json", "throughput_v5_h100.json"):
        assert throughput.load_calibration(name)["values"][
            "cpu_reduce_copy_s_per_param"]["kind"] == "measured"
    doc = json.loads(v12.read_text())
    doc["copy_in"] = [dict(r, host_s_per_element=r["host_s_per_element"] * 2) for r in doc["copy_in"]]
    session = tmp_path / "session"
    session.mkdir()
    (session / "parts.json").write_text(json.dumps(doc))
    acc = importlib.import_module("benchmarks.throughput.model_accuracy")
    own = acc.session_constants(session).cpu_reduce_copy_s_per_param
    assert own == pytest.approx({k: 2 * v for k, v in rates.items()})
    assert acc.session_constants(acc.SESSION_V6).cpu_reduce_copy_s_per_param == h100
    assert measured_parts.copy_in_rates([root / "planning" / "measured" / "h100_parts.json"]) is None


def test_the_host_time_per_block_is_read_for_the_setups_block_kind(tmp_path):
    """Session v13: te-fsdp-example (LayerNorm, GELU, biases, no RoPE) ran host-bound at about
    1.5x the Llama blocks' host time per block, and the tiny-block stacks timed only the Llama
    blocks. parts.py now times every kind the presets use (LAYER_BLOCKS, keyed by
    ModelSpec.block_kind); the model reads the setup's kind where the table has it and the
    Llama blocks' where it does not (a table from before session v13: the shipped one)."""
    import importlib

    from kfp_sagemaker_blackwell.catalog.spec import PRESETS
    from kfp_sagemaker_blackwell.planning import measured_parts

    parts = importlib.import_module("benchmarks.throughput.parts")
    kinds = {p.block_kind for p in PRESETS.values()}
    assert kinds <= set(parts.LAYER_BLOCKS)  # every preset's blocks can be timed
    assert PRESETS["1b"].block_kind == measured_parts.DEFAULT_BLOCK == "rmsnorm-swiglu"
    assert PRESETS["te-fsdp-example"].block_kind == "layernorm-gelu-bias-norope"
    for kind in parts.LAYER_BLOCKS:  # the stack's spec is of the kind it is recorded as
        assert parts.layer_spec(4, kind).validate().block_kind == kind
    # a table that timed te-fsdp-example's blocks at 1.5x the Llama blocks' per-layer time
    shipped = measured_parts.MEASURED / "h200_parts.json"
    doc = json.loads(shipped.read_text())
    assert {r.get("block", measured_parts.DEFAULT_BLOCK) for r in doc["layer"]} == {"rmsnorm-swiglu"}
    doc["layer"] += [dict(r, block="layernorm-gelu-bias-norope", fwd_bwd_s=r["fwd_bwd_s"] * 1.5)
                     for r in doc["layer"]]
    path = tmp_path / "h200_parts.json"
    path.write_text(json.dumps(doc))
    table = measured_parts.load([path], "H200")
    llama, example = table.layer_host_s("bf16"), table.layer_host_s("bf16", "layernorm-gelu-bias-norope")
    assert example[0] == pytest.approx(1.5 * llama[0]) and example[1] == pytest.approx(1.5 * llama[1])
    assert table.layer_host_s("bf16", "layernorm-swiglu") == llama  # a kind not timed: the Llama blocks'
    assert parts.layer_fit(doc["layer"])["bf16/layernorm-gelu-bias-norope"]["per_layer_s"] == \
        pytest.approx(1.5 * parts.layer_fit(doc["layer"])["bf16"]["per_layer_s"])
    timed = replace(throughput.DEFAULT, parts_tables={**throughput.DEFAULT.parts_tables, "H200": table})
    host_bound = TrainingSetup(replace(PRESETS["te-fsdp-example"], num_layers=12), 2, 2048, "bf16", False, 1)
    llama_step = TrainingSetup(replace(PRESETS["1b"], num_layers=6), 1, 1536, "bf16", False, 1)
    assert throughput.predict(host_bound, "H200", constants=timed).step_seconds > \
        1.1 * throughput.predict(host_bound, "H200").step_seconds
    assert throughput.predict(llama_step, "H200", constants=timed).step_seconds == \
        throughput.predict(llama_step, "H200").step_seconds
