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
import json
from pathlib import Path

import pytest

from kfp_sagemaker_blackwell.planning import estimator as est

ROOT = Path(__file__).resolve().parent.parent
SPOT_CHECKS = ROOT / "benchmarks" / "memory" / "spot_checks_h200.json"
GRID = ROOT / "benchmarks" / "memory" / "h200_grid.json"


def _compare_module():
    return importlib.import_module("benchmarks.memory.compare")


def assert_within_3_percent_median_and_8_percent_worst(measured: Path, ok_rows: int) -> None:
    """The estimate against the runs of ``measured`` that completed (at least ``ok_rows``)."""
    compare = _compare_module()
    rows = compare.compare(measured)
    s = compare.summary(rows)
    assert s["ok_rows"] >= ok_rows
    assert s["median_abs_error"] <= 0.03, compare.markdown(rows)
    assert s["worst_abs_error"] <= 0.08, compare.markdown(rows)


def test_estimate_is_within_3_percent_median_and_8_percent_worst_on_the_h200_grid():
    assert_within_3_percent_median_and_8_percent_worst(GRID, ok_rows=16)
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
    assert_within_3_percent_median_and_8_percent_worst(SPOT_CHECKS, ok_rows=7)


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

    from kfp_sagemaker_blackwell.catalog import hardware
    from kfp_sagemaker_blackwell.catalog.spec import preset as get_preset
    from kfp_sagemaker_blackwell.planning import planner

    # The H200 lent here reports 150,109,880,320 bytes (probe_h200.json).
    h200 = dataclasses.replace(hardware.gpu("H200"), memory_bytes=150_109_880_320)
    hw = planner.Hardware(h200, "", 1, 1)
    # The spot checks ran before the trainer compiled its loss (the eager cross-entropy) and
    # before it set expandable segments (PyTorch's default allocator).
    req = planner.Request(get_preset(preset), seq, hw, ("bf16",), (0,), "off", 0.0,
                          {"backend": "torch", "loss_kernel": "eager",
                           "expandable_segments": False})
    largest_ok = BOUNDARIES[(preset, seq)]
    assert planner.largest_batch(req, "bf16", False) in (largest_ok - 1, largest_ok)


def test_peak_reserved_is_predicted_on_configuration_families_the_fit_never_saw():
    # Issue 25 items 3 and 5: the allocator reserve is fitted on the peak reserved memory of
    # every grid that records it; each family (preset x width x sequence x checkpointing) is
    # predicted by a fit that left that whole family out, its runs and its outcomes.
    compare = _compare_module()
    rows = [r for p in compare.RESERVED_GRIDS for r in compare.compare(p)]
    held = compare.reserved_summary(compare.held_out_reserved(rows))
    assert held["rows"] >= 150 and held["families"] >= 30
    # Before (allocated + 0.67 x the loss's largest tensor ...): median 1.76, worst -5.7 / +5.2.
    assert held["median_abs_gib"] <= 1.25, compare.reserve_report()
    # Over-prediction is the safe side; the boundary constraints push 3b checkpointed up.
    assert -6.0 <= held["worst_under_gib"] and held["worst_over_gib"] <= 7.5, compare.reserve_report()
    # The shipped constants are the fit on all of them, not tuned by hand.
    from kfp_sagemaker_blackwell.planning import estimator as est

    fitted = compare.fit_reserve(rows)
    assert est.RESERVE_COEFFICIENTS[0] == pytest.approx(fitted[0], abs=0.01 * 2**30)
    assert est.RESERVE_COEFFICIENTS[1:] == pytest.approx(fitted[1:], abs=0.005)


BOUNDARY_DOC = ROOT / "benchmarks" / "memory" / "boundary_h200.json"


def test_planner_answers_the_measured_h200_boundary_or_one_below_on_all_six():
    # Issue 25's done-when: the largest-batch answer equals the measured largest batch or one
    # below on every boundary configuration, never above (boundary_h200.json: TE, compiled
    # loss, one H200; before: 32/34, 40/53, 16/17, 28/31, 13/15, 12/13).
    boundary = importlib.import_module("benchmarks.memory.boundary")
    doc = json.loads(BOUNDARY_DOC.read_text())
    answers = {}
    for b in doc["boundaries"]:
        got = boundary.predicted_largest(b["preset"], b["num_layers"], b["seq_length"],
                                         b["activation_checkpointing"], b["precision"],
                                         doc["gpu_memory_bytes"], expandable_segments=False)
        answers[(b["preset"], b["seq_length"], b["activation_checkpointing"])] = (
            got, b["measured_largest"])
    assert len(answers) == 6
    assert all(m - 1 <= got <= m for got, m in answers.values()), answers


