"""The compiled pipelines and components, and whole local runs of the precision sweep."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kfp_sagemaker_blackwell.pipelines.compile import COMPILED

ROOT = Path(__file__).resolve().parent.parent
AWS_TASKS = {"build-image", "sagemaker-training", "parse-logs", "cleanup"}
PURE_TASKS = {"memory-estimate", "compare-convergence", "rank-throughput", "prerank-candidates"}


def _load(text):
    """A YAML document, through libyaml where PyYAML has it: the compiled pipelines are up to
    0.5 MB, which the pure-Python loader takes 4x as long to read (the same data)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _pipeline_files():
    return sorted(COMPILED.glob("*.yaml"))


def _all_tasks(doc):
    """Every task of the root DAG and of nested DAGs (exit handler, loops)."""
    dags = [doc["root"]["dag"]] + [c["dag"] for c in doc["components"].values() if "dag" in c]
    for dag in dags:
        yield from dag["tasks"].items()


def test_both_pipelines_are_compiled():
    assert {p.stem for p in _pipeline_files()} == {"precision_sweep", "batch_tuning",
                                                   "plan_and_train"}


@pytest.mark.parametrize("path", _pipeline_files(), ids=lambda p: p.stem)
def test_compiled_pipeline_loads_and_validates_against_the_pipeline_spec(path):
    from google.protobuf import json_format
    from kfp import components
    from kfp.pipeline_spec import pipeline_spec_pb2

    components.load_component_from_file(str(path))
    doc = _load(path.read_text())
    # Strict proto parsing: an unknown or mistyped field anywhere fails.
    json_format.ParseDict(doc, pipeline_spec_pb2.PipelineSpec())


@pytest.mark.parametrize("path", _pipeline_files(), ids=lambda p: p.stem)
def test_compiled_pipeline_holds_no_credentials(path):
    text = path.read_text()
    assert not re.search(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b", text)  # access key ids
    assert not re.search(r"(?i)secret[^\n]{0,40}[:=]\s*['\"]?[A-Za-z0-9/+]{40}\b", text)
    assert "127.0.0.1" not in text  # the local backend's endpoint never leaks in
    doc = _load(text)
    for name, executor in doc["deploymentSpec"]["executors"].items():
        env = {e["name"] for e in executor.get("container", {}).get("env", [])}
        assert not {e for e in env if e.startswith("AWS_")}, f"{name} sets AWS variables"
    for task_name, task in _all_tasks(doc):
        for param in task.get("inputs", {}).get("parameters", {}).values():
            value = json.dumps(param.get("runtimeValue", {}))
            assert "testing" not in value and "AWS_" not in value, task_name


@pytest.mark.parametrize("path", _pipeline_files(), ids=lambda p: p.stem)
def test_aws_steps_do_not_cache_and_safe_steps_retry(path):
    doc = _load(path.read_text())
    seen = set()
    for name, task in _all_tasks(doc):
        base = re.sub(r"-\d+$", "", name)
        if base in AWS_TASKS:
            seen.add(base)
            assert task.get("cachingOptions", {}) == {}, f"{name} caches"
            assert task.get("retryPolicy", {}).get("maxRetryCount", 0) >= 2, f"{name} no retry"
        elif base in PURE_TASKS:
            assert task["cachingOptions"] == {"enableCache": True}
    assert seen == AWS_TASKS


def test_every_component_yaml_loads_and_composes_into_a_new_pipeline(tmp_path):
    from kfp import compiler, components, dsl

    loaded = {
        p.stem: components.load_component_from_file(str(p))
        for p in sorted((COMPILED / "components").glob("*.yaml"))
    }
    assert set(loaded) == {"build_image", "cleanup", "compare_convergence", "memory_estimate",
                           "parse_logs", "plan_training", "prerank_candidates",
                           "rank_throughput", "sagemaker_training"}

    @dsl.pipeline(name="another-teams-pipeline")
    def theirs(role_arn: str, bucket: str):
        done = loaded["cleanup"](run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
        with dsl.ExitHandler(done):
            image = loaded["build_image"](run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                                          s3_uri=f"s3://{bucket}/build")
            plan = loaded["memory_estimate"](model_preset="1b", precisions=["bf16", "fp8"])
            with dsl.ParallelFor(plan.outputs["runnable_precisions"]) as precision:
                job = loaded["sagemaker_training"](
                    image_uri=image.outputs["image_uri"], role_arn=role_arn,
                    output_s3_uri=f"s3://{bucket}/out", precision=precision,
                    memory_plan=plan.outputs["plan"])
                logs = loaded["parse_logs"](job_name=job.outputs["job_name"])
            loaded["compare_convergence"](series=dsl.Collected(logs.outputs["series"]))
            trials = loaded["prerank_candidates"](
                memory_plan=plan.outputs["plan"],
                batch_candidates=plan.outputs["batch_candidates"]).outputs["trials"]
            loaded["rank_throughput"](series=dsl.Collected(logs.outputs["series"]), plan=trials)
            loaded["plan_training"](training_tokens=10**9,
                                    probe_series=dsl.Collected(logs.outputs["series"]))

    out = tmp_path / "theirs.yaml"
    compiler.Compiler().compile(theirs, str(out))
    assert "comp-sagemaker-training" in out.read_text()


def test_parallelism_is_set_at_compile_time(tmp_path):
    out = tmp_path / "p.yaml"
    subprocess.run([sys.executable, str(ROOT / "pipelines" / "precision_sweep.py"), "--compile",
                    "--parallelism", "2", "--output", str(out)], check=True, capture_output=True)
    assert "parallelismLimit: 2" in out.read_text()


def test_help_documents_every_pipeline_parameter():
    out = subprocess.run([sys.executable, str(ROOT / "pipelines" / "precision_sweep.py"),
                          "--help"], check=True, capture_output=True, text=True).stdout
    for flag in ("--training-plan-arn", "--use-spot", "--precisions", "--baseline",
                 "--fail-on-unrunnable", "--run-local", "--compile"):
        assert flag in out
    assert "Flexible Training Plan" in out  # the docstring's Args text, not just the flag


def test_kfp_local_fixes_loop_over_named_outputs_and_outer_outputs(tmp_path):
    """kfp.local (2.17) mis-runs both patterns the sweep uses; our fixes must hold."""
    from typing import NamedTuple

    from kfp import dsl, local

    from kfp_sagemaker_blackwell.pipelines import _kfp_local_fixes

    @dsl.component(install_kfp_package=False)
    def plan() -> NamedTuple("Outputs", [("items", list), ("doc", str)]):  # noqa: F821
        from collections import namedtuple

        return namedtuple("Outputs", ["items", "doc"])(["a", "b"], "the-plan")

    @dsl.component(install_kfp_package=False)
    def use(item: str, doc: str) -> str:
        assert doc == "the-plan", f"outer output replaced by the loop item: {doc!r}"
        return f"{item}:{doc}"

    @dsl.component(install_kfp_package=False)
    def gather(values: list) -> str:
        return ",".join(sorted(values))

    @dsl.pipeline
    def p() -> str:
        t = plan()
        with dsl.ParallelFor(t.outputs["items"], parallelism=1) as item:
            u = use(item=item, doc=t.outputs["doc"])
        return gather(values=dsl.Collected(u.output)).output

    _kfp_local_fixes.apply()
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path))
    assert p().output == "a:the-plan,b:the-plan"


