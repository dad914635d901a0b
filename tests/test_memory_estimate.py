"""The memory estimate: its arithmetic, its planning rules, its errors, CLI and component."""

import dataclasses
import json
import subprocess
import sys
import time

import pytest

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.catalog.spec import PRESETS, preset
from kfp_sagemaker_blackwell.common.errors import USER_ERROR_EXIT_CODE, UserError
from kfp_sagemaker_blackwell.components.memory_estimate import __main__ as cli
from kfp_sagemaker_blackwell.components.memory_estimate import report
from kfp_sagemaker_blackwell.components.memory_estimate.launcher import run_component
from kfp_sagemaker_blackwell.planning import estimator, planner
from kfp_sagemaker_blackwell.planning.estimator import estimate, phases
from kfp_sagemaker_blackwell.planning.memory_plan import MemoryPlan
from kfp_sagemaker_blackwell.planning.training_setup import TrainingSetup

GiB = 2**30


def _run_component(**given):
    """The component's work with the signature's defaults for what is not given."""
    return run_component(**cli.with_defaults(given))


def _phase(setup, name, gpu="H200"):
    return dict(phases(setup, gpu))[name]


def _request(model="8b", *, instance_type="ml.p6-b200.48xlarge", gpu=None, world_size=None,
             seq=4096, batch=(0,), precisions=("bf16",), ac="auto", headroom=0.05, **training):
    hw = planner.resolve_hardware(gpu=gpu, instance_type=instance_type if not gpu else None,
                                  world_size=world_size)
    return planner.Request(preset(model), seq, hw, tuple(precisions), tuple(batch), ac, headroom,
                           training)


# ---- arithmetic -------------------------------------------------------------------------


def test_optimizer_step_holds_16_bytes_per_parameter_for_fp32_master_and_adam_states():
    # Rajbhandari et al.: fp32 master (4) + fp32 moments (8) + gradient; here the
    # sharded gradient is fp32 too (FSDP2 casts it to the parameter's dtype): 16 B.
    s = TrainingSetup(preset("1b"), batch_size=1, seq_length=128)
    parts = _phase(s, "optimizer step")
    p = s.model.total_params()
    states = parts["parameters"] + parts["gradients"] + parts["optimizer_states"]
    assert states == pytest.approx(16 * p)
    assert parts["master_weights"] == 0  # fp32 parameters are the master weights


def test_sharded_states_divide_by_the_world_size():
    one = _phase(TrainingSetup(preset("8b"), 1, 128), "optimizer step")
    eight = _phase(TrainingSetup(preset("8b"), 1, 128, world_size=8), "optimizer step")
    for part in ("parameters", "gradients", "optimizer_states"):
        assert eight[part] == pytest.approx(one[part] / 8)


def test_te_fsdp_example_settings_hold_bf16_params_grads_and_states_without_master():
    s = TrainingSetup(preset("te-fsdp-example"), 1, 128, param_dtype="bf16", master_weights=False,
                      optimizer_state_dtype="bf16", fsdp_version=1, optimizer="adamw-foreach")
    parts = _phase(s, "optimizer step")
    p = s.model.total_params()
    assert parts["parameters"] == pytest.approx(2 * p)
    assert parts["gradients"] == pytest.approx(2 * p)
    assert parts["optimizer_states"] == pytest.approx(4 * p)
    assert parts["master_weights"] == 0
    assert parts["fsdp_buffers"] == pytest.approx(2 * p)  # foreach Adam's sqrt temporary


def test_bf16_params_with_master_weights_add_an_fp32_copy():
    s = TrainingSetup(preset("1b"), 1, 128, param_dtype="bf16", master_weights=True)
    assert _phase(s, "optimizer step")["master_weights"] == pytest.approx(4 * s.model.total_params())


@pytest.mark.parametrize(
    "precision,gpu,bytes_per_param",
    [("mxfp8", "B200", 2.0625), ("nvfp4", "B200", 1.125), ("fp8", "H200", 2.0),
     ("fp8", "B200", 1.0)],
)
def test_te_quantised_weight_copies_follow_the_format_byte_sizes(precision, gpu, bytes_per_param):
    # One block's copy is live while it computes (FSDP2: not kept forward -> backward,
    # as measured on the H200 grid).
    m = preset("8b")
    s = TrainingSetup(m, 1, 1024, precision=precision)
    last = f"backward of block {m.num_layers - 1}"
    assert _phase(s, last, gpu)["quantized_weights"] == pytest.approx(
        estimator._block_linear_weights(m) * bytes_per_param
    )
    assert _phase(s, "loss forward", gpu)["quantized_weights"] == 0
    # 16-bit precisions keep no quantised copy.
    assert _phase(TrainingSetup(m, 1, 1024), last, gpu)["quantized_weights"] == 0


