"""parse_logs: the parser, the run report, the series CSV and the CLI (no AWS, no KFP)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from kfp_sagemaker_blackwell.catalog import logformat as lf
from kfp_sagemaker_blackwell.common.step_series import SERIES_SCHEMA, parse_series, read_series
from kfp_sagemaker_blackwell.components.parse_logs import parser as P
from kfp_sagemaker_blackwell.components.parse_logs.analysis import analyse
from kfp_sagemaker_blackwell.components.parse_logs.parser import LogParser, feed_blocks, parse_bytes
from kfp_sagemaker_blackwell.components.parse_logs.report import markdown, write_outputs


def step(i, loss=None, precision="fp8", emulated=False, **kw):
    values = dict(loss=3.0 - 0.01 * i if loss is None else loss, lr=3e-4, grad_norm=0.9,
                  tokens_per_s=1000.0 + i, tokens_per_s_per_gpu=125.0, tflops_per_gpu=400.0,
                  mfu=0.2, mem_alloc_gib=40.5, mem_reserved_gib=48.0)
    values.update(kw)
    return lf.format_step(lf.StepRecord(i, precision=precision, emulated=emulated, **values))


def start_lines(precision="fp8", recipe="DelayedScaling", backend="te", emulated=False,
                seed=1234, floor=1.149):
    return [
        lf.format_json("config", {"seed": seed, "batch_size": 8, "seq_length": 2048,
                                  "grad_accum_steps": 1, "precision": precision}),
        lf.format_recipe(lf.RecipeRecord(precision, recipe, backend, emulated)),
        lf.format_json("world", {"world_size": 8, "gpu": "NVIDIA B200"}),
        lf.format_json("data", {"source": "synthetic", "entropy_floor": floor}),
    ]


def parse_lines(lines, **kw):
    return parse_bytes(("\n".join(lines) + "\n").encode(), **kw)


def test_trainer_lines_round_trip_through_the_parser():
    lines = start_lines() + [step(i) for i in range(1, 51)]
    lines.append(lf.format_json("summary", {"status": "completed", "steps": 50,
                                            "tokens": 50 * 131072, "final_loss": 2.5}))
    parsed = parse_lines(lines)
    assert parsed.series["step"] == list(range(1, 51))
    assert parsed.series["loss"][-1] == pytest.approx(2.5)
    assert parsed.series["tokens_per_s"][0] == 1001.0
    assert set(parsed.series["precision"]) == {"fp8"} and not any(parsed.series["emulated"])
    assert parsed.recipe["recipe"] == "DelayedScaling" and parsed.recipe["source"] == "trainer"
    assert parsed.records["data"]["entropy_floor"] == 1.149
    assert parsed.summary["status"] == "completed"
    assert parsed.stats["unparsed_trainer_records"] == 0
    assert parsed.stats["step_lines"] == 50 and parsed.stats["lines"] == len(lines)


def test_bulk_parser_agrees_with_logformat_parse_step_line_by_line():
    recs = [
        lf.StepRecord(7, 2.5, 3e-4, 0.75, 1234.5, 617.2, 1.5, math.nan, 1.25, 2.0, "mxfp8", True),
        lf.StepRecord(8, math.inf, 1e-9, math.nan, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, "fp8-current",
                      False),
        lf.StepRecord(9, -math.inf, 12345.0, 1e30, 1e-30, 5.0, 6.0, 0.5, 79.9, 80.0, "nvfp4",
                      False),
    ]
    lines = ["[default0]:" + lf.format_step(r) for r in recs]
    parsed = parse_lines(lines)
    for i, line in enumerate(lines):
        ref = lf.parse_step(line)
        assert ref is not None
        for name in lf.STEP_FIELDS:
            got = parsed.series[name][i]
            want = getattr(ref, name)
            if isinstance(want, float) and math.isnan(want):
                assert math.isnan(got), name
            else:
                assert got == want, name


def test_noise_around_trainer_lines_is_ignored_and_counted_as_lines():
    noise = [
        "[default3]:algo-1:45:45 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P/CUMEM/read",
        "W1129 12:00:07.1 140 torch/distributed/run.py:793] Setting OMP_NUM_THREADS to 1",
        "[default1]:/usr/lib/python3/site-packages/transformer_engine/base.py:3: UserWarning: x",
        "Training:  45%|████▌     | 450/1000 [00:12<00:15]\rTraining:  46%|████▌     | 460/1000",
        "",
    ]
    lines = []
    for i in range(1, 21):
        lines += noise
        lines.append("[default0]:" + step(i))
    parsed = parse_lines(lines)
    assert parsed.series["step"] == list(range(1, 21))
    assert parsed.stats["lines"] == len(lines)
    assert parsed.stats["unparsed_trainer_records"] == 0
    assert parsed.events == []


def test_step_line_after_a_carriage_return_and_interleaved_with_another_rank_is_read():
    lines = [
        "progress 10%\rprogress 20%\r[default0]:" + step(1),
        "[default1]:rank 1 says hi [default0]:" + step(2),
        "[default0]:" + step(3) + " skipped=1",
    ]
    parsed = parse_lines(lines)
    assert parsed.series["step"] == [1, 2, 3]


GOOD = step(5)


@pytest.mark.parametrize("bad", [
    GOOD[:60],  # cut in the middle
    GOOD.replace("loss=2.950000", "loss=abc"),  # not a number
    GOOD.replace("loss=2.950000", "loss=.95"),  # float() takes these, the contract does not
    GOOD.replace("loss=2.950000", "loss=-.95"),
    GOOD.replace("lr=3.0000e-04", "lr=3_0"),
    GOOD.replace("mfu=0.2000", "mfu=NaN"),
    GOOD.replace("mfu=0.2000", "mfu=infinity"),
    GOOD.replace("step=5", "step=+5"),
    GOOD.replace("precision=fp8", "precision=fp8!"),
    GOOD.replace("loss=2.950000", "loss=2.95\t"),
    "[trainer] summary {not json",
    "[trainer] bogus kind",
    "[trainer] event " + "{" * 5000,  # deeply nested, cut
])
def test_cut_and_garbled_trainer_lines_are_counted_not_fatal(bad):
    parsed = parse_lines([step(4), bad, step(6)])
    assert parsed.series["step"] == [4, 6]
    assert parsed.stats["unparsed_trainer_records"] == 1
    assert lf.parse_step(bad) is None or bad == GOOD[:60]


def test_non_utf8_bytes_do_not_break_parsing():
    data = b"\xff\xfe garbage \x80\x81\n" + step(1).encode() + b"\n\xc3\x28 more\n" + \
        b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB \xff\n"
    parsed = parse_bytes(data)
    assert parsed.series["step"] == [1]
    assert parsed.event_counts["oom"] == 1
    assert parsed.events[0]["bytes_requested"] == int(1.5 * 2**30)


def test_cuda_oom_is_one_event_with_the_allocation_size_in_bytes():
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
           "total capacity of 139.81 GiB of which 1.23 GiB is free. Including non-PyTorch "
           "memory, this process has 138.5 GiB memory in use.")
    lines = start_lines() + [step(1), step(2)]
    lines += [f"[default{r}]:Traceback (most recent call last):" for r in range(2)]
    lines += [f"[default{r}]:{oom.replace('GPU 0', f'GPU {r}')}" for r in range(2)]
    lines.append(lf.format_json("event", {"kind": "oom", "message": "CUDA out of memory: tried "
                                          "to allocate 2.00 GiB on NVIDIA B200 at step 3"}))
    lines.append(lf.format_json("summary", {"status": "failed", "steps": 2,
                                            "failure_reason": "CUDA out of memory at step 3"}))
    parsed = parse_lines(lines)
    ooms = [e for e in parsed.events if e["kind"] == "oom"]
    assert len(ooms) == 1 and parsed.event_counts["oom"] == 1
    assert ooms[0]["bytes_requested"] == 2 * 2**30
    assert ooms[0]["gpu_total_bytes"] == int(139.81 * 2**30)
    assert ooms[0]["step"] == 2 and ooms[0]["reports"] >= 2
    report = analyse(parsed, requested_precision="fp8")
    assert report["status"] == "oom" and report["failed"]
    assert "out of memory" in report["failure_reason"]
    assert parsed.stats["tracebacks"] == 2


def test_old_style_oom_message_and_trainer_only_oom_event_are_read():
    old = ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB "
           "total capacity; 77.1 GiB already allocated)")
    parsed = parse_lines([step(1), old])
    (e,) = [e for e in parsed.events if e["kind"] == "oom"]
    assert e["bytes_requested"] == 20 * 2**20 and e["gpu_total_bytes"] == int(79.15 * 2**30)
    trainer_only = parse_lines([lf.format_json("event", {
        "kind": "oom", "message": "CUDA out of memory: tried to allocate 20.00 GiB on the CPU "
        "(total 139.81 GiB) at step 1"})])
    (e,) = trainer_only.events
    assert e["kind"] == "oom" and e["bytes_requested"] == 20 * 2**30


def test_nan_loss_is_detected_from_step_lines():
    lines = [step(i) for i in range(1, 6)] + [step(6, loss=math.nan), step(7, loss=math.inf)]
    parsed = parse_lines(lines)
    (e,) = [e for e in parsed.events if e["kind"] == "nan_loss"]
    assert e["step"] == 6 and e["non_finite_steps"] == 2
    assert analyse(parsed)["status"] == "nan"


def test_nan_loss_event_from_the_trainer_is_not_doubled():
    lines = [step(1), step(2, loss=math.nan),
             lf.format_json("event", {"kind": "nan_loss", "message": "non-finite loss"})]
    parsed = parse_lines(lines)
    assert parsed.event_counts["nan_loss"] == 1


def test_loss_spike_is_reported_once_per_spike():
    losses = [3.0 - 0.01 * i for i in range(40)]
    losses[20] = losses[21] = 9.0  # one spike over two steps
    losses[35] = 8.0
    parsed = parse_lines([step(i + 1, loss=x) for i, x in enumerate(losses)])
    spikes = [e for e in parsed.events if e["kind"] == "loss_spike"]
    assert [e["step"] for e in spikes] == [21, 36]
    assert spikes[0]["ratio"] > 2
    smooth = parse_lines([step(i + 1, loss=3.0 - 0.01 * i) for i in range(40)])
    assert "loss_spike" not in smooth.event_counts


def test_restart_replays_steps_and_the_later_lines_win():
    lines = start_lines() + [step(i) for i in range(1, 11)]
    lines.append(lf.format_json("event", {"kind": "sigterm", "message": "stop requested"}))
    lines.append(lf.format_json("checkpoint", {"action": "saved", "step": 8, "path": "s3://b/8"}))
    lines += start_lines()
    lines.append(lf.format_json("checkpoint", {"action": "resumed", "step": 8,
                                               "path": "s3://b/8"}))
    lines += [step(i, loss=1.0) for i in range(9, 16)]
    parsed = parse_lines(lines)
    assert parsed.series["step"] == list(range(1, 16))
    assert parsed.series["loss"][8] == 1.0  # step 9 from the second run
    kinds = parsed.event_counts
    assert kinds["sigterm"] == 1 and kinds["checkpoint_saved"] == 1
    assert kinds["checkpoint_resumed"] == 1 and kinds["restart"] == 1


def test_new_stream_for_the_same_host_is_a_restart():
    p = LogParser()
    p.feed((step(1) + "\n").encode(), "job/algo-1-1700000000")
    p.feed(b"hello\n", "job/algo-2-1700000000")
    p.feed((step(2) + "\n").encode(), "job/algo-1-1700003600")
    parsed = p.result()
    restarts = [e for e in parsed.events if e["kind"] == "restart"]
    assert len(restarts) == 1 and restarts[0]["stream"] == "job/algo-1-1700003600"
    assert parsed.streams == ["job/algo-1-1700000000", "job/algo-2-1700000000",
                              "job/algo-1-1700003600"]


def test_nccl_errors_sigterm_and_exceptions_are_events():
    lines = [
        step(1),
        "[rank3]:[E1129 12:00:00 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 milliseconds",
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
        "unhandled system error",
        "[W1129 api.py:704] Received Signals.SIGTERM death signal, shutting down workers",
        "ValueError: something broke",
        "UserWarning: this mentions no error at all",
    ]
    parsed = parse_lines(lines)
    c = parsed.event_counts
    assert c["nccl_error"] == 2 and c["sigterm"] == 1 and c["error"] == 1
    (err,) = [e for e in parsed.events if e["kind"] == "error"]
    assert err["exception"] == "ValueError" and err["step"] == 1


def test_te_fsdp_example_lines_are_read():
    lines = [
        "[GPU-0] WORLD_SIZE = 8",
        "[GPU-0] Using precision preset: mxfp8",
        "[GPU-0] Training configuration: dtype=torch.bfloat16, FP8=enabled",
        "[GPU-0] Using FP8 recipe: MXFP8BlockScaling",
        "[GPU-0] Pre-FSDP memory use = 3221.225472MiB",
        "[GPU-0] Post-FSDP memory use = 402.653184MiB",
        "[GPU-0] Training Time: 12.5s",
        "[GPU-0] Avg. Iter. Time: 2.5s",
        "[GPU-0] Peak Memory Use: 81234.5MBs",
    ]
    parsed = parse_lines(lines)
    assert parsed.te["avg_iter_time_s"] == 2.5 and parsed.te["peak_memory_mb"] == 81234.5
    assert parsed.te["world_size"] == 8 and parsed.te["precision_preset"] == "mxfp8"
    assert parsed.recipe["precision"] == "mxfp8" and parsed.recipe["source"] == "te"
    assert parsed.event_counts["recipe"] == 1
    report = analyse(parsed, requested_precision="mxfp8")
    assert report["status"] == "completed" and report["precision_confirmed"]
    assert report["metrics"]["peak_memory_gib"] == pytest.approx(81234.5e6 / 2**30)
    assert report["metrics"]["avg_iter_time_s"] == 2.5 and not report["warnings"]


def test_te_fsdp_example_in_bf16_confirms_from_its_configuration_line():
    lines = ["[GPU-0] Using precision preset: fp32",
             "[GPU-0] Training configuration: dtype=torch.float32, FP8=disabled",
             "[GPU-0] Avg. Iter. Time: 2.5s"]
    report = analyse(parse_lines(lines), requested_precision="fp32")
    assert report["precision"] == "fp32" and report["precision_confirmed"]


def test_recipe_phrases_from_other_trainers_confirm_the_precision():
    parsed = parse_lines(["2026 INFO MXFP8 enabled", "NVFP4 enabled: NVFP4BlockScaling"])
    assert parsed.recipe["precision"] == "mxfp8"
    assert parsed.event_counts["recipe"] == 2


def test_precision_mismatch_and_missing_confirmation_warn():
    mismatch = analyse(parse_lines(start_lines(precision="bf16", recipe="none")),
                       requested_precision="fp8")
    assert any("precision mismatch" in w for w in mismatch["warnings"])
    assert mismatch["precision"] == "bf16"
    unconfirmed = analyse(parse_lines([step(1, precision="fp8")]), requested_precision="fp8")
    assert any("no start-up line confirms" in w for w in unconfirmed["warnings"])
    assert not unconfirmed["precision_confirmed"]
    ok = analyse(parse_lines(start_lines()), requested_precision="fp8")
    assert not [w for w in ok["warnings"] if "precision" in w]


def test_emulated_runs_are_labelled():
    lines = start_lines(backend="torch", emulated=True) + [step(1, emulated=True)]
    report = analyse(parse_lines(lines), requested_precision="fp8")
    assert report["emulated"] is True
    assert any("EMULATED" in w for w in report["warnings"])
    assert "emulated numerics" in markdown(report)


def test_metrics_use_steady_state_throughput_and_peak_memory():
    lines = start_lines() + [step(1, tokens_per_s=10.0)]
    lines += [step(i, tokens_per_s=1000.0, mem_alloc_gib=40.0 + i) for i in range(2, 21)]
    lines.append(lf.format_json("summary", {"status": "completed", "steps": 20,
                                            "peak_allocated_bytes": 70 * 2**30,
                                            "tokens": 20 * 131072}))
    report = analyse(parse_lines(lines))
    m = report["metrics"]
    assert m["mean_tokens_per_s"] == 1000.0  # the first (warm-up) step is left out
    assert m["peak_memory_gib"] == 70.0
    # final loss: the mean over the final window, the last 10% (2) of the 20 steps
    assert m["final_loss"] == pytest.approx((3.0 - 0.19 + 3.0 - 0.2) / 2)
    assert m["last_loss"] == pytest.approx(3.0 - 0.2)
    assert report["tokens_per_step"] == 131072 and report["seed"] == 1234
    assert report["entropy_floor"] == 1.149


def test_empty_and_stepless_logs_have_clear_statuses():
    assert analyse(parse_bytes(b""))["status"] == "no_logs"
    report = analyse(parse_lines(["just noise"]))
    assert report["status"] == "no_steps" and report["failed"]
    assert analyse(parse_lines([step(1)]))["status"] == "incomplete"


@pytest.mark.parametrize("block", [300, 1000, 4096, 1 << 20])
def test_block_boundaries_do_not_change_the_result(block):
    lines = start_lines() + [f"noise {i}\r" + step(i) for i in range(1, 200)]
    data = ("\n".join(lines) + "\n").encode()
    parser = LogParser()
    feed_blocks(parser, [data[i:i + 333] for i in range(0, len(data), 333)], block=block)
    parsed = parser.result()
    assert parsed.series["step"] == list(range(1, 200))
    assert parsed.stats["lines"] == len(lines)
    assert parsed.stats["unparsed_trainer_records"] == 0


def test_a_line_longer_than_a_block_is_cut_and_the_next_lines_are_read():
    data = b"x" * 10_000 + b"\n" + (step(1) + "\n").encode()
    parser = LogParser()
    feed_blocks(parser, [data], block=4096)
    assert parser.result().series["step"] == [1]


def test_the_exact_pattern_is_used_when_a_value_breaks_the_contract():
    # one bad value in a buffer sends the whole buffer to the exact pattern: same result
    good = [step(i) for i in range(1, 30)]
    bad = good[:10] + [good[10].replace("grad_norm=0.9000", "grad_norm=1_0")] + good[11:]
    parsed = parse_lines(bad)
    assert parsed.series["step"] == [i for i in range(1, 30) if i != 11]
    assert parsed.stats["unparsed_trainer_records"] == 1


def test_series_csv_round_trips_with_metadata(tmp_path):
    lines = start_lines(seed=7, floor=1.2) + [step(i) for i in range(1, 11)]
    lines.append(lf.format_json("summary", {"status": "completed", "steps": 10, "tokens": 10240}))
    parsed = parse_lines(lines)
    path = tmp_path / "s.csv"
    out = write_outputs(parsed, requested_precision="fp8", run="job-fp8", series_path=path,
                        markdown_path=tmp_path / "s.md", events_path=tmp_path / "e.json")
    assert out.rows == 10
    text = path.read_text()
    assert text.startswith(f"# {SERIES_SCHEMA} ")
    s = read_series(path)
    assert s.meta["precision"] == "fp8" and s.meta["status"] == "completed"
    assert s.meta["seed"] == 7 and s.meta["entropy_floor"] == 1.2
    assert s.columns["step"] == list(range(1, 11))
    assert s.columns["tokens"][0] == 1024.0
    assert s.columns["seed"] == [7] * 10 and s.columns["run"][0] == "job-fp8"
    assert s.columns["loss"] == pytest.approx(parsed.series["loss"])
    events = json.loads((tmp_path / "e.json").read_text())
    assert events["schema"] == "kfp-sagemaker/log-events/v1" and events["status"] == "completed"
    assert "| final loss (mean of the last 10% of steps) |" in (tmp_path / "s.md").read_text()


def test_a_run_without_steps_still_writes_its_precision_and_failure(tmp_path):
    lines = start_lines(precision="nvfp4", recipe="NVFP4BlockScaling")
    lines.append("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB.")
    path = tmp_path / "s.csv"
    write_outputs(parse_lines(lines), requested_precision="nvfp4", run="j", series_path=path)
    s = read_series(path)
    assert len(s) == 0 and s.precision == "nvfp4" and s.meta["status"] == "oom"
    assert "8.00 GiB" in s.meta["failure_reason"]


def test_the_series_writer_refuses_a_log_the_readers_would_refuse(tmp_path):
    """Issue 28.10: one contract for writer and readers (kfp_sagemaker_blackwell.common.step_series):
    step lines in a precision the trainer does not know, or in two precisions, do not
    become a series; the error names the row."""
    from kfp_sagemaker_blackwell.common.step_series import SeriesFormatError

    unknown = start_lines() + [step(1), step(2, precision="x_y"), step(3)]
    with pytest.raises(SeriesFormatError, match=r"s\.csv:4.*column precision: 'x_y'"):
        write_outputs(parse_lines(unknown), requested_precision="fp8",
                      series_path=tmp_path / "s.csv")
    mixed = start_lines() + [step(1), step(2, precision="bf16")]
    with pytest.raises(SeriesFormatError, match="step 2 says precision 'bf16' but the "
                                                "metadata says 'fp8'"):
        write_outputs(parse_lines(mixed), requested_precision="fp8",
                      series_path=tmp_path / "s.csv")
    assert not (tmp_path / "s.csv").exists()


def test_a_file_that_is_not_a_series_is_refused_with_its_name(tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="x.csv.*missing column"):
        read_series(bad)
    with pytest.raises(ValueError, match="empty file"):
        parse_series("", source="empty.csv")


def test_cli_reads_a_file_and_stdin_and_prints_json(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("\n".join(start_lines() + [step(i) for i in range(1, 6)]) + "\n")
    cmd = [sys.executable, "-m", "kfp_sagemaker_blackwell.components.parse_logs", "--requested-precision", "fp8",
           "--json"]
    out = subprocess.run(cmd + ["--file", str(log), "--series", str(tmp_path / "s.csv")],
                         capture_output=True, text=True, check=True)
    report = json.loads(out.stdout)
    assert report["status"] == "incomplete" and report["metrics"]["steps"] == 5
    assert (tmp_path / "s.csv").exists()
    piped = subprocess.run(cmd + ["--file", "-"], input=log.read_text(), capture_output=True,
                           text=True, check=True)
    assert json.loads(piped.stdout)["metrics"]["steps"] == 5
    failed = subprocess.run(cmd + ["--file", str(log), "--fail-on-failed-run"],
                            capture_output=True, text=True)
    assert failed.returncode == 0  # incomplete is not failed
    missing = subprocess.run(cmd + ["--file", str(tmp_path / "nope.log")], capture_output=True,
                             text=True)
    assert missing.returncode == 2 and "argument --file: " in missing.stderr


def test_cli_help_explains_the_sources():
    out = subprocess.run([sys.executable, "-m", "kfp_sagemaker_blackwell.components.parse_logs", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--job" in out and "--file" in out and "CloudWatch" in out


def test_fast_and_exact_scan_patterns_have_the_same_groups():
    assert P.SCAN_RE.groups == P.EXACT_SCAN_RE.groups == len(lf.STEP_FIELDS) + 1


def test_cli_fails_by_default_when_the_log_could_not_be_read(tmp_path):
    empty = tmp_path / "empty.log"
    empty.write_text("")
    garbage = tmp_path / "garbage.log"
    garbage.write_bytes(b"\xff\xfe not a trainer line\n" * 3)
    cmd = [sys.executable, "-m", "kfp_sagemaker_blackwell.components.parse_logs", "--json", "--file"]
    for log, status in ((empty, "no_logs"), (garbage, "no_steps")):
        out = subprocess.run(cmd + [str(log)], capture_output=True, text=True)
        assert out.returncode == 1, (log, out.stderr)
        assert json.loads(out.stdout)["status"] == status
        lenient = subprocess.run(cmd + [str(log), "--no-fail-on-failed-run"],
                                 capture_output=True, text=True)
        assert lenient.returncode == 0


class _Out:
    def __init__(self, path):
        self.path, self.metadata, self.metrics = str(path), {}, {}

    def log_metric(self, name, value):
        self.metrics[name] = value


def test_component_step_fails_when_the_log_could_not_be_read(tmp_path):
    from kfp_sagemaker_blackwell.components.parse_logs.component import parse_logs

    (tmp_path / "empty.log").write_text("")
    log = _Out(tmp_path / "empty.log")

    def call(**kwargs):
        outs = {n: _Out(tmp_path / n) for n in ("metrics", "series", "summary", "events")}
        return parse_logs.python_func(log_file=log, **outs, **kwargs), outs

    with pytest.raises(RuntimeError, match="status no_logs.*fail_on_failed_run=False"):
        call()
    result, outs = call(fail_on_failed_run=False)
    assert result.status == "no_logs" and Path(outs["summary"].path).exists()