def test_kfp_local_fixes_give_a_loop_body_the_loop_wide_list_it_asks_for(tmp_path):
    """A loop body that also takes the loop's own list (budget_items: the jobs sharing a
    budget) gets the list, as on a cluster, not its item; the item still reaches it."""
    from typing import NamedTuple

    from kfp import dsl, local

    from kfp_sagemaker_blackwell.pipelines import _kfp_local_fixes

    @dsl.component(install_kfp_package=False)
    def plan() -> NamedTuple("Outputs", [("items", list)]):  # noqa: F821
        from collections import namedtuple

        return namedtuple("Outputs", ["items"])([{"batch_size": 4}, {"batch_size": 8}])

    @dsl.component(install_kfp_package=False)
    def use(batch_size: int, budget_items: list) -> str:
        from kfp_sagemaker_blackwell.common.kfp_values import integral

        assert isinstance(budget_items, list), f"the loop item, not the list: {budget_items!r}"
        return f"{batch_size}/{integral(budget_items)}"

    @dsl.component(install_kfp_package=False)
    def gather(values: list) -> str:
        return " ".join(sorted(values))

    @dsl.pipeline
    def p() -> str:
        t = plan()
        with dsl.ParallelFor(t.outputs["items"], parallelism=1) as item:
            u = use(batch_size=item.batch_size, budget_items=t.outputs["items"])
        return gather(values=dsl.Collected(u.output)).output

    _kfp_local_fixes.apply()
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path))
    whole = "[{'batch_size': 4}, {'batch_size': 8}]"
    assert p().output == f"4/{whole} 8/{whole}"


def test_the_training_boundary_takes_kfp_local_floats_as_ints_and_refuses_an_item_budget():
    from kfp_sagemaker_blackwell.common.errors import UserError
    from kfp_sagemaker_blackwell.components.sagemaker_training.request import (
        Budget,
        TrainingJobConfig,
    )

    cfg = TrainingJobConfig.from_values({
        "run_id": "r", "image_uri": "i", "role_arn": "a", "output_s3_uri": "s3://b/o",
        "fallback_instances": [{"InstanceType": "ml.p5.48xlarge", "InstanceCount": 2.0}],
        "hyperparameters": {"steps": 4.0, "lr": 0.5}, "budget_items": [{"batch_size": 4.0}]})
    assert cfg.fallback_instances == [{"InstanceType": "ml.p5.48xlarge", "InstanceCount": 2}]
    assert type(cfg.fallback_instances[0]["InstanceCount"]) is int
    assert cfg.hyperparameters == {"steps": 4, "lr": 0.5}
    assert cfg.budget_items == [{"batch_size": 4}]
    assert Budget.parse(10, [{"batch_size": 4}, {"batch_size": 8}]).jobs == 2
    assert Budget.parse(10, None).jobs == 1
    with pytest.raises(UserError) as err:
        Budget.parse(10, {"batch_size": 4.0})  # a loop item where the loop's list belongs
    assert err.value.field == "budget_items" and "not a list" in err.value.problem


