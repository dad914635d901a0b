"""The issue-26 benchmark tools on the CPU: the profile's kernel attribution, and the levers2
stage's runs (their trainer flags parse, the winners are chosen by the 1% rule)."""

import importlib
import json
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from kfp_sagemaker_blackwell.catalog import flags as config

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "trainer"


@pytest.fixture(scope="module")
def tools():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("like_for_like"), importlib.import_module("profile_step")
    finally:
        sys.path.remove(str(BENCH))


def _x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def _kernel(name, corr, ts, dur, launch_ts, tid=1):
    return [_x("cuda_runtime", "cudaLaunchKernel", launch_ts, 1, tid, correlation=corr),
            _x("kernel", name, ts, dur, 7, correlation=corr)]


def test_kernels_are_attributed_by_their_launching_ranges_and_idle_time_is_the_gaps(tools):
    _, prof = tools
    events = [
        _x("cpu_op", "FSDP::pre_forward", 0, 50), _x("cpu_op", "aten::copy_", 10, 30),
        *_kernel("elementwise_kernel<copy>", 2, 60, 20, 20),
        _x("cpu_op", "aten::mm", 52, 6), *_kernel("sm90_xmma_gemm_bf16", 3, 70, 25, 55),  # overlaps
        _x("cpu_op", "Optimizer.step#AdamW.step", 100, 100), _x("cpu_op", "aten::_fused_adamw_", 120, 60),
        *_kernel("vectorized_elementwise_kernel", 1, 300, 10, 150),
        _x("user_annotation", "trainer.loss", 400, 20), _x("cpu_op", "aten::pow", 402, 10),
        *_kernel("vectorized_elementwise_kernel", 4, 430, 5, 405),
        _x("cpu_op", "autograd::engine::evaluate_function: PowBackward0", 500, 20, tid=2),
        *_kernel("vectorized_elementwise_kernel", 5, 530, 5, 510, tid=2),
        _x("cpu_op", "aten::sum", 600, 10), *_kernel("reduce_kernel", 6, 640, 5, 605),  # fsdp.py's y.sum()
        _x("cpu_op", "FullyShardedDataParallel.forward", 700, 50), _x("cpu_op", "aten::sum", 710, 10),
        *_kernel("reduce_kernel", 7, 760, 5, 715),  # a reduction inside the model: not the loss
        _x("gpu_user_annotation", "trainer.loss", 430, 5),  # the GPU copy of a range: not a kernel
    ]
    out = prof.analyse({"traceEvents": events}, wall_s=1000e-6, iters=1)
    ms = out["ms_per_iter"]
    assert ms["fsdp_copies_collectives"] == 0.02 and ms["gemm"] == 0.025 and ms["optimizer"] == 0.01
    assert ms["loss"] == 0.015 and ms["elementwise"] == 0.005
    assert out["kernel_ms_per_iter"] == 0.075  # 75 us of kernels, 65 us of them not overlapping
    assert out["busy_ms_per_iter"] == 0.065 and out["gpu_idle_fraction"] == 0.935


def test_the_gpus_waits_are_attributed_to_what_the_host_did_meanwhile(tools):
    # Session v8's finding in miniature: after a step's last kernel the host makes the next batch
    # (aten::bucketize, aten::index on the CPU) before it copies it (aten::to) and launches the
    # forward; the GPU waits 2 ms for it. A 0.1 ms launch gap inside the forward is not a long gap.
    _, prof = tools
    events = [
        _x("cpu_op", "Optimizer.step#AdamW.step", 0, 50), *_kernel("multi_tensor_apply_kernel", 1, 40, 960, 10),
        _x("cpu_op", "aten::bucketize", 1000, 500), _x("cpu_op", "aten::index", 1500, 1400),
        _x("cpu_op", "aten::to", 2900, 50), _x("cpu_op", "aten::_to_copy", 2905, 40),
        *_kernel("Memcpy HtoD (Pageable -> Device)", 2, 3000, 10, 2910),
        _x("cpu_op", "aten::linear", 3005, 10), *_kernel("nvjet_sm90_gemm", 3, 3010, 100, 3008),
        _x("cpu_op", "aten::linear", 3200, 10), *_kernel("nvjet_sm90_gemm", 4, 3210, 100, 3202),
    ]
    out = prof.analyse({"traceEvents": events}, wall_s=4000e-6, iters=1)
    idle = out["idle"]
    assert idle["inside_window_ms_per_iter"] == 2.1 and idle["in_gaps_over_ms_per_iter"] == 2.0
    assert idle["by_next_launch"][0] == {"name": "aten::to > aten::_to_copy", "ms_per_iter": 2.0}
    assert idle["host_during_long_gaps"][:2] == [{"name": "aten::index", "ms_per_iter": 1.4},
                                                 {"name": "aten::bucketize", "ms_per_iter": 0.5}]
    line = prof.shapes_table({"run": out})
    assert "GPU idle between kernels 2.10 ms/iter, 2.00 in gaps >= 0.5 ms" in line and "aten::index 1.40" in line