def test_block_activations_match_the_tensors_trainer_blocks_save_on_an_h200():
    # benchmarks/memory/probe_h200.json measured kfp_sagemaker_blackwell.trainer.model.Block (bf16) saving
    # these bytes per token beyond its (pre-existing) input; the estimator counts
    # the input too (the previous block's output, saved once per block).
    measured_without_input = {"1b": 93320.125, "te-fsdp-example": 53328.125, "8b": 170120.25}
    for name, measured in measured_without_input.items():
        s = TrainingSetup(preset(name), 1, 2048, backend="torch")
        per_token = estimator._block_saved_bytes_per_token(s)
        assert per_token - 2 * s.model.hidden_size == pytest.approx(measured, abs=1)


def test_cross_entropy_bytes_per_logit_match_the_measured_trainer_loss():
    s = TrainingSetup(preset("1b"), 2, 1024, loss_kernel="eager")
    fwd, bwd, _, held = estimator._loss_bytes(s, 2048)
    n = 2048 * 128256
    # probe_h200.json "loss": forward peak 8, backward peak 12 above the held bf16 logits.
    assert (fwd / n, bwd / n, held / n) == (10.0, 14.0, 2.0)


def test_compiled_cross_entropy_keeps_no_fp32_copy_of_the_logits():
    s = TrainingSetup(preset("1b"), 2, 1024)
    assert s.loss_kernel == "compiled"  # the trainer's default (--loss-kernel)
    fwd, bwd, _, held = estimator._loss_bytes(s, 2048)
    n = 2048 * 128256
    # The 16-bit logits, plus the gradient in their dtype in backward, plus fp32 per token.
    assert fwd / n == pytest.approx(2.0, abs=1e-3) and bwd / n == pytest.approx(4.0, abs=1e-3)
    assert held / n == 2.0


def test_unknown_loss_kernel_is_refused_by_name():
    with pytest.raises(UserError, match="loss_kernel"):
        estimate(TrainingSetup(preset("1b"), 1, 128, loss_kernel="fused"), "H200")


def test_vocab_zero_has_no_logits_and_no_root_parameters():
    s = TrainingSetup(preset("te-fsdp-example"), 4, 2048)
    for _, parts in phases(s, "H200"):
        assert parts.get("logits_and_loss", 0) == 0
    assert estimator._Terms(s, hardware.gpu("H200")).p_root == 0


def test_peak_grows_with_batch_and_sequence_and_checkpointing_lowers_it():
    m = preset("8b")
    peaks = [estimate(TrainingSetup(m, b, 2048, world_size=8), "B200").peak_bytes
             for b in (1, 2, 4, 8)]
    assert peaks == sorted(peaks) and len(set(peaks)) == 4
    short = estimate(TrainingSetup(m, 2, 2048, world_size=8), "B200").peak_bytes
    long = estimate(TrainingSetup(m, 2, 8192, world_size=8), "B200").peak_bytes
    assert long > short
    ckpt = estimate(TrainingSetup(m, 4, 4096, world_size=8, activation_checkpointing=True), "B200")
    full = estimate(TrainingSetup(m, 4, 4096, world_size=8), "B200")
    assert ckpt.peak_bytes < 0.6 * full.peak_bytes


def test_breakdown_adds_up_to_the_peak_and_names_every_part():
    e = estimate(TrainingSetup(preset("14b"), 2, 4096, precision="fp8", world_size=8), "H200")
    assert list(e.breakdown) == list(estimator.PARTS)
    assert sum(e.breakdown.values()) == e.peak_bytes
    assert e.peak_allocated_bytes == sum(e.breakdown[k] for k in estimator.ALLOCATED_PARTS)
    assert e.breakdown["cuda_context"] > 0 and e.breakdown["allocator_reserve"] > 0


def test_gradient_accumulation_keeps_unsharded_fp32_gradients_alive_through_forward():
    # FSDP2 without gradient sync accumulates unsharded gradients in the reduce dtype.
    m = preset("8b")
    plain = _phase(TrainingSetup(m, 1, 1024, world_size=8), "loss forward")
    accum = _phase(TrainingSetup(m, 1, 1024, world_size=8, gradient_accumulation_steps=4),
                   "loss forward")
    assert plain["gradients"] == 0
    assert accum["gradients"] == pytest.approx(4 * m.total_params())