def test_kfp_local_fixes_refuse_kfp_versions_they_were_not_written_for(monkeypatch):
    import kfp

    from kfp_sagemaker_blackwell.pipelines import _kfp_local_fixes as fixes

    assert fixes.check_version() == kfp.__version__  # the pinned one is supported
    for version in ("2.16.0", "2.18.0", "3.0.0"):
        with pytest.raises(fixes.UnsupportedKfpVersion, match=f"kfp {version} is installed"):
            fixes.check_version(version)
    monkeypatch.setattr(fixes, "_APPLIED", False)
    monkeypatch.setattr(kfp, "__version__", "2.99.0")
    with pytest.raises(fixes.UnsupportedKfpVersion, match="pip install 'kfp==2.17"):
        fixes.apply()


# ---- whole local runs (the embedded default), tiny model ----

TINY = {
    "model_preset": "tiny",
    "batch_size": 4,
    "seq_length": 32,
    "max_steps": 12,
    "activation_checkpointing": "off",
    "hyperparameters": {"log-every": "1", "checkpoint-every": "0"},
}


@pytest.mark.slow
def test_local_sweep_completes_with_report_recommendation_and_cleanup(tmp_path):
    from kfp_sagemaker_blackwell.common import aws
    from kfp_sagemaker_blackwell.iam import policy as iam_policy
    from kfp_sagemaker_blackwell.pipelines import local as _local
    from kfp_sagemaker_blackwell.pipelines.precision_sweep import build_pipeline

    args = {**TINY, "instance_type": "ml.p5e.48xlarge", "precisions": ["bf16", "fp8", "mxfp8"]}
    with _local.local_aws() as backend, aws.record_calls() as recording:
        args = {"role_arn": _local.LOCAL_ROLE_ARN, "bucket": _local.LOCAL_BUCKET, **args}
        run = _local.run_local(build_pipeline(1), args, runs_dir=tmp_path)
        jobs = _local.training_jobs(backend)
    assert run.state == "SUCCEEDED", run.error
    # mxfp8 needs Blackwell: the plan skipped it, no job was started for it
    assert sorted(j["HyperParameters"]["precision"] for j in jobs) == ["bf16", "fp8"]
    assert all(j["TrainingJobStatus"] == "Completed" for j in jobs)
    plan = json.loads(run.parameters("memory-estimate")["plan"])
    assert plan["precisions"]["mxfp8"]["supported"] is False
    summary = _local.summarise(run, jobs, report_task="compare-convergence")
    assert summary.recommended_precision in ("bf16", "fp8")
    assert summary.report is not None and "data:image/png;base64," in summary.report.read_text()
    assert "Cleanup ran" in summary.text
    cleanup_report = run.output("cleanup", "report")
    assert cleanup_report is not None and run.parameters("cleanup")["failed"] == 0
    # every AWS call the components made is allowed by the pod's IAM policy
    calls = recording.calls()
    assert {c.operation for c in calls} >= {"CreateTrainingJob", "GetLogEvents"}
    assert iam_policy.check_calls(iam_policy.pod_policy(), calls) == []


@pytest.mark.slow
def test_a_failing_precision_still_runs_cleanup_and_reports_the_failure(tmp_path):
    from kfp_sagemaker_blackwell.pipelines import local as _local
    from kfp_sagemaker_blackwell.pipelines.precision_sweep import build_pipeline

    args = {
        **TINY,
        "precisions": ["bf16", "fp8"],
        # the fp8 job fails on "SageMaker" (a CUDA OOM the trainer simulates at step 1;
        # a value the trainer refuses is now refused before launch)
        "precision_hyperparameters": {"fp8": {"simulate-oom-at-step": "1"}},
    }
    with _local.local_aws() as backend:
        args = {"role_arn": _local.LOCAL_ROLE_ARN, "bucket": _local.LOCAL_BUCKET, **args}
        run = _local.run_local(build_pipeline(1), args, runs_dir=tmp_path)
        jobs = _local.training_jobs(backend)
    assert run.state == "FAILED" and "sagemaker-training" in run.error
    by_precision = {j["HyperParameters"]["precision"]: j for j in jobs}
    assert by_precision["bf16"]["TrainingJobStatus"] == "Completed"
    assert by_precision["fp8"]["TrainingJobStatus"] == "Failed"
    assert "out of memory" in by_precision["fp8"]["FailureReason"].lower()
    summary = _local.summarise(run, jobs, report_task="compare-convergence")
    assert "Cleanup ran" in summary.text and "Failed" in summary.text
    assert "out of memory" in summary.text.lower()
    assert summary.failed_jobs == [by_precision["fp8"]["TrainingJobName"]]
    assert run.output("cleanup", "report") is not None