def test_planner_answers_torch_backend_boundaries_no_fit_saw_within_the_bar():
    # Validation outside the fit: boundary_h200_torch.json (torch backend, compiled loss, one
    # H200; 3b s8192 ckpt, 3b s2048 no-ckpt, 1b s8192 ckpt), measured after the reserve was
    # fitted and never used by it (compare.RESERVED_GRIDS does not list it).
    boundary = importlib.import_module("benchmarks.memory.boundary")
    compare = _compare_module()
    path = ROOT / "benchmarks" / "memory" / "boundary_h200_torch.json"
    assert path not in compare.RESERVED_GRIDS
    doc = json.loads(path.read_text())
    assert len(doc["boundaries"]) == 3
    for b in doc["boundaries"]:
        got = boundary.predicted_largest(b["preset"], b["num_layers"], b["seq_length"],
                                         b["activation_checkpointing"], b["precision"],
                                         doc["gpu_memory_bytes"], backend=b["backend"],
                                         expandable_segments=False)
        assert b["boundary_found"] and b["measured_largest"] - 1 <= got <= b["measured_largest"], b


def test_held_out_fits_keep_the_grids_out_of_memory_runs_out_and_the_boundaries_within_reach():
    # Leave-one-family-out on the fit decision itself: a fit that never saw a family predicts
    # its out-of-memory runs (spot checks, boundaries) not to fit, and answers the boundaries.
    compare = _compare_module()
    rows = [r for p in compare.RESERVED_GRIDS for r in compare.compare(p)]
    oom_families = sorted({r.family for r in rows if r.status == "oom"}, key=str)
    assert len(oom_families) >= 7
    missed = []
    for fam in oom_families:
        coef = compare.fit_reserve([r for r in rows if r.family != fam],
                                   compare._constraints_without(rows, fam))
        missed += [r.label for r in rows if r.family == fam and r.status == "oom"
                   and compare.predicted_reserve(r, coef) + r.context_bytes <= r.gpu_memory_bytes]
    # Only 3b s4096 with checkpointing (see below): its held-out fit lets b32 and b33 fit.
    assert sorted(missed) == ["3b bf16 te b32 s4096 ckpt w1", "3b bf16 te b33 s4096 ckpt w1"], missed
    verdicts = compare.held_out_boundaries(rows)
    within = [v for v in verdicts if v["measured_largest"] - 1 <= v["held_out"] <= v["measured_largest"]]
    # The one exception: 3b s4096 with checkpointing is the only family whose runs show the
    # checkpointed spill (gradients and moments beyond one block's recompute splitting the
    # compiled logits gradient's segment); without it that term has no data and the answer
    # is 34 for a measured 31.
    assert [v["configuration"] for v in verdicts if v not in within] == ["3b s4096 ckpt bf16"], verdicts
    assert all(v["shipped"] in (v["measured_largest"] - 1, v["measured_largest"]) for v in verdicts)


def test_reserved_peak_of_the_compiled_loss_run_is_not_under_predicted():
    # Held out of the fit entirely: the one committed run with the compiled cross-entropy and
    # a recorded reserve (1b, batch 4, seq 4096, TE, one H200: 44,612,749,824 allocated,
    # 50,193,235,968 reserved; benchmarks/trainer/raw/like_for_like_h200.log). The old reserve
    # took 0.85 x fp32 logits the compiled loss never makes.
    from kfp_sagemaker_blackwell.catalog.spec import preset
    from kfp_sagemaker_blackwell.planning.estimator import estimate
    from kfp_sagemaker_blackwell.planning.training_setup import TrainingSetup

    e = estimate(TrainingSetup(preset("1b"), 4, 4096, "bf16", loss_kernel="compiled",
                               expandable_segments=False), "H200")
    assert 50_193_235_968 <= e.peak_reserved_bytes <= 1.08 * 50_193_235_968
    big = estimate(TrainingSetup(preset("1b"), 32, 2048, "bf16", loss_kernel="compiled",
                                 expandable_segments=False), "H200")
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


FSDP1_HELD_OUT = ROOT / "benchmarks" / "memory" / "fsdp1_h100_heldout.json"