def test_quantized_model_init_stores_linear_weights_quantised():
    m = preset("8b")
    plain = _phase(TrainingSetup(m, 1, 1024, precision="mxfp8", world_size=8), "optimizer step")
    qinit = _phase(TrainingSetup(m, 1, 1024, precision="mxfp8", world_size=8,
                                 param_dtype="bf16", quantized_model_init=True), "optimizer step")
    lin = m.num_layers * estimator._block_linear_weights(m)
    expected = (lin * 2.0625 + (m.total_params() - lin) * 2) / 8  # MXFP8 weights, bf16 rest
    assert qinit["parameters"] == pytest.approx(expected)
    assert qinit["parameters"] < plain["parameters"]
    assert qinit["master_weights"] == pytest.approx(4 * m.total_params() / 8)


def test_the_unsharded_one_gpu_model_holds_each_weight_copy_and_no_fsdp_buffers():
    """--no-single-gpu-fsdp (issue 40's lever): the plain module holds every block's weight
    copy from its forward to its backward, FSDP2 none (the trainer's measured rows:
    tests/test_memory_estimate_accuracy.py)."""
    sharded = TrainingSetup(model=preset("1b"), batch_size=4, seq_length=4096, precision="fp8")
    plain = dataclasses.replace(sharded, single_gpu_fsdp=False)
    assert estimate(plain, "H100").breakdown["fsdp_buffers"] == 0
    assert estimate(plain, "H100").peak_allocated_bytes > estimate(sharded, "H100").peak_allocated_bytes
    # more GPUs always shard: the switch means nothing there
    eight = dataclasses.replace(sharded, world_size=8)
    assert estimate(dataclasses.replace(eight, single_gpu_fsdp=False), "H100").peak_allocated_bytes == \
        estimate(eight, "H100").peak_allocated_bytes


def test_cuda_graphs_add_the_blocks_static_weight_gradients_before_the_backward():
    """--cuda-graphs: the backward graphs' static outputs are every block's weight gradients,
    alive from the first forward on (TE's make_graphed_callables); the eager step has none
    before its backward (the trainer's measured footprints: tests/test_memory_estimate_accuracy.py)."""
    eager = TrainingSetup(model=preset("1b"), batch_size=4, seq_length=4096, precision="fp8", single_gpu_fsdp=False)
    graphed = estimate(dataclasses.replace(eager, cuda_graphs=True), "H100")
    blocks = preset("1b").num_layers * preset("1b").block_params() * 4  # fp32 weight gradients
    assert graphed.peak_allocated_bytes == pytest.approx(estimate(eager, "H100").peak_allocated_bytes + blocks, rel=1e-6)
    assert graphed.phase == estimate(eager, "H100").phase
    # accumulating micro-batches, TE clones each returned gradient: both copies are held
    accum = dataclasses.replace(eager, gradient_accumulation_steps=2)
    assert estimate(dataclasses.replace(accum, cuda_graphs=True), "H100").peak_allocated_bytes == \
        pytest.approx(estimate(accum, "H100").peak_allocated_bytes + blocks, rel=1e-6)


@pytest.mark.parametrize("change, field", [
    (dict(world_size=8), "world_size"),
    (dict(single_gpu_fsdp=True), "single_gpu_fsdp"),
    (dict(activation_checkpointing=True), "activation_checkpointing"),
    (dict(backend="torch"), "backend"),
])
def test_cuda_graphs_are_refused_where_the_trainer_cannot_capture_them(change, field):
    setup = TrainingSetup(model=preset("1b"), batch_size=1, seq_length=2048, precision="fp8",
                          single_gpu_fsdp=False, cuda_graphs=True)
    with pytest.raises(UserError) as exc:
        estimate(dataclasses.replace(setup, **change), "H100")
    assert exc.value.field == field and "cuda_graphs" in str(exc.value)


def test_cuda_graphs_plan_without_checkpointing_and_refuse_it_when_asked():
    out = _run_component(model_preset="1b", gpu="H100", world_size=1, seq_length=4096, precisions=["fp8"],
                         single_gpu_fsdp=False, cuda_graphs=True)
    entry = json.loads(out.plan)["precisions"]["fp8"]
    assert entry["activation_checkpointing"] is False and entry["batch_size"] >= 1
    with pytest.raises(UserError) as exc:
        _run_component(model_preset="1b", gpu="H100", world_size=1, seq_length=4096, precisions=["fp8"],
                       single_gpu_fsdp=False, cuda_graphs=True, activation_checkpointing="on")
    assert exc.value.field == "activation_checkpointing"


