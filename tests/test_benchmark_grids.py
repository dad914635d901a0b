"""The GPU measurement grids (benchmarks/throughput/measure.py, benchmarks/memory/measure_fsdp1.py)
are checked here without a GPU: their configurations are what the issues ask for, the validation
points lie outside the calibration grids, and the result parsing reads fsdp.py's output."""

import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load(rel: str):
    """A benchmark script as a module (``benchmarks/throughput/measure.py`` ->
    ``benchmarks.throughput.measure``)."""
    return importlib.import_module(rel.removesuffix(".py").replace("/", "."))


def _key(c: dict, fields: tuple) -> tuple:
    return tuple(c[f] for f in fields)


def test_throughput_grid_covers_issue_13_and_validation_is_outside_calibration():
    m = _load("benchmarks/throughput/measure.py")
    cal, val = m.configurations("calibration"), m.configurations("validation")
    widths = {m.spec_of(c).hidden_size for c in cal}
    assert min(widths) == 2048 and max(widths) == 8192 and len(widths) >= 3
    assert {c["precision"] for c in cal} == {"bf16", "fp8", "fp8-current", "fp8-block"}
    assert {c["activation_checkpointing"] for c in cal} == {True, False}
    assert len({c["batch_size"] for c in cal}) >= 2 and len({c["seq_length"] for c in cal}) >= 2
    fields = ("preset", "num_layers", "batch_size", "seq_length", "activation_checkpointing", "precision")
    assert len(val) >= 12
    assert not {_key(c, fields) for c in val} & {_key(c, fields) for c in cal}
    assert any(c["preset"] == "1b" and c["num_layers"] == 16 and c["batch_size"] == 4
               and c["seq_length"] == 4096 for c in val)
    assert any(c["preset"] == "te-fsdp-example" for c in val)
    # Every configuration is predicted to fit an H200 with room to spare.
    assert all(m.predicted_peak_bytes(c) < 128 * 2**30 for c in cal + val)


def test_throughput_rates_follow_the_step_time():
    m = _load("benchmarks/throughput/measure.py")
    r = m.rates({"batch_size": 2, "seq_length": 4096}, 0.5, 1e10, 1979.0, 989.0)
    assert r["tokens_per_s_per_gpu"] == 16384
    assert abs(r["tflops_per_gpu"] - 163.84) < 1e-9
    assert abs(r["mfu"] - 163.84 / 1979) < 1e-12 and abs(r["mfu_bf16_peak"] - 163.84 / 989) < 1e-12


def test_step_clock_leaves_out_the_warmup_steps():
    m = _load("benchmarks/throughput/measure.py")
    clock = m.StepClock()
    clock.stamps = [1.0, 3.0, 4.0, 4.5, 5.5]  # ends of steps 1..5
    assert clock.intervals(2) == [1.0, 0.5, 1.0]  # steps 3, 4, 5


def test_fsdp1_grid_covers_issue_18():
    m = _load("benchmarks/memory/measure_fsdp1.py")
    cal, val = m.points("calibration"), m.points("validation")
    assert len(cal) >= 40 and len(val) >= 12
    every = cal + val
    assert {p["layers"] for p in every} == {10, 24}
    assert {p["batch_size"] for p in every} == {1, 4, 8, 16}
    assert {p["seq_length"] for p in every} == {2048, 4096, 8192}
    assert {p["precision"] for p in every} == {"bf16", "fp16", "fp8", "fp8-current", "fp8-block"}
    assert {p["ac"] for p in every} == {"off", "ckpt", "off-no-te-fsdp"}
    size = ("layers", "batch_size", "seq_length")
    assert not {_key(p, size) for p in val} & {_key(p, size) for p in cal}
    args = m.fsdp_args(m._point("validation", 24, 8, 8192, "fp8-block", "ckpt"), 3)
    assert args[:10] == ["-k", "24", "-b", "8", "-s", "8192", "-n", "16", "-d", "128"]
    assert "--checkpoint-layer" in args and "--precision" in args
    assert m.child_recipe({"precision": "fp8-block"}) == "fp8-block"
    assert m.child_recipe({"precision": "fp8"}) == "none"


