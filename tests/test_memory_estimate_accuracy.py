"""The estimator against peak memory recorded with the trainer on H200s.

- benchmarks/memory/h200_grid.json: the calibration grid (trainer, TE backend, 1b/3b,
  bf16/fp8, checkpointing on/off, batch 1/4, sequence 2048/4096, 1 and 2 GPUs);
- benchmarks/memory/spot_checks_h200.json: trainer runs (torch backend, bf16),
  including batches just below and above the out-of-memory boundary.

Both record torch.cuda.max_memory_allocated and max_memory_reserved (the reserve's fit,
checked family by family, leave-one-family-out). The issue's accuracy bar: median
absolute error <= 3%, worst <= 8% on the rows that ran; rows that ran out of memory
predicted not to fit (or within the worst error of the limit).
"""

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPOT_CHECKS = ROOT / "benchmarks" / "memory" / "spot_checks_h200.json"
GRID = ROOT / "benchmarks" / "memory" / "h200_grid.json"


def _compare_module():
    return importlib.import_module("benchmarks.memory.compare")


def test_estimate_is_within_3_percent_median_and_8_percent_worst_on_the_h200_grid():
    compare = _compare_module()
    rows = compare.compare(GRID)
    s = compare.summary(rows)
    assert s["ok_rows"] >= 16
    assert s["median_abs_error"] <= 0.03, compare.markdown(rows)
    assert s["worst_abs_error"] <= 0.08, compare.markdown(rows)
    # The grid covers what the issue asks for: two model sizes, bf16 and fp8,
    # checkpointing on and off, several batch sizes and sequence lengths, 2 GPUs.
    import json

    results = json.loads(GRID.read_text())["results"]
    for key, at_least in (("preset", 2), ("precision", 2), ("activation_checkpointing", 2),
                          ("batch_size", 2), ("seq_length", 2), ("world_size", 2)):
        assert len({r[key] for r in results}) >= at_least, key


def test_grid_runs_are_predicted_to_fit_and_its_out_of_memory_runs_not():
    compare = _compare_module()
    rows = compare.compare(GRID)
    refused = [r.label for r in rows if r.status == "ok" and not r.fits_predicted]
    assert not refused, f"predicted not to fit but ran: {refused}"
    missed = [r.label for r in rows if r.status == "oom" and not r.oom_predicted]
    assert not missed, f"ran out of memory but predicted to fit far from the limit: {missed}"


def test_estimate_is_within_3_percent_median_and_8_percent_worst_of_trainer_runs():
    compare = _compare_module()
    rows = compare.compare(SPOT_CHECKS)
    s = compare.summary(rows)
    assert s["ok_rows"] >= 7
    assert s["median_abs_error"] <= 0.03, compare.markdown(rows)
    assert s["worst_abs_error"] <= 0.08, compare.markdown(rows)


# The spot checks' out-of-memory boundaries (torch backend, bf16, no checkpointing, one
# H200): the largest batch that ran, by (preset, sequence).
BOUNDARIES = {("1b", 2048): 17, ("te-fsdp-example", 4096): 23}


def test_runs_that_ran_out_of_memory_are_predicted_not_to_fit_and_runs_that_ran_are_predicted_to_fit():
    # The fit decision is on the predicted peak reserved memory of a run with memory to
    # spare; at the limit the allocator releases cached blocks and retries, so the largest
    # batch that ran may be refused (one below), never a larger one allowed (issue 25 item 3).
    compare = _compare_module()
    rows = compare.compare(SPOT_CHECKS)
    oom = [r for r in rows if r.status == "oom"]
    ok = [r for r in rows if r.status == "ok"]
    assert len(oom) >= 4
    missed = [r.label for r in oom if r.fits_predicted]
    assert not missed, f"predicted to fit but ran out of memory: {missed}"
    at_limit = {f"{p} bf16 torch b{b} s{s} no-ckpt w1" for (p, s), b in BOUNDARIES.items()}
    refused = [r.label for r in ok if not r.fits_predicted and r.label not in at_limit]
    assert not refused, f"predicted not to fit but ran: {refused}"


@pytest.mark.parametrize("preset,seq", sorted(BOUNDARIES))
def test_largest_batch_at_zero_headroom_is_the_largest_the_trainer_ran_or_one_below(preset, seq):
    import dataclasses

    from catalog import hardware
    from catalog.spec import preset as get_preset
    from components.memory_estimate import planner

    # The H200 lent here reports 150,109,880,320 bytes (probe_h200.json).
    h200 = dataclasses.replace(hardware.gpu("H200"), memory_bytes=150_109_880_320)
    hw = planner.Hardware(h200, "", 1, 1)
    # The spot checks ran before the trainer compiled its loss: the eager cross-entropy.
    req = planner.Request(get_preset(preset), seq, hw, ("bf16",), (0,), "off", 0.0,
                          {"backend": "torch", "loss_kernel": "eager"})
    largest_ok = BOUNDARIES[(preset, seq)]
    assert planner.largest_batch(req, "bf16", False) in (largest_ok - 1, largest_ok)