def test_an_estimate_takes_under_10_ms_and_imports_no_torch():
    s = TrainingSetup(PRESETS["64b"], 4, 8192, precision="mxfp8", world_size=16)
    gpu = hardware.gpu("B200")
    t0 = time.thread_time()  # CPU time: the estimate's cost, not the machine's load
    for _ in range(100):
        estimate(s, gpu)
    assert (time.thread_time() - t0) / 100 < 0.010
    code = ("import sys; import kfp_sagemaker_blackwell.components.memory_estimate.launcher; "
            "print([m for m in ('torch', 'kfp', 'transformer_engine') if m in sys.modules]); "
            "import kfp_sagemaker_blackwell.components.memory_estimate.__main__; "
            "print([m for m in ('torch', 'transformer_engine') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "[]"]


# ---- planning rules ---------------------------------------------------------------------


def test_requested_batch_that_fits_is_used_without_checkpointing():
    res = planner.plan(_request("1b", batch=(4,), seq=2048))
    e = res.plan.entry_for("bf16")
    assert (e.batch_size, e.activation_checkpointing, e.fits) == (4, False, True)
    assert e.reason == "" and not e.checkpointing_required


def test_batch_that_fits_only_with_checkpointing_switches_it_on_in_auto_mode():
    req = _request("8b", batch=(0,), seq=4096)
    e = planner.plan(req).plan.precisions["bf16"]
    between = e.max_batch_size_without_checkpointing + 1
    assert between <= e.max_batch_size_with_checkpointing
    e2 = planner.plan(_request("8b", batch=(between,), seq=4096)).plan.entry_for("bf16")
    assert e2.activation_checkpointing and e2.checkpointing_required and e2.fits
    assert "only with activation checkpointing" in e2.reason
    off = planner.plan(_request("8b", batch=(between,), seq=4096, ac="off")).plan
    assert not off.precisions["bf16"].fits
    assert "with activation checkpointing batch" in off.precisions["bf16"].reason
    with pytest.raises(UserError, match="batch_size"):
        off.entry_for("bf16")


def test_batch_zero_is_the_largest_that_fits():
    req = _request("8b", batch=(0,), seq=4096, precisions=("fp8",))
    e = planner.plan(req).plan.precisions["fp8"]
    b = e.batch_size
    assert b == e.max_batch_size_without_checkpointing > 0
    usable = req.usable_bytes
    s = req.setup("fp8", b, False)
    assert estimate(s, "B200").peak_bytes <= usable
    assert estimate(req.setup("fp8", b + 1, False), "B200").peak_bytes > usable


def test_several_batch_sizes_plan_the_largest_that_fits():
    res = planner.plan(_request("1b", batch=(1, 2, 4, 100000), seq=2048))
    assert res.plan.precisions["bf16"].batch_size == 4
    assert len(res.estimates) == 8  # 4 batch sizes x 2 checkpointing modes


def test_precision_the_gpu_cannot_run_is_reported_not_runnable_with_the_reason():
    res = planner.plan(_request("1b", instance_type="ml.p5e.48xlarge", seq=2048,
                                precisions=("bf16", "fp8", "mxfp8", "nvfp4")))
    plan = MemoryPlan.from_json(res.plan.to_json())
    assert plan.runnable_precisions() == ["bf16", "fp8"]
    assert plan.supported_precisions == hardware.gpu("H200").supported_precisions()
    assert "Blackwell" in plan.precisions["mxfp8"].reason
    with pytest.raises(UserError, match="precision"):
        plan.entry_for("nvfp4")
    assert plan.entry_for("fp8").batch_size > 0
    assert "not measured" in plan.precisions["mxfp8"].note


def test_a_model_too_large_for_the_gpus_says_so_and_suggests_more_gpus():
    res = planner.plan(_request("64b", gpu="H100", world_size=1, seq=4096, batch=(1,)))
    e = res.plan.precisions["bf16"]
    assert not e.fits and e.max_batch_size_with_checkpointing == 0
    assert "world_size" in e.reason


def test_large_models_need_checkpointing_on_b200_as_the_article_reports():
    # The article: above ~14B most configurations run out of memory without
    # activation checkpointing; up to ~14B it is usually unnecessary.
    big = planner.plan(_request("64b", seq=8192, batch=(2,))).plan.precisions["bf16"]
    assert big.fits and big.activation_checkpointing and big.checkpointing_required
    small = planner.plan(_request("8b", seq=4096, batch=(2,))).plan.precisions["bf16"]
    assert small.fits and not small.activation_checkpointing


def test_batch_candidates_are_powers_of_two_up_to_the_largest_that_fits():
    res = planner.plan(_request("1b", seq=2048, precisions=("bf16",), ac="off"))
    top = res.plan.precisions["bf16"].max_batch_size_without_checkpointing
    sizes = sorted(c["batch_size"] for c in planner.batch_candidates(res))
    assert sizes[-1] == top and sizes[0] == 1 and all(b <= top for b in sizes)


def test_batch_candidates_respect_a_cap_for_short_tuning_runs():
    res = planner.plan(_request("1b", seq=2048, precisions=("bf16",), ac="off"))
    assert res.plan.precisions["bf16"].max_batch_size_without_checkpointing > 6
    assert sorted(c["batch_size"] for c in planner.batch_candidates(res, 6)) == [1, 2, 4, 6]
    with pytest.raises(UserError, match="max_candidate_batch_size"):
        planner.batch_candidates(res, -1)


# ---- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,field,hint",
    [
        ({"gpu": "Z9000"}, "gpu", "B200"),
        ({"instance_type": "ml.p9.huge"}, "instance_type", "ml.p6-b200.48xlarge"),
        ({"instance_type": "ml.p6-b200.48xlarge", "world_size": 3}, "world_size", "1, 2, 4, 8"),
        ({"instance_type": "ml.p6-b200.48xlarge", "world_size": 12}, "world_size", "multiple of 8"),
        ({"instance_type": "ml.p6-b200.48xlarge", "gpu": "H100"}, "gpu", "B200"),
        ({}, "instance_type", "ml.p6-b200.48xlarge"),
        ({"gpu": "B200", "world_size": -2}, "world_size", "positive"),
    ],
)
def test_bad_hardware_names_the_field_and_what_is_valid(kwargs, field, hint):
    with pytest.raises(UserError) as err:
        planner.resolve_hardware(**kwargs)
    assert err.value.field == field and hint in str(err.value)


