"""The throughput model against the trainer's steady-state step times on an H200.

benchmarks/throughput/h200_grid.json (the trainer, TE backend, one H200): a calibration
split the model's H200 constants were fitted on, and a validation split outside it. That
split is by row: 3 of its 14 configuration families (preset x width x sequence x
checkpointing) have runs in the calibration split too. The held-out figures that count are
leave-one-family-out (benchmarks/throughput/lofo_h200.json: one refit per family on every
other family, issue 25 item 5), checked below and stated in benchmarks/throughput/README.md.
"""

import importlib
import json
from pathlib import Path

import pytest

from kfp_sagemaker_blackwell.planning import throughput

ROOT = Path(__file__).resolve().parent.parent
GRID = ROOT / "benchmarks" / "throughput" / "h200_grid.json"


def _accuracy():
    return importlib.import_module("benchmarks.throughput.model_accuracy")


def test_validation_split_within_11_percent_worst_and_4_percent_median():
    # In-sample (the shipped fit sees every row). v4 (residuals fitted on the union of every
    # H200 trainer run, not on this grid alone): median 2.8%, worst 10.0%; v3 (fitted on this
    # grid): 2.8%, 10.0% (1b L16 fp8 b2 s4096); v2's fitted constants reached 8% worst here.
    acc = _accuracy()
    doc = acc.load(GRID)
    rows = acc.rows(doc, "validation")
    s = acc.summary(rows)
    assert s["rows"] >= 10, s
    assert s["median_abs_error"] <= 0.04, acc.markdown(doc)
    assert s["worst_abs_error"] <= 0.11, acc.markdown(doc)


def test_validation_speedups_over_bf16_within_0_09():
    acc = _accuracy()
    doc = acc.load(GRID)
    s = acc.summary(acc.rows(doc, "validation"))
    assert s["speedup_pairs"] >= 3, s
    # Not held out: the shipped fit sees every family; the held-out figures are the LOFO test's
    # and the held-out files'. v3: worst 0.089 (te-fsdp-example fp8 predicted to gain too
    # little); v2 reached 0.05.
    assert s["worst_speedup_error"] <= 0.09, acc.markdown(doc)


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


def test_the_1b_preset_at_the_bars_shape_is_predicted_as_todays_trainer_runs_it():
    """The 1b preset at batch 4, sequence 4096 with the compiled cross-entropy (the trainer's
    default). Session v13 (2026-12-07, one H200, today's trainer: one host thread per process)
    measured it at 71,922 tokens/s fp8 and 59,764 bf16 (raw/session_v13_h200/grid.json, in the
    union the shipped residuals are fitted on): predicted within 3%. The same shape timed by
    benchmarks/trainer/like_for_like.py before the trainer's host-thread change (65,042 fp8,
    56,187 bf16: 10.6% and 6.4% slower than v13) stays within 10%: the model follows the trainer
    users run today, not the older one."""
    import json

    from kfp_sagemaker_blackwell.catalog.spec import preset
    from kfp_sagemaker_blackwell.planning import throughput
    from kfp_sagemaker_blackwell.planning.training_setup import TrainingSetup

    v13 = {r["name"]: r for r in json.loads(
        (ROOT / "benchmarks" / "throughput" / "raw" / "session_v13_h200" / "grid.json").read_text())["results"]}
    older = json.loads((ROOT / "benchmarks" / "trainer" / "raw" / "like_for_like_h200.json").read_text())
    for precision in ("bf16", "fp8"):
        predicted = throughput.predict(TrainingSetup(preset("1b"), 4, 4096, precision), "H200").tokens_per_s_per_gpu
        today = v13[f"val-1b-L16-b4-s4096-noac-{precision}"]["tokens_per_s_per_gpu"]
        assert abs(predicted / today - 1) <= 0.03, precision
        before = older[f"1b-b4/trainer-te/{precision}+compiled-loss"]["tokens_per_s"]
        assert today > before and abs(predicted / before - 1) <= 0.10, precision


LOFO = ROOT / "benchmarks" / "throughput" / "lofo_h200.json"


def test_leave_one_family_out_predicts_families_the_fit_never_saw():
    # Every family of the grid (and of the torch-backend runs) is held out once; its runs are
    # predicted here, now, with the constants of the fold that never saw it (so a change to
    # the model that the committed folds no longer describe fails: rerun model_accuracy.py
    # --leave-one-family-out).
    import json

    acc = _accuracy()
    doc, torch_doc = acc.load(GRID), acc.load_torch()
    lofo = json.loads(LOFO.read_text())
    recorded = {r["name"]: r["predicted"] for f in lofo["folds"] for r in f["runs"]}
    for backend, d, least in (("te", doc, 20), ("torch", torch_doc, 5)):
        families = {acc.family(r) for r in d["results"] if r.get("status") == "ok"}
        held = [tuple(f["family"]) for f in lofo["folds"] if f["backend"] == backend]
        assert sorted(held, key=str) == sorted(families, key=str) and len(held) >= least
        rows = acc.held_out_rows(d, lofo, backend)
        for r in rows:
            assert abs(r.predicted / recorded[r.record["name"]] - 1) < 1e-6, r.label
    te = acc.summary(acc.held_out_rows(doc, lofo, "te"))
    torch = acc.summary(acc.held_out_rows(torch_doc, lofo, "torch"))
    assert te["rows"] >= 60 and torch["rows"] >= 6
    # The held-out figures on the grid alone (folds fitted on the grid's other families), v5
    # with session v13's parts (2026-12-07): TE median 1.4%, worst 19.2% (1b L8 fp8-block b1
    # s8192), speed-up median 0.015, worst 0.085 (v5 with the 2026-12-02 parts 1.7%, 23.5%,
    # 0.019, 0.268; v4 1.8%, 21.5%, 0.020, 0.238; v2 1.3%, 10.8%, 0.021, 0.143); torch, the 6
    # calibration-torch runs of h200_torch_grid.json in 6 families: median 6.0%, worst 18.2%
    # (5.5%, 17.5% before). Issue 25's bar is not met; these bounds keep it from getting worse.
    # The union of every run is the next test's.
    md = acc.held_out_markdown(doc, lofo, torch_doc)
    assert te["median_abs_error"] <= 0.015 and te["worst_abs_error"] <= 0.193, md
    assert te["worst_speedup_error"] <= 0.09 and te["median_speedup_error"] <= 0.016, md
    assert torch["median_abs_error"] <= 0.08 and torch["worst_abs_error"] <= 0.183, md


