"""Batch tuning's "probe, then extrapolate": a probe corrects every candidate, the best are timed."""

import json

import pytest
import yaml

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.common.errors import USER_ERROR_EXIT_CODE, UserError
from kfp_sagemaker_blackwell.components.memory_estimate.__main__ import with_defaults
from kfp_sagemaker_blackwell.components.memory_estimate.launcher import run_component
from kfp_sagemaker_blackwell.planning import estimator, probe, throughput
from kfp_sagemaker_blackwell.planning.memory_plan import MemoryPlan
from kfp_sagemaker_blackwell.planning.prerank import prerank, request_of
from kfp_sagemaker_blackwell.planning.probe import parse_probes

GiB = 2**30
# batch tuning's memory plan: 8B on one ml.p5e.48xlarge (8 x H200), fp8, both modes
PLAN = dict(instance_type="ml.p5e.48xlarge", model_preset="8b", seq_length=2048, batch_size=0,
            precisions=["fp8"], activation_checkpointing="auto", max_candidate_batch_size=64,
            require_all_runnable=True)


@pytest.fixture(scope="module")
def planned():
    out = run_component(**with_defaults(PLAN))
    return MemoryPlan.from_json(out.plan), out.batch_candidates


def _probe(batch=4, ac=False, tps=8000.0, **more):
    return {"precision": "fp8", "batch_size": batch, "activation_checkpointing": ac,
            "tokens_per_s_per_gpu": tps, "gpu": "H200", "world_size": 8, "source": "probe-job",
            **more}


def _key(c):
    return (c["batch_size"], c["activation_checkpointing"])


def test_without_a_probe_every_candidate_is_timed_exactly_as_the_plan_lists_it(planned):
    plan, candidates = planned
    out = prerank(plan, candidates, (), 3)
    assert out.trials == candidates  # same items, same order: the same jobs as before
    assert out.dropped == [] and [r.rank for r in out.ranked] == list(range(1, len(candidates) + 1))
    assert all(r.throughput_kind == r.memory_kind == "predicted" for r in out.ranked)


def test_candidates_handed_over_with_float_numbers_give_the_same_trials(planned):
    """kfp.local hands memory_estimate's candidates to the next step with every number a
    float (batch_size 4.0); the trials a cluster would give come out: ints again."""
    plan, candidates = planned
    floats = [{k: float(v) if isinstance(v, int) and not isinstance(v, bool) else v
               for k, v in c.items()} for c in candidates]
    assert any(isinstance(c["batch_size"], float) for c in floats)
    trials = prerank(plan, floats, (), 3).trials
    assert trials == candidates
    assert [type(t["batch_size"]) for t in trials] == [int] * len(candidates)


def test_the_models_asked_again_give_the_plans_predictions(planned):
    """The pre-ranking rebuilds each candidate's setup from the plan: the same model."""
    plan, candidates = planned
    request = request_of(plan)
    for c in candidates:
        setup = request.setup(c["precision"], c["batch_size"], c["activation_checkpointing"])
        tps = throughput.predict_checked(setup, request.hardware.gpu,
                                         instance_type=plan.instance_type).tokens_per_s_per_gpu
        assert round(tps, 1) == c["predicted_tokens_per_s_per_gpu"]
        assert estimator.estimate_checked(setup, request.hardware.gpu).peak_bytes <= \
            request.usable_bytes


def test_one_probe_scales_every_candidate_by_its_measured_over_predicted(planned):
    plan, candidates = planned
    request = request_of(plan)
    gpu = hardware.gpu("H200")
    at = throughput.predict(request.setup("fp8", 4, False), gpu,
                            instance_type=plan.instance_type).tokens_per_s_per_gpu
    out = prerank(plan, candidates, parse_probes(json.dumps(_probe(tps=0.9 * at))), 0)
    assert len(out.trials) == len(candidates)  # trial_count 0: all that fit (no peak: all)
    for r in out.ranked:
        assert r.throughput_kind == "probe-corrected" and r.memory_kind == "predicted"
        assert r.tokens_per_s_per_gpu == pytest.approx(0.9 * r.predicted_tokens_per_s_per_gpu,
                                                       rel=1e-6)
    # one factor: the plan's order stays
    assert [_key(t) for t in out.trials] == [_key(c) for c in candidates]
    own = next(t for t in out.trials if _key(t) == (4, False))  # the probe's own configuration
    assert own["corrected_tokens_per_s_per_gpu"] == pytest.approx(0.9 * at, abs=0.1)
    assert own["throughput_source"].startswith("probed: probe-job on 8 H200 GPU(s), x0.900")
    other = next(t for t in out.trials if _key(t) == (16, True))
    assert "(batch 4, checkpointing off), applied to batch 16, checkpointing on" in \
        other["throughput_source"]