def test_the_profile_table_shows_both_sides_and_the_difference(tools):
    _, prof = tools
    ref = {"ms_per_iter": dict.fromkeys(prof.CATEGORIES, 1.0), "kernel_ms_per_iter": 11.0,
           "busy_ms_per_iter": 10.0, "wall_ms_per_iter": 12.0, "gpu_idle_fraction": 0.1667}
    mine = {**ref, "ms_per_iter": {**ref["ms_per_iter"], "optimizer": 3.5}}
    text = prof.table({"fsdp.py/fp8": ref, "trainer/fp8": mine})
    assert "| optimizer | 1.00 | 3.50 | +2.50 |" in text and "| gemm | 1.00 | 1.00 | +0.00 |" in text


def test_levers2_trainer_runs_use_flags_the_trainer_accepts(tools):
    lfl, _ = tools
    runs = [r for r in lfl.levers2({}) + lfl.levers2_best({}) if r.kind == "trainer"]
    assert {"--cuda-graphs", "--late-sync", "--fp8-weight-cache", "--no-single-gpu-fsdp", "32"} <= {
        f for r in runs for f in r.flags}
    for run in runs:
        cmd = run.command()
        args = cmd[cmd.index("--levers") + 3:]
        cfg = config.parse(args, env={})
        assert cfg.max_steps == lfl.L2_ITERS and cfg.grad_accum_steps == run.accum
        assert run.tokens() == cfg.batch_size * cfg.seq_length * cfg.grad_accum_steps


def test_levers2_keeps_only_levers_faster_by_more_than_one_percent(tools):
    lfl, _ = tools
    base = "L2/b8-noac/trainer-te/fp8"
    results = {base: {"median_s": 1.0}, f"{base}+unsharded": {"median_s": 0.985},
               f"{base}+graphs": {"median_s": 0.995}, f"{base}+late-sync": {"median_s": 0.98},
               f"{base}+amax32": {"median_s": 0.992}}
    assert lfl.l2_winners(results) == ["unsharded", "late-sync"]
    ids = [r.id for r in lfl.levers2_best(results)]
    assert ids[:2] == [f"{base}+unsharded+late-sync", "L2/b8-noac/trainer-te/bf16+unsharded+late-sync"]
    best = next(r for r in lfl.levers2_best(results) if r.id.endswith("fp8+unsharded+late-sync"))
    assert best.flags == ["--no-single-gpu-fsdp", "--late-sync"]
    assert not any("--cuda-graphs" in r.flags and r.ac for r in lfl.levers2_best(
        {**results, f"{base}+graphs": {"median_s": 0.9}}))  # graphs refuse checkpointing