HELD_OUT = ROOT / "benchmarks" / "throughput" / "h200_heldout.json"
TORCH_GRID = ROOT / "benchmarks" / "throughput" / "h200_torch_grid.json"


def test_the_v3_one_shot_held_out_record_states_what_the_readme_says():
    """The record of issue 25's one-shot held-out check (spent: later models are fitted on
    these runs): 41 TE runs in 19 families absent from h200_grid.json and 10 torch runs,
    measured on 2026-12-02, predicted with the frozen v3 residuals by v3's model
    (raw/heldout_eval_v3.json). Model v5 changed the step's structure, so its code no longer
    reproduces v3's predictions (commit 1b436c7 and earlier did); the record stands as
    history: TE median 7.7%, worst 37.0% (64b L2 fp8 b2 s1024), speed-up median 0.025, worst
    0.243; torch median 3.4%, worst 28.3% (1b L8 b1 s16384)."""
    import json

    record = json.loads((ROOT / "benchmarks" / "throughput" / "raw" / "heldout_eval_v3.json").read_text())
    te, torch = record[0]["backends"]["te"], record[1]["backends"]["torch"]
    assert record[1]["fitted_rows_left_out"] == 6 and torch["rows"] == 10 and te["rows"] == 41
    assert len(te["unseen_families"]) >= 19 and len(torch["unseen_families"]) >= 9
    assert ["64b", 8192, 1024, False] in te["unseen_families"]
    assert (round(te["median_abs_error"], 3), round(te["worst_abs_error"], 3)) == (0.077, 0.370)
    assert (round(te["median_speedup_error"], 3), round(te["worst_speedup_error"], 3)) == (0.025, 0.243)
    assert (round(torch["median_abs_error"], 3), round(torch["worst_abs_error"], 3)) == (0.034, 0.283)
    worst = max(te["runs"], key=lambda r: abs(r["error"]))
    assert worst["label"].startswith("64b L2 fp8 b2 s1024")


def test_a_held_out_file_is_evaluated_per_backend_with_its_unseen_families(tmp_path):
    """model_accuracy.evaluate_held_out: a results file the fit never saw, summarised per
    backend, naming the families no fitted run belongs to."""
    import json

    acc = _accuracy()
    doc = acc.load(GRID)
    torch_doc = acc.load(acc.TORCH_RUNS)
    r = dict(next(x for x in doc["results"] if x["preset"] == "8b"), name="new",
             seq_length=32768, batch_size=1, tokens_per_s_per_gpu=30000.0, split="heldout")
    t = dict(torch_doc["results"][0], split="heldout-torch")
    path = tmp_path / "held_out.json"
    fitted_row = doc["results"][0]  # a calibration row: left out of a held-out check
    path.write_text(json.dumps({"gpu": "H200", "results": [r, t, fitted_row]}))
    out = acc.evaluate_held_out(path, fitted_on=[doc])
    assert out["fitted_rows_left_out"] == 1
    assert set(out["backends"]) == {"te", "torch"}
    assert out["backends"]["te"]["unseen_families"] == [["8b", 4096, 32768, False]]
    assert out["backends"]["te"]["runs"][0]["unseen_family"] is True
    assert out["backends"]["torch"]["rows"] == 1


LOFO_ALL = ROOT / "benchmarks" / "throughput" / "lofo_all_h200.json"


def test_union_leave_one_family_out_over_every_measured_run_meets_the_v5_bars():
    """Issue 25 items 2, 5, issue 36: every measured H200 trainer run (h200_grid.json
    2026-12-01, h200_heldout.json and h200_torch_grid.json 2026-12-02, session v13's grid and
    held-out files 2026-12-07) is predicted by a fit that never saw a run of its family (preset
    x width x sequence x checkpointing; lofo_all_h200.json), re-predicted here with each fold's
    constants. Model v5 refitted in session v13 (with its parts): TE 252 runs / 56 families
    median 4.7%, worst 24.9% (3b L4 bf16 b1 s8192, 2026-12-02), speed-up (pairs within a
    session) median 0.021, worst 0.195; per session 2026-12-01 (25 families) 2.2% / 23.8%,
    2026-12-02 (19) 7.8% / 24.9%, 2026-12-07 (56: today's trainer) 5.1% / 24.7%; torch 16 runs /
    16 families 5.8% / 18.4%. Session v12's fit (111 runs) was 3.9% / 27.7%, speed-up 0.025 /
    0.267; torch 5.1% / 18.1%. Issue 25's bar (5% / 10%, 0.04) is met at the median only; these
    bounds keep it from getting worse. (The variants considered and not shipped,
    raw/lofo_all_h200_v4a/b/c.json, v5a/b.json and v12_root_fitted.json, did worse: see the
    README.)"""
    import json

    acc = _accuracy()
    union = acc.load_union()
    lofo = json.loads(LOFO_ALL.read_text())
    recorded = {(r["file"], r["name"]): r["predicted"] for f in lofo["folds"] for r in f["runs"]}
    ok = [r for r in union["results"] if r.get("status") == "ok"]
    for backend, least in (("te", 50), ("torch", 15)):
        families = {acc.family(r) for r in ok if acc.backend_of(r) == backend}
        folds = [f for f in lofo["folds"] if f["backend"] == backend]
        assert sorted((tuple(f["family"]) for f in folds), key=str) == sorted(families, key=str)
        assert len(folds) >= least
        rows = acc.union_held_out_rows(union, lofo, backend)
        assert len(rows) == sum(acc.backend_of(r) == backend for r in ok)
        for r in rows:  # the committed folds still describe the model
            assert r.predicted == pytest.approx(recorded[(r.record["file"], r.record["name"])], rel=1e-6)
    # a fold never saw its family: the unseen families are named in its record
    assert ["64b", 8192, 1024, False] in [f["family"] for f in lofo["folds"] if f["backend"] == "te"]
    s = acc.union_summaries(union, lofo)
    md = acc.union_markdown(union, lofo)
    te, torch = s["te"]["all"], s["torch"]["all"]
    early, late, today = s["te"]["2026-12-01"], s["te"]["2026-12-02"], s["te"]["2026-12-07"]
    assert (te["families"], early["families"], late["families"], today["families"], torch["families"]) == \
        (56, 25, 19, 56, 16)
    assert te["median_abs_error"] <= 0.047 and te["worst_abs_error"] <= 0.249, md
    assert te["median_speedup_error"] <= 0.022 and te["worst_speedup_error"] <= 0.196, md
    assert early["median_abs_error"] <= 0.023 and early["worst_abs_error"] <= 0.238, md
    assert late["median_abs_error"] <= 0.078 and late["worst_abs_error"] <= 0.249, md
    assert today["median_abs_error"] <= 0.051 and today["worst_abs_error"] <= 0.247, md
    assert torch["median_abs_error"] <= 0.058 and torch["worst_abs_error"] <= 0.185, md
    assert lofo["summaries"]["te"]["all"]["rows"] == te["rows"] == 252
    assert lofo["summaries"]["te"]["all"]["median_speedup_error"] == pytest.approx(te["median_speedup_error"])