def _fsdp1_family(result: dict) -> tuple:
    args = result["fsdp_args"].split()
    return (result["layers"], args[args.index("-n") + 1], args[args.index("-d") + 1], result["seq_length"])


def test_estimate_of_te_fsdp_py_is_within_the_bar_on_families_no_term_was_read_from():
    # Issue 36 item 5: 16 fsdp.py runs on one H100 (session v7, 2026-12-07) at widths, depths and
    # sequences of no calibration point (hidden 1024/3072/4096, head size 64, 4-32 layers,
    # sequence 1024-16384, batch 1-32; bf16, fp8, fp8-current, fp8-block; checkpointing on and
    # off). Measured on the 15 whose (depth, heads, head size, sequence) no calibration point
    # has: median 0.4%, worst +4.2% (over), worst under -1.1%. The 16th (24 layers, s8192,
    # batch 1, ckpt, fp8) shares its family with calibration points: -0.3%.
    compare = _compare_module()
    calibration = {_fsdp1_family(r) for r in json.loads(FSDP1_GRID.read_text())["results"]}
    held_out = json.loads(FSDP1_HELD_OUT.read_text())["results"]
    all_rows = compare.compare(FSDP1_HELD_OUT)
    assert len(all_rows) == len(held_out) == 16
    outside = [(r, row) for r, row in zip(held_out, all_rows, strict=True) if _fsdp1_family(r) not in calibration]
    assert len(outside) == 15
    assert {r["precision"] for r, _ in outside} == {"bf16", "fp8", "fp8-current", "fp8-block"}
    assert {r["ac"] for r, _ in outside} == {"off", "ckpt"}
    rows = [row for _, row in outside]
    s = compare.summary(rows)
    assert s["ok_rows"] == 15
    assert s["median_abs_error"] <= 0.02, compare.markdown(rows)
    assert s["worst_abs_error"] <= 0.05, compare.markdown(rows)
    assert s["worst_under_prediction"] >= -0.03, compare.markdown(rows)


def test_estimate_matches_the_trainer_peaks_recorded_with_the_throughput_grid():
    # 70 trainer runs (TE backend, world size 1) of benchmarks/throughput/h200_grid.json:
    # widths 2048-8192, bf16 / fp8 / fp8-current / fp8-block, checkpointing on and off.
    compare = _compare_module()
    rows = compare.compare(THROUGHPUT_GRID)
    s = compare.summary(rows)
    assert s["ok_rows"] >= 60
    assert s["median_abs_error"] <= 0.01, compare.markdown(rows)
    assert s["worst_abs_error"] <= 0.03, compare.markdown(rows)


def test_estimate_matches_the_trainers_one_gpu_rows_of_every_mode():
    """Issue 40's rows (benchmarks/trainer/small_steps.json, every session that ran them):
    FSDP2, the unsharded module and qinit priced within 3% under / 5% over their allocated
    peaks; a graphed step never more than 3% under its footprint (the allocated peak plus the
    graphs' pool's free part). A new session's rows are checked as they are appended."""
    compare = _compare_module()
    rows = compare.small_steps()
    eager = [r for r in rows if "graphs" not in r.label]
    graphed = [r for r in rows if "graphs" in r.label]
    assert [r.label for r in eager if not -0.03 <= r.error <= 0.05] == [], compare.markdown(eager)
    assert [r.label for r in graphed if r.error < -0.03] == [], compare.markdown(graphed)
    modes = {r.label.split()[4] for r in rows}
    assert {"FSDP2", "unsharded", "qinit", "qinit+unsharded", "graphs", "graphs+qinit"} <= modes
    assert {r.family[0] for r in eager} >= {"1b", "te-fsdp-example"} and len(graphed) >= 5


def test_small_step_rows_with_a_lever_the_estimator_lacks_are_left_out(tmp_path):
    compare = _compare_module()
    row = {"id": "S/1b-b1-s2048/fp8", "gpu": "NVIDIA H100 80GB HBM3", "model_preset": "1b", "batch_size": 1,
           "seq_length": 2048, "precision": "fp8", "levers": [], "peak_allocated_gib": 20.21}
    graphed_without_pool = {**row, "levers": ["graphs"]}
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([row, {**row, "levers": ["prefetch"]}, graphed_without_pool,
                                {**row, "levers": ["graphs"], "graph_pool_free_gib": 0.54}]))
    rows = compare.small_steps(path)
    assert [r.label.split()[4] for r in rows] == ["FSDP2", "graphs"]
    assert rows[1].measured_allocated == pytest.approx((20.21 + 0.54) * 2**30, rel=1e-9)