def test_the_dry_run_prints_each_run_with_its_expected_seconds(tmp_path):
    out = subprocess.run([sys.executable, str(BENCH / "like_for_like.py"), "--dry-run", "--stages",
                          "levers2", "--state", str(tmp_path / "none.json")],
                         capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    assert out[0].startswith("L2/b8-noac/fsdp.py/bf16 expect=41s total=41s ")
    assert len(out) == 13 and " total=495s " in out[-1]


def test_the_profile_dry_run_lists_both_sides_per_precision_with_traces():
    out = subprocess.run([sys.executable, str(BENCH / "profile_step.py"), "--dry-run"],
                         capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    assert [line.split()[0] for line in out] == ["fsdp.py/bf16", "trainer/bf16", "fsdp.py/fp8", "trainer/fp8"]
    assert " total=183s " in out[-1] and all("--profile-iters 5:9 --profile-trace /tmp/" in x for x in out)


def test_pytorch_nocast_kernels_are_elementwise_not_fp8_casts(tools):
    # issue 26's profile (raw/issue26_profile_h200.json): the trainer's "+8.5 ms of FP8 casts"
    # in bf16 was this bf16 add, and fsdp.py's 25 ms a plain copy
    _, prof = tools
    nocast = "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::{}"
    assert prof.classify(nocast.format("CUDAFunctor_add<c10::BFloat16"), []) == "elementwise"
    assert prof.classify(nocast.format("direct_copy_kernel_cuda(at::T"), []) == "elementwise"
    assert prof.classify("cast_transpose_fusion_kernel_optimized(transformer_engine::CTDBiasDActParam<",
                         []) == "fp8_cast_transpose_amax"


def test_the_step_timers_trace_summary_classifies_kernels_like_the_profile(tools):
    # steady_timer.py --profile-trace had its own kernel table, which still counted
    # gpu_kernel_impl_nocast kernels as FP8 casts; both now read kernel_names.BY_KERNEL
    _, prof = tools
    sys.path.insert(0, str(BENCH))
    try:
        timer = importlib.import_module("steady_timer")
    finally:
        sys.path.remove(str(BENCH))
    nocast_add = "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<add>"
    for name in (nocast_add, "nvjet_tst_256x128_64x4_2x1_v_bz_coopA_NTN", "ncclDevKernel_AllGather_RING_LL",
                 "cast_transpose_fusion_kernel_optimized"):
        assert timer.category(name) == prof.classify(name, [])
    assert timer.category(nocast_add) == "elementwise"
    assert timer.category("void at::native::nll_loss_forward_reduce_cuda_kernel_2d") == "loss"


def _rec(lfl, rid, median_s):
    """A recorded run of the levers2 stages (as the harness writes it) with this median."""
    run = next(r for r in lfl.levers2({}) + lfl.levers2_best({}) if r.id == rid)
    return {"run": asdict(run), "median_s": median_s, "tokens_per_s": round(run.tokens() / median_s, 1),
            "spread": 0.01, "rc": 0, "stage": "levers2"}


def test_the_levers2_table_labels_each_row_by_the_flags_that_ran(tools):
    # issue 26: the row of --no-single-gpu-fsdp --cuda-graphs read "fp8+graphs"
    lfl, _ = tools
    base = "L2/b8-noac/trainer-te/fp8"
    ids = [base, f"{base}+unsharded", f"{base}+graphs", "L2/1b-b4/trainer-te/fp8+graphs",
           "L2/1b-b4/trainer-te/fp8", "L2/1b-b4/trainer-te/bf16", "L2/1b-b4/trainer-te/bf16+graphs",
           "L2/b4x2-noac/trainer-te/fp8+weight-cache", f"{base}+amax32"]
    results = {rid: _rec(lfl, rid, 1.0 - 0.01 * i) for i, rid in enumerate(ids)}
    text = lfl.levers2_table(results)
    rows = {line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith("| ")}
    assert "b8-noac/trainer-te/fp8+graphs" not in rows
    row = rows["b8-noac/trainer-te/fp8+unsharded+graphs"].split(" | ")
    assert row[1] == "--no-single-gpu-fsdp --cuda-graphs"
    assert row[-1] == f"{0.99 / 0.98:.3f} (vs fp8+unsharded) |"  # graphs against what they add to
    assert rows["b4x2-noac/trainer-te/fp8+weight-cache"].split(" | ")[1] == "--grad-accum-steps 2 --fp8-weight-cache"
    assert rows["b8-noac/trainer-te/fp8+amax32"].split(" | ")[1] == "--fp8-amax-history-len 32"
    assert "1b-b4 fp8+unsharded+graphs / bf16+unsharded+graphs: **" in text


def test_a_lever_that_needs_another_wins_only_against_that_one(tools):
    lfl, _ = tools
    base = "L2/b8-noac/trainer-te/fp8"
    results = {base: {"median_s": 1.0}, f"{base}+unsharded": {"median_s": 0.983},
               f"{base}+graphs": {"median_s": 0.98}}  # 1.020x the base, 1.003x unsharded
    assert lfl.l2_parent("graphs") == "unsharded" and lfl.l2_parent("unsharded") is None
    assert lfl.l2_winners(results) == ["unsharded"]
    assert lfl.l2_winners({**results, f"{base}+graphs": {"median_s": 0.97}}) == ["unsharded", "graphs"]


def test_a_run_starts_only_with_its_expected_wall_and_a_margin_left(tools):
    # call 7 of 2026-12-02 started the b4x2 run with 44.6 s left; it needed ~50 s and was cut (rc 124)
    lfl, _ = tools
    run = next(r for r in lfl.levers2_best({}) if r.id == "L2/b4x2-noac/trainer-te/fp8")
    assert not lfl.fits(run, 44.6) and lfl.fits(run, 51.0)


def test_the_readme_like_for_like_tables_are_like_for_like_output(tools):
    # each table of docs/results.md's trainer section (once the README's "Measured so far") is
    # --table output of the results file its paragraph names
    lfl, _ = tools
    root = BENCH.parents[1]
    text = (root / "docs" / "results.md").read_text()
    section = text[text.index("## Trainer throughput"):].split("\n## ", 1)[0]
    blocks = re.findall(r"((?:^ *\|.*\n)+)", section, re.M)
    assert len(blocks) >= 2
    for block in blocks:
        named = re.findall(r"benchmarks/trainer/raw/(\w+\.json)", section[:section.index(block)])
        out = lfl.tables(json.loads((BENCH / "raw" / named[-1]).read_text()))
        assert "\n".join(line.strip() for line in block.splitlines()) in out, named[-1]


def test_small_step_runs_use_flags_and_shapes_the_trainer_accepts(tools):
    """Issue 40's small-step stage: every run is a trainer command the trainer parses, at the
    shape its id names, with each lever's flags and environment (qinit's experimental gate)."""
    lfl, _ = tools
    runs = lfl.small({})
    assert len({r.id for r in runs}) == len(runs)
    assert runs[0].id == "S/1b-b4-s4096/bf16" and runs[1].id == "S/1b-b4-s4096/fp8"  # the bar's pair first
    memory = lfl.small_memory({})  # the new modes' memory on the other shapes
    assert len({r.id for r in memory}) == len(memory)
    assert {r.id.split("/")[1] for r in memory if "+graphs" in r.id} >= {"1b-b2-s4096", "te-b2-s2048", "1b-b2-s8192"}
    for run in runs + memory:
        cmd = run.command()
        args = cmd[cmd.index("--levers") + 3:]
        cfg = config.parse(args, env=run.env)
        sid = run.id.split("/")[1]
        assert f"b{cfg.batch_size}-s{cfg.seq_length}" in sid and cfg.precision == run.precision
        assert cfg.cuda_graphs == ("+graphs" in run.id) and cfg.quantized_model_init == ("+qinit" in run.id)
        assert cfg.single_gpu_fsdp == ("+graphs" not in run.id and "+unsharded" not in run.id)
        assert cfg.data_prefetch == ("+prefetch" in run.id)
        assert ("OMP_NUM_THREADS" in run.env) == ("+pool" in run.id)  # the host pool, by environment


def test_small_steps_rows_and_table_compare_each_lever_with_its_own_base(tools):
    lfl, _ = tools
    runs = {r.id: r for r in lfl.small({})}

    def rec(rid, median):
        return {"run": asdict(runs[rid]), "median_s": median, "p90_s": median * 1.02, "spread": 0.01,
                "rc": 0, "session_id": "gpu-x", "peak_gib": 30.0, "mfu_bf16_peak": 0.5}
    results = {"S/1b-b4-s4096/bf16": rec("S/1b-b4-s4096/bf16", 0.30),
               "S/1b-b4-s4096/fp8": rec("S/1b-b4-s4096/fp8", 0.24),
               "S/1b-b4-s4096/fp8+graphs": rec("S/1b-b4-s4096/fp8+graphs", 0.20),
               "S/1b-b4-s4096/fp8+qinit": {"run": asdict(runs["S/1b-b4-s4096/fp8+qinit"]), "rc": 1}}
    rows = lfl.small_steps_rows(results)
    assert [r["id"] for r in rows] == ["S/1b-b4-s4096/bf16", "S/1b-b4-s4096/fp8", "S/1b-b4-s4096/fp8+graphs"]
    fp8 = rows[1]
    assert fp8["model_preset"] == "1b" and fp8["batch_size"] == 4 and fp8["seq_length"] == 4096
    assert fp8["tokens_per_s_per_gpu_median"] == round(4 * 4096 / 0.24, 1) and fp8["session_id"] == "gpu-x"
    assert rows[2]["levers"] == ["graphs"] and "--cuda-graphs" in rows[2]["trainer_flags"]
    table = lfl.small_table(results)
    assert "| S/1b-b4-s4096/fp8 |" in table and "**1.250**" in table  # 0.30 / 0.24
    assert "1.200" in table  # graphs against fp8 without them: 0.24 / 0.20
    assert "S/1b-b4-s4096/fp8+qinit (rc=1)" in table


def test_a_graphed_runs_row_carries_the_reserved_peak_and_the_graph_pools_free_part(tools):
    """The allocated peak of a --cuda-graphs run leaves out the activations its replays write
    into the graphs' pools: the row keeps the reserved peak and the pools' free part beside it."""
    lfl, _ = tools
    run = {r.id: r for r in lfl.small({})}["S/1b-b4-s4096/fp8+graphs"]
    summary = {"peak_allocated_bytes": 30 * 2**30, "peak_reserved_bytes": 45 * 2**30,
               "graph_pool_bytes": 14 * 2**30, "graph_pool_free_bytes": 12 * 2**30}
    rec = lfl.parse("[trainer] summary " + json.dumps(summary), run)
    assert (rec["peak_gib"], rec["peak_reserved_gib"], rec["graph_pool_free_gib"]) == (30.0, 45.0, 12.0)
    rec.update(run=asdict(run), median_s=0.2, rc=0)
    row = lfl.small_steps_rows({run.id: rec})[0]
    assert (row["peak_allocated_gib"], row["peak_reserved_gib"], row["graph_pool_gib"],
            row["graph_pool_free_gib"]) == (30.0, 45.0, 14.0, 12.0)


def test_host_time_sums_the_launching_threads_outermost_ranges_per_iteration(tools):
    """Issue 40 item 1: where the host's time goes. Nested ranges count once (the outermost),
    another thread's ranges not at all; launches and runtime time are the busiest thread's."""
    _, ps = tools
    events = [_x("cpu_op", "te::linear_fwd", 0, 100), _x("cpu_op", "aten::mm", 10, 50),  # nested
              _x("user_annotation", "trainer.loss", 200, 40), _x("cpu_op", "te::linear_fwd", 300, 60),
              _x("cpu_op", "aten::copy_", 0, 500, tid=2),  # the other thread: ignored
              *_kernel("gemm_kernel", 1, 20, 30, 15), *_kernel("gemm_kernel", 2, 320, 30, 310)]
    host = ps.host_time(events, iters=2)["host"]
    assert host["launches_per_iter"] == 1.0
    assert host["outer_ranges_ms_per_iter"] == round((100 + 40 + 60) * 1e-3 / 2, 3)
    assert host["top_outer_ranges"][0] == {"name": "te::linear_fwd", "ms_per_iter": 0.08}
    assert ps.host_time([_x("cpu_op", "x", 0, 1)], 1) == {}


def test_shape_profiles_run_the_backend_asked_for_and_name_it(tools):
    # issue 36 item 2's torch side: the same steps without TransformerEngine, their traces and
    # ids apart from the TE runs' (session_v8.sh's torch stage)
    _, prof = tools
    te = prof.shape_runs("8b:1:2048:4", 4, ["bf16"], [])
    torch_ = prof.shape_runs("8b:1:2048:4,te-fsdp-example:2:2048", 4, ["bf16"], [], backend="torch")
    assert [r.id for r in te] == ["8b-1-2048-4/trainer/bf16"]
    assert [r.id for r in torch_] == ["8b-1-2048-4/trainer-torch/bf16", "te-fsdp-example-2-2048/trainer-torch/bf16"]
    cmd = torch_[0].command()
    assert cmd[cmd.index("--backend") + 1] == "torch" and cmd[cmd.index("--num-layers") + 1] == "4"
    assert te[0].trace != torch_[0].trace
    lever = prof.shape_runs("8b:1:2048:4", 4, ["bf16"], ["--data-prefetch"], backend="torch")[0]
    assert lever.id == "8b-1-2048-4/trainer-torch/bf16+data-prefetch" and "--data-prefetch" in lever.command()
    assert lever.trace not in (te[0].trace, torch_[0].trace)
    with pytest.raises(SystemExit, match="PRESET:BATCH:SEQ"):
        prof.shape_runs("8b:1", 4, ["bf16"], [])


def test_a_profile_is_compared_part_by_part_with_the_models_prediction_for_the_same_setup():
    accuracy = importlib.import_module("benchmarks.throughput.model_accuracy")
    profile = json.loads((BENCH / "raw" / "issue26_profile_h200.json").read_text())
    # issue 26's trainer runs (te-fsdp-example, batch 8, seq 8192), named as --shapes names them
    runs = {f"te-fsdp-example-8-8192/trainer-te/{k.split('/')[1]}": v
            for k, v in profile.items() if k.startswith("trainer/")}
    rows = {r["run"]: r for r in accuracy.profile_vs_model(runs, "H200")}
    fp8 = rows["te-fsdp-example-8-8192/trainer-te/fp8"]
    # every kernel category lands in exactly one part: the parts add up to the kernel total
    measured = sum(p["measured_ms"] for p in fp8["parts"].values())
    assert measured == pytest.approx(profile["trainer/fp8"]["kernel_ms_per_iter"], abs=0.05)
    assert fp8["parts"]["optimizer"]["measured_ms"] == pytest.approx(8.17 + 3.37, abs=0.01)
    # the prediction is the model's for that setup on that GPU, part by part
    from kfp_sagemaker_blackwell.catalog.spec import preset
    from kfp_sagemaker_blackwell.planning import throughput
    from kfp_sagemaker_blackwell.planning.training_setup import TrainingSetup
    p = throughput.predict(TrainingSetup(preset("te-fsdp-example"), 8, 8192, "fp8", False, 1), "H200")
    assert fp8["predicted_step_ms"] == pytest.approx(p.step_seconds * 1e3, abs=0.01)
    assert fp8["parts"]["fsdp_copies"]["predicted_ms"] == pytest.approx(p.parts["fsdp_copies"] * 1e3, abs=0.01)
    assert "| te-fsdp-example-8-8192/trainer-te/bf16 |" in accuracy.profile_markdown(list(rows.values()))


def test_host_batch_times_the_synthetic_batch_per_thread_count_and_refuses_bad_shapes(capsys):
    """benchmarks/trainer/host_batch.py (session v9's CPU reproduction of the pool's stall): one
    row per thread count and shape, each count in its own process; bad input names the flag."""
    hb = importlib.import_module("benchmarks.trainer.host_batch")
    assert hb.main(["--threads", "1,2", "--shapes", "1x64,2x32", "--iters", "3", "--gap-ms", "0", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["threads"], r["batch_size"], r["seq_length"]) for r in rows] == [
        (1, 1, 64), (1, 2, 32), (2, 1, 64), (2, 2, 32)]
    assert all(0 < r["median_ms"] <= r["p90_ms"] <= r["max_ms"] and r["iters"] == 3 for r in rows)
    for bad in (["--shapes", "4by4096"], ["--threads", "0"], ["--iters", "0"]):
        with pytest.raises(SystemExit):
            hb.main(bad)
        assert re.search(r"--(shapes|threads|iters)", capsys.readouterr().err)


def test_update_check_names_the_parameter_kinds_a_step_leaves_unchanged():
    """benchmarks/trainer/update_check.py (session v9: --quantized-model-init did not learn):
    global optimizer-step hooks tell, by parameter kind, which weights a step moved."""
    import io

    import torch

    uc = importlib.import_module("benchmarks.trainer.update_check")
    moved = torch.nn.Parameter(torch.ones(4, 4))
    frozen = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))  # a zero gradient: Adam leaves it
    opt = torch.optim.AdamW([moved, frozen], lr=0.1, weight_decay=0.0)
    out = io.StringIO()
    check = uc.UpdateCheck(steps=1, out=out).install()
    try:
        moved.grad, frozen.grad = torch.ones(4, 4), torch.zeros(3, dtype=torch.bfloat16)
        opt.step()
        opt.step()  # after the checked step the hooks are gone
    finally:
        for h in check.handles:
            h.remove()
    assert len(check.results) == 1 and out.getvalue().startswith("update_check step=1 ")
    summary = check.results[0]
    assert summary["Parameter/float32"]["changed"] == 1 and summary["Parameter/float32"]["median_rel_change"] > 0.05
    assert summary["Parameter/bfloat16"] == {"params": 1, "changed": 0, "median_rel_change": 0.0,
                                             "max_rel_change": 0.0, "grad_norm": 0.0}
    assert summary["Parameter/float32"]["grad_norm"] == pytest.approx(4.0)  # ||ones(4, 4)||