def test_fsdp1_output_parsing():
    m = _load("benchmarks/memory/measure_fsdp1.py")
    ok = m.parse_output("[GPU-0] Avg. Iter. Time: 0.5s\n[GPU-0] Peak Memory Use: 12345.678MBs\n"
                        'FSDP1_CHILD {"max_allocated_bytes": 12345678000, "step_s": 0.4}\n')
    assert ok["status"] == "ok" and ok["peak_allocated_bytes"] == 12345678000
    assert ok["reported_avg_iter_s"] == 0.5
    oom = m.parse_output("Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n")
    assert oom["status"] == "oom"
    err = m.parse_output("Traceback ...\nValueError: bad recipe\n")
    assert err["status"] == "error" and "bad recipe" in err["error"]


def test_every_grid_records_the_machine_the_same_way(monkeypatch):
    import torch

    class Props:
        name, total_memory = "NVIDIA H200", 150_000_000_000

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    from benchmarks.gpu_record import machine

    expected = machine()
    assert expected["machine"].startswith("8x NVIDIA H200") and expected["gpu_memory_bytes"] == Props.total_memory
    for rel in ("benchmarks/throughput/measure.py", "benchmarks/memory/measure_grid.py"):
        header = _load(rel).header("python3 x")
        assert {k: header[k] for k in expected} == expected, rel
        assert header["command"] == "python3 x" and header["results"] == []


def test_a_failed_run_records_how_it_ended_and_frees_the_gpu(monkeypatch):
    import torch

    from benchmarks.gpu_record import failed, released

    freed = []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 7)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: 9)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: freed.append(True))

    class Failed:
        kind, reason = "oom", "CUDA out of memory. " * 40

    record: dict = {}
    failed(record, Failed)
    assert record["status"] == "oom" and len(record["error"]) == 300
    assert (record["peak_allocated_bytes"], record["peak_reserved_bytes"]) == (7, 9)
    Failed.kind = "nan"
    failed(record, Failed)
    assert record["status"] == "error"
    assert released(record, 0.0) is record and freed and record["seconds"] > 0


def _grid_families(m) -> dict[str, set]:
    import json

    doc = json.loads((ROOT / "benchmarks/throughput/h200_grid.json").read_text())
    acc = _load("benchmarks/throughput/model_accuracy.py")
    out: dict[str, set] = {}
    for r in doc["results"]:
        out.setdefault(r["split"], set()).add(acc.family(r))
    return out


def test_heldout_split_is_outside_every_family_of_the_h200_grid():
    """Issue 25: at least 26 TE runs, in families h200_grid.json has in neither split, with a
    bf16 / FP8 pair in every family, unseen widths and depths, seq 1k..16k, batch 1..16."""
    m = _load("benchmarks/throughput/measure.py")
    grid = _grid_families(m)
    assert set(grid) == {"calibration", "validation"}
    ho = m.configurations("heldout")
    assert len(ho) >= 26 and all(c["backend"] == "te" and c["split"] == "heldout" for c in ho)
    fams: dict[tuple, set] = {}
    for c in ho:
        fams.setdefault(m.family(c), set()).add(c["precision"])
    assert not set(fams) & (grid["calibration"] | grid["validation"])
    assert all("bf16" in p and p - {"bf16"} for p in fams.values())  # speed-up pairs
    assert {c["precision"] for c in ho} == {"bf16", "fp8", "fp8-current", "fp8-block"}
    assert sum(c["precision"] in ("fp8-current", "fp8-block") for c in ho) >= 4
    assert {3072, 5120} <= {m.spec_of(c).hidden_size for c in ho}
    assert min(c["seq_length"] for c in ho) == 1024 and max(c["seq_length"] for c in ho) == 16384
    assert min(c["batch_size"] for c in ho) == 1 and max(c["batch_size"] for c in ho) == 16
    assert {c["activation_checkpointing"] for c in ho} == {True, False}
    # few tokens per step for the width (FP8's fixed costs dominate): <= 2k tokens at width >= 4096
    assert any(c["batch_size"] * c["seq_length"] <= 2048 and m.spec_of(c).hidden_size >= 4096
               and c["precision"] != "bf16" for c in ho)


def test_torch_set_is_bf16_on_the_torch_backend_in_its_own_roles():
    m = _load("benchmarks/throughput/measure.py")
    grid = _grid_families(m)
    ts = m.configurations("torch")
    assert all(c["backend"] == "torch" and c["precision"] == "bf16" for c in ts)
    cal = [c for c in ts if c["split"] == "calibration-torch"]
    ho = [c for c in ts if c["split"] == "heldout-torch"]
    ho2 = [c for c in ts if c["split"] == "heldout2-torch"]
    assert len(ho) >= 8 and len(cal) + len(ho) + len(ho2) == len(ts)
    assert {m.family(c) for c in cal} <= grid["calibration"]
    assert not {m.family(c) for c in ho + ho2} & (grid["calibration"] | grid["validation"])
    assert {m.family(c) for c in ho} <= {m.family(c) for c in m.configurations("heldout")}
    assert {m.family(c) for c in ho2} <= {m.family(c) for c in m.configurations("heldout2")}


