"""The trainer's speed levers (issue 26) on the CPU: same numerics as the default path, and the
combinations they cannot serve refused with the flag and the fix."""

import contextlib
import io
import sys
import types

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from kfp_sagemaker_blackwell.catalog import flags as config
from kfp_sagemaker_blackwell.catalog import logformat
from kfp_sagemaker_blackwell.trainer import parallel, te_backend, train
from kfp_sagemaker_blackwell.trainer.model import init_weights

NO_OUTPUTS = dict(output_data_dir="", model_dir="")


def _run(**kw):
    out = io.StringIO()
    kw.setdefault("seq_length", 32)
    kw.setdefault("max_steps", 3)
    kw.setdefault("checkpoint_dir", "")
    summary = train.run(config.make("tiny", log_every=1, **NO_OUTPUTS, **kw), log_out=out)
    lines = out.getvalue().splitlines()
    steps = [(r.loss, r.grad_norm) for r in map(logformat.parse_step, lines) if r is not None]
    model = next(p for k, p in filter(None, map(logformat.parse_json, lines)) if k == "model")
    return summary, steps, model


@pytest.mark.parametrize("accum", [1, 2])
def test_the_unsharded_one_gpu_path_trains_exactly_as_fsdp2(accum):
    fsdp, fsdp_steps, fsdp_model = _run(grad_accum_steps=accum)
    plain, plain_steps, plain_model = _run(grad_accum_steps=accum, single_gpu_fsdp=False)
    assert (fsdp_model["sharding"], plain_model["sharding"]) == ("fsdp2", "none")
    assert plain_steps == fsdp_steps
    assert plain["final_loss"] == fsdp["final_loss"]


def test_late_sync_reads_the_same_losses_and_still_stops():
    _, early, _ = _run()
    summary, late, _ = _run(late_sync=True)
    assert late == early and summary["status"] == "completed"
    stopped, _, _ = _run(late_sync=True, stop_after_step=2)
    assert stopped["status"] == "stopped" and stopped["steps"] == 2


@pytest.mark.parametrize("kw", [dict(), dict(grad_accum_steps=2), dict(late_sync=True)])
def test_data_prefetch_trains_on_the_same_batches_and_uses_each_prefetched_one(kw, monkeypatch):
    _, plain, _ = _run(**kw)
    made: list[tuple[int, int, bool]] = []
    real = train._batch

    def counted(source, cfg, world, step, micro, plan, pin=False):
        made.append((step, micro, pin))  # pin: made by the prefetch (pinned for the copy)
        return real(source, cfg, world, step, micro, plan, pin)

    monkeypatch.setattr(train, "_batch", counted)
    # a global optimizer post-hook, as benchmarks/trainer/steady_timer.py's CUDA sync: the next
    # batch must be made before it runs, or a timed run would prefetch on an idle GPU
    at_sync: list[tuple[int, int]] = []
    handle = register_optimizer_step_post_hook(lambda *_: at_sync.append(made[-1][:2]))
    try:
        summary, ahead, _ = _run(data_prefetch=True, **kw)
    finally:
        handle.remove()
    assert ahead == plain and summary["status"] == "completed"
    # each batch made once: step 1's in its step, steps 2 and 3's first micro-batch by the step
    # before (after its update), none for the step after the last
    micros = kw.get("grad_accum_steps", 1)
    assert made == [(1, m, False) for m in range(micros)] + [
        (s, m, m == 0) for s in (2, 3) for m in range(micros)]
    assert at_sync == [(2, 0), (3, 0), (3, micros - 1)]


def test_a_source_that_fails_while_prefetching_fails_the_step_that_needs_it(monkeypatch):
    real = train._batch

    def failing(source, cfg, world, step, micro, plan, pin=False):
        if step == 3:
            raise ValueError("vocab-size=256: token id 300 in /data; set vocab-size above the largest id")
        return real(source, cfg, world, step, micro, plan, pin)

    monkeypatch.setattr(train, "_batch", failing)
    failures = []
    for prefetch in (False, True):
        with pytest.raises(train.TrainingFailed) as err:
            _run(data_prefetch=prefetch)
        failures.append((err.value.reason, err.value.summary["steps"]))
    assert failures[0] == failures[1] and "token id 300" in failures[0][0] and failures[0][1] == 2