def test_update_check_follows_master_copies_where_the_optimizer_keeps_them():
    """An optimizer with master copies (TE's FusedAdam API: get_unscaled_state(p,
    "master_param")) whose weights do not show its step: the masters' change is reported per
    kind, so a step that moves the masters but not the weights (or neither) is told apart."""
    import io

    import torch

    uc = importlib.import_module("benchmarks.trainer.update_check")

    class MasterSGD(torch.optim.Optimizer):
        def __init__(self, params, lr):
            super().__init__(params, {"lr": lr})
            for g in self.param_groups:
                for p in g["params"]:
                    self.state[p]["master_param"] = p.detach().float().clone()

        def get_unscaled_state(self, p, name):
            return self.state[p][name]

        def step(self, closure=None):
            for g in self.param_groups:
                for p in g["params"]:
                    m = self.state[p]["master_param"]
                    m -= g["lr"] * p.grad.float()
                    p.data.copy_(m.to(p.dtype))  # bf16: a small step is under its spacing

    w = torch.nn.Parameter(torch.ones(8, dtype=torch.bfloat16))
    opt = MasterSGD([w], lr=1e-4)
    check = uc.UpdateCheck(steps=1, out=io.StringIO()).install()
    try:
        w.grad = torch.ones(8, dtype=torch.bfloat16)
        opt.step()
    finally:
        for h in check.handles:
            h.remove()
    s = check.results[0]["Parameter/bfloat16"]
    assert s["changed"] == 0 and s["master_changed"] == 1
    assert s["master_median_rel_change"] == pytest.approx(1e-4, rel=0.01)