def test_world_size_multiple_of_the_node_and_default_all_gpus_of_the_instances_are_accepted():
    assert planner.resolve_hardware(instance_type="ml.p6-b200.48xlarge").world_size == 8
    two = planner.resolve_hardware(instance_type="ml.p6-b200.48xlarge", instance_count=2)
    assert two.world_size == 16
    with pytest.raises(UserError, match="world_size"):
        planner.resolve_hardware(instance_type="ml.p6-b200.48xlarge", instance_count=2,
                                 world_size=8)
    with pytest.raises(UserError, match="instance_count"):
        planner.resolve_hardware(instance_type="ml.p6-b200.48xlarge", instance_count=0)
    assert planner.resolve_hardware(instance_type="ml.p6-b200.48xlarge", world_size=16).world_size == 16
    assert planner.resolve_hardware(gpu="nvidia h200").gpu.name == "H200"


@pytest.mark.parametrize(
    "dims,field",
    [
        ({"num_heads": 3}, "num_heads"),
        ({"num_layers": 0}, "num_layers"),
        ({"hidden_size": -8}, "hidden_size"),
        ({"num_kv_heads": 5}, "num_kv_heads"),
        ({"mlp": "relu"}, "mlp"),
    ],
)
def test_bad_model_dimensions_name_the_field(dims, field):
    with pytest.raises(UserError) as err:
        planner.model_from_values("8b", **dims)
    assert err.value.field == field


@pytest.mark.parametrize(
    "changes,field",
    [
        ({"batch": (-1,)}, "batch_size"),
        ({"seq": 0}, "seq_length"),
        ({"precisions": ("fp6",)}, "precisions"),
        ({"precisions": ()}, "precisions"),
        ({"ac": "sometimes"}, "activation_checkpointing"),
        ({"headroom": 1.5}, "headroom"),
        ({"backend": "jax"}, "backend"),
        ({"param_dtype": "fp8"}, "param_dtype"),
        ({"fsdp_version": 3}, "fsdp_version"),
        ({"quantized_model_init": True}, "quantized_model_init"),
    ],
)
def test_bad_training_settings_name_the_field(changes, field):
    with pytest.raises(UserError) as err:
        planner.plan(_request("1b", **changes))
    assert err.value.field == field


# ---- CLI ------------------------------------------------------------------------------


def test_cli_flags_are_the_components_parameters_plus_the_model_and_training_extras():
    parser, _ = cli.build_parser()
    flags = {o for a in parser._actions for o in a.option_strings}
    wanted = ("--model-preset --num-layers --hidden-size --num-heads --num-kv-heads "
              "--ffn-hidden-size --vocab-size --mlp --norm --bias --no-bias --tie-embeddings "
              "--rotary --batch-size --seq-length --precisions --activation-checkpointing "
              "--world-size --param-dtype --master-weights --no-master-weights "
              "--optimizer-state-dtype --fsdp-version --backend --gpu --instance-type --json "
              "--optimizer --dropout --reduce-dtype --gradient-accumulation-steps").split()
    assert set(wanted) <= flags


def test_cli_defaults_are_the_components():
    parser, params = cli.build_parser()
    values = cli.component_values(parser.parse_args([]), params)
    assert values["model_preset"] == "8b" and values["instance_type"] == "ml.p6-b200.48xlarge"
    assert values["precisions"] == ["bf16", "fp8", "mxfp8", "nvfp4"]