def test_peak_reserved_is_predicted_on_configuration_families_the_fit_never_saw():
    # Issue 25 items 3 and 5: the allocator reserve is fitted on the peak reserved memory of
    # every grid that records it; each family (preset x width x sequence x checkpointing) is
    # predicted by a fit that left that whole family out.
    compare = _compare_module()
    rows = [r for p in compare.RESERVED_GRIDS for r in compare.compare(p)]
    held = compare.reserved_summary(compare.held_out_reserved(rows))
    assert held["rows"] >= 150 and held["families"] >= 30
    assert held["median_abs_gib"] <= 2.0, compare.reserve_report()
    assert -6.0 <= held["worst_under_gib"] and held["worst_over_gib"] <= 6.0, compare.reserve_report()
    # The shipped constants are the fit on all of them, not tuned by hand.
    from components.memory_estimate import estimator as est

    fixed, fsdp2, of_loss, of_fsdp = compare.fit_reserve(rows)
    assert est.ALLOCATOR_RESERVE_FIXED == pytest.approx(fixed, abs=0.01 * 2**30)
    assert est.ALLOCATOR_RESERVE_FSDP2 == pytest.approx(fsdp2, abs=0.01 * 2**30)
    assert est.ALLOCATOR_RESERVE_OF_LOSS == pytest.approx(of_loss, abs=0.005)
    assert est.ALLOCATOR_RESERVE_OF_FSDP == pytest.approx(of_fsdp, abs=0.005)


def test_reserved_peak_of_the_compiled_loss_run_is_not_under_predicted():
    # Held out of the fit entirely: the one committed run with the compiled cross-entropy and
    # a recorded reserve (1b, batch 4, seq 4096, TE, one H200: 44,612,749,824 allocated,
    # 50,193,235,968 reserved; benchmarks/trainer/raw/like_for_like_h200.log). The old reserve
    # took 0.85 x fp32 logits the compiled loss never makes.
    from catalog.spec import preset
    from components.common.training_setup import TrainingSetup
    from components.memory_estimate.estimator import estimate

    e = estimate(TrainingSetup(preset("1b"), 4, 4096, "bf16", loss_kernel="compiled"), "H200")
    assert 50_193_235_968 <= e.peak_reserved_bytes <= 1.08 * 50_193_235_968
    big = estimate(TrainingSetup(preset("1b"), 32, 2048, "bf16", loss_kernel="compiled"), "H200")
    logits16 = 32 * 2048 * 128256 * 2
    assert big.breakdown["allocator_reserve"] < 6 * 2**30 + 0.7 * logits16


FSDP1_GRID = ROOT / "benchmarks" / "memory" / "fsdp1_h200_grid.json"
THROUGHPUT_GRID = ROOT / "benchmarks" / "throughput" / "h200_grid.json"


def test_estimate_of_te_fsdp_py_fsdp1_is_within_issue_18s_bar_outside_its_calibration_points():
    # TE's examples/pytorch/fsdp/fsdp.py (FSDP1) on an H200, world size 1: the FSDP1 terms
    # (NO_SHARD at world size 1, every block's FP8 weights held from forward to backward,
    # hidden dropout masks, the fp8-current / fp8-block tensors) were read off the
    # calibration points; the validation points (other batch x sequence x depth mixes) check them.
    compare = _compare_module()
    rows = compare.compare(FSDP1_GRID, split="validation")
    s = compare.summary(rows)
    assert s["ok_rows"] >= 10
    assert s["median_abs_error"] <= 0.02, compare.markdown(rows)
    assert s["worst_abs_error"] <= 0.05, compare.markdown(rows)
    assert s["worst_under_prediction"] >= -0.03, compare.markdown(rows)
    cal = compare.summary(compare.compare(FSDP1_GRID, split="calibration"))
    assert cal["ok_rows"] >= 40 and cal["median_abs_error"] <= 0.02 and cal["worst_under_prediction"] >= -0.03
    import json

    results = json.loads(FSDP1_GRID.read_text())["results"]
    for key, values in (("layers", {10, 24}), ("batch_size", {1, 4, 8, 16}), ("seq_length", {2048, 4096, 8192}),
                        ("precision", {"bf16", "fp16", "fp8", "fp8-current", "fp8-block"}),
                        ("ac", {"off", "ckpt", "off-no-te-fsdp"})):
        assert {r[key] for r in results} == values, key