LIKE_FOR_LIKE = ROOT / "benchmarks" / "trainer" / "raw" / "like_for_like_h200.json"


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_estimate_matches_the_compiled_and_eager_loss_peaks_measured_on_an_h200(precision):
    # The trainer's two loss kernels, measured in one device call (1b preset, batch 4, seq
    # 4096, TE backend, one H200): the compiled cross-entropy's 18.5 GiB saving is modelled.
    import json

    from kfp_sagemaker_blackwell.catalog.spec import preset
    from kfp_sagemaker_blackwell.planning.estimator import estimate
    from kfp_sagemaker_blackwell.planning.training_setup import TrainingSetup

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

    from kfp_sagemaker_blackwell.components.memory_estimate import __main__ as cli
    from kfp_sagemaker_blackwell.planning.estimator import estimate

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


def _fake_gpu(boundary_of):
    """A trainer stand-in for boundary.py: a batch runs when it is at most ``boundary_of(spec)``,
    else runs out of memory; records the batches it was asked to run."""
    calls = []

    def run(spec, timeout_s):
        calls.append((spec["preset"], spec["seq_length"], spec["batch_size"]))
        ok = spec["batch_size"] <= boundary_of(spec)
        # like measure_grid.measure's record: the depth is in "model", no "num_layers" or "steps"
        rec = {k: v for k, v in spec.items() if k not in ("num_layers", "steps")}
        return {**rec, "model": {"num_layers": spec["num_layers"]}, "status": "ok" if ok else "oom",
                "peak_reserved_bytes": 1}
    return run, calls


@pytest.mark.parametrize(("predicted", "largest", "expected_runs"), [
    (16, 16, [16, 17]),              # the planner right: two runs
    (16, 17, [16, 17, 19, 18]),      # one below: gallop +1, +2, then bisect
    (18, 16, [18, 17, 15, 16]),      # above: down -1, -2, then bisect
    (10, 30, [10, 11, 13, 17, 25, 41, 33, 29, 31, 30]),  # far below: 10 runs, not 21
    (1, 0, [1]),                     # batch 1 does not fit: nothing below to try
])
def test_boundary_search_gallops_then_bisects(predicted, largest, expected_runs):
    boundary = importlib.import_module("benchmarks.memory.boundary")
    asked = []

    def probe(b):
        asked.append(b)
        return "ok" if b <= largest else "oom"
    boundary.search(predicted, probe, predicted + boundary.MAX_ABOVE)
    assert asked == expected_runs
    runs = [{"batch_size": b, "status": "ok" if b <= largest else "oom"} for b in asked]
    if largest:
        assert boundary.verdict(predicted, runs)["measured_largest"] == largest


def test_boundary_search_stops_on_an_error_and_at_its_ceiling():
    boundary = importlib.import_module("benchmarks.memory.boundary")
    asked = []
    boundary.search(8, lambda b: asked.append(b) or ("ok" if b < 9 else "error"), 100)
    assert asked == [8, 9]
    asked.clear()
    boundary.search(8, lambda b: asked.append(b) or "ok", 12)  # never out of memory
    assert asked == [8, 9, 11]


