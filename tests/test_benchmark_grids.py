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
