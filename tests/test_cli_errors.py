"""Issue 29.5: what AWS refuses reaches the user as one line naming the field and the fix,
with an exit code that means one thing (common/errors.py), never a traceback."""

import os
import re
import subprocess
import sys

import pytest
from botocore import exceptions as bx
from conftest import serve

from kfp_sagemaker_blackwell.common import errors
from kfp_sagemaker_blackwell.common.shipped import CHECKOUT


def _client_error(code, message, operation, **extra):
    return bx.ClientError({"Error": {"Code": code, "Message": message, **extra}}, operation)


def _no_aws_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE="/nonexistent", AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
               AWS_EC2_METADATA_DISABLED="true", PYTHONPATH=str(CHECKOUT))
    return env


def test_a_missing_bucket_against_serve_is_one_line_naming_the_field():
    """The bucket check is the server's (SageMaker's validation, as the local backend
    serves it): its ValidationException is one line naming the request field."""
    proc, _, env = serve()
    try:
        out = subprocess.run(
            [sys.executable, "-m", "kfp_sagemaker_blackwell.components.sagemaker_training", "--run-id", "e29",
             "--task", "train", "--image-uri",
             "123456789012.dkr.ecr.us-west-2.amazonaws.com/kfp-sagemaker-trainer:test",
             "--role-arn", "arn:aws:iam::123456789012:role/SageMakerTraining", "--region",
             "us-west-2", "--output-s3-uri", "s3://no-such-bucket-29/out", "--model-preset",
             "tiny", "--batch-size", "2", "--seq-length", "32", "--max-steps", "2"],
            capture_output=True, text=True, cwd=CHECKOUT,
            env={**env, "PYTHONPATH": str(CHECKOUT)}, timeout=120)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert out.returncode == errors.USER_ERROR_EXIT_CODE, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    (line,) = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert line.startswith("error: OutputDataConfig.S3OutputPath: AWS refused CreateTrainingJob")
    assert "no-such-bucket-29" in line and "Fix: " in line


def test_no_credentials_for_build_components_image_is_one_line_and_exit_77(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "kfp_sagemaker_blackwell.pipelines.compile", "--build-components-image", "--s3-uri",
         "s3://some-bucket/p", "--region", "us-west-2", "--output-dir", str(tmp_path)],
        capture_output=True, text=True, cwd=CHECKOUT, env=_no_aws_env(), timeout=120)
    assert out.returncode == errors.AWS_CREDENTIALS_EXIT_CODE, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    (line,) = [ln for ln in out.stderr.splitlines() if ln.startswith("error:")]
    assert line.startswith("error: AWS credentials: none found") and "AWS_PROFILE" in line


def test_a_server_side_validation_error_names_the_field_aws_names():
    exc = _client_error("ValidationException", "1 validation error detected: Value 'a_b' at "
                        "'trainingJobName' failed to satisfy constraint: Member must satisfy "
                        "regular expression pattern", "CreateTrainingJob")
    code, line = errors.explain(exc)
    assert code == errors.USER_ERROR_EXIT_CODE
    assert line.startswith("trainingJobName: AWS refused CreateTrainingJob (ValidationException")
    assert "Fix: change the value" in line


@pytest.mark.parametrize("exc, code, start", [
    (bx.EndpointConnectionError(endpoint_url="http://127.0.0.1:1/"),
     errors.AWS_UNREACHABLE_EXIT_CODE, "endpoint: Could not connect"),
    (_client_error("AccessDenied", "not allowed", "PutObject"),
     errors.AWS_CREDENTIALS_EXIT_CODE, "AWS credentials: AWS refused PutObject (AccessDenied"),
    (_client_error("ExpiredTokenException", "expired", "CreateTrainingJob"),
     errors.AWS_CREDENTIALS_EXIT_CODE, "AWS credentials: AWS refused CreateTrainingJob"),
    (_client_error("NoSuchBucket", "The specified bucket does not exist", "PutObject",
                   BucketName="b1"), errors.USER_ERROR_EXIT_CODE, "bucket: s3://b1 does not"),
    (_client_error("ThrottlingException", "slow down", "ListTrainingJobs"),
     errors.AWS_REFUSED_EXIT_CODE, "ListTrainingJobs: AWS refused ListTrainingJobs"),
    (bx.NoRegionError(), errors.USER_ERROR_EXIT_CODE, "region: no AWS region given"),
])
def test_each_aws_error_gets_its_exit_code_and_one_line(exc, code, start):
    got_code, line = errors.explain(exc)
    assert (got_code, line[:len(start)]) == (code, start)
    assert "\n" not in line and "Fix: " in line