def test_fsdp_copy_in_host_time_is_split_between_the_root_and_the_blocks(tools):
    # Session v11: the root unit's copy-in (embedding, LM head) held the host 15 ms a step at
    # 8b L4 b1 s1024 while the GPU idled; the profile reports it per iteration, root apart.
    _, prof = tools
    events = []
    for it in range(2):
        t = it * 100_000
        events += [_x("user_annotation", "FSDP::post_backward_reduce (blocks.1)", t, 2_000),
                   _x("cpu_op", "aten::_chunk_cat", t + 100, 1_000),
                   _x("user_annotation", "FSDP::post_backward_reduce (blocks.0)", t + 3_000, 2_000),
                   _x("cpu_op", "aten::_chunk_cat", t + 3_100, 1_500),
                   _x("user_annotation", "FSDP::post_backward_reduce", t + 6_000, 20_000),
                   _x("cpu_op", "aten::_chunk_cat", t + 6_100, 15_000),
                   # another thread's chunk_cat, and one outside any reduce: neither counts
                   _x("cpu_op", "aten::_chunk_cat", t + 6_200, 9_000, tid=2),
                   _x("cpu_op", "aten::_chunk_cat", t + 50_000, 9_000)]
    out = prof.fsdp_copy_in_host(events, iters=2)["fsdp_copy_in_host"]
    assert out == {"root_ms_per_iter": 15.0, "blocks_ms_per_iter": 2.5}
    assert prof.fsdp_copy_in_host([_x("cpu_op", "aten::_chunk_cat", 0, 5)], iters=1) == {}


