"""Which cross-entropy each measured trainer run ran (benchmarks/throughput/loss_kernels.py),
and the harness fix that makes every later run compile its own loss (gpu_record.fresh_compile_state).

measure.py used to run a whole split in one process; dynamo compiles the trainer's
``torch.compile(_cross_entropy, dynamic=False)`` at most 8 times per process, so from the ninth
loss shape on the runs measured the eager loss, not the compiled one users run."""

import importlib
import json

import pytest
import torch

from benchmarks import gpu_record


def _kernels():
    return importlib.import_module("benchmarks.throughput.loss_kernels")


def _run(name: str, batch: int, seq: int, vocab: int = 128256) -> dict:
    return {"name": name, "batch_size": batch, "seq_length": seq, "status": "ok",
            "model": {"vocab_size": vocab}}


WARNING = ("[rank0]:W1208 01:13:20.357000 2536 torch/_dynamo/convert_frame.py:1743] [1/8] "
           "torch._dynamo hit config.recompile_limit (8)\n"
           "[rank0]:W1208 01:13:20.357000 2536 torch/_dynamo/convert_frame.py:1743] [1/8]    "
           "function: '_cross_entropy' (/work/main/kfp_sagemaker_blackwell/trainer/loss.py:30)\n")
START = "transformer_engine/__init__.py:130: RuntimeWarning: Detected a Jax installation but ...\n"


def _log(runs: list[dict], warn_before: str | None) -> str:
    out = START
    for r in runs:
        if r["name"] == warn_before:
            out += WARNING
        out += json.dumps({"name": r["name"], "status": "ok"}) + "\n"
    return out


def test_the_ninth_loss_shape_of_a_process_ran_eager_and_the_log_says_so():
    k = _kernels()
    runs = [_run(f"r{i}", 1, 1024 * (i + 1)) for i in range(10)]
    runs.insert(3, _run("again", 1, 1024))  # a shape already compiled: compiled again
    runs.append(_run("bare-stack", 4, 4096, vocab=0))  # no cross-entropy at all
    got = k.replay({"results": runs}, _log(runs, warn_before="r8"))
    assert got["eager"] == ["r8", "r9"] and got["compiled"] == 9 and got["problems"] == []
    # A second process starts with an empty cache: the same shapes compile again.
    two = k.replay({"results": runs}, _log(runs[:6], None) + _log(runs[6:], None))
    assert two["eager"] == [] and two["problems"] == []


def test_runs_measured_after_the_harness_fix_count_compiled():
    """measure.py marks each run it measured after emptying dynamo's caches ("compile_state":
    "fresh"): however many shapes came before, the run compiled its loss."""
    k = _kernels()
    runs = [dict(_run(f"r{i}", 1, 1024 * (i + 1)), compile_state="fresh") for i in range(12)]
    got = k.replay({"results": runs}, _log(runs, warn_before=None))
    assert got["eager"] == [] and got["compiled"] == 12 and got["problems"] == []
    assert k.label_without_log({"results": runs})["eager"] == []


def test_a_replay_that_disagrees_with_the_log_is_reported_not_labelled():
    k = _kernels()
    runs = [_run(f"r{i}", 1, 1024 * (i + 1)) for i in range(10)]
    assert k.replay({"results": runs}, _log(runs, warn_before="r9"))["problems"]
    assert k.replay({"results": runs}, _log(runs, warn_before=None))["problems"]


def test_the_committed_labels_are_what_the_logs_say():
    """loss_kernel_runs.json is rebuilt from the committed logs (every replay checked against
    dynamo's warnings) and matches; the held-out splits of every session ran 13-14 runs eager,
    among them v21's val-8b-L6-b1-s16384 bf16 (22% slower than in v10, whose process compiled it)."""
    k = _kernels()
    assert k.main(["--check"]) == 0
    files = json.loads(k.OUT.read_text())["files"]
    assert files["h200_grid.json"]["default"] == "eager"
    assert "val-8b-L6-b1-s16384-noac-bf16" in files["raw/session_v21_h100/grid.json"]["eager"]
    assert "val-8b-L6-b1-s16384-noac-bf16" not in files["raw/session_v10_h100/grid.json"]["eager"]
    for s in ("v6_h100", "v10_h100", "v13_h200", "v21_h100"):
        assert len(files[f"raw/session_{s}/heldout.json"]["eager"]) in (13, 14)


def test_model_accuracy_predicts_each_run_with_the_loss_it_ran():
    """By default; --eager-unlabelled predicts as every report before session v22 did."""
    acc = importlib.import_module("benchmarks.throughput.model_accuracy")
    path = acc.SESSION_V13 / "heldout.json"
    labelled = {r["name"]: r for r in acc.load(path)["results"]}
    acc.LOSS_AS_RUN = False
    try:
        plain = {r["name"]: r for r in acc.load(path)["results"]}
    finally:
        acc.LOSS_AS_RUN = True
    assert "loss_kernel" not in plain["ho-3b-L4-b1-s8192-noac-bf16"]
    assert acc.setup_of(plain["ho-3b-L4-b1-s8192-noac-bf16"]).loss_kernel == "eager"
    assert labelled["ho-3b-L4-b1-s8192-noac-bf16"]["loss_kernel"] == "compiled"
    assert labelled["ho-3b-L4-b4-s8192-ac-bf16"]["loss_kernel"] == "eager"
    assert acc.setup_of(labelled["ho-3b-L4-b1-s8192-noac-bf16"]).loss_kernel == "compiled"
    assert acc.load(acc.GRID)["results"][0]["loss_kernel"] == "eager"  # 2026-12-01: before the compiled loss


def _compiles(fn, shapes, reset: bool) -> int:
    """How many of ``shapes`` ran a graph dynamo compiled for them (the rest ran eager)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    compiled = 0
    for n in shapes:
        if reset:
            gpu_record.fresh_compile_state()
        before = counters["stats"]["unique_graphs"]
        fn(torch.zeros(n, 4), torch.zeros(n, dtype=torch.long))
        compiled += counters["stats"]["unique_graphs"] > before
    return compiled


@pytest.mark.filterwarnings("ignore")
def test_each_configuration_compiles_its_own_loss_after_the_harness_resets_dynamo():
    """The dynamo behaviour loss_kernels.py replays, on this CPU (the eager backend: dynamo's
    cache, not inductor's code): ten new shapes in one process compile eight times; with the
    harness's reset before each configuration every one compiles, as in a user's job."""

    def ce(logits, targets):
        return torch.nn.functional.cross_entropy(logits.float(), targets)

    fn = torch.compile(ce, dynamic=False, backend="eager")
    shapes = [2 + i for i in range(10)]
    assert _compiles(fn, shapes, reset=False) == _kernels().RECOMPILE_LIMIT == torch._dynamo.config.recompile_limit
    assert _compiles(fn, shapes, reset=True) == 10