def test_cli_errors_prints_one_line_and_lets_a_bug_keep_its_traceback(capsys):
    @errors.cli_errors
    def refused() -> int:
        raise bx.NoCredentialsError()

    @errors.cli_errors
    def bug() -> int:
        raise KeyError("a bug, not the user's")

    assert refused() == errors.AWS_CREDENTIALS_EXIT_CODE
    err = capsys.readouterr().err
    assert err.startswith("error: AWS credentials: none found") and err.count("\n") == 1
    with pytest.raises(KeyError):
        bug()


# ---- issue 27: errors carry their field; nobody reads it back from the text -------------


def test_a_user_error_and_a_trainer_config_error_are_field_errors():
    from kfp_sagemaker_blackwell.catalog.errors import FieldError
    from kfp_sagemaker_blackwell.catalog.flags import ConfigError

    user = errors.UserError("max_steps", "0: must be >= 1.", "pass max_steps=1 or more.")
    assert isinstance(user, FieldError) and str(user) == (
        "max_steps: 0: must be >= 1. Fix: pass max_steps=1 or more.")
    config = ConfigError("--lr: -1 is outside (0, inf).", "lr", "give lr a value in (0, inf)")
    assert isinstance(config, FieldError) and (config.field, config.name) == ("lr", "lr")
    assert str(config) == "--lr: -1 is outside (0, inf). Fix: give lr a value in (0, inf)"


def test_an_unknown_name_carries_its_suggestion_and_its_choices():
    from kfp_sagemaker_blackwell.catalog import precisions

    with pytest.raises(ValueError) as raised:
        precisions.parse_precision("fp9")
    said = "'fp9': unknown; did you mean 'fp8' or 'fp32'?"
    assert str(raised.value).startswith(f"precision={said} choose one of")
    err = errors.unknown_name("precisions", raised.value)
    assert (err.field, err.problem) == ("precisions", said)
    assert err.fix == f"choose one of {', '.join(precisions.PRECISIONS)}."


@pytest.mark.parametrize("dims, field", [({"num_kv_heads": 3}, "num_kv_heads"),
                                         ({"num_heads": 7}, "num_heads"),
                                         ({"model_preset": "9b"}, "model_preset")])
def test_the_training_config_names_the_model_field_the_spec_refuses(dims, field):
    from kfp_sagemaker_blackwell.components.sagemaker_training.request import (
        TrainingJobConfig,
        resolve,
    )

    cfg = TrainingJobConfig(
        image_uri="123456789012.dkr.ecr.us-west-2.amazonaws.com/trainer:t",
        role_arn="arn:aws:iam::123456789012:role/R", output_s3_uri="s3://bucket/out",
        run_id="fields", **{"model_preset": "8b", **dims})
    with pytest.raises(errors.UserError) as err:
        resolve(cfg, region="us-west-2")
    assert err.value.field == field, err.value


# ---- issue 44: every path option of every command line, and the counts they take ----------
# A case is (id, the module whose main(argv) runs, argv, the option the error must name).
# In argv, {dir} is an existing directory, {file} an existing file, {missing} a directory
# that does not exist, {log} a readable file. Each must exit 2 with one error line naming the
# option, no traceback, and nothing written (the folder's contents unchanged).
C = "kfp_sagemaker_blackwell.components."
PARSE_LOGS, COMPARE, RANK = C + "parse_logs.__main__", C + "compare_convergence.__main__", \
    C + "rank_throughput.__main__"
ESTIMATE, PLAN, CLEANUP = C + "memory_estimate.__main__", C + "plan_training.__main__", \
    C + "cleanup.__main__"
PRERANK, BUILD = C + "prerank_candidates.__main__", C + "build_image.__main__"
SWEEP, COMPILE = "kfp_sagemaker_blackwell.pipelines.precision_sweep", \
    "kfp_sagemaker_blackwell.pipelines.compile"
TOKENS, BACKEND = "kfp_sagemaker_blackwell.trainer.make_tokens", \
    "kfp_sagemaker_blackwell.local_backend.__main__"
PLAN_ARGS = ["--training-tokens", "1000000000", "--model-preset", "tiny"]