def test_the_accuracy_the_model_declares_is_its_leave_one_family_out_record():
    """planning/throughput.py declares its held-out accuracy once (its predictions' source
    string and plan_training's default runtime_margin are made from it): the median |error|
    and the worst too-fast miss over every fold of lofo_all_h200.json, and a margin that
    lets the worst run finish (a job past max_runtime_seconds is stopped before its last
    step)."""
    import json

    from kfp_sagemaker_blackwell.planning import throughput

    lofo = json.loads(LOFO_ALL.read_text())
    runs = [r for f in lofo["folds"] for r in f["runs"]]
    too_fast = max(r["predicted"] / r["measured"] - 1 for r in runs)
    assert throughput.HELD_OUT_WORST_TOO_FAST == round(too_fast, 3)
    assert throughput.HELD_OUT_MEDIAN_ERROR == round(
        lofo["summaries"]["te"]["all"]["median_abs_error"], 3)
    # the slowest run against its prediction still ends inside the margin, with room
    assert 1 + throughput.RUNTIME_MARGIN >= max(r["predicted"] / r["measured"] for r in runs) + 0.05
    assert f"median error {throughput.HELD_OUT_MEDIAN_ERROR:.1%}, worst 25%" in \
        throughput.HOPPER_SOURCE


def test_b200_llama3_8b_fp8_stays_below_the_best_published_8xb200_figure():
    """Issue 25: B200 predictions stay below the best published 8xB200 figure for the same
    model (Megatron-Bridge, Llama-3-8B, seq 8192, FP8 current scaling: about 30,600 tokens/s
    per GPU). The v4 refit leaves GPUs without a parts table unchanged (24,401 tokens/s/GPU for
    fp8 at the plan's batch 3, as v3)."""
    acc = _accuracy()
    fp8 = [r for r in acc.blackwell_rows() if r[1] in ("fp8", "fp8-current")]
    assert len(fp8) == 4 and all(0 < r[2] < 30_600 for r in fp8), fp8


HELD_OUT_H100 = ROOT / "benchmarks" / "throughput" / "heldout_eval_h100_v6.json"