def test_the_results_page_quotes_the_h200_bar_as_the_recorded_rows_give_it():
    """docs/results.md states issue 40's bar on an H200 (fp8 with FP8 primary weights and the
    unsharded module or the graphs, against plain bf16 of the same session): the ratios it
    prints are the recorded rows' medians, so a new session's rows or an edit of the page cannot
    leave the user's figure behind the data."""
    rows = [r for r in json.loads((BENCH / "small_steps.json").read_text())
            if r["gpu"] == "NVIDIA H200" and (r["model_preset"], r["batch_size"], r["seq_length"]) == ("1b", 4, 4096)
            and "#" not in r["id"]]
    sessions = {r["session_id"] for r in rows}
    assert len(sessions) == 1, "the page quotes one H200 session: name which one if a second lands"
    by = {(r["precision"], tuple(sorted(r["levers"]))): r["tokens_per_s_per_gpu_median"] for r in rows}
    bf16 = by[("bf16", ())]
    unsharded, graphs = by[("fp8", ("qinit", "unsharded"))] / bf16, by[("fp8", ("graphs", "qinit"))] / bf16
    page = (BENCH.parents[1] / "docs" / "results.md").read_text()
    assert f"**{unsharded:.3f}x** bf16" in page and f"at {graphs:.3f}x" in page
    assert f"{by[('fp8', ('qinit', 'unsharded'))]:,.0f} and {by[('fp8', ('graphs', 'qinit'))]:,.0f} against {bf16:,.0f}" in page
    assert unsharded >= 1.30  # the bar, met by the median of one lever set