PATH_CASES: list[tuple[str, str, list[str], str]] = [
    ("parse-logs-series-a-directory", PARSE_LOGS, ["--file", "{log}", "--series", "{dir}"],
     "--series"),
    ("parse-logs-series-in-no-directory", PARSE_LOGS,
     ["--file", "{log}", "--series", "{missing}/s.csv"], "--series"),
    ("parse-logs-markdown-a-directory", PARSE_LOGS, ["--file", "{log}", "--markdown", "{dir}"],
     "--markdown"),
    ("parse-logs-events-in-no-directory", PARSE_LOGS,
     ["--file", "{log}", "--events", "{missing}/e.json"], "--events"),
    ("parse-logs-file-a-directory", PARSE_LOGS, ["--file", "{dir}"], "--file"),
    ("parse-logs-file-missing", PARSE_LOGS, ["--file", "{missing}/train.log"], "--file"),
    ("compare-html-a-directory", COMPARE, ["{log}", "--html", "{dir}"], "--html"),
    ("compare-markdown-in-no-directory", COMPARE, ["{log}", "--markdown", "{missing}/m.md"],
     "--markdown"),
    ("compare-verdicts-a-directory", COMPARE, ["{log}", "--verdicts", "{dir}"], "--verdicts"),
    ("compare-series-a-directory", COMPARE, ["{dir}"], "series"),
    ("compare-series-missing", COMPARE, ["{missing}/a.csv"], "series"),
    ("rank-html-a-directory", RANK, ["{log}", "--html", "{dir}"], "--html"),
    ("rank-markdown-in-no-directory", RANK, ["{log}", "--markdown", "{missing}/m.md"],
     "--markdown"),
    ("rank-series-a-directory", RANK, ["{dir}"], "series"),
    ("rank-plan-a-directory", RANK, ["{log}", "--plan", "{dir}"], "--plan"),
    ("estimate-plan-out-a-directory", ESTIMATE, ["--plan-out", "{dir}"], "--plan-out"),
    ("estimate-plan-out-in-no-directory", ESTIMATE, ["--plan-out", "{missing}/p.json"],
     "--plan-out"),
    ("estimate-markdown-out-a-directory", ESTIMATE, ["--markdown-out", "{dir}"],
     "--markdown-out"),
    ("estimate-probe-file-a-directory", ESTIMATE, ["--probe", "@{dir}"], "probe"),
    ("plan-verdicts-a-directory", PLAN, [*PLAN_ARGS, "--convergence-verdicts", "{dir}"],
     "--convergence-verdicts"),
    ("plan-verdicts-missing", PLAN, [*PLAN_ARGS, "--convergence-verdicts", "{missing}/v.json"],
     "--convergence-verdicts"),
    ("plan-choice-out-a-directory", PLAN, [*PLAN_ARGS, "--choice-out", "{dir}"], "--choice-out"),
    ("plan-candidates-out-in-no-directory", PLAN,
     [*PLAN_ARGS, "--candidates-out", "{missing}/c.json"], "--candidates-out"),
    ("plan-markdown-out-a-directory", PLAN, [*PLAN_ARGS, "--markdown-out", "{dir}"],
     "--markdown-out"),
    ("cleanup-report-a-directory", CLEANUP, ["--run-id", "r1", "--report", "{dir}"], "--report"),
    ("cleanup-report-in-no-directory", CLEANUP, ["--run-id", "r1", "--report", "{missing}/r.md"],
     "--report"),
    ("prerank-plan-file-a-directory", PRERANK, ["--memory-plan", "@{dir}", "--batch-candidates",
                                                "[]", "--probe", "[]"], "memory_plan"),
    ("build-context-dir-missing", BUILD, ["--run-id", "r1", "--print-tag", "--context-dir",
                                          "{missing}"], "dockerfile"),
    ("pipeline-output-a-directory", SWEEP, ["--compile", "--output", "{dir}"], "--output"),
    ("pipeline-output-in-no-directory", SWEEP, ["--compile", "--output", "{missing}/p.yaml"],
     "--output"),
    ("pipeline-runs-dir-a-file", SWEEP, ["--run-local", "--runs-dir", "{file}"], "--runs-dir"),
    ("compile-output-dir-a-file", COMPILE, ["--output-dir", "{file}"], "--output-dir"),
    ("compile-output-dir-under-a-file", COMPILE, ["--output-dir", "{file}/sub"], "--output-dir"),
    ("make-tokens-input-missing", TOKENS, ["{missing}/a.txt", "--out", "{dir}/t"], "inputs"),
    ("make-tokens-input-a-directory", TOKENS, ["{dir}", "--out", "{dir}/t"], "inputs"),
    ("make-tokens-out-a-file", TOKENS, ["{log}", "--out", "{file}"], "--out"),
    ("backend-work-dir-a-file", BACKEND, ["serve", "--work-dir", "{file}"], "--work-dir"),
    # counts: 0 and negatives refused, naming the option (not taken as 1, or a traceback)
    ("pipeline-parallelism-0", SWEEP, ["--compile", "--output", "{dir}/p.yaml", "--parallelism",
                                       "0"], "--parallelism"),
    ("pipeline-parallelism-negative", SWEEP, ["--compile", "--output", "{dir}/p.yaml",
                                              "--parallelism", "-1"], "--parallelism"),
    ("cleanup-max-objects-0", CLEANUP, ["--run-id", "r1", "--region", "us-west-2", "--max-objects", "0"], "max_objects"),
    ("cleanup-max-objects-negative", CLEANUP, ["--run-id", "r1", "--region", "us-west-2",
                                      "--max-objects", "-5"],
     "max_objects"),
    ("backend-max-concurrent-jobs-0", BACKEND, ["serve", "--max-concurrent-jobs", "0"],
     "--max-concurrent-jobs"),
    ("backend-port-negative", BACKEND, ["serve", "--port", "-1"], "--port"),
    ("backend-stop-grace-negative", BACKEND, ["serve", "--stop-grace", "-1"], "--stop-grace"),
    ("backend-spot-savings-above-1", BACKEND, ["serve", "--spot-savings", "2"], "--spot-savings"),
    ("estimate-world-size-0", ESTIMATE, ["--gpu", "H200", "--world-size", "0"], "world_size"),
    ("estimate-world-size-negative", ESTIMATE, ["--gpu", "H200", "--world-size", "-2"],
     "world_size"),
]