def test_the_h100_session_evaluation_is_what_the_model_predicts_now():
    """Issue 36 on the H100 session of 2026-12-06 (raw/session_v6_h100, session_v6.sh):
    heldout_eval_h100_v6.json (model_accuracy.py --session ... --session-out ...) re-predicted
    here from its recorded fits, without refitting. Model v5, every run predicted with the
    cross-entropy it ran (session v22: 13 held-out runs ran eager in measure.py's process; before,
    every run was predicted eager): (a) the H200-fitted residuals (session v13's union fit) with
    the H100's parts: TE held out median 2.2%, worst too fast +20.2% (as recorded before the
    relabelling: 6.4%, +19.8%); (b) refitted on the session's grid (51 runs, 19 families),
    predicting 51 runs in 24 families none of which is in the grid: median 2.6%, worst too
    fast +19.4% (3b L4 bf16 b1 s8192; before the relabelling 4.2%, +15.0%; v4: 5.1%, +31.2%),
    worst too slow -34.0% (3b L6 fp8 b2 s1024), speed-up median 0.021, worst 0.180; torch
    refitted on its 6 calibration runs: worst +42.3% (the base file's torch residuals: 28.8%);
    (c) the reference's drift (bf16 +12.4%, fp8 +17.5% over the TE block) explains none of
    it: taken out, the held-out median grows to 7.1%. (b) ships as the H100's calibration: its
    worst too fast, which sets the margin, is (a)'s less 0.8 points; (a) is 0.4 points better
    at the median."""
    import json

    acc = _accuracy()
    ev = json.loads(HELD_OUT_H100.read_text())
    now = acc.evaluate_session(acc.SESSION_V6, fitted=ev["fits"])
    for part in ("a_v4_h200_residuals", "b_refit_on_session_grid", "c_drift_corrected"):
        assert set(now[part]) == set(ev[part])
        for name, got in now[part].items():
            was = ev[part][name]
            assert [r["name"] for r in got["runs"]] == [r["name"] for r in was["runs"]]
            assert [r["predicted"] for r in got["runs"]] == pytest.approx(
                [r["predicted"] for r in was["runs"]], rel=1e-9), (part, name)
            assert [r["measured"] for r in got["runs"]] == pytest.approx(
                [r["measured"] for r in was["runs"]], rel=1e-12)
    assert ev["held_out_families_in_grid"] == [] and ev["held_out_families"] == 24
    assert ev["session"]["gpu"] == "NVIDIA H100 80GB HBM3" and ev["session"]["date"] == "2026-12-06"
    a, b, c = (ev[k]["te_heldout"] for k in ("a_v4_h200_residuals", "b_refit_on_session_grid",
                                             "c_drift_corrected"))
    assert a["rows"] == b["rows"] == 51 and ev["a_v4_h200_residuals"]["te_all"]["rows"] == 102
    # the same-session refit misses the held-out families less at its worst than the H200
    # residuals, and within half a point of them at the median
    assert b["worst_too_fast"] < a["worst_too_fast"] and b["median_abs_error"] < a["median_abs_error"] + 0.005
    # (the speed-ups: alike, 0.021 against (a)'s 0.021)
    assert b["median_abs_error"] <= 0.026 and b["worst_too_fast"] <= 0.194 and b["worst_abs_error"] <= 0.34
    assert b["worst_speedup_error"] <= 0.18 and b["median_speedup_error"] <= 0.021
    # the drift: measured at the start and the end of the TE block; not what the misses are
    assert ev["drift"]["bf16"]["growth"] == pytest.approx(0.124, abs=0.001)
    assert ev["drift"]["fp8"]["growth"] == pytest.approx(0.175, abs=0.001)
    assert c["median_abs_error"] > b["median_abs_error"] + 0.04 and abs(b["drift_slope"]) < 0.11
    torch_b = ev["b_refit_on_session_grid"]
    assert torch_b["torch_heldout"]["rows"] == 17
    assert torch_b["torch_heldout"]["worst_abs_error"] > torch_b["torch_heldout_v4_torch_residuals"]["worst_abs_error"]


HELD_OUT_H100_V10 = ROOT / "benchmarks" / "throughput" / "heldout_eval_h100_v10.json"


def _assert_the_record_is_predicted_now(acc, directory, ev) -> None:
    """A session evaluation's recorded predictions ((a), (b), (s)) re-predicted from its
    recorded fits, without refitting: the committed file still describes the model."""
    now = acc.evaluate_session(directory, fitted=ev["fits"])
    for part in ("a_v4_h200_residuals", "b_refit_on_session_grid", "s_shipped_calibration"):
        for name, was in ev[part].items():
            if not isinstance(was, dict):
                continue
            got = now[part][name]
            assert [r["predicted"] for r in got["runs"]] == pytest.approx(
                [r["predicted"] for r in was["runs"]], rel=1e-9), (part, name)


def test_the_second_h100_session_checks_the_shipped_calibration_across_days():
    """Issue 36, session v10 (2026-12-07, raw/session_v10_h100, one host thread): parts, grid
    (68 runs), held-out families (53 runs, 25 families, none in the grid) and the reference at
    both ends of one session. heldout_eval_h100_v10.json is re-predicted here from its recorded
    fits, with the session's own parts (session_constants: parts and grid of one session).
    What it shows (model v5, every run predicted with the cross-entropy it ran, session v22):
    the shipped H100 calibration (session v6's parts and fit, a day earlier) predicts the new
    day's held-out families within its own record (median 2.2%, worst too fast +9.5% against
    +19.4%: inside its 29.4% runtime margin), while this session's own refit misses further at
    its worst (median 1.8%, worst too fast +18.6%; before the relabelling 3.6% / +12.5% shipped,
    5.0% / +22.1% own; model v4: 4.4% / +31.4% shipped, 5.3% / +44.0% own): a new calibration
    is not shipped. The reference moved under 1% over the TE block (v6: +12-18%)."""
    import json

    acc = _accuracy()
    ev = json.loads(HELD_OUT_H100_V10.read_text())
    _assert_the_record_is_predicted_now(acc, acc.SESSION_V6.with_name("session_v10_h100"), ev)
    assert ev["session"]["date"] == "2026-12-07" and ev["held_out_families_in_grid"] == []
    assert ev["held_out_families"] == 25 and abs(ev["drift"]["fp8"]["growth"]) < 0.01
    shipped, own = ev["s_shipped_calibration"], ev["b_refit_on_session_grid"]["te_heldout"]
    assert shipped["fitted_on"] == throughput.ACCURACY["H100"].record
    held = shipped["te_heldout"]
    assert held["rows"] == 53 and held["median_abs_error"] <= 0.045
    assert held["worst_too_fast"] < throughput.ACCURACY["H100"].worst_too_fast  # 9.5% < 19.4%
    assert held["median_abs_error"] <= 0.023 and held["worst_too_fast"] <= 0.095
    assert own["worst_too_fast"] > held["worst_too_fast"] + 0.05


def test_a_session_is_evaluated_with_its_own_parts():
    """session_constants: the session directory's parts.json replaces the shipped table of its
    GPU (v10's parts, 2026-12-07, not v6's of 2026-12-06, which are the shipped ones); a
    directory without one leaves the model as it is."""
    acc = _accuracy()
    v10 = acc.session_constants(acc.SESSION_V6.with_name("session_v10_h100"))
    assert "2026-12-07" in v10.parts_tables["H100"].source
    assert "2026-12-06" in throughput.constants_for("H100").parts_tables["H100"].source
    assert acc.session_constants(ROOT / "benchmarks") is acc.base()


