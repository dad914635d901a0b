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
    assert {p.stem for p in _pipeline_files()} == {"precision_sweep", "batch_tuning",
                                                   "plan_and_train"}


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
                           "parse_logs", "plan_training", "rank_throughput",
                           "sagemaker_training"}

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


def test_kfp_local_fixes_refuse_kfp_versions_they_were_not_written_for(monkeypatch):
    import kfp

    from pipelines import _kfp_local_fixes as fixes

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
    from components.common import aws, iam_policy
    from pipelines import local as _local
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
    from pipelines import local as _local
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
    from pipelines import local as _local
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
]


@pytest.mark.parametrize("module,argv,message", BAD_RUN_LOCAL,
                         ids=[" ".join(a) for _, a, _ in BAD_RUN_LOCAL])
def test_run_local_refuses_bad_arguments_before_anything_starts(module, argv, message, tmp_path,
                                                                capsys, monkeypatch):
    import importlib

    from components.local import LocalBackend

    def no_backend(*args, **kwargs):
        raise AssertionError("the local backend was started for bad arguments")

    monkeypatch.setattr(LocalBackend, "__init__", no_backend)
    main = importlib.import_module(f"pipelines.{module}").main
    try:
        code = main(["--run-local", "--runs-dir", str(tmp_path / "runs"), *argv])
    except SystemExit as exc:  # argparse's own errors (a malformed JSON list)
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert not (tmp_path / "runs").exists()


def _readme_blocks(heading: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split(heading, 1)[1].split("\n### ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


@pytest.mark.slow
def test_the_readme_own_pipeline_snippet_runs_locally_through_run_pipeline(tmp_path,
                                                                           monkeypatch):
    from pipelines import local

    define, run_it = _readme_blocks("### Using a component in your own pipeline")
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
    from pipelines._progress import Progress
    from trainer import logformat as lf

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