def test_shape_profiles_resume_and_say_when_the_budget_left_runs_out(tools, tmp_path, monkeypatch, capsys):
    """A call cut by its budget names the runs it left in its last line (session_common.sh's
    step() then does not mark the profiles done), and the next call into the same folder keeps
    what was profiled and runs only the rest."""
    import subprocess as sp
    import types

    _, prof = tools
    earlier = json.loads((BENCH / "raw" / "session_v20_h200" / "profile_shapes.json").read_text())
    done = "te-fsdp-example-2-2048-12/trainer/bf16"
    (tmp_path / "profile_shapes.json").write_text(json.dumps({done: earlier[done]}))
    clock, ran = [1000.0], []

    def fake_run(cmd, **kw):  # each run takes 30 s of the budget and leaves no trace
        ran.append(cmd)
        clock[0] += 30
        return sp.CompletedProcess(cmd, 1, "", "")

    monkeypatch.setattr(prof.subprocess, "run", fake_run)
    monkeypatch.setattr(prof, "time", types.SimpleNamespace(time=lambda: clock[0]))
    argv = ["profile_step.py", "--shapes", "te-fsdp-example:2:2048:12,8b:1:1024:4", "--precisions", "bf16,fp8",
            "--out-dir", str(tmp_path), "--time-budget", "75"]
    monkeypatch.setattr(sys, "argv", argv)
    assert prof.main() == 0
    # the script's own lines (under make test's workers, another test's leftover thread once
    # wrote four spaces into the captured output just before the last one)
    lines = [ln.strip() for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert f"[profile] {done}: profiled earlier" in lines
    assert len(ran) == 2  # te fp8 and 8b bf16; 8b fp8 finds 15 s of 75 left
    assert lines[-1] == "[profile] time budget reached: 1 runs left (8b-1-1024-4/trainer/fp8)"
    kept = json.loads((tmp_path / "profile_shapes.json").read_text())
    assert kept[done] == earlier[done] and kept["8b-1-1024-4/trainer/bf16"]["rc"] == 1
    # the next call: the failed runs again (no trace), the profiled one not; all fit: no budget line
    ran.clear()
    monkeypatch.setattr(sys, "argv", argv[:-1] + ["200"])
    assert prof.main() == 0
    assert len(ran) == 3 and "time budget reached" not in capsys.readouterr().out