def test_holding_the_fsdp_copies_at_their_formula_predicts_the_held_out_families_worse():
    """The study in benchmarks/throughput/README.md ("Prepared, not run"): evaluation (b) with
    one residual held. Held at its own fitted value it is (b); held at the formula's 1.0 (no
    residual on the FSDP copies) the median and the speed-up's worst get a little worse (model
    v5, every run predicted with the loss it ran: 2.7% vs 2.6%, 0.182 vs 0.180) and the worst
    too-fast miss a little better (18.4% vs 19.4%). Before session v22 relabelled the runs the
    fit put the copies at 0.51 and the formula cost 3 points of median (7.3% vs 4.2%): the
    copies' residual was absorbing the eager loss the model wrongly assumed. Fitted like for like
    it is 0.80, where the trainer's profiles read 0.78-0.85."""
    import json

    acc = _accuracy()
    ev = json.loads(HELD_OUT_H100.read_text())
    b = ev["b_refit_on_session_grid"]["te_heldout"]
    same = acc.session_variant(acc.SESSION_V6, {"fsdp_copy_scale": ev["fits"]["b"]["fsdp_copy_scale"]})
    assert same["te_heldout"]["median_abs_error"] == pytest.approx(b["median_abs_error"], abs=0.002)
    # the other four refitted from (b)'s start land near (b), not on it (v5: 13.7% vs 15.0%)
    assert same["te_heldout"]["worst_too_fast"] == pytest.approx(b["worst_too_fast"], abs=0.015)
    formula = acc.session_variant(acc.SESSION_V6, {"fsdp_copy_scale": 1.0})
    assert "fsdp_copy_scale" not in formula["fitted"] and "fsdp_copy_scale" in acc.FIT  # restored
    h = formula["te_heldout"]
    assert b["median_abs_error"] < h["median_abs_error"] < b["median_abs_error"] + 0.005  # 2.7% vs 2.6%
    assert h["worst_speedup_error"] > b["worst_speedup_error"]
    assert h["worst_too_fast"] < b["worst_too_fast"]
    assert 0.78 <= ev["fits"]["b"]["fsdp_copy_scale"] <= 0.85


def test_session_runs_are_timed_from_the_driver_log():
    """Each run's time (for the drift) comes from driver.log's call windows and the runs' own
    durations: the grid's 51 runs span its two calls, the held-out runs come after them, the
    references bracket the TE block, the torch runs come before it."""
    acc = _accuracy()
    docs = acc.load_session()
    t = {k: [r["clock_s"] for r in d["results"]] for k, d in docs.items()}
    assert all(x is not None for v in t.values() for x in v)
    assert max(t["torch"]) < min(t["ref_start"]) < min(t["grid"]) < max(t["grid"]) < min(t["heldout"])
    assert max(t["heldout"]) < min(t["heldout2"]) <= max(t["heldout2"]) < min(t["ref_end"])
    assert t["grid"] == sorted(t["grid"])
    # the grid's second call (17:03:27-17:04:15) holds its last 6 runs
    assert all(17 * 3600 + 3 * 60 + 27 <= x <= 17 * 3600 + 4 * 60 + 15 for x in t["grid"][45:])
    d = acc.drift(docs)
    first = dict(docs["grid"]["results"][0], clock_s=d["bf16"]["start_clock_s"])
    assert acc.drift_factor(first, d) == pytest.approx(1.0)
    late = dict(first, precision="fp8-block", clock_s=d["fp8"]["end_clock_s"] + 100)
    assert acc.drift_factor(late, d) == pytest.approx(1 + d["fp8"]["growth"])


def test_the_h100_is_predicted_with_its_own_fit_and_declares_its_own_accuracy():
    """Issue 36 item 3: the same-session refit (b) predicted the H100's held-out families better
    than the H200-fitted residuals (a), so the H100 ships with it (TE residuals; the torch
    backend keeps the base file's, its refit on 6 runs was worse held out). Each
    GPU declares its held-out accuracy from its own record; the H200's names stay what the
    planner's bands and plan_training's default margin read."""
    import json

    acc = _accuracy()
    from kfp_sagemaker_blackwell.planning import throughput

    ev = json.loads(HELD_OUT_H100.read_text())
    h100 = throughput.constants_for("H100")
    got = acc.values_of(h100)
    for name in acc.FIT:  # TE residuals: the session grid's fit
        assert got[name] == pytest.approx(ev["fits"]["b"][name], rel=1e-9), name
    # torch: model v5's H200 union fit of session v12, kept in the H100's file (its torch rows
    # were evaluated with them) while the H200's moved with session v13's refit
    doc = throughput.load_calibration("throughput_v5_h100.json")["values"]
    kept = {"attention_torch_gqa": doc["attention_backend_factor"]["value"]["torch-gqa"],
            "block_fixed_torch": doc["block_fixed_s"]["value"]["torch"],
            "cpu_layer_torch": doc["cpu_layer_scale"]["value"]["torch"]}
    assert kept == {"attention_torch_gqa": 1.52, "block_fixed_torch": 0.0009527, "cpu_layer_torch": 1.424}
    for name in acc.FIT_TORCH:
        assert got[name] == kept[name] != acc.values_of(throughput.DEFAULT)[name], name
    assert throughput.constants_for("H200") is throughput.DEFAULT
    assert throughput.constants_for("B200") is throughput.DEFAULT
    # the H100's held-out rows, predicted by the shipped H100 calibration, are (b)'s
    b = ev["b_refit_on_session_grid"]["te_heldout"]
    docs = acc.load_session()
    held = acc.session_split(docs)["heldout"]
    rows = acc.rows(held, None, h100)
    assert [r.predicted for r in rows] == pytest.approx([r["predicted"] for r in b["runs"]], rel=1e-9)
    from kfp_sagemaker_blackwell.catalog.spec import PRESETS
    from kfp_sagemaker_blackwell.planning.training_setup import TrainingSetup

    s = TrainingSetup(PRESETS["8b"], 1, 8192, "fp8", False, 8)
    assert throughput.predict(s, "H100").step_seconds == throughput.predict(
        s, "H100", constants=h100).step_seconds != throughput.predict(
        s, "H100", constants=throughput.DEFAULT).step_seconds
    # accuracy per GPU, from its record
    a = throughput.ACCURACY["H100"]
    assert a.median_error == round(b["median_abs_error"], 3)
    assert a.worst_too_fast == round(b["worst_too_fast"], 3)
    assert a.speedup_median_error == round(b["median_speedup_error"], 3)
    union = json.loads(acc.LOFO_ALL.read_text())["summaries"]["te"]["all"]
    assert throughput.ACCURACY["H200"].speedup_median_error == round(union["median_speedup_error"], 3)
    assert a.runtime_margin == round(a.worst_too_fast + throughput.RUNTIME_SAFETY_ALLOWANCE, 3)
    assert throughput.accuracy_for("H200") == throughput.ACCURACY["H200"]
    assert (throughput.HELD_OUT_MEDIAN_ERROR, throughput.HELD_OUT_WORST_TOO_FAST,
            throughput.RUNTIME_MARGIN) == (0.03, 0.249, 0.349)
    assert throughput.accuracy_for("B200") is None
    assert "measured H100 parts" in throughput.predict(s, "H100").source
    assert f"median error {a.median_error:.1%}, worst 19%" in throughput.H100_SOURCE