@pytest.mark.slow
def test_unrunnable_precision_can_fail_the_run_before_any_training(tmp_path):
    from kfp_sagemaker_blackwell.pipelines import local as _local
    from kfp_sagemaker_blackwell.pipelines.precision_sweep import build_pipeline

    args = {**TINY, "instance_type": "ml.p5e.48xlarge", "precisions": ["bf16", "nvfp4"],
            "fail_on_unrunnable": True}
    with _local.local_aws() as backend:
        args = {"role_arn": _local.LOCAL_ROLE_ARN, "bucket": _local.LOCAL_BUCKET, **args}
        run = _local.run_local(build_pipeline(1), args, runs_dir=tmp_path)
        jobs = _local.training_jobs(backend)
    assert run.state == "FAILED" and "memory-estimate" in run.error
    assert jobs == []  # nothing was paid for
    assert run.output("cleanup", "report") is not None


# ---- --run-local checks its arguments before anything starts ----

BAD_RUN_LOCAL = [
    ("precision_sweep", ["--precisions", "bf16,fp9"], "did you mean 'fp8'"),
    ("precision_sweep", ["--precisions", '["bf16","fp8"'], "is not valid JSON"),
    ("precision_sweep", ["--precisions", '{"bf16": 1}'], "expected a JSON list"),
    ("precision_sweep", ["--precisions", "[]"], "non-empty list"),
    ("precision_sweep", ["--baseline", "fp16"], "baseline"),
    ("precision_sweep", ["--model-preset", "9b"], "preset"),
    ("precision_sweep", ["--activation-checkpointing", "sometimes"], "activation_checkpointing"),
    ("precision_sweep", ["--instance-type", "ml.p9.48xlarge"], "instance_type"),
    ("precision_sweep", ["--cleanup-policy", '{"checkpoints": "remove"}'], "checkpoints"),
    ("precision_sweep", ["--loss-tolerance-rel", "0"], "loss_tolerance_rel"),
    ("precision_sweep", ["--use-spot", "true"], "max_wait_seconds"),
    ("precision_sweep", ["--instance-type", "ml.p5e.48xlarge", "--fail-on-unrunnable", "true"],
     "cannot all run"),
    ("batch_tuning", ["--precision", "mxfp9"], "did you mean 'mxfp8'"),
    ("batch_tuning", ["--max-batch-size", "-1"], "max_batch_size"),
    # what the DSL passes to the training step is what the check checks (issue 27's drift)
    ("precision_sweep", ["--output-kms-key-id", "not-a-key"], "output_kms_key_id: 'not-a-key'"),
    ("precision_sweep", ["--max-cost-usd", "-5"], "max_cost_usd: -5"),
    ("batch_tuning", ["--output-kms-key-id", "not-a-key"], "output_kms_key_id: 'not-a-key'"),
    ("batch_tuning", ["--max-cost-usd", "-5"], "max_cost_usd: -5"),
    ("batch_tuning", ["--volume-kms-key-id", "alias/x y"], "volume_kms_key_id"),
    ("batch_tuning", ["--probe", '{"precision": "fp8", "batch_size": 2'], "probe: "),
    ("batch_tuning", ["--probe", '{"precision": "bf16", "batch_size": 2, "activation_'
                      'checkpointing": false, "tokens_per_s_per_gpu": 9000, "gpu": "B200"}'],
     "probe: ran bf16 on B200; the candidates are fp8 on B200"),
    ("batch_tuning", ["--probe", '{"precision": "fp8", "batch_size": 2, "activation_'
                      'checkpointing": false, "tokens_per_s_per_gpu": 9000, "gpu": "H200"}'],
     "probe fp8 on a B200 instance"),
    ("batch_tuning", ["--probe", '{"precision": "fp8", "batch_size": 1, "activation_'
                      'checkpointing": false, "tokens_per_s_per_gpu": 9000, "gpu": "B200"}',
                      "--trial-count", "-1"], "trial_count: -1 is not a count"),
    ("precision_sweep", ["--max-cost-usd", "10"], "exceeds $10.00"),  # 4 jobs x 24 h of p6
]


# Refused alike by --run-local and --compile (one check, pipelines/_cli.refuse).
BAD_ARGUMENTS = BAD_RUN_LOCAL + [
    ("precision_sweep", ["--bucket", "b\ninjected: x"], "control character '\\n'"),
    ("batch_tuning", ["--bucket", "b\ninjected: x"], "control character '\\n'"),
    ("precision_sweep", ["--s3-prefix", "runs\u2028injected: x"], "s3_prefix"),
    ("precision_sweep", ["--hyperparameters", "lr=3e-4\r\x1b[2J"], "hyperparameters"),
    ("precision_sweep", ["--bucket", "Bad_Bucket"], "bucket: 'Bad_Bucket' is not an S3 bucket"),
    ("batch_tuning", ["--bucket", "Bad_Bucket"], "bucket: 'Bad_Bucket' is not an S3 bucket"),
    ("precision_sweep", ["--precisions", "bf16,fp4"], "did you mean 'nvfp4'"),
    ("batch_tuning", ["--precision", "fp4"], "did you mean 'nvfp4'"),
]


@pytest.mark.parametrize("module,argv,message", BAD_ARGUMENTS,
                         ids=[" ".join(a) for _, a, _ in BAD_ARGUMENTS])
