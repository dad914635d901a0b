"""Issue 26: a steady state without stalls (the garbage collector scheduled by the trainer),
robust step-time figures, MFU against the bf16 peak, and no view returned by the FSDP2 root."""

import gc
import io
import math
import warnings

import pytest
import torch

from kfp_sagemaker_blackwell.catalog import flags as config
from kfp_sagemaker_blackwell.catalog import logformat, spec
from kfp_sagemaker_blackwell.trainer import gc_schedule, metrics, model, train


def _meter(peak=1979.0, bf16_peak=989.0, warmup=2):
    return metrics.Meter(spec.preset("tiny"), 64, 4_096_000_000, 1, peak, warmup, False, bf16_peak)


def test_step_line_carries_the_timing_fields_and_older_lines_still_parse():
    rec = logformat.StepRecord(7, 2.5, 3e-4, 0.75, 1234.5, 617.2, 1.5, 0.31, 1.25, 2.0, "fp8", False)
    timing = logformat.StepTiming(0.2654, 0.2650, 0.2671, 0.62, 0.0003)
    line = "[default0]: " + logformat.format_step(rec, timing) + " skipped=1"
    assert logformat.parse_step(line) == rec  # a reader of the 12 fields reads it as before
    assert logformat.parse_timing(line) == timing
    old = logformat.format_step(rec)  # a line written before the timing fields existed
    assert logformat.parse_step(old) == rec and logformat.parse_timing(old) is None
    nan = logformat.StepTiming(math.nan, math.nan, math.nan, math.nan, math.nan)
    back = logformat.parse_timing(logformat.format_step(rec, nan))
    assert back is not None and all(math.isnan(x) for x in vars(back).values())


def test_one_slow_step_moves_the_median_figure_by_under_a_percent_and_the_mean_by_far_more():
    steady = [0.250 * (1 + 0.004 * ((i * 7) % 5 - 2)) for i in range(10)]  # +-0.8% jitter

    def summary(times):
        m = _meter()
        for i, t in enumerate([3.0, 0.4, *times], start=1):  # two warm-up steps, left out
            m.record(i, t)
        return m.summary(emulated=False)

    calm, stalled = summary(steady), summary(steady[:5] + [0.5] + steady[5:])  # a 2x step
    robust = stalled["tokens_per_s_per_gpu_median"] / calm["tokens_per_s_per_gpu_median"]
    assert abs(robust - 1) < 0.01
    assert stalled["tokens_per_s_per_gpu"] / calm["tokens_per_s_per_gpu"] < 0.95  # the mean moves
    assert stalled["steady_state_step_s_max"] == 0.5 and stalled["steady_state_steps"] == 11
    assert calm["steady_state_step_s_median"] <= calm["steady_state_step_s_p90"] <= 0.26


def test_mfu_is_against_the_bf16_peak_for_every_precision_with_the_precision_peak_beside_it():
    m = _meter(peak=1979.0, bf16_peak=989.0)
    for i in range(1, 6):
        m.record(i, 0.01)
    record, timing = m.step_record(5, 2.0, 1e-3, 1.0, "fp8", False, gc_s=0.0)
    assert timing.mfu_bf16_peak == pytest.approx(record.mfu * 1979 / 989)
    assert timing.step_s == timing.step_s_median == pytest.approx(0.01)
    s = m.summary(emulated=False)
    assert s["mfu_precision_peak"] == s["mfu"]
    assert s["mfu_bf16_peak"] == pytest.approx(s["mfu"] * 1979 / 989, rel=1e-3)
    emulated = _meter().summary(emulated=True)
    assert emulated["mfu_bf16_peak"] is None and emulated["mfu_bf16_peak_median"] is None