def test_held_out_misses_read_in_milliseconds():
    """model_accuracy.py --misses-in-ms (session v10): the held-out runs binned by measured step
    time, the worst too-fast miss and the most ms past the prediction per bin, and the relative
    margin a fixed per-step allowance would need to cover every run."""
    acc = _accuracy()
    runs = [{"source": "a", "name": "x", "measured_ms": 100.0, "predicted_ms": 80.0},   # +25%, 20 ms
            {"source": "a", "name": "y", "measured_ms": 120.0, "predicted_ms": 125.0},  # too slow
            {"source": "b", "name": "z", "measured_ms": 1000.0, "predicted_ms": 900.0}]  # +11.1%, 100 ms
    m = acc.misses_in_ms(runs, bins=(150.0,), allowances_ms=(0.0, 20.0))
    small, large = m["bins"]
    assert (small["runs"], large["runs"]) == (2, 1)
    assert small["worst_too_fast"] == pytest.approx(0.25) and small["most_ms_past"] == pytest.approx(20.0)
    assert small["worst_run"] == "a: x" and large["most_ms_past"] == pytest.approx(100.0)
    # c = 0: the worst ratio (100/80); c = 20 ms: the large step decides ((1000 - 20) / 900)
    assert m["relative_margin_for_allowance_ms"] == pytest.approx({0.0: 0.25, 20.0: 980 / 900 - 1})
    real = acc.misses_in_ms(acc.held_out_steps())
    assert real["runs"] == 252 + 51 + 53  # H200 LOFO (session v13's union), H100 v6 (b), H100 v10 (b)
    # the reading (session v13): every held-out run within 30 ms per step plus 10.0%, 40 ms
    # plus 7.2% (session v10, 215 runs: 30 ms plus 9.6%)
    assert real["relative_margin_for_allowance_ms"][30.0] <= 0.101
    assert real["relative_margin_for_allowance_ms"][40.0] < 0.08


def test_two_h100_sessions_measured_the_same_configurations_alike():
    """model_accuracy.py --reproducibility (session v10 against v6, a day apart, the pool and
    one host thread): most runs both sessions measured agree within 5%, the median ratio is
    within 1%; the runs furthest apart are named."""
    acc = _accuracy()
    raw = ROOT / "benchmarks" / "throughput" / "raw"
    r = acc.session_reproducibility(raw / "session_v6_h100", raw / "session_v10_h100")
    assert r["runs"] == 129 and abs(r["median_ratio"] - 1) < 0.01
    assert r["within"]["5%"] >= 0.7 * r["runs"] and r["within"]["1%"] <= r["within"]["2%"] <= r["within"]["5%"]
    assert r["furthest"][0]["name"].startswith("torch-") and r["furthest"][0]["ratio"] > 2
    with pytest.raises(ValueError, match="no run in common"):
        acc.session_reproducibility(raw / "session_v6_h100", raw / "session_v8_h100")


def test_the_floor_names_what_day_to_day_spread_leaves_to_any_model(tmp_path):
    """model_accuracy.py --floor: a configuration measured at 100 and 150 tokens/s on two days
    cannot be predicted within (150 - 100) / 250 = 20% on both; two runs of one configuration
    that ran different cross-entropies (measure.py ran some eager, loss_kernels.py) are not
    compared. The H100's sessions v10, v14 and v21 (one trainer, other days) spread a median 6%
    below 150 ms a step and 1% above it (none of those above 5%: the ones that did had run the
    eager loss on one day), and te-fsdp-example L12 b2 s2048 fp8 (one of the worst held-out
    misses) by more than 40%."""
    acc = _accuracy()
    def results(path, tps, step_s=0.1, loss="compiled"):
        path.write_text(json.dumps({"results": [
            {"name": "x", "status": "ok", "backend": "te", "tokens_per_s_per_gpu": tps, "step_s": step_s},
            {"name": "t", "status": "ok", "backend": "torch", "tokens_per_s_per_gpu": tps, "step_s": step_s},
            {"name": "v", "status": "ok", "backend": "te", "tokens_per_s_per_gpu": tps, "step_s": step_s,
             "model": {"vocab_size": 1000}, "loss_kernel": loss}]}))
        return path
    f = acc.reproducibility_floor([results(tmp_path / "a.json", 100.0),
                                   results(tmp_path / "b.json", 150.0, loss="eager")])
    assert f["configurations"] == 1 and f["floor_over_10pct"][0]["floor"] == pytest.approx(0.2)
    same = acc.reproducibility_floor([results(tmp_path / "a.json", 100.0), results(tmp_path / "b.json", 150.0)])
    assert same["configurations"] == 2
    assert f["bins"]["steps under 150 ms"]["floor_over_10pct"] == 1
    with pytest.raises(ValueError, match="two or more"):
        acc.reproducibility_floor([tmp_path / "a.json"])
    raw = ROOT / "benchmarks" / "throughput" / "raw"
    h100 = acc.reproducibility_floor([raw / f"session_{v}_h100" for v in ("v10", "v14", "v21")])
    small, large = h100["bins"]["steps under 150 ms"], h100["bins"]["steps of 150 ms or more"]
    assert h100["configurations"] == small["configurations"] + large["configurations"] == 122
    assert small["median_spread"] > 1.05 > 1.02 > large["median_spread"] and large["floor_over_5pct"] == 0
    worst = h100["floor_over_10pct"][0]
    assert worst["name"] == "ho2-te-fsdp-example-L12-b2-s2048-noac-fp8" and worst["spread"] > 1.4


