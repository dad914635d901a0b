"""The throughput model against the trainer's steady-state step times on an H200.

benchmarks/throughput/h200_grid.json (the trainer, TE backend, one H200): a calibration
split the model's H200 constants were fitted on, and a validation split outside it. That
split is by row: 3 of its 14 configuration families (preset x width x sequence x
checkpointing) have runs in the calibration split too. The held-out figures that count are
leave-one-family-out (benchmarks/throughput/lofo_h200.json: one refit per family on every
other family, issue 25 item 5), checked below and stated in benchmarks/throughput/README.md.
"""

import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRID = ROOT / "benchmarks" / "throughput" / "h200_grid.json"


def _accuracy():
    return importlib.import_module("benchmarks.throughput.model_accuracy")


def test_validation_split_within_8_percent_worst_and_4_percent_median():
    acc = _accuracy()
    doc = acc.load(GRID)
    rows = acc.rows(doc, "validation")
    s = acc.summary(rows)
    assert s["rows"] >= 10, s
    assert s["median_abs_error"] <= 0.04, acc.markdown(doc)
    assert s["worst_abs_error"] <= 0.08, acc.markdown(doc)


def test_validation_speedups_over_bf16_within_0_05():
    acc = _accuracy()
    doc = acc.load(GRID)
    s = acc.summary(acc.rows(doc, "validation"))
    assert s["speedup_pairs"] >= 3, s
    assert s["worst_speedup_error"] <= 0.05, acc.markdown(doc)


def test_calibration_split_fits_too():
    acc = _accuracy()
    doc = acc.load(GRID)
    s = acc.summary(acc.rows(doc, "calibration"))
    assert s["rows"] >= 20 and s["median_abs_error"] <= 0.05, acc.markdown(doc)


def test_b200_llama3_8b_predictions_fall_inside_the_published_ranges():
    """For the memory plan's configuration of Llama-3-8B at sequence 8192 on 8 B200s
    (batch 3, no checkpointing), each recipe's predicted speed-up over bf16 lies in the
    published end-to-end range (sources in model_accuracy.PUBLISHED_B200_LLAMA3_8B)."""
    acc = _accuracy()
    rows = [r for r in acc.blackwell_rows() if r[0] == "batch 3, checkpointing off"]
    for _, precision, _, speedup, _ in rows:
        if precision in acc.PUBLISHED_B200_LLAMA3_8B:
            lo, hi, _ = acc.PUBLISHED_B200_LLAMA3_8B[precision]
            assert lo <= speedup <= hi, (precision, speedup)
    assert {r[1] for r in rows} >= set(acc.PUBLISHED_B200_LLAMA3_8B) | {"fp8-block"}


def test_one_billion_parameter_presets_gain_modestly_from_fp8_on_b200():
    """The article: small models gain modestly from low precision (quantisation and host
    overhead eat the gain). The 1b preset at the plan's batch gains less than the 8B."""
    from kfp_sagemaker_blackwell.catalog.spec import PRESETS
    from kfp_sagemaker_blackwell.planning import planner

    def gain(preset, seq):
        plan = planner.plan(planner.Request(
            model=PRESETS[preset], seq_length=seq,
            hardware=planner.resolve_hardware(instance_type="ml.p6-b200.48xlarge"),
            precisions=("bf16", "fp8"))).plan.precisions
        return plan["fp8"].tokens_per_s_per_gpu / plan["bf16"].tokens_per_s_per_gpu

    small, big = gain("1b", 2048), gain("8b", 8192)
    assert 1.0 < small < 1.3 and small < big


def test_compiled_loss_runs_measured_after_the_grid_are_predicted_within_8_percent():
    # Held out: the 1b preset with the compiled cross-entropy (the trainer's default since the
    # grid was measured), timed on one H200 by benchmarks/trainer/like_for_like.py.
    import json

    from kfp_sagemaker_blackwell.catalog.spec import preset
    from kfp_sagemaker_blackwell.planning import throughput
    from kfp_sagemaker_blackwell.planning.training_setup import TrainingSetup

    runs = json.loads((ROOT / "benchmarks" / "trainer" / "raw" / "like_for_like_h200.json").read_text())
    for precision in ("bf16", "fp8"):
        measured = runs[f"1b-b4/trainer-te/{precision}+compiled-loss"]["tokens_per_s"]
        predicted = throughput.predict(TrainingSetup(preset("1b"), 4, 4096, precision), "H200")
        assert abs(predicted.tokens_per_s_per_gpu / measured - 1) <= 0.08, precision


LOFO = ROOT / "benchmarks" / "throughput" / "lofo_h200.json"


def test_leave_one_family_out_predicts_families_the_fit_never_saw():
    # Every family of the grid is held out once; its runs are predicted here, now, with the
    # constants of the fold that never saw it (so a change to the model that the committed
    # folds no longer describe fails: rerun model_accuracy.py --leave-one-family-out).
    import json

    acc = _accuracy()
    doc = acc.load(GRID)
    lofo = json.loads(LOFO.read_text())
    families = {acc.family(r) for r in doc["results"] if r.get("status") == "ok"}
    held = [tuple(f["family"]) for f in lofo["folds"]]
    assert sorted(held, key=str) == sorted(families, key=str) and len(held) >= 20
    rows = acc.held_out_rows(doc, lofo)
    recorded = {r["name"]: r["predicted"] for f in lofo["folds"] for r in f["runs"]}
    for r in rows:
        assert abs(r.predicted / recorded[r.record["name"]] - 1) < 1e-6, r.label
    s = acc.summary(rows)
    assert s["rows"] == len(recorded) >= 60
    # The honest held-out figures (README): median 1.7%, worst 22.9% (1b L16 fp8 b2 s4096, a
    # host-bound step), speed-up worst 0.16. Issue 25's bar (worst 10%, speed-up 0.04) is
    # not met; these bounds keep it from getting worse unnoticed.
    assert s["median_abs_error"] <= 0.025, acc.held_out_markdown(doc, lofo)
    assert s["worst_abs_error"] <= 0.25, acc.held_out_markdown(doc, lofo)
    assert s["worst_speedup_error"] <= 0.17, acc.held_out_markdown(doc, lofo)
    assert sum(abs(r.error) > 0.10 for r in rows) <= 3