def _fill(argv: list[str], tmp_path) -> list[str]:
    places = {"dir": tmp_path / "a-dir", "file": tmp_path / "a-file",
              "missing": tmp_path / "no-such-dir", "log": tmp_path / "train.log"}
    return [a.format(**{k: str(v) for k, v in places.items()}) for a in argv]


def _tree(root) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1)
                  for p in root.rglob("*"))


def test_the_path_table_covers_every_command_and_is_unique():
    assert len({c[0] for c in PATH_CASES}) == len(PATH_CASES)
    assert {c[1] for c in PATH_CASES} >= {PARSE_LOGS, COMPARE, RANK, ESTIMATE, PLAN, CLEANUP,
                                          PRERANK, BUILD, SWEEP, COMPILE, TOKENS, BACKEND}


@pytest.mark.parametrize(("module", "argv", "option"), [c[1:] for c in PATH_CASES],
                         ids=[c[0] for c in PATH_CASES])
def test_a_bad_path_or_count_exits_2_naming_the_option_and_writes_nothing(
        tmp_path, capsys, monkeypatch, module, argv, option):
    import importlib

    monkeypatch.chdir(tmp_path)
    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "train.log").write_text("hello\n")
    before = _tree(tmp_path)
    main = importlib.import_module(module).main
    try:
        code = main(_fill(argv, tmp_path))
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    assert code == errors.USER_ERROR_EXIT_CODE, (out, err)
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if "error" in ln]
    assert len(lines) == 1 and option in lines[0], err
    assert _tree(tmp_path) == before  # nothing written, no directory made


def _parsers():
    """Every command line's parser (make_tokens' is inside its main: PATH_CASES covers it)."""
    import importlib

    from kfp_sagemaker_blackwell.local_backend.__main__ import _parser as backend_parser
    from kfp_sagemaker_blackwell.pipelines import _cli, precision_sweep
    from kfp_sagemaker_blackwell.pipelines.compile import parser as compile_parser

    for module in (PARSE_LOGS, COMPARE, RANK, ESTIMATE, PLAN, CLEANUP, PRERANK, BUILD,
                   C + "sagemaker_training.__main__"):
        yield module, importlib.import_module(module).build_parser()[0]
    sweep = _cli.build_parser(name="precision_sweep", doc=precision_sweep.__doc__ or "",
                              build=precision_sweep.build_pipeline, default_parallelism=4,
                              local_defaults={})[0]
    yield SWEEP, sweep
    yield COMPILE, compile_parser()
    serve = backend_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore
    yield BACKEND, serve


# An option that names a local file or folder, by its name (S3 URIs and image references
# are not local paths).
PATH_NAME = re.compile(r"(^|_)(path|file|dir|out|output|html|markdown|series|events|report|"
                       r"verdicts|json)(_|$)")
NOT_LOCAL = re.compile(r"s3|uri|image|kms|arn|^log_group$|^dockerfile$|^context_dir$")


def test_every_path_option_of_every_command_line_has_a_path_type():
    from kfp_sagemaker_blackwell.catalog import paths

    path_types = {paths.output_file, paths.input_file, paths.input_file_or_stdin,
                  paths.output_dir}
    seen, untyped = [], []
    for module, parser in _parsers():
        for action in parser._actions:
            if action.nargs == 0 or not PATH_NAME.search(action.dest) or \
                    NOT_LOCAL.search(action.dest):
                continue
            seen.append(f"{module}:{action.dest}")
            if action.type not in path_types:
                untyped.append(f"{module}:{action.dest}")
    assert len(seen) >= 20, seen
    assert untyped == [], untyped