def test_misses_are_grouped_by_how_alike_other_days_measured_their_configuration(tmp_path):
    """model_accuracy.py --misses-by-floor: a held-out run whose configuration two sessions
    measured 1% apart is the model's miss; one measured 30% apart is grouped apart, and a
    configuration measured once has no floor."""
    acc = _accuracy()
    def run(name, session, measured, predicted):
        return {"name": name, "session": session, "measured": measured, "predicted": predicted}
    folds = [{"backend": "te", "runs": [run("alike", "d1", 100.0, 120.0), run("alike", "d2", 101.0, 120.0),
                                         run("moved", "d1", 100.0, 90.0), run("moved", "d2", 130.0, 90.0),
                                         run("once", "d2", 50.0, 51.0)]},
             {"backend": "torch", "runs": [run("alike", "d1", 1.0, 9.0)]}]
    path = tmp_path / "lofo.json"
    path.write_text(json.dumps({"folds": folds}))
    g = acc.misses_by_floor(path)["groups"]
    assert set(g) == {"floor <= 3%", "floor > 10%", "measured once"}
    alike = g["floor <= 3%"]
    assert alike["runs"] == 2 and alike["too_fast_beyond_10pct"] == 2
    assert alike["worst_too_fast"]["error"] == pytest.approx(0.2) and alike["worst_too_fast"]["session"] == "d1"
    moved = g["floor > 10%"]
    assert moved["worst_too_slow"]["error"] == pytest.approx(90 / 130 - 1) and moved["too_fast_beyond_10pct"] == 0
    assert moved["worst_too_slow"]["floor"] == pytest.approx(30 / 230)
    assert g["measured once"]["worst_too_fast"]["floor"] is None


def test_a_depth_ladder_gives_each_block_kind_its_time_per_block(tmp_path):
    """model_accuracy.py --ladder on a measure.py --split ladder file: the slope of the step over
    the depth per preset and precision (a kind's time per block), measured and predicted, and
    each kind's slope over the 1b preset's."""
    import dataclasses

    from kfp_sagemaker_blackwell.catalog import spec as spec_mod
    acc = _accuracy()
    measure = importlib.import_module("benchmarks.throughput.measure")
    records = []
    per_block = {"te-fsdp-example": 0.009, "1b": 0.006, "8b": 0.0065}  # seconds, fp8: 1.2x
    for c in measure.ladder():
        model = dataclasses.asdict(dataclasses.replace(spec_mod.preset(c["preset"]), num_layers=c["num_layers"]))
        step = 0.015 + c["num_layers"] * per_block[c["preset"]] * (1.2 if c["precision"] == "fp8" else 1.0)
        records.append(dict(c, model=model, status="ok", step_s=step, tokens_per_s_per_gpu=512 / step))
    path = tmp_path / "ladder.json"
    path.write_text(json.dumps({"gpu": "H200", "results": records}))
    lines = {(ln["preset"], ln["precision"]): ln for ln in acc.ladder_report(path)["lines"]}
    assert len(lines) == 6 and lines[("8b", "bf16")]["depths"] == [2.0, 4.0, 6.0]
    assert lines[("te-fsdp-example", "fp8")]["measured_ms_per_block"] == pytest.approx(10.8)
    assert lines[("1b", "bf16")]["measured_ms_per_step"] == pytest.approx(15.0)
    assert lines[("te-fsdp-example", "bf16")]["measured_over_1b"] == pytest.approx(1.5)
    assert "measured_over_1b" not in lines[("1b", "fp8")]
    for ln in lines.values():  # the model's line of the same steps: positive per block, host-bound
        assert ln["predicted_ms_per_block"] > 1.0


SMALL_STEPS_V11 = ROOT / "benchmarks" / "throughput" / "raw" / "session_v11_h100" / "smallcal.json"


def test_the_small_step_families_no_fit_saw_are_not_priced_too_fast_on_the_h100():
    """Session v11's 12 small-step runs (one H100, b1 s1536, widths 2048/4096/8192 at two depths,
    bf16 and fp8; families no calibration has seen): model v4 priced the 8b and 64b ones up to
    30% too fast (a job sized on them would have hit MaxRuntime's margin) and the 1b ones 2.5x
    too slow. Model v5 (the root unit's copy-in on the host, one overlap per block, the sync
    before the optimizer) prices none too fast; the 1b ones stay too slow (the H100's per-step
    host time is fitted on session v6, whose host ran PyTorch's thread pool)."""
    acc = _accuracy()
    rows = acc.rows(acc.load(SMALL_STEPS_V11), None, throughput.constants_for("H100"))
    assert len(rows) == 12
    assert max(r.error for r in rows) <= 0.0  # v4: +30.2%
    wide = [r for r in rows if r.record["model"]["hidden_size"] >= 4096]
    assert len(wide) == 8 and min(r.error for r in wide) >= -0.17  # within 17%, too slow
    assert min(r.error for r in rows) >= -0.58  # 1b L2 bf16: 23.1 ms measured, 53.9 predicted