@pytest.mark.parametrize("kw, field", [
    (dict(fp8_weight_cache=True, precision="bf16"), "fp8-weight-cache"),
    (dict(cuda_graphs=True), "cuda-graphs"),  # FSDP2 on one GPU is the default
    (dict(cuda_graphs=True, single_gpu_fsdp=False, activation_checkpointing=True), "cuda-graphs"),
    (dict(late_sync=True, precision="fp16"), "late-sync"),
])
def test_unsupported_lever_combinations_are_refused_with_the_fix(kw, field):
    with pytest.raises(config.ConfigError) as err:
        config.make("tiny", **kw).validate()
    assert err.value.name == field and "Fix:" in str(err.value)


@pytest.mark.parametrize("kw", [dict(fp8_weight_cache=True, precision="fp8"),
                                dict(cuda_graphs=True, single_gpu_fsdp=False)])
def test_te_only_levers_are_refused_on_the_torch_backend_before_any_work(kw):
    with pytest.raises(config.ConfigError) as err:
        train.run(config.make("tiny", backend="torch", device="cpu", checkpoint_dir="", **NO_OUTPUTS, **kw))
    assert "backend=te" in str(err.value) and "Fix:" in str(err.value)


def test_the_weight_cache_marks_only_the_first_micro_batch_of_a_step():
    seen: list[bool | None] = []

    class Recorder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(()))

        def forward(self, inputs, is_first_microbatch=None):
            seen.append(is_first_microbatch)
            return torch.nn.functional.one_hot(inputs, cfg.model.vocab_size).float() * self.w

    cfg = config.make("tiny", precision="fp8", fp8_weight_cache=True, grad_accum_steps=3, seq_length=8,
                      batch_size=2)
    world = parallel.World(0, 0, 1, 1, torch.device("cpu"))
    from kfp_sagemaker_blackwell.trainer import data

    trainer = train.Trainer(cfg, types.SimpleNamespace(param_dtype=None), world)
    trainer.model, trainer.source = Recorder(), data.make_source(cfg)
    trainer.batches = train._Batches(trainer.source, cfg, world, trainer.plan)
    import contextlib

    for step in (1, 2):
        trainer.forward_backward(step, contextlib.nullcontext)
    assert seen == [True, False, False, True, False, False]
    assert te_backend.block_kwargs(None, None) == {}
    freqs = torch.zeros(4)
    assert te_backend.block_kwargs(freqs, False) == {"rotary_pos_emb": freqs, "is_first_microbatch": False}


def test_the_unsharded_compute_autocast_gives_the_residual_stream_the_compute_dtype():
    cpu = parallel.World(0, 0, 1, 1, torch.device("cpu"))
    assert parallel.compute_autocast(cpu, torch.bfloat16, sharded=False) is __import__("contextlib").nullcontext
    gpu = parallel.World(0, 0, 1, 1, torch.device("cuda", 0))
    assert parallel.compute_autocast(gpu, torch.bfloat16, sharded=True) is __import__("contextlib").nullcontext
    ctx = parallel.compute_autocast(gpu, torch.bfloat16, sharded=False)
    assert ctx.keywords == {"dtype": torch.bfloat16, "cache_enabled": False}  # graphs need the cache off
    h = torch.randn(2, 3)
    assert parallel.cast_to_compute(h) is h
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert parallel.cast_to_compute(h).dtype == torch.bfloat16
        assert parallel.cast_to_compute(torch.arange(3)).dtype == torch.int64


def test_the_unsharded_path_checkpoints_and_resumes_either_way(tmp_path):
    full, _, _ = _run(max_steps=5)
    for name, first, second in (("plain", False, False), ("from-fsdp2", True, False)):
        ck = str(tmp_path / name)
        _run(max_steps=5, checkpoint_dir=ck, stop_after_step=2, single_gpu_fsdp=first)
        resumed, _, _ = _run(max_steps=5, checkpoint_dir=ck, single_gpu_fsdp=second)
        assert resumed["resumed_from_step"] == 2 and resumed["final_loss"] == full["final_loss"], name