def test_boundary_resumes_from_the_json_a_time_boxed_call_left(tmp_path, monkeypatch):
    boundary = importlib.import_module("benchmarks.memory.boundary")
    clock = [0.0]
    monkeypatch.setattr(boundary.time, "monotonic", lambda: clock[0])
    offsets = {"1b": 1, "3b": 0, "8b": -2, "te-fsdp-example": 3}

    def largest(spec):
        conf = (spec["preset"], spec["num_layers"], spec["seq_length"], spec["activation_checkpointing"],
                spec["precision"])
        return boundary.predicted_largest(*conf, 150_109_880_320) + offsets[spec["preset"]]
    fake, calls = _fake_gpu(largest)

    def slow(spec, timeout_s):  # every run takes 40 s of the budget
        clock[0] += 40
        return fake(spec, timeout_s)
    monkeypatch.setattr(boundary, "_run", slow)
    out = tmp_path / "boundary.json"
    out.write_text(json.dumps({"command": "first", "gpu_memory_bytes": 150_109_880_320,
                               "cuda_alloc_conf": None, "results": [], "boundaries": []}))
    assert boundary.main(["--out", str(out), "--resume", "--time-budget", "300"]) == 3
    first = list(calls)
    assert 0 < len(first) <= 300 // 40 + 1
    doc = json.loads(out.read_text())
    assert len(doc["results"]) == len(first) and not all(b["boundary_found"] for b in doc["boundaries"])
    assert boundary.main(["--out", str(out), "--resume"]) == 0
    again = calls[len(first):]
    assert not set(first) & set(again)  # nothing measured twice
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("first ; python benchmarks/memory/boundary.py")
    assert len(doc["boundaries"]) == len(boundary.CONFIGURATIONS)
    for b in doc["boundaries"]:
        assert b["boundary_found"] and b["measured_largest"] == b["predicted_largest"] + offsets[b["preset"]]
    assert [b["within_bar"] for b in doc["boundaries"]] == [offsets[b["preset"]] in (0, 1)
                                                            for b in doc["boundaries"]]
    assert len(calls) < 4 * len(boundary.CONFIGURATIONS)  # linear from p-1 needed p-1..p+4 for +3


def test_planner_never_answers_above_the_measured_h200_boundary():
    # benchmarks/memory/boundary_h200.json: six configurations searched to the first OOM batch on
    # an H200 (compiled loss, TE). The planner's largest batch, recomputed now, never above.
    boundary = importlib.import_module("benchmarks.memory.boundary")
    doc = json.loads((ROOT / "benchmarks" / "memory" / "boundary_h200.json").read_text())
    prober = boundary.Prober(doc, 2, 1.0, 0.0, runner=lambda spec, t: pytest.fail("no runs here"))
    assert len(doc["boundaries"]) == len(boundary.CONFIGURATIONS) >= 6
    for preset, layers, seq, ac, prec in boundary.CONFIGURATIONS:
        conf = {"preset": preset, "num_layers": layers, "seq_length": seq,
                "activation_checkpointing": ac, "precision": prec}
        predicted = boundary.predicted_largest(preset, layers, seq, ac, prec, doc["gpu_memory_bytes"],
                                               expandable_segments=False)
        v = boundary.verdict(predicted, prober.runs(conf))
        assert v["boundary_found"], conf
        assert not v["above"], (conf, predicted, v["measured_largest"])


# ---- issue 41: expandable segments (the trainer's default), one H100, 2026-12-06 ----------


def _h100_boundaries():
    """(file, document, boundary, largest batch that ran, first batch out of memory or None)
    of every configuration searched under expandable segments."""
    compare = _compare_module()
    out = []
    for path in compare.EXPANDABLE_BOUNDARIES:
        doc = json.loads(path.read_text())
        assert compare.expandable_of(doc)  # cuda_alloc_conf unset: the trainer's default
        for b in doc["boundaries"]:
            keys = ("preset", "num_layers", "seq_length", "activation_checkpointing", "precision")
            runs = [r for r in doc["results"] if all(r[k] == b[k] for k in keys)]
            ran = max(r["batch_size"] for r in runs if r["status"] == "ok")
            oom = min((r["batch_size"] for r in runs if r["status"] == "oom"), default=None)
            out.append((path.name, doc, b, ran, oom))
    return out


def _h100_answer(doc, b):
    boundary = importlib.import_module("benchmarks.memory.boundary")
    return boundary.predicted_largest(b["preset"], b["num_layers"], b["seq_length"],
                                      b["activation_checkpointing"], b["precision"],
                                      doc["gpu_memory_bytes"], gpu=doc["gpu"],
                                      backend=b.get("backend", "te"),
                                      expandable_segments=_compare_module().expandable_of(doc))


def test_planner_answers_the_h100_expandable_segments_boundaries_within_the_bar():
    # Recomputed for the H100's memory (the files' own predicted_largest were the planner of
    # that day, partly for the H200's memory). Measured: TE 3b L8 s2048 fp8 27 (28 oom), TE 8b
    # L6 s4096 ckpt 21 (22 oom), torch 8b L8 s4096 ckpt 18 (19 oom); incomplete: torch 3b L8
    # s2048 22 ran, 24 oom (23 not run), TE 14b L6 s4096 5 ran (no oom reached). Before: 23,
    # 16, 11 with the default allocator's reserve.
    found = 0
    for name, doc, b, ran, oom in _h100_boundaries():
        got = _h100_answer(doc, b)
        where = (name, b["preset"], b["seq_length"], b["activation_checkpointing"], got, ran, oom)
        assert got >= ran - 1, where  # never more than one below a batch that ran
        if oom is not None:
            assert got <= ran, where  # never above the largest that ran, never at a failure
        if oom == ran + 1:
            found += 1
            assert got in (ran - 1, ran), where
    assert found == 3