HELD_OUT_H200_V13 = ROOT / "benchmarks" / "throughput" / "heldout_eval_h200_v13.json"


def test_the_h200_session_of_todays_trainer_checked_the_shipped_model_and_joined_the_union():
    """Issue 36, session v13 (2026-12-07, raw/session_v13_h200, one H200, today's trainer):
    parts, grid (82 runs) and held-out families (59 runs, 28 families, none in the grid) in one
    lease; the device time ended before the end reference and the torch set, so the session is
    evaluated without drift correction or torch rows (model_accuracy.SESSION_OPTIONAL).
    - Before the refit (raw/heldout_eval_h200_v13_before_refit.json, a record): session v12's
      shipped H200 calibration, which never saw a run of this session, predicted all 141 TE
      runs at median 7.6%, worst too fast +26.1%, inside its 37.7% margin.
    - The session's own refit on its grid predicts its held-out families at median 2.3% but
      worst too fast +34.1% (te-fsdp-example L12 bf16 b2 s2048; each run predicted with the
      loss it ran, session v22; before, 3.4% and +38.3%): worse than the union's, so the
      shipped refit is the union's (lofo_all_h200.json, 252 runs), with this session's parts.
    heldout_eval_h200_v13.json is re-predicted here from its recorded fits."""
    import json

    from kfp_sagemaker_blackwell.planning import throughput

    acc = _accuracy()
    ev = json.loads(HELD_OUT_H200_V13.read_text())
    _assert_the_record_is_predicted_now(acc, acc.SESSION_V13, ev)
    assert ev["session"]["gpu"] == "NVIDIA H200" and ev["session"]["date"] == "2026-12-07"
    assert ev["held_out_families_in_grid"] == [] and ev["held_out_families"] == 28
    assert ev["drift"] == {} and ev["b_refit_on_session_grid"]["torch_heldout"] is None
    own = ev["b_refit_on_session_grid"]["te_heldout"]
    assert own["rows"] == 59 and own["median_abs_error"] <= 0.023 and own["worst_too_fast"] > 0.34
    union = json.loads(LOFO_ALL.read_text())["summaries"]["te"]
    assert own["worst_too_fast"] > union["2026-12-07"]["worst_abs_error"]
    # the shipped calibration is the union's, which holds this session's runs and parts
    assert ev["s_shipped_calibration"]["fitted_on"] == throughput.ACCURACY["H200"].record
    assert throughput.DEFAULT.parts_tables["H200"].source.startswith("h200_parts.json")
    shipped_parts = json.loads((ROOT / "planning" / "measured" / "h200_parts.json").read_text())
    assert shipped_parts["session"] == ev["session"]["session"]
    before = json.loads((ROOT / "benchmarks" / "throughput" / "raw" /
                         "heldout_eval_h200_v13_before_refit.json").read_text())["s_shipped_calibration"]
    assert before["fitted_on"] == "lofo_all_h200.json" and before["te_all"]["rows"] == 141
    assert before["te_all"]["median_abs_error"] <= 0.077 and 0.26 < before["te_all"]["worst_too_fast"] < 0.377


def test_the_h100_calibration_predicts_todays_trainer_on_another_h100_within_its_band():
    """Session v14 (benchmarks/throughput/heldout_eval_h100_v14.json): the shipped H100
    calibration, fitted on session v6's grid, predicts the 57 held-out runs of today's trainer on
    another H100 (27 families, none in its grid) at median 2.3%, worst +4.7% too fast: inside the
    H100 band's worst (19.4%) and margin (each run predicted with the loss it ran, session v22;
    before: 2.5%, +4.3%). Re-predicted now, every run is as recorded."""
    import json

    root = Path(__file__).resolve().parents[1] / "benchmarks" / "throughput"
    rec = json.loads((root / "heldout_eval_h100_v14.json").read_text())
    acc = _accuracy()
    runs = []
    for ev in rec["evaluations"]:
        now = acc.evaluate_held_out(root / ev["file"], throughput.constants_for("H100"),
                                    fitted_on=[acc.load(acc.SESSION_V6 / "grid.json")])
        assert [r["predicted"] for r in now["backends"]["te"]["runs"]] == pytest.approx(
            [r["predicted"] for r in ev["backends"]["te"]["runs"]], rel=1e-9)
        runs += now["backends"]["te"]["runs"]
    assert len(runs) == 57 and all(r["unseen_family"] for r in runs)
    errors = sorted(abs(r["error"]) for r in runs)
    assert errors[len(errors) // 2] < throughput.ACCURACY["H100"].median_error
    assert max(r["error"] for r in runs) < throughput.ACCURACY["H100"].worst_too_fast


def test_the_runtime_margin_covers_every_full_depth_small_step_the_trainer_ran():
    """Issue 40's one-GPU table (1b and te-fsdp-example at full depth, micro-batch 1-4,
    sequence 2048-8192, no lever; benchmarks/trainer/small_steps.json), which no fit has seen:
    a plan on any of these steps is priced with the GPU's runtime margin, so no configuration
    may run slower than its prediction by more than that margin (a job would hit MaxRuntime).
    Today: H200 +21.1% too fast at worst (te-fsdp-example bf16 b1 s2048) against its 34.9%
    margin; H100 +4.8%."""
    acc = _accuracy()
    checked = acc.small_steps_predicted()
    assert {"H100", "H200"} <= set(checked)
    for gpu, res in checked.items():
        assert len(res) >= 10, gpu
        margin = throughput.ACCURACY[gpu].runtime_margin
        too_fast = {k: p / m - 1 for k, (m, _, p) in res.items() if p / m - 1 > margin}
        assert not too_fast, (gpu, margin, too_fast)