def test_cli_old_spellings_still_work_with_a_deprecation_message(capsys):
    rc = cli.main(["--preset", "1b", "--gpu", "H200", "--batch-size", "1", "--precision", "fp8",
                   "--no-activation-checkpointing", "--json"])
    captured = capsys.readouterr()
    assert rc == 0
    doc = json.loads(captured.out)
    assert doc["precision"] == "fp8" and doc["activation_checkpointing"] is False
    assert doc["plan"]["model"]["num_layers"] == 16  # the 1b preset, not the default 8b
    for old, new in (("--preset", "--model-preset"), ("--precision", "--precisions")):
        assert f"{old} is deprecated; use {new}" in captured.err
    # --no-activation-checkpointing is the switch's own off form, as in every CLI
    assert "--no-activation-checkpointing is deprecated" not in captured.err


def test_cli_json_has_peak_bytes_and_a_breakdown_in_bytes(capsys):
    rc = cli.main(["--model-preset", "14b", "--gpu", "H200", "--world-size", "8", "--batch-size",
                   "2", "--seq-length", "4096", "--precisions", "fp8", "--activation-checkpointing",
                   "off", "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["peak_bytes"] == sum(doc["breakdown"].values())
    assert doc["activation_checkpointing"] is False and doc["precision"] == "fp8"
    assert MemoryPlan.from_json(json.dumps(doc["plan"])).entry_for("fp8").batch_size == 2


def test_cli_sweep_lists_every_configuration_and_writes_the_plan(tmp_path, capsys):
    plan_path = tmp_path / "plan.json"
    rc = cli.main(["--model-preset", "1b", "--instance-type", "ml.p6-b200.48xlarge",
                   "--seq-length", "2048", "--precisions", "bf16,fp8,mxfp8", "--batch-size", "4",
                   "--activation-checkpointing", "off", "--json", "--plan-out", str(plan_path)])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["estimates"]) == 3
    assert set(MemoryPlan.from_json(plan_path.read_text()).precisions) == {"bf16", "fp8", "mxfp8"}


def test_cli_describes_te_fsdp_example_and_prints_markdown(capsys):
    rc = cli.main(["--model-preset", "te-fsdp-example", "--gpu", "B200", "--world-size", "8",
                   "--batch-size", "16", "--seq-length", "8192", "--precisions", "mxfp8",
                   "--activation-checkpointing", "on", "--param-dtype", "bf16", "--no-master-weights",
                   "--optimizer-state-dtype", "bf16", "--fsdp-version", "1",
                   "--optimizer", "adamw-foreach"])
    out = capsys.readouterr().out
    assert rc == 0 and "| mxfp8 | yes | yes | 16 | on |" in out


def test_cli_user_error_exits_2_naming_the_field(capsys):
    rc = cli.main(["--model-preset", "8b", "--gpu", "H200", "--num-heads", "7"])
    assert rc == USER_ERROR_EXIT_CODE
    assert "num_heads" in capsys.readouterr().err


def test_cli_help_explains_itself():
    out = subprocess.run([sys.executable, "-m", "kfp_sagemaker_blackwell.components.memory_estimate", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "largest micro-batch" in out and "--instance-type" in out and "te-fsdp-example" in out


# ---- component --------------------------------------------------------------------------


def test_component_outputs_plan_runnable_precisions_markdown_and_metrics():
    out = _run_component(instance_type="ml.p5.48xlarge", model_preset="8b", seq_length=4096,
                        precisions=["bf16", "fp8", "nvfp4"], batch_size=0)
    plan = MemoryPlan.from_json(out.plan)
    assert out.runnable_precisions == plan.runnable_precisions() == ["bf16", "fp8"]
    assert out.all_runnable is False
    assert "| nvfp4 | no |" in out.markdown
    assert out.metrics["bf16_fits"] == 1.0 and out.metrics["nvfp4_fits"] == 0.0
    assert out.batch_candidates and {c["precision"] for c in out.batch_candidates} == {"bf16", "fp8"}
    with pytest.raises(UserError, match="nvfp4"):
        _run_component(instance_type="ml.p5.48xlarge", model_preset="8b", seq_length=4096,
                      precisions=["bf16", "nvfp4"], require_all_runnable=True)


def test_component_model_overrides_keep_the_presets_other_dimensions():
    out = _run_component(instance_type="", gpu="B200", model_preset="8b", num_layers=4, vocab_size=0,
                        precisions="bf16", batch_size=1)
    model = MemoryPlan.from_json(out.plan).model
    assert (model["num_layers"], model["vocab_size"], model["hidden_size"]) == (4, 0, 4096)


def test_markdown_shows_the_breakdown_in_gib():
    md = report.markdown(planner.plan(_request("8b", seq=4096, precisions=("bf16", "fp8"))))
    assert "| optimizer states (sharded) |" in md and "| **total** |" in md


# ---- optional cross-check ---------------------------------------------------------------


def test_fsdp_mem_tracker_cross_check_agrees_on_a_block_stack():
    # PyTorch's FakeTensor-based tracker on the trainer's model (CPU, world size 2):
    # the blocks' parameters, gradients, states and activations agree within 10%.
    from kfp_sagemaker_blackwell.components.memory_estimate import crosscheck

    s = TrainingSetup(preset("te-fsdp-example").replace(num_layers=2), 1, 1024,
                      backend="torch", world_size=2)
    peak = crosscheck.tracker_peak(s, timeout=120)
    assert estimate(s, "H200").peak_allocated_bytes == pytest.approx(peak, rel=0.10)
    with pytest.raises(UserError, match="cross_check"):
        crosscheck.check_supported(TrainingSetup(preset("tiny"), 1, 64, precision="fp8"))


def test_batch_candidates_are_pre_ranked_by_predicted_throughput():
    res = planner.plan(_request("1b", seq=2048, precisions=("bf16", "fp8"), ac="auto"))
    cands = planner.batch_candidates(res)
    rates = [c["predicted_tokens_per_s_per_gpu"] for c in cands]
    assert rates == sorted(rates, reverse=True) and len(set(rates)) > 3
    assert cands[0]["batch_size"] > 1  # batch 1 is host-bound, never the predicted best
    assert cands[-1]["batch_size"] == 1


# ---- FSDP1 (TE's fsdp.py) terms ----

def _fsdp_py(**kw):
    base = dict(model=preset("te-fsdp-example"), batch_size=4, seq_length=4096, precision="fp8",
                param_dtype="bf16", master_weights=False, optimizer_state_dtype="bf16",
                fsdp_version=1, optimizer="adamw-foreach", dropout=0.1)
    base.update(kw)
    return TrainingSetup(**base)


def test_fsdp1_keeps_every_blocks_fp8_weights_until_its_backward_and_fsdp2_one():
    last = "backward of block 23"
    held1 = _phase(_fsdp_py(), last)["quantized_weights"]
    held2 = _phase(_fsdp_py(fsdp_version=2), last)["quantized_weights"]
    one_block = estimator._block_linear_weights(preset("te-fsdp-example")) * 2.0  # FP8 + transpose
    assert held2 == pytest.approx(one_block)
    assert held1 == pytest.approx(24 * one_block)
    # With checkpointing the forward saves nothing: one block's copy, as FSDP2.
    assert _phase(_fsdp_py(activation_checkpointing=True), last)["quantized_weights"] == pytest.approx(one_block)
    # bf16 quantises nothing.
    assert _phase(_fsdp_py(precision="bf16"), last)["quantized_weights"] == 0


def test_fsdp1_at_world_size_1_gathers_nothing_but_at_world_size_2_it_does():
    assert _phase(_fsdp_py(), "backward of block 23")["fsdp_buffers"] < 2 * 2**30 * 0.05
    w2 = _phase(_fsdp_py(world_size=2), "backward of block 23")["fsdp_buffers"]
    assert w2 >= 2 * preset("te-fsdp-example").block_params() * 2  # current + prefetched block, bf16


def test_dropout_adds_two_byte_masks_per_hidden_element_and_is_validated():
    with_d = estimate(_fsdp_py(precision="bf16"), "H200").breakdown["activations"]
    without = estimate(_fsdp_py(precision="bf16", dropout=0.0), "H200").breakdown["activations"]
    m = preset("te-fsdp-example")
    assert with_d - without == pytest.approx(24 * 4 * 4096 * 2.0 * m.hidden_size, rel=1e-9)
    for bad in (1.0, -0.1, True, "0.1"):
        with pytest.raises(UserError) as e:
            estimate(_fsdp_py(dropout=bad), "H200")
        assert e.value.field == "dropout"


def test_component_training_parameters_are_training_setup_fields_with_its_defaults():
    # One declaration per training knob: the component's parameters that shape the step
    # (optimizer and dropout among them, issue 25) are TrainingSetup's fields, same defaults.
    # TrainingSetup declares them (every planning caller: the training component's memory
    # pre-flight, compare_convergence, rank_throughput, plan_training); the signature must
    # restate them as literals (KFP runs its source text; planning cannot read a component),
    # so this test holds the literals to it, as tests/test_catalog.py does the instance type.
    import dataclasses

    from kfp_sagemaker_blackwell.common import cli as common_cli
    from kfp_sagemaker_blackwell.components.memory_estimate import launcher as run
    from kfp_sagemaker_blackwell.components.memory_estimate.component import memory_estimate
    from kfp_sagemaker_blackwell.planning.training_setup import TrainingSetup

    declared = common_cli.defaults(memory_estimate)
    fields = {f.name: f.default for f in dataclasses.fields(TrainingSetup)}
    fields["param_dtype"] = "fp32"  # None in TrainingSetup: fp32, its stored_param_dtype
    knobs = run.training_parameters(declared)
    assert set(knobs) == {"backend", "param_dtype", "master_weights", "optimizer_state_dtype",
                          "fsdp_version", "quantized_model_init", "single_gpu_fsdp", "cuda_graphs",
                          "optimizer", "dropout", "expandable_segments"}
    assert knobs == {k: fields[k] for k in knobs}


def test_a_plan_checks_its_training_setup_once_not_per_estimate(monkeypatch):
    # Values parsed once (issue 27): the request is checked where it is made; the hundreds
    # of setups its search estimates and predicts differ only in what that check covered.
    from kfp_sagemaker_blackwell.planning.training_setup import TrainingSetup

    calls = []
    check = TrainingSetup.validate
    monkeypatch.setattr(TrainingSetup, "validate", lambda s: calls.append(s) or check(s))
    result = _run_component()
    assert len(result.runnable_precisions) > 1
    assert len(calls) == 1


def test_activation_checkpointing_words_are_read_once_and_a_bad_one_names_the_parameter():
    plan = json.loads(_run_component(model_preset="1b", gpu="H200", precisions=["bf16"],
                                     activation_checkpointing="TRUE").plan)
    assert plan["training"]["activation_checkpointing_mode"] == "on"
    with pytest.raises(UserError) as err:
        _run_component(gpu="H200", activation_checkpointing="Maybe")
    assert err.value.field == "activation_checkpointing"
    assert str(err.value).startswith("activation_checkpointing: ='Maybe' is not one of auto, on, off.")


def test_the_allocator_in_use_decides_the_reserve():
    # Issue 41: under expandable segments (the trainer's default) the fit decision is the
    # allocated peak + CUDA context + a small constant; PyTorch's default allocator (a job whose
    # PYTORCH_CUDA_ALLOC_CONF leaves them off) keeps its fragmentation reserve.
    s = TrainingSetup(preset("8b"), 2, 2048, "fp8")
    assert s.expandable_segments
    on = estimator.estimate(s, "H200")
    off = estimator.estimate(dataclasses.replace(s, expandable_segments=False), "H200")
    assert on.peak_allocated_bytes == off.peak_allocated_bytes
    assert on.breakdown["allocator_reserve"] == estimator.ALLOCATOR_RESERVE_EXPANDABLE
    assert on.peak_bytes == on.peak_allocated_bytes + on.breakdown["cuda_context"] + \
        estimator.ALLOCATOR_RESERVE_EXPANDABLE
    assert off.breakdown["allocator_reserve"] > 20 * 2**30  # 8B's moments split the cache
    assert off.full_speed_bytes == off.peak_bytes  # that reserve is what the allocator holds
    # what the allocator keeps cached with memory to spare: above the fit, below the default's
    assert on.peak_bytes < on.full_speed_bytes < off.peak_bytes
    assert on.to_dict()["expandable_segments"] and not off.to_dict()["expandable_segments"]
    with pytest.raises(UserError) as err:
        estimator.estimate(dataclasses.replace(s, expandable_segments="yes"), "H200")
    assert err.value.field == "expandable_segments"


def test_the_plan_carries_the_allocator_and_batch_zero_avoids_the_slow_edge():
    # 3b at 8 layers, fp8, sequence 2048 on an H100 (torch's 79.18 GiB): up to 27 fits (27 ran,
    # 28 ran out of memory: boundary_h100_te.json), but 26 and 27 ran 24-29% slower per token
    # than 23-24; batch 0 takes the largest at full speed, the plan still reports 27.
    gpu = dataclasses.replace(hardware.gpu("H100"), memory_bytes=85_017_493_504)
    req = planner.Request(preset("3b").replace(num_layers=8), 2048, planner.Hardware(gpu, "", 1, 1),
                          ("fp8",), (0,), "off", 0.0)
    entry = planner.plan(req).plan.precisions["fp8"]
    assert entry.max_batch_size_without_checkpointing == 27
    assert entry.batch_size == planner.full_speed_batch(req, "fp8", False) == 24
    assert "largest at full speed" in entry.reason and "up to 27 fits" in entry.reason
    assert planner.plan(req).plan.training["expandable_segments"] is True
    off = dataclasses.replace(req, training={"expandable_segments": False})
    plan_off = planner.plan(off).plan
    assert plan_off.training["expandable_segments"] is False
    assert plan_off.precisions["fp8"].batch_size == planner.largest_batch(off, "fp8", False) < 24