def test_a_probe_that_used_more_memory_drops_the_candidates_that_no_longer_fit(planned):
    plan, candidates = planned
    request = request_of(plan)
    gpu = hardware.gpu("H200")
    # the probe's peak is the allocator's (peak reserved): 1.5x the predicted reserved
    predicted_at = estimator.estimate_checked(
        request.setup("fp8", 4, False), gpu).peak_reserved_bytes
    probes = parse_probes(json.dumps(_probe(peak_memory_bytes=int(1.5 * predicted_at))))
    out = prerank(plan, candidates, probes, 2)
    dropped_for_memory = [r for r in out.ranked if not r.fits]
    assert dropped_for_memory, "a 1.5x peak must push the largest batches out"
    for r in out.ranked:
        e = estimator.estimate_checked(request.setup(
            "fp8", r.candidate["batch_size"], r.candidate["activation_checkpointing"]), gpu)
        assert r.predicted_peak_bytes == e.peak_bytes
        # reserved scaled by the probe, the CUDA context (not in the probe's figure) kept
        assert r.peak_bytes == pytest.approx(e.peak_bytes + 0.5 * e.peak_reserved_bytes,
                                             rel=1e-6)
        assert r.fits == (r.peak_bytes <= request.usable_bytes)
    for r in dropped_for_memory:
        assert not r.timed and r.why_not.startswith("predicted not to fit after the probe's")
    fitting = [r for r in out.ranked if r.fits]
    assert [r.rank for r in fitting] == list(range(1, len(fitting) + 1))
    assert len(out.trials) == 2 and all(t["corrected_peak_bytes"] <= request.usable_bytes
                                        for t in out.trials)
    assert fitting[2].why_not == f"ranked 3 of {len(fitting)}: trial_count=2"
    # the best two that still fit, by corrected speed
    best = sorted(fitting, key=lambda r: -r.tokens_per_s_per_gpu)[:2]
    assert [_key(t) for t in out.trials] == [_key(r.candidate) for r in best]


def test_probes_of_two_configurations_correct_each_candidate_by_its_nearest_and_reorder(planned):
    plan, candidates = planned
    request = request_of(plan)
    gpu = hardware.gpu("H200")

    def predicted(b, ac):
        return throughput.predict(request.setup("fp8", b, ac), gpu,
                                  instance_type=plan.instance_type).tokens_per_s_per_gpu

    # without checkpointing the model is 40% too fast, with it right: checkpointing wins
    probes = parse_probes(json.dumps([_probe(4, False, 0.6 * predicted(4, False)),
                                      _probe(16, True, 1.0 * predicted(16, True))]))
    out = prerank(plan, candidates, probes, 3)
    assert all(t["activation_checkpointing"] for t in out.trials)
    assert out.ranked[0].throughput_probe.batch_size == 16
    off = next(r for r in out.ranked if _key(r.candidate) == (8, False))
    assert off.throughput_probe.batch_size == 4  # same mode, nearest batch
    assert off.tokens_per_s_per_gpu == pytest.approx(0.6 * off.predicted_tokens_per_s_per_gpu,
                                                     rel=1e-6)


@pytest.mark.parametrize("given, match", [
    (_probe(tps=1.0, precision="bf16"), "probe: ran bf16 on H200; the candidates are fp8 on H200"),
    ({**_probe(), "gpu": "B200"}, "probe: ran fp8 on B200; the candidates are fp8 on H200"),
])
def test_a_probe_of_another_precision_or_gpu_is_refused_naming_the_parameter(planned, given,
                                                                             match):
    plan, candidates = planned
    with pytest.raises(UserError, match=match) as err:
        prerank(plan, candidates, parse_probes(json.dumps(given)), 3)
    assert "Fix: probe fp8 on a H200 instance" in str(err.value)