def test_issue_36s_new_held_out_families_are_in_neither_the_grid_nor_the_earlier_held_out_set():
    """The session's held-out check (issue 36): >= 20 configurations whose families the grid
    (what the model is fitted on) does not hold, and that no earlier held-out file held either."""
    m = _load("benchmarks/throughput/measure.py")
    grid = _grid_families(m)
    ho2 = m.configurations("heldout2")
    old = {m.family(c) for c in m.configurations("heldout")}
    fams = {m.family(c) for c in ho2}
    assert not fams & (grid["calibration"] | grid["validation"] | old)
    assert len(ho2) + len(m.configurations("heldout")) >= 20
    # each new family is a pair: bf16 and an FP8 recipe of the same shape (a speed-up to check)
    for f in fams:
        precs = {c["precision"] for c in ho2 if m.family(c) == f}
        assert "bf16" in precs and precs - {"bf16"}, f


def test_device_sets_fit_the_h200_and_the_session_budget():
    """Within 128 GiB predicted, and the expected seconds inside the session's 300 s (TE
    held-out) and 180 s (torch) slots."""
    m = _load("benchmarks/throughput/measure.py")
    for split, budget in (("heldout", 300), ("torch", 180)):
        combos = m.configurations(split)
        assert all(m.predicted_peak_bytes(c) < 128 * 2**30 for c in combos)
        assert sum(m.estimated_seconds(combos, 8)) < budget, split


def test_torch_path_runs_on_a_cpu_without_importing_transformer_engine(tmp_path):
    """The smoke split end to end in a fresh process, with a transformer_engine on the path
    that leaves a mark when imported: measure.py refuses it (the torch set runs on the GPU
    while TE is being installed)."""
    import json
    import os
    import subprocess
    import sys

    fake = tmp_path / "site" / "transformer_engine"
    fake.mkdir(parents=True)
    mark = tmp_path / "imported"
    (fake / "__init__.py").write_text(f"open({str(mark)!r}, 'w').close()\n__version__ = 'fake'\n")
    out, raw = tmp_path / "smoke.json", tmp_path / "raw.log"
    code = ("import sys; from benchmarks.throughput import measure\n"
            f"rc = measure.main(['--out', {str(out)!r}, '--split', 'smoke', '--device', 'cpu', '--steps', '4',"
            f" '--raw-log', {str(raw)!r}])\n"
            "from benchmarks import gpu_record\n"
            "try:\n    import transformer_engine\nexcept ModuleNotFoundError:\n    print('refused')\n"
            "sys.exit(rc)\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path / 'site'}"}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "refused" in p.stdout and not mark.exists()
    doc = json.loads(out.read_text())
    assert set(doc["schema"]) >= {"split", "step_s", "tokens_per_s_per_gpu"}
    assert [r["status"] for r in doc["results"]] == ["ok", "ok"]
    assert all(r["backend"] == "torch" and len(r["step_times_s"]) == 2 for r in doc["results"])
    assert raw.read_text().count("### smoke-") == 2


def test_parts_plan_covers_issue_25_item_1():
    """parts.py's plan: TE linear at every preset's block and LM-head shape, M 2k..64k, 4
    recipes; attention by seq 1k..16k over the presets' heads/head sizes; the fixed costs."""
    parts = _load("benchmarks/throughput/parts.py")
    gemms = _load("benchmarks/throughput/gemms.py")
    lin = parts.linear_args(parts.LINEAR_TOKENS, 0.12)
    items = gemms.todo(lin)
    assert {r for _, r, _ in items} == set(gemms.RECIPES)
    assert {m for _, _, m in items} == {2048, 4096, 8192, 16384, 32768, 65536}
    kn = {(s["in_features"], s["out_features"]) for s, _, _ in items}
    from kfp_sagemaker_blackwell.catalog import spec as spec_mod

    for p in ("small", "1b", "3b", "8b", "14b", "32b", "64b"):
        m = spec_mod.preset(p)
        assert (m.hidden_size, m.hidden_size) in kn and (m.hidden_size, m.vocab_size) in kn
        assert (m.ffn_hidden_size, m.hidden_size) in kn
    plan = parts.plan(list(parts.SECTIONS))
    secs = {s for s, _, _ in plan}
    assert secs == {"layer", "quantisation", "optimizer", "attention", "copy_in"}
    att = parts.attention_shapes()
    assert {(a["heads"], a["kv_heads"], a["head_dim"]) for a in att} >= {(32, 8, 64), (32, 8, 128), (64, 8, 128)}
    assert sum(s == "attention" for s, _, _ in plan) == len(att) * 5
    # the whole plan is expected inside the session's 150 s for parts
    assert 0.4 * len(plan) + gemms.planned_seconds(items, lin) < 150