def test_the_schedule_freezes_setup_turns_automatic_collection_off_and_collects_every_n_steps():
    assert gc.isenabled()
    g = gc_schedule.GcSchedule(every=3)
    g.start()
    try:
        assert not gc.isenabled() and gc.get_freeze_count() > 0 and g.frozen == gc.get_freeze_count()
        for step in range(1, 10):
            g.before_step(step)
        assert g.scheduled == 3 and g.automatic == 0  # steps 3, 6, 9
        assert g.take() == pytest.approx(g.scheduled_s) and g.take() == 0.0
    finally:
        g.stop()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert g.summary()["gc_scheduled"] == 3


def test_collections_the_trainer_did_not_schedule_are_recorded_with_their_generation():
    g = gc_schedule.GcSchedule(every=0)  # Python's collector left on: the diagnostic
    g.start()
    try:
        assert gc.isenabled() and gc.get_freeze_count() == 0
        g.before_step(6)
        gc.collect()  # stands for the full collection the thresholds start mid-step
        s = g.summary()
    finally:
        g.stop()
    assert s["gc_automatic"] >= 1 and s["gc_automatic_full"] >= 1 and s["gc_max_pause_step"] == 6
    assert s["gc_scheduled"] == 0 and gc.isenabled()


def test_a_run_with_the_schedule_restores_the_collector_and_reports_what_it_did():
    out = io.StringIO()
    summary = train.run(config.make("tiny", seq_length=32, max_steps=6, log_every=1, gc_every=2),
                        log_out=out)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert summary["gc_every"] == 2 and summary["gc_scheduled"] == 3  # steps 2, 4 and 6
    assert summary["gc_automatic_full"] == 0 and summary["gc_frozen_objects"] > 0
    timings = [t for t in map(logformat.parse_timing, out.getvalue().splitlines()) if t]
    assert len(timings) == 6 and all(t.gc_s >= 0 and t.step_s > 0 for t in timings)
    assert summary["steady_state_step_s_median"] > 0 and summary["tokens_per_s_per_gpu_median"] > 0


def test_gc_every_must_not_be_negative():
    with pytest.raises(config.ConfigError, match="gc-every"):
        config.make("tiny", gc_every=-1)


def test_root_output_is_a_non_view_alias_that_keeps_the_gradient():
    x = torch.randn(2, 3, 4, requires_grad=True)
    view = (x * 2).reshape(6, 4).reshape(2, 3, 4)
    assert view._base is not None
    out = model.root_output(view)
    assert out._base is None and out.data_ptr() == view.data_ptr()
    out.sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 2.0))
    plain = x * 3
    assert model.root_output(plain) is plain


@pytest.mark.parametrize("precision,bare", [("fp8", False), ("fp32", False), ("bf16", True)])
def test_the_fsdp2_root_returns_no_view_on_any_path(precision, bare):
    extra = {"vocab_size": 0, "tie_embeddings": False} if bare else {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train.run(config.make("tiny", seq_length=32, max_steps=2, log_every=1, precision=precision,
                              **extra), log_out=io.StringIO())
    assert not [w for w in caught if "returned a view tensor" in str(w.message)]


def test_graph_pools_free_part_is_reported_because_the_allocated_peak_leaves_it_out(monkeypatch):
    """--cuda-graphs: replays write activations into the graphs' private pools, which the
    allocator counts as reserved, not allocated (session v14's H100: 30.5 GiB allocated, 44.6
    reserved). The summary reports the pools so the step's real footprint can be read."""
    gib = 2**30
    snapshot = [
        {"segment_pool_id": (0, 0), "total_size": 40 * gib, "allocated_size": 30 * gib},  # default pool
        {"segment_pool_id": (1, 0), "total_size": 10 * gib, "allocated_size": 2 * gib},
        {"segment_pool_id": (1, 0), "total_size": 4 * gib, "allocated_size": 0},
    ]
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: snapshot)
    assert metrics.graph_pool_bytes() == {"graph_pool_bytes": 14 * gib, "graph_pool_free_bytes": 12 * gib}
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: snapshot[:1])
    assert metrics.graph_pool_bytes() == {"graph_pool_bytes": 0, "graph_pool_free_bytes": 0}