@pytest.mark.parametrize("text, match", [
    ('{"precision": "fp8"', "probe: .* is not JSON"),
    ("[]", "probe: is an empty list"),
    ('[{"precision": "fp8", "batch_size": 2}]', "probe: a probe lacks 'activation_checkpointing', 'tokens_per_s_per_gpu'"),
    ('{"precision": "fp8", "batch_size": 2, "activation_checkpointing": false, '
     '"tokens_per_s_per_gpu": -5, "gpu": "H200"}', "is not a measurement"),
])
def test_bad_probe_json_is_a_user_error_naming_probe_and_the_format(text, match):
    with pytest.raises(UserError, match=match):
        parse_probes(text)


def test_a_count_below_zero_and_a_probe_no_candidate_survives_are_user_errors(planned):
    plan, candidates = planned
    with pytest.raises(UserError, match="trial_count: -1 is not a count"):
        prerank(plan, candidates, (), -1)
    huge = parse_probes(json.dumps(_probe(peak_memory_bytes=10**15)))
    with pytest.raises(UserError, match="probe: corrects every candidate's peak above"):
        prerank(plan, candidates, huge, 3)


def test_a_correction_of_the_exact_configuration_still_refuses_another(planned):
    """memory_estimate's correction (same_configuration) is unchanged; carrying a probe to
    another batch is asked for by name, and never to another precision."""
    plan, _ = planned
    setup = request_of(plan).setup("fp8", 8, True)
    gpu = hardware.gpu("H200")
    p = probe.Probe.from_dict(_probe())
    with pytest.raises(ValueError, match="did not probe fp8 batch 8"):
        probe.correct(p, setup, gpu)
    bf16 = probe.Probe.from_dict(_probe(precision="bf16"))
    with pytest.raises(ValueError, match="did not probe fp8 on H200"):
        probe.correct(bf16, setup, gpu, same_configuration=False)
    with pytest.raises(ValueError, match="measured no peak"):
        probe.correct_peak(p, setup, gpu, same_configuration=False)