def test_planner_answers_held_out_h100_boundaries_within_the_bar_and_its_answer_runs_three_times():
    # Issue 41's check on shapes no constant was fitted on (one H100, 2026-12-07). Session v7:
    # TE 1b s8192 ckpt fp8 14 (15 oom), 8b L4 s2048 fp8 27 (28), 3b L6 s4096 ckpt bf16 30 (31),
    # 14b L4 s8192 ckpt bf16 8 (9); torch 1b s8192 ckpt 14 (15). Session v8: torch 8b L4 s2048
    # no-ckpt 22 (23), torch 3b L6 s4096 ckpt 30 (31). The planner answers 13, 26, 29, 8, 13, 21
    # and 29, and each answer ran three times in fresh processes. Session v9: torch 14b L6 s4096
    # no-ckpt 5 (6): the answer 5 is the measured largest, ran three times. Undecided in their
    # own files, decided by a later session's: v7's torch 8b L4 (23 not run; v8) and v8's torch
    # 14b L6 (5 ran once; v9). Each answer that was run ran; no batch at or below it failed.
    complete = undecided = 0
    for path in _compare_module().HELD_OUT_BOUNDARIES:
        doc = json.loads(path.read_text())
        for b in doc["boundaries"]:
            keys = ("preset", "num_layers", "seq_length", "activation_checkpointing", "precision")
            runs = [r for r in doc["results"] if all(r[k] == b[k] for k in keys)]
            ran = max(r["batch_size"] for r in runs if r["status"] == "ok")
            oom = min((r["batch_size"] for r in runs if r["status"] == "oom"), default=None)
            got = _h100_answer(doc, b)
            where = (path.name, b["preset"], b["seq_length"], b["activation_checkpointing"], got, ran, oom)
            assert got == b["predicted_largest"], where  # the answer the repeats ran is today's
            assert [r["status"] for r in runs if r["batch_size"] == got][:1] == ["ok"], where
            default = boundary_answer_without_expandable_segments(doc, b)
            assert default <= got <= ran, where
            if oom is None:
                undecided += 1
                continue
            assert ran - 1 <= got < oom, where
            if oom == ran + 1:
                complete += 1
                assert b["planner_ran_every_time"] and b["planner_runs"] == ["ok"] * 3, where
                assert [r["status"] for r in runs if r["batch_size"] == got] == ["ok"] * 3, where
            else:
                undecided += 1
    assert (complete, undecided) == (8, 2)


def boundary_answer_without_expandable_segments(doc: dict, b: dict) -> int:
    boundary = importlib.import_module("benchmarks.memory.boundary")
    return boundary.predicted_largest(b["preset"], b["num_layers"], b["seq_length"],
                                      b["activation_checkpointing"], b["precision"],
                                      doc["gpu_memory_bytes"], gpu=doc["gpu"],
                                      backend=b.get("backend", "te"), expandable_segments=False)


def test_expandable_reserve_fitted_on_te_decides_every_torch_run_and_the_other_way_round():
    compare = _compare_module()
    gib = 2**30
    hi, lo = compare.fit_expandable_reserve((compare.EXPANDABLE_BOUNDARY_TE,))
    shipped = est.ALLOCATOR_RESERVE_EXPANDABLE
    assert lo < shipped <= hi < shipped + 0.05 * gib  # the most cautious reserve TE allows
    # held out: every torch-backend run that ran fits with it, every one out of memory does not
    torch_runs = compare.boundary_runs(compare.EXPANDABLE_BOUNDARY_TORCH)
    assert len(torch_runs) == 13
    assert all((r.status == "ok") == (r.room >= shipped) for r in torch_runs)
    # fitted on torch alone (1.86 GiB) instead: TE's two boundaries come out one below, within
    # the bar, never above
    hi_torch, _ = compare.fit_expandable_reserve((compare.EXPANDABLE_BOUNDARY_TORCH,))
    te_runs = compare.boundary_runs(compare.EXPANDABLE_BOUNDARY_TE)
    assert all(r.room < hi_torch for r in te_runs if r.status == "oom")
    refused = sorted((r.configuration, r.batch_size) for r in te_runs
                     if r.status == "ok" and r.room < hi_torch)
    assert refused == [("3b L8 s2048 no-ckpt fp8", 27), ("8b L6 s4096 ckpt bf16", 21)]