class _QuantisedByItsOwnInit(torch.nn.Module):
    """Stands in for a TE module under ``quantized_model_init``: its ``reset_parameters``
    materialises and sets its own weight (here a constant that ``init_weights`` never draws)."""

    def __init__(self, n: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(n, n, device="meta"))

    def reset_parameters(self) -> None:
        self.weight = torch.nn.Parameter(torch.full(self.weight.shape, 7.0))


class _MetaModel(torch.nn.Module):
    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.tok_embeddings = torch.nn.Embedding(vocab, hidden, device="meta")
        self.block = _QuantisedByItsOwnInit(hidden)


@pytest.mark.parametrize("quantized", [False, True])
def test_materialise_initialises_every_parameter_te_does_not(monkeypatch, quantized):
    # Session v7 (one H100): with --quantized-model-init the token embedding was materialised
    # empty and never initialised, and the first loss was NaN. TE's own modules keep the values
    # their reset_parameters drew (and quantised) only under quantized_model_init.
    cfg = config.make("tiny", precision="fp8", quantized_model_init=quantized)
    model = _MetaModel(cfg.model.vocab_size, 64)
    with torch.no_grad():
        te_backend.materialise(model, [model.block], cfg, torch.device("cpu"))
    emb = model.tok_embeddings.weight
    assert not emb.is_meta and torch.isfinite(emb).all()
    assert abs(emb.std().item() - 0.02) < 0.002 and abs(emb.mean().item()) < 0.002
    # the same values a full initialisation gives the embedding, whatever it skipped
    reference = _MetaModel(cfg.model.vocab_size, 64).to_empty(device="cpu")
    init_weights(reference, cfg.model, cfg.seed)
    assert torch.equal(emb, reference.tok_embeddings.weight)
    block = model.block.weight
    assert torch.equal(block, torch.full_like(block, 7.0)) == quantized


class _StandInLayer(torch.nn.Module):
    """te.TransformerLayer's stand-in: records its keyword arguments."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.kwargs = kwargs


def _stand_in_te(monkeypatch) -> None:
    te = types.ModuleType("transformer_engine.pytorch")
    te.TransformerLayer = _StandInLayer
    te.RMSNorm = te.LayerNorm = te.Linear = te.RotaryPositionEmbedding = lambda *a, **k: torch.nn.Identity()
    te.quantized_model_init = lambda **k: contextlib.nullcontext()
    root = types.ModuleType("transformer_engine")
    root.pytorch = te
    monkeypatch.setitem(sys.modules, "transformer_engine", root)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", te)
    monkeypatch.setattr(te_backend, "te_recipe", lambda *a: None)


@pytest.mark.parametrize("quantized", [False, True])
def test_te_blocks_draw_the_trainers_initialisation(monkeypatch, quantized):
    # Session v11 (one H100): with --quantized-model-init TE drew the blocks' weights with its
    # default normal(0, 0.023) and no depth scaling, so the output projections started 6.5x
    # larger than the control's and the loss did not move in 16 steps. TE's blocks now get
    # init_weights' distributions: normal(0, 0.02), proj and fc2 by 1/sqrt(2 * layers).
    _stand_in_te(monkeypatch)
    cfg = config.make("tiny", precision="fp8", quantized_model_init=quantized)
    model = te_backend.TECausalLM(cfg, set(), device="meta")
    layers = cfg.model.num_layers
    assert len(model.blocks) == layers
    g = torch.Generator().manual_seed(0)
    for block in model.blocks:
        for key, std in (("init_method", 0.02), ("output_layer_init_method", 0.02 / (2 * layers) ** 0.5)):
            w = torch.empty(512, 512)
            torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=g)))
            block.kwargs[key](w)
            assert abs(w.std().item() / std - 1.0) < 0.02 and abs(w.mean().item()) < 0.05 * std, key