def test_run_local_refuses_bad_arguments_before_anything_starts(module, argv, message, tmp_path,
                                                                capsys, monkeypatch):
    import importlib

    from kfp_sagemaker_blackwell.local_backend import LocalBackend

    def no_backend(*args, **kwargs):
        raise AssertionError("the local backend was started for bad arguments")

    monkeypatch.setattr(LocalBackend, "__init__", no_backend)
    main = importlib.import_module(f"kfp_sagemaker_blackwell.pipelines.{module}").main
    try:
        code = main(["--run-local", "--runs-dir", str(tmp_path / "runs"), *argv])
    except SystemExit as exc:  # argparse's own errors (a malformed JSON list)
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not (tmp_path / "runs").exists()




@pytest.mark.parametrize("module,argv,message", BAD_ARGUMENTS,
                         ids=[" ".join(a) for _, a, _ in BAD_ARGUMENTS])
def test_compile_refuses_every_default_run_local_refuses_and_control_characters(
        module, argv, message, tmp_path, capsys):
    """--compile runs the same check as --run-local, on the defaults it would write."""
    import importlib

    out = tmp_path / "p.yaml"
    main = importlib.import_module(f"kfp_sagemaker_blackwell.pipelines.{module}").main
    try:
        code = main(["--compile", "--output", str(out), *argv])
    except SystemExit as exc:  # argparse's own errors (a malformed JSON list)
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not out.exists()


@pytest.mark.parametrize("module", ["precision_sweep", "batch_tuning"])
def test_the_argument_check_passes_the_training_step_what_the_compiled_pipeline_passes(
        module, tmp_path):
    """The check and the DSL build the training task's arguments with one function, so
    every parameter the compiled task receives from the pipeline is one the check checks."""
    import importlib
    from types import SimpleNamespace

    from kfp_sagemaker_blackwell.pipelines import _cli, _steps

    mod = importlib.import_module(f"kfp_sagemaker_blackwell.pipelines.{module}")
    out = tmp_path / "p.yaml"
    assert mod.main(["--compile", "--output", str(out)]) == 0
    doc = _load(out.read_text())
    compiled = next(t for name, t in _all_tasks(doc) if name == "sagemaker-training")
    # (pipelinechannel--*: what the f-strings of the S3 prefixes are made of)
    passed = {k for k in compiled["inputs"]["parameters"] if not k.startswith("pipelinechannel--")}
    params = _cli.build_parser(name=module, doc="", build=mod.build_pipeline,
                               default_parallelism=1, local_defaults={})[1]
    arguments = _cli.local_arguments(params, {})
    item = SimpleNamespace(precision="bf16", batch_size=1, activation_checkpointing=False)
    loop = ({"precision": "bf16", "precisions": ["bf16"]} if module == "precision_sweep"
            else {"candidate": item, "candidates": [item]})
    extra = {"plan": "{}"} if module == "precision_sweep" else {}
    checked = mod.training_arguments(arguments, **_steps.stand_ins(arguments), **loop, **extra)
    assert set(checked) == passed
    assert {k: checked[k] for k in ("max_cost_usd", "output_kms_key_id", "instance_hour_prices")
            } == {k: arguments[k] for k in ("max_cost_usd", "output_kms_key_id",
                                            "instance_hour_prices")}


def test_a_budget_the_check_has_no_price_for_is_left_to_the_launch(tmp_path):
    """A training plan's fee is looked up at launch (DescribeTrainingPlan): --compile does
    not refuse a budget it cannot price."""
    from kfp_sagemaker_blackwell.pipelines import precision_sweep

    plan = "arn:aws:sagemaker:us-west-2:123456789012:training-plan/p6-week"
    assert precision_sweep.main(["--compile", "--output", str(tmp_path / "p.yaml"),
                                 "--training-plan-arn", plan, "--max-cost-usd", "10"]) == 0


def test_plan_and_train_checks_its_probes_and_its_training_as_compiled(tmp_path, capsys):
    from types import SimpleNamespace

    from kfp_sagemaker_blackwell.pipelines import _cli, _steps
    from kfp_sagemaker_blackwell.pipelines import plan_and_train as mod

    out = tmp_path / "p.yaml"
    assert mod.main(["--compile", "--output", str(out)]) == 0
    tasks = dict(_all_tasks(_load(out.read_text())))
    params = _cli.build_parser(name="plan_and_train", doc="", build=mod.build_pipeline,
                               default_parallelism=1, local_defaults={})[1]
    arguments = _cli.local_arguments(params, {})
    run = _steps.stand_ins(arguments)
    item = SimpleNamespace(instance_type="ml.p5.48xlarge", instance_count=1, precision="bf16",
                           batch_size=1, activation_checkpointing=False)
    checked = {
        "sagemaker-training": mod.probe_arguments(arguments, **run, candidate=item,
                                                  candidates=[item]),
        "sagemaker-training-2": mod.train_arguments(arguments, **run,
                                                    chosen=dict.fromkeys(mod.CHOSEN)),
    }
    for task, values in checked.items():
        passed = {k for k in tasks[task]["inputs"]["parameters"]
                  if not k.startswith("pipelinechannel--")}
        assert set(values) == passed, task
    assert mod.main(["--compile", "--output", str(out), "--probe-max-cost-usd", "-5"]) == 2
    assert "max_cost_usd: -5" in capsys.readouterr().err