def test_the_cli_reads_files_and_prints_the_labelled_table(planned, tmp_path, capsys):
    from kfp_sagemaker_blackwell.components.prerank_candidates.__main__ import main

    plan, candidates = planned
    (tmp_path / "plan.json").write_text(plan.to_json())
    (tmp_path / "c.json").write_text(json.dumps({"batch_candidates": candidates}))
    (tmp_path / "p.json").write_text(json.dumps(_probe(peak_memory_bytes=80 * GiB)))
    argv = ["--memory-plan", f"@{tmp_path}/plan.json", "--batch-candidates",
            f"@{tmp_path}/c.json", "--probe", f"@{tmp_path}/p.json", "--trial-count", "2"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "**2 of 12 candidates timed** (trial_count=2)." in text
    assert "| tokens/s/GPU (predicted) | tokens/s/GPU (probe-corrected) |" in text
    assert "- probed: probe-job (fp8 batch 4, checkpointing off, 8 x H200): 8,000 tokens/s" \
        in text
    assert main([*argv, "--json"]) == 0
    trials = json.loads(capsys.readouterr().out)
    assert len(trials) == 2 and {t["throughput_kind"] for t in trials} == {"probe-corrected"}
    assert main([*argv[:4], "--probe", "@nope.json"]) == USER_ERROR_EXIT_CODE
    assert "probe: nope.json could not be read" in capsys.readouterr().err


def test_the_compiled_pipeline_times_the_pre_ranked_trials_and_reports_them(tmp_path):
    from kfp_sagemaker_blackwell.pipelines import batch_tuning

    out = tmp_path / "bt.yaml"
    assert batch_tuning.main(["--compile", "--output", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    tasks = {name: t for comp in doc["components"].values() if "dag" in comp
             for name, t in comp["dag"]["tasks"].items()}
    pre = tasks["prerank-candidates"]["inputs"]["parameters"]
    assert pre["memory_plan"]["taskOutputParameter"] == {"outputParameterKey": "plan",
                                                         "producerTask": "memory-estimate"}
    assert pre["probe"]["componentInputParameter"] == "pipelinechannel--probe"
    assert pre["trial_count"]["componentInputParameter"] == "pipelinechannel--trial_count"
    loop = tasks["for-loop-2"]
    assert loop["parameterIterator"]["items"]["inputParameter"] == \
        "pipelinechannel--prerank-candidates-trials"
    ranked = tasks["rank-throughput"]["inputs"]["parameters"]["plan"]
    assert ranked["taskOutputParameter"] == {"outputParameterKey": "trials",
                                             "producerTask": "prerank-candidates"}
    defaults = doc["root"]["inputDefinitions"]["parameters"]
    assert defaults["probe"]["defaultValue"] == "" and defaults["trial_count"]["defaultValue"] == 3


# ---- whole local runs (the embedded default), tiny model ----

LOCAL = {"model_preset": "tiny", "precision": "fp8", "seq_length": 32, "max_batch_size": 4,
         "activation_checkpointing": "off", "max_steps": 4,
         "hyperparameters": {"log-every": "1", "checkpoint-every": "0"}}


def _run_on_the_local_backend(args, tmp_path):
    """batch_tuning with ``args`` on the local backend: the run (succeeded) and its jobs."""
    from kfp_sagemaker_blackwell.pipelines import batch_tuning
    from kfp_sagemaker_blackwell.pipelines import local as _local

    with _local.local_aws() as backend:
        args = {"role_arn": _local.LOCAL_ROLE_ARN, "bucket": _local.LOCAL_BUCKET, **args}
        run = _local.run_local(batch_tuning.build_pipeline(1), args, runs_dir=tmp_path)
        jobs = _local.training_jobs(backend)
    assert run.state == "SUCCEEDED", run.error
    return run, jobs


@pytest.mark.slow
def test_a_probe_pre_ranks_and_only_the_best_trial_is_timed_on_the_local_backend(tmp_path):
    from kfp_sagemaker_blackwell.common import cli
    from kfp_sagemaker_blackwell.pipelines import batch_tuning
    from kfp_sagemaker_blackwell.pipelines import local as _local

    # a probe of batch 1 on one B200 (the default instance type's GPU), as a user gives it
    given = {"precision": "fp8", "batch_size": 1, "activation_checkpointing": False,
             "tokens_per_s_per_gpu": 50000.0, "gpu": "B200", "world_size": 1,
             "source": "probe-job-1"}
    args = {**cli.defaults(batch_tuning.PIPELINE.pipeline_func), **LOCAL,
            "probe": json.dumps(given), "trial_count": 1}
    batch_tuning.check_arguments({"role_arn": _local.LOCAL_ROLE_ARN,
                                  "bucket": _local.LOCAL_BUCKET, **args})
    run, jobs = _run_on_the_local_backend(args, tmp_path)
    candidates = run.parameters("memory-estimate")["batch_candidates"]
    trials = run.parameters("prerank-candidates")["trials"]
    assert len(candidates) == 3 and len(trials) == 1  # batches 1, 2, 4: the best one timed
    assert trials[0]["batch_size"] == candidates[0]["batch_size"]  # one probe: the order stays
    # (kfp.local hands JSON numbers back as floats)
    assert [j["HyperParameters"]["batch-size"] for j in jobs] == [str(int(trials[0]["batch_size"]))]
    pre = run.output("prerank-candidates", "summary").read_text()
    assert "**1 of 3 candidates timed** (trial_count=1)." in pre
    assert "- probed: probe-job-1 (fp8 batch 1, checkpointing off, 1 x B200)" in pre
    summary = run.output("rank-throughput", "summary").read_text()
    assert "tokens/s/GPU (predicted for ml.p6-b200.48xlarge, probe-corrected)" in summary
    assert f"| {trials[0]['corrected_tokens_per_s_per_gpu']:,.0f} |" in summary
    assert "tokens/s/GPU (measured)" in summary
    assert run.output("cleanup", "report") is not None


@pytest.mark.slow
def test_without_a_probe_every_candidate_is_timed_on_the_local_backend(tmp_path):
    from kfp_sagemaker_blackwell.common import cli
    from kfp_sagemaker_blackwell.pipelines import batch_tuning

    args = {**cli.defaults(batch_tuning.PIPELINE.pipeline_func), **LOCAL, "max_batch_size": 2}
    run, jobs = _run_on_the_local_backend(args, tmp_path)
    candidates = run.parameters("memory-estimate")["batch_candidates"]
    assert run.parameters("prerank-candidates")["trials"] == candidates
    assert sorted(j["HyperParameters"]["batch-size"] for j in jobs) == ["1", "2"]
    summary = run.output("rank-throughput", "summary").read_text()
    assert "probe-corrected" not in summary and "predicted for ml.p6-b200.48xlarge by the plan" \
        in summary