def test_parts_copy_in_units_are_the_presets_fsdp_units():
    """The copy-in timings (session v11: FSDP2's reduce-scatter copy-in held the host 15 ms a
    step at 8b L4) cover one block and the root of small, mid and wide presets, with exactly
    their units' gradient elements."""
    import math

    parts = _load("benchmarks/throughput/parts.py")
    from kfp_sagemaker_blackwell.catalog import spec as spec_mod

    for p in parts.COPY_IN_PRESETS:
        m = spec_mod.preset(p)
        units = parts.copy_in_shapes(p)
        assert sum(math.prod(s) for s in units["block"]) == m.block_params()
        assert sum(math.prod(s) for s in units["root"]) == m.embedding_params() + m.norm_params()
    assert len(parts.copy_in_shapes("8b")["root"]) == 3 and len(parts.copy_in_shapes("1b")["root"]) == 2
    labels = [label for sec, label, _ in parts.plan(["copy_in"])]
    assert labels == [f"{u} {p}" for p in ("1b", "8b", "64b") for u in ("block", "root")]


def test_parts_fits_recover_slope_and_intercept():
    parts = _load("benchmarks/throughput/parts.py")
    layers = [{"recipe": "fp8", "layers": n, "fwd_bwd_s": 0.002 + 0.0005 * n} for n in (1, 4, 16)]
    f = parts.layer_fit(layers)["fp8"]
    assert abs(f["per_layer_s"] - 0.0005) < 1e-12 and abs(f["per_step_s"] - 0.002) < 1e-12
    q = [{"recipe": "bf16", "elements": e, "fwd_bwd_s": 1e-4} for e in (4, 16, 64)]
    q += [{"recipe": "fp8-block", "elements": e, "fwd_bwd_s": 1e-4 + 2e-6 * e} for e in (4, 16, 64)]
    g = parts.quantisation_fit(q)
    assert set(g) == {"fp8-block"} and abs(g["fp8-block"]["per_element_s"] - 2e-6) < 1e-15
    assert abs(parts.attention_flops(1, 1024, 32, 128) - 3.5 * 2 * 1024 * 1024 * 32 * 128) < 1


def test_gemms_repetitions_cap_long_timings():
    gemms = _load("benchmarks/throughput/gemms.py")
    assert gemms.repetitions(0.5, 5, 20, 20) == (1, 3)  # long: 3 timed, 1 warm-up
    assert gemms.repetitions(1e-4, 5, 20, 20) == (5, 20)
    assert gemms.repetitions(0.5, 5, 20, 0) == (5, 20)  # no cap: as before


def test_the_grid_separates_width_from_depth_at_a_small_step():
    """Session v10: the fit traded a per-parameter cost against the host's per-layer one at
    1-2k tokens. The calibration split now holds the tokens of a step fixed (1 x 1536) and
    varies the width (2048, 4096, 8192) at two depths each, bf16 and fp8, in families that no
    held-out set has, and each fits an 80 GB GPU under the session's 71 GiB cap."""
    m = _load("benchmarks/throughput/measure.py")
    small = [c for c in m.configurations("calibration") if c["batch_size"] * c["seq_length"] == 1536]
    assert {c["split"] for c in small} == {"calibration"}
    by_width: dict[int, set] = {}
    for c in small:
        by_width.setdefault(m.spec_of(c).hidden_size, set()).add((c["num_layers"], c["precision"]))
    assert set(by_width) == {2048, 4096, 8192}
    for width, runs in by_width.items():
        assert len({n for n, _ in runs}) == 2 and {p for _, p in runs} == {"bf16", "fp8"}, width
    held = {m.family(c) for split in ("heldout", "heldout2") for c in m.configurations(split)}
    assert not {m.family(c) for c in small} & held
    assert all(m.predicted_peak_bytes(c) < 71 * 2**30 for c in small)