def test_default_allocator_answers_stay_below_every_batch_that_failed_under_it():
    # PyTorch's default allocator (a job that turns expandable segments off): the H200 files,
    # measured before the trainer set them, keep their reserve and its answers.
    compare = _compare_module()
    boundary = importlib.import_module("benchmarks.memory.boundary")
    for path in (compare.BOUNDARY, ROOT / "benchmarks" / "memory" / "boundary_h200_torch.json"):
        doc = json.loads(path.read_text())
        assert not compare.expandable_of(doc)
        for b in doc["boundaries"]:
            got = boundary.predicted_largest(b["preset"], b["num_layers"], b["seq_length"],
                                             b["activation_checkpointing"], b["precision"],
                                             doc["gpu_memory_bytes"],
                                             backend=b.get("backend", "te"),
                                             expandable_segments=False)
            failed = [r["batch_size"] for r in doc["results"] if r["status"] == "oom"
                      and all(r[k] == b[k] for k in ("preset", "num_layers", "seq_length",
                                                     "activation_checkpointing", "precision"))]
            assert failed and got < min(failed), (path.name, b, got)


def test_edge_batches_run_slower_under_expandable_segments_and_the_estimate_says_which():
    # step_s per token of the H100 boundary runs: the batches whose allocator cache no longer
    # fits beside the step (Estimate.full_speed_bytes > the GPU; the cache model is fitted on
    # the throughput runs, never on these) ran 7.7-29% slower per token than their
    # configuration's fastest; every other run within 2.4%.
    compare = _compare_module()
    speeds = [s for p in compare.EXPANDABLE_BOUNDARIES for s in compare.edge_speed(p)]
    assert len(speeds) == 17
    assert all(s["slow"] == (not s["full_speed_predicted"]) for s in speeds), speeds
    slow = [s["slower"] for s in speeds if s["slow"]]
    assert len(slow) == 7 and min(slow) > 0.07 and max(slow) > 0.25
    assert max(s["slower"] for s in speeds if not s["slow"]) < 0.03


def test_expandable_cache_is_fitted_on_the_h100_throughput_runs():
    compare = _compare_module()
    rows = compare.expandable_cache_rows()
    assert len(rows) >= 100
    fitted = compare.fit_expandable_cache(rows)
    assert est.EXPANDABLE_CACHE_COEFFICIENTS[0] == pytest.approx(fitted[0], abs=0.005 * 2**30)
    assert est.EXPANDABLE_CACHE_COEFFICIENTS[1:] == pytest.approx(fitted[1:], abs=0.005)


def test_boundary_repeat_runs_the_planners_answer_again_and_says_whether_it_ran_every_time(tmp_path, monkeypatch):
    """Issue 41: the planner's largest batch must run three times in a row. ``--repeat 3`` runs
    it twice more after the search (fresh processes); a run that then fails is in the record."""
    boundary = importlib.import_module("benchmarks.memory.boundary")
    conf = ("1b", None, 2048, False, "bf16")
    predicted = boundary.predicted_largest(*conf, 150_109_880_320)
    flaky = {"n": 0}

    def runner(spec, timeout_s):
        if spec.get("repeat") == 2:  # the third run of the planner's answer runs out of memory
            flaky["n"] += 1
            return {**spec, "status": "oom"}
        return {**spec, "status": "ok" if spec["batch_size"] <= predicted else "oom"}
    monkeypatch.setattr(boundary, "_run", runner)
    out = tmp_path / "b.json"
    out.write_text(json.dumps({"command": "c", "gpu_memory_bytes": 150_109_880_320, "cuda_alloc_conf": None,
                               "results": [], "boundaries": []}))
    assert boundary.main(["--out", str(out), "--resume", "--configs", "1b/2048/no-ckpt/bf16",
                          "--repeat", "3"]) == 0
    b = json.loads(out.read_text())["boundaries"][0]
    assert b["measured_largest"] == predicted and b["within_bar"]  # the search ignores the repeats
    assert b["planner_runs"] == ["ok", "ok", "oom"] and b["planner_ran_every_time"] is False
    assert flaky["n"] == 1