def test_estimate_matches_the_trainer_peaks_recorded_with_the_throughput_grid():
    # 70 trainer runs (TE backend, world size 1) of benchmarks/throughput/h200_grid.json:
    # widths 2048-8192, bf16 / fp8 / fp8-current / fp8-block, checkpointing on and off.
    compare = _compare_module()
    rows = compare.compare(THROUGHPUT_GRID)
    s = compare.summary(rows)
    assert s["ok_rows"] >= 60
    assert s["median_abs_error"] <= 0.01, compare.markdown(rows)
    assert s["worst_abs_error"] <= 0.03, compare.markdown(rows)


LIKE_FOR_LIKE = ROOT / "benchmarks" / "trainer" / "raw" / "like_for_like_h200.json"


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_estimate_matches_the_compiled_and_eager_loss_peaks_measured_on_an_h200(precision):
    # The trainer's two loss kernels, measured in one device call (1b preset, batch 4, seq
    # 4096, TE backend, one H200): the compiled cross-entropy's 18.5 GiB saving is modelled.
    import json

    from catalog.spec import preset
    from components.common.training_setup import TrainingSetup
    from components.memory_estimate.estimator import estimate

    runs = json.loads(LIKE_FOR_LIKE.read_text())
    for kernel, key in (("eager", f"1b-b4/trainer-te/{precision}"),
                        ("compiled", f"1b-b4/trainer-te/{precision}+compiled-loss")):
        measured = runs[key]["trainer"]["peak_allocated_bytes"]
        e = estimate(TrainingSetup(preset("1b"), 4, 4096, precision, loss_kernel=kernel), "H200")
        assert e.peak_allocated_bytes == pytest.approx(measured, rel=0.01), (kernel, e.phase)


def _fsdp_py_cli_flags(result: dict) -> list[str]:
    """TE's fsdp.py as the CLI describes it (the flags ``benchmarks/memory/compare.py``'s
    ``fsdp1_setup`` sets in Python): bf16 (or fp16) parameters, gradients and foreach Adam
    moments, no master copy, FSDP1, hidden dropout 0.1."""
    dtype = "fp16" if result["precision"] == "fp16" else "bf16"
    return ["--model-preset", "te-fsdp-example", "--num-layers", str(result["layers"]),
            "--gpu", "H200", "--world-size", "1", "--batch-size", str(result["batch_size"]),
            "--seq-length", str(result["seq_length"]), "--precisions", result["precision"],
            "--activation-checkpointing", "on" if result["ac"] == "ckpt" else "off",
            "--param-dtype", dtype, "--no-master-weights", "--optimizer-state-dtype", "bf16",
            "--fsdp-version", "1", "--optimizer", "adamw-foreach", "--dropout", "0.1",
            "--headroom", "0", "--json"]


def test_cli_describes_te_fsdp_py_and_matches_the_python_api_on_its_h200_grid(capsys):
    # Issue 25 item 4: from the command line, --fsdp-version 1 alone under-predicted fsdp.py by
    # ~10% (no dropout masks, fused AdamW); with --dropout and --optimizer the CLI gives the
    # Python API's prediction, within the grid's accuracy bar (the 16 validation points).
    import json
    import statistics

    from components.memory_estimate import cli
    from components.memory_estimate.estimator import estimate

    compare = _compare_module()
    errors = []
    for r in json.loads(FSDP1_GRID.read_text())["results"]:
        if r["split"] != "validation" or r["status"] != "ok":
            continue
        assert cli.main(_fsdp_py_cli_flags(r)) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["dropout"] == 0.1 and doc["optimizer"] == "adamw-foreach"
        python_api = estimate(compare.fsdp1_setup(r), "H200").peak_allocated_bytes
        assert doc["peak_allocated_bytes"] == python_api, r["name"]
        errors.append(abs(doc["peak_allocated_bytes"] / r["peak_allocated_bytes"] - 1))
    assert len(errors) >= 10
    assert statistics.median(errors) <= 0.02 and max(errors) <= 0.05, errors


def test_boundary_script_plans_six_configurations_and_judges_the_planner_by_the_issues_bar():
    # benchmarks/memory/boundary.py runs on a GPU later; what it decides is checked here.
    boundary = importlib.import_module("benchmarks.memory.boundary")
    confs = boundary.CONFIGURATIONS
    assert len(confs) >= 6 and {c[3] for c in confs} == {True, False}
    assert len({c[0] for c in confs}) >= 4
    runs = [{"batch_size": b, "status": "ok"} for b in (15, 16, 17)] + [
        {"batch_size": 18, "status": "oom"}]
    assert boundary.verdict(16, runs)["within_bar"] and boundary.verdict(17, runs)["within_bar"]
    assert boundary.verdict(18, runs)["above"] and not boundary.verdict(18, runs)["within_bar"]
    assert not boundary.verdict(15, runs)["within_bar"]  # two below: users lose a batch
    assert not boundary.verdict(16, runs[:3])["boundary_found"]  # never ran out of memory
    assert boundary.predicted_largest("1b", None, 2048, False, "bf16", 150_109_880_320) >= 16