def test_compile_writes_good_defaults_and_imports_no_torch(tmp_path):
    out = tmp_path / "p.yaml"
    code = ("import sys, json; from kfp_sagemaker_blackwell.pipelines.precision_sweep import main; "
            f"rc = main(['--compile', '--output', {str(out)!r}, '--bucket', 'my-bucket', "
            "'--precisions', 'bf16,fp8', '--hyperparameters', 'lr=3e-4']); "
            "print(json.dumps([rc, [m for m in ('torch', 'transformer_engine') "
            "if m in sys.modules]]))")
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True, cwd=ROOT)
    assert json.loads(done.stdout.splitlines()[-1]) == [0, []]
    doc = _load(out.read_text())
    inputs = doc["root"]["inputDefinitions"]["parameters"]
    assert inputs["bucket"]["defaultValue"] == "my-bucket"
    assert inputs["precisions"]["defaultValue"] == ["bf16", "fp8"]


def test_compile_all_refuses_a_components_image_with_a_newline(tmp_path):
    done = subprocess.run([sys.executable, "-m", "kfp_sagemaker_blackwell.pipelines.compile", "--output-dir",
                           str(tmp_path), "--components-image", "r.io/a/b:1\ninjected: x"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and "is not an image reference" in done.stderr, done.stderr
    assert not list(tmp_path.rglob("*.yaml"))


def _readme_blocks(heading: str) -> list[str]:
    """The ```python blocks of a section of docs/components.md (once the README's)."""
    text = (ROOT / "docs" / "components.md").read_text()
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def _task_settings(doc: dict) -> dict[str, tuple]:
    """Task (numbered copies folded) -> (caching on?, retries), from a compiled pipeline."""
    out = {}
    for name, task in _all_tasks(doc):
        if "componentRef" not in task or name.startswith(("for-loop", "exit-handler", "condition")):
            continue
        out[re.sub(r"-\d+$", "", name)] = (task.get("cachingOptions", {}).get("enableCache", False),
                                            task.get("retryPolicy", {}).get("maxRetryCount", 0))
    return out


def test_the_readme_snippet_compiles_with_caching_off_and_retries_for_aws_steps(tmp_path):
    """The README's "Using a component" snippet, compiled: its components come from the
    compiled YAML, and its tasks have the settings the Python components give theirs."""
    from kfp import compiler

    define, _ = _readme_blocks("## Using a component in your own pipeline")
    scope: dict = {}
    exec(compile(define, "README:own-pipeline", "exec"), scope)
    out = tmp_path / "my_pipeline.yaml"
    compiler.Compiler().compile(scope["my_pipeline"], str(out))
    settings = _task_settings(_load(out.read_text()))
    assert settings == {"build-image": (False, 2), "sagemaker-training": (False, 2),
                        "memory-estimate": (True, 0)}, settings


def test_a_component_behaves_the_same_from_yaml_as_from_python(tmp_path):
    """Every shipped component YAML, loaded with load_component (by name or path), gives
    tasks the settings of the Python component; the pipelines' tasks have them too."""
    from kfp_sagemaker_blackwell.common.component import load_component, task_defaults
    from kfp_sagemaker_blackwell.pipelines.compile import discover_components

    python = discover_components()
    for name, comp in python.items():
        by_name = load_component(name)
        by_path = load_component(COMPILED / "components" / f"{name}.yaml")
        assert task_defaults(by_name) == task_defaults(by_path) == task_defaults(comp), name
    expected = {comp.component_spec.name: task_defaults(comp) for comp in python.values()}
    for pipeline, doc in _compiled_fresh(tmp_path):
        for task, (caching, retries) in _task_settings(doc).items():
            want = expected[task]
            assert (caching, retries) == (want.caching, want.retries), (pipeline, task)


def test_load_component_refuses_a_yaml_this_package_does_not_define(tmp_path):
    from kfp import compiler, dsl

    from kfp_sagemaker_blackwell.common.component import load_component

    @dsl.component(base_image="python:3.11")
    def someone_elses(x: int) -> int:
        return x

    path = tmp_path / "theirs.yaml"
    compiler.Compiler().compile(someone_elses, str(path))
    with pytest.raises(ValueError, match="does not define"):
        load_component(path)
    with pytest.raises(ValueError, match="neither a component name"):
        load_component("Sagemaker Training")


@pytest.mark.slow
def test_the_readme_own_pipeline_snippet_runs_locally_through_run_pipeline(tmp_path,
                                                                           monkeypatch):
    from kfp_sagemaker_blackwell.pipelines import local

    define, run_it = _readme_blocks("## Using a component in your own pipeline")
    monkeypatch.chdir(ROOT)  # the snippet loads compiled/components/*.yaml by relative path
    real = local.run_pipeline
    monkeypatch.setattr(local, "run_pipeline", lambda *a, **kw: real(
        *a, **{**kw, "runs_dir": tmp_path, "log_file": tmp_path / "run.log"}))
    scope: dict = {}
    exec(compile(define, "README:own-pipeline", "exec"), scope)
    exec(compile(run_it, "README:run-locally", "exec"), scope)
    run = scope["run"]
    assert run.state == "SUCCEEDED", (run.error, (tmp_path / "run.log").read_text()[-3000:])
    (job,) = run.jobs
    assert job["TrainingJobStatus"] == "Completed"
    assert job["HyperParameters"]["model-preset"] == "tiny" and job["HyperParameters"]["max-steps"] == "10"
    assert run.parameters("sagemaker-training")["status"] == "Completed"
    assert "Executing task" in (tmp_path / "run.log").read_text()  # the tasks' output went there


def test_progress_prints_one_line_per_job_update_and_one_per_task():
    from kfp_sagemaker_blackwell.catalog import logformat as lf
    from kfp_sagemaker_blackwell.pipelines._progress import Progress

    clock = iter(range(0, 1000, 5))
    out: list[str] = []
    progress = Progress(out.append, tty=False, now=lambda: next(clock))
    lines = ["10:00:00.0 - INFO - Executing task \x1b[96m'sagemaker-training'\x1b[0m",
             "    created training job fp8-sagemaker-training-1a2b",
             "    [algo-1-1] " + lf.format_json("config", {"max_steps": 8, "batch_size": 8})]
    for step in range(1, 9):
        lines.append("    [algo-1-1] " + lf.format_step(lf.StepRecord(
            step, 2.0 - step / 10, 1e-3, 1.0, 100.0 * step, 100.0 * step, 0.1, float("nan"),
            float("nan"), float("nan"), "fp8", True)))
    lines.append("10:00:09.0 - INFO - Task 'sagemaker-training' finished with status SUCCESS")
    for line in lines:
        progress.feed(line)
    # one clock tick per line: job created at 5 s, steps at 15, 20, ... 50 s; off a terminal a
    # line at the first step, at each quarter of max_steps and at the end, however slow
    assert [o.split("  ")[0] for o in out[:-1]] == [
        "[fp8] step 1/8", "[fp8] step 2/8", "[fp8] step 4/8", "[fp8] step 6/8", "[fp8] step 8/8"]
    assert out[0] == "[fp8] step 1/8  loss 1.900  100 tokens/s  elapsed 0:10\n"
    assert out[2] == "[fp8] step 4/8  loss 1.600  250 tokens/s  elapsed 0:25  ETA 0:20\n"
    assert out[-2].endswith("done\n") and out[-1] == "  sagemaker-training: SUCCESS (55 s)\n"
    progress.tty = True
    progress.feed("    created training job bf16-x")
    progress.feed("    [algo-1-1] " + lf.format_json("config", {"max_steps": 8}))
    progress.feed(lines[4])
    assert out[-1].startswith("\r\x1b[K[fp8] step 2/8") and "ETA" not in out[-1]


_FRESH: list[tuple[str, dict]] = []


def _compiled_fresh(tmp_path):
    """Every pipeline module's PIPELINE, compiled now (not the checked-in files): once per
    module, the first caller's tmp_path holding the files (the tests only read the documents)."""
    from kfp import compiler

    from kfp_sagemaker_blackwell.pipelines.compile import discover_pipelines

    if not _FRESH:
        for name, pipeline in discover_pipelines().items():
            out = tmp_path / f"{name}.yaml"
            compiler.Compiler().compile(pipeline, str(out))
            _FRESH.append((name, _load(out.read_text())))
    return _FRESH


def _placeholder(channel: str) -> str:
    return "{{$.inputs.parameters['" + channel + "']}}"


def _expression(spec: dict) -> str:
    """A task input as one template: a constant with placeholders, or the channel it reads."""
    if "componentInputParameter" in spec:
        return _placeholder(spec["componentInputParameter"])
    return json.dumps(spec.get("runtimeValue", {}).get("constant", ""))


# Two values of each training input a loop may feed, to show the job name tells them apart.
_LOOP_FED_VALUES = {"precision": ("bf16", "fp8"), "batch_size": (1, 2),
                    "activation_checkpointing": (False, True), "seq_length": (64, 128),
                    "max_steps": (10, 20), "model_preset": ("tiny", "small"),
                    "instance_count": (1, 2),
                    "instance_type": ("ml.p5.48xlarge", "ml.p6-b200.48xlarge")}


def _job_name(**overrides):
    from kfp_sagemaker_blackwell.components.sagemaker_training.request import (
        TrainingJobConfig,
        resolve,
    )

    base = dict(image_uri="123456789012.dkr.ecr.us-west-2.amazonaws.com/t:ctx-1",
                role_arn="arn:aws:iam::123456789012:role/r", output_s3_uri="s3://bucket/p/output",
                run_id="run-1", region="us-west-2", model_preset="tiny", seq_length=64,
                batch_size=1, precision="bf16", max_steps=10, override_memory_check=True)
    return resolve(TrainingJobConfig(**{**base, **overrides})).job_name


def test_no_two_training_jobs_of_a_pipeline_can_share_a_checkpoint_or_output_prefix(tmp_path):
    """Structural, for every training task of every pipeline: its output and checkpoint
    prefixes are under the run's (run id) and either end in the job's own name
    (output_s3_uri: SageMaker's ``<uri>/<job>/``; checkpoint_s3_prefix) or hold every
    loop-item value the task trains with; and the job name differs whenever one of those
    loop-item values does. So no two loop items, or tasks, share a prefix."""
    for pipeline, doc in _compiled_fresh(tmp_path):
        templates = []
        for name, task in _all_tasks(doc):
            if not task["componentRef"]["name"].startswith("comp-sagemaker-training"):
                continue
            inputs = task["inputs"]["parameters"]
            fed = {}  # task input -> the loop-item value it reads
            for key, spec in inputs.items():
                channel = spec.get("componentInputParameter", "")
                if key.startswith("pipelinechannel--") or not channel.endswith("-loop-item"):
                    continue
                selector = re.search(r'\["(\w+)"\]', spec.get("parameterExpressionSelector", ""))
                fed[key] = channel + (f"-subvar-{selector.group(1)}" if selector else "")
            named_by_job = {"output_s3_uri"} | ({"checkpoint_s3_prefix"} & set(inputs))
            checkpoint = "checkpoint_s3_prefix" if "checkpoint_s3_prefix" in inputs \
                else "checkpoint_s3_uri"
            assert checkpoint in inputs, f"{pipeline}/{name}: no checkpoint prefix"
            for field in ("output_s3_uri", checkpoint):
                template = _expression(inputs[field])
                assert "{{$.pipeline_job_uuid}}" in template, (pipeline, name, field, template)
                templates.append(template)
                if field in named_by_job:
                    continue  # <template>/<job name>
                missing = sorted(v for v in fed.values()
                                 if _placeholder(v) not in template)
                assert not missing, (f"{pipeline}/{name}: {field} {template} does not hold "
                                     f"the loop-item values {missing}: two items share it")
            for key in fed:
                assert key in _LOOP_FED_VALUES, f"add two values of {key} to _LOOP_FED_VALUES"
                one, other = _LOOP_FED_VALUES[key]
                assert _job_name(**{key: one}) != _job_name(**{key: other}), (
                    f"{pipeline}/{name}: two loop items differing in {key} get one job name")
        assert templates, f"{pipeline} has no training task"
        assert len(templates) == len(set(templates)), f"{pipeline}: prefixes repeat {templates}"


def test_checkpoint_s3_prefix_gives_the_job_checkpoints_named_after_it():
    from kfp_sagemaker_blackwell.common.errors import UserError
    from kfp_sagemaker_blackwell.components.sagemaker_training.request import (
        TrainingJobConfig,
        build_request,
        resolve,
    )

    cfg = TrainingJobConfig(
        image_uri="123456789012.dkr.ecr.us-west-2.amazonaws.com/t:ctx-1",
        role_arn="arn:aws:iam::123456789012:role/r", output_s3_uri="s3://bucket/p/output",
        run_id="run-1", region="us-west-2", model_preset="tiny", seq_length=64, batch_size=1,
        max_steps=10, override_memory_check=True, use_spot=True, max_wait_seconds=86400,
        checkpoint_s3_prefix="s3://bucket/p/checkpoints/")
    resolved = resolve(cfg)
    assert build_request(resolved)["CheckpointConfig"]["S3Uri"] == (
        f"s3://bucket/p/checkpoints/{resolved.job_name}")
    with pytest.raises(UserError, match="checkpoint_s3_prefix: is given together"):
        resolve(TrainingJobConfig(**{**cfg.__dict__, "checkpoint_s3_uri": "s3://bucket/c"}))


def test_every_task_output_a_pipeline_reads_is_declared_by_its_producer(tmp_path):
    """KFP 2.x leaks a dict loop item's sub-fields used in an f-string up through an
    ExitHandler as outputs of the task that produced the list (kubeflow/pipelines#13273):
    it compiles, and the driver fails at run time. No pipeline may read such an output."""
    for pipeline, doc in _compiled_fresh(tmp_path):
        dags = [doc["root"]["dag"]] + [c["dag"] for c in doc["components"].values() if "dag" in c]
        for dag in dags:
            for name, task in dag["tasks"].items():
                for key, spec in task.get("inputs", {}).get("parameters", {}).items():
                    source = spec.get("taskOutputParameter")
                    if not source:
                        continue
                    producer = dag["tasks"][source["producerTask"]]["componentRef"]["name"]
                    declared = doc["components"][producer].get("outputDefinitions", {}).get(
                        "parameters", {})
                    assert source["outputParameterKey"] in declared, (
                        f"{pipeline}/{name}.{key} reads {source} that {producer} does not have")


def test_component_yaml_finds_a_shipped_yaml_and_takes_only_a_name():
    import kfp_sagemaker_blackwell as package

    assert package.component_yaml("cleanup") == COMPILED / "components" / "cleanup.yaml"
    for bad in ("../../setup", "/etc/passwd", "Cleanup", ""):
        with pytest.raises(ValueError, match="not a component name"):
            package.component_yaml(bad)
    with pytest.raises(FileNotFoundError, match="sagemaker_training"):
        package.component_yaml("sagemaker_trainin")
