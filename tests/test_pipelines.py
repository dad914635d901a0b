"""The compiled pipelines and components, and whole local runs of the precision sweep."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipelines.compile import COMPILED

ROOT = Path(__file__).resolve().parent.parent
AWS_TASKS = {"build-image", "sagemaker-training", "parse-logs", "cleanup"}
PURE_TASKS = {"memory-estimate", "compare-convergence", "rank-throughput"}


def _pipeline_files():
    return sorted(COMPILED.glob("*.yaml"))


def _all_tasks(doc):
    """Every task of the root DAG and of nested DAGs (exit handler, loops)."""
    dags = [doc["root"]["dag"]] + [c["dag"] for c in doc["components"].values() if "dag" in c]
    for dag in dags:
        yield from dag["tasks"].items()


def test_both_pipelines_are_compiled():
    assert {p.stem for p in _pipeline_files()} == {"precision_sweep", "batch_tuning"}


@pytest.mark.parametrize("path", _pipeline_files(), ids=lambda p: p.stem)
def test_compiled_pipeline_loads_and_validates_against_the_pipeline_spec(path):
    from google.protobuf import json_format
    from kfp import components
    from kfp.pipeline_spec import pipeline_spec_pb2

    components.load_component_from_file(str(path))
    doc = yaml.safe_load(path.read_text())
    # Strict proto parsing: an unknown or mistyped field anywhere fails.
    json_format.ParseDict(doc, pipeline_spec_pb2.PipelineSpec())


@pytest.mark.parametrize("path", _pipeline_files(), ids=lambda p: p.stem)
def test_compiled_pipeline_holds_no_credentials(path):
    text = path.read_text()
    assert not re.search(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b", text)  # access key ids
    assert not re.search(r"(?i)secret[^\n]{0,40}[:=]\s*['\"]?[A-Za-z0-9/+]{40}\b", text)
    assert "127.0.0.1" not in text  # the local backend's endpoint never leaks in
    doc = yaml.safe_load(text)
    for name, executor in doc["deploymentSpec"]["executors"].items():
        env = {e["name"] for e in executor.get("container", {}).get("env", [])}
        assert not {e for e in env if e.startswith("AWS_")}, f"{name} sets AWS variables"
    for task_name, task in _all_tasks(doc):
        for param in task.get("inputs", {}).get("parameters", {}).values():
            value = json.dumps(param.get("runtimeValue", {}))
            assert "testing" not in value and "AWS_" not in value, task_name


@pytest.mark.parametrize("path", _pipeline_files(), ids=lambda p: p.stem)
def test_aws_steps_do_not_cache_and_safe_steps_retry(path):
    doc = yaml.safe_load(path.read_text())
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
                           "parse_logs", "rank_throughput", "sagemaker_training"}

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
            loaded["rank_throughput"](series=dsl.Collected(logs.outputs["series"]))

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

    from pipelines import _kfp_local_fixes

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
    from components.common import aws, iam_policy
    from pipelines import _local
    from pipelines.precision_sweep import build_pipeline

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
    from pipelines import _local
    from pipelines.precision_sweep import build_pipeline

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
    from pipelines import _local
    from pipelines.precision_sweep import build_pipeline

    args = {**TINY, "instance_type": "ml.p5e.48xlarge", "precisions": ["bf16", "nvfp4"],
            "fail_on_unrunnable": True}
    with _local.local_aws() as backend:
        args = {"role_arn": _local.LOCAL_ROLE_ARN, "bucket": _local.LOCAL_BUCKET, **args}
        run = _local.run_local(build_pipeline(1), args, runs_dir=tmp_path)
        jobs = _local.training_jobs(backend)
    assert run.state == "FAILED" and "memory-estimate" in run.error
    assert jobs == []  # nothing was paid for
    assert run.output("cleanup", "report") is not None
