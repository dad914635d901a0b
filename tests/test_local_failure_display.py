"""Issue 29.5: a local run whose task fails says why in the terminal, in plain text."""

from kfp import dsl

from kfp_sagemaker_blackwell.pipelines.local import failure_causes, run_pipeline, summarise


@dsl.component(install_kfp_package=False, base_image="python:3.11")
def needs_an_extra() -> int:
    print("starting")
    raise ModuleNotFoundError("No module named 'matplotlib' (the [local] extra is missing)")


@dsl.component(install_kfp_package=False, base_image="python:3.11")
def fine() -> int:
    return 1


@dsl.pipeline
def failing() -> None:
    fine()
    needs_an_extra()


def test_a_failed_task_shows_its_cause_without_ansi_codes(tmp_path):
    run = run_pipeline(failing, {}, runs_dir=tmp_path / "runs", log_file=tmp_path / "run.log")
    assert run.state == "FAILED"
    text = summarise(run, run.jobs, report_task="none").text
    assert "\x1b[" not in text  # kfp.local colours task names; the terminal gets plain text
    assert "Inner task failed: 'needs-an-extra'" in text
    assert ("needs-an-extra failed; its log ends:\n     ModuleNotFoundError: No module named "
            "'matplotlib' (the [local] extra is missing)") in text
    assert list(run.causes) == ["needs-an-extra"]  # the task that succeeded is not named


def test_failure_causes_prefers_the_error_lines_over_the_last_lines():
    log = "\n".join([
        "10:00:00.0 - INFO - Executing task \x1b[96m'train'\x1b[0m",
        "    error: precision: 'fp9' is not a precision. Fix: pass one of bf16, fp8",
        "    Nothing was started.",
        "10:00:01.0 - ERROR - Task \x1b[96m'train'\x1b[0m finished with status \x1b[91mFAILURE\x1b[0m",
        "10:00:02.0 - INFO - Executing task \x1b[96m'quiet'\x1b[0m",
        "    something odd", "    and then it stopped",
        "10:00:03.0 - ERROR - Task 'quiet' finished with status FAILURE"])
    assert failure_causes(log) == {
        "train": ["error: precision: 'fp9' is not a precision. Fix: pass one of bf16, fp8"],
        "quiet": ["something odd", "and then it stopped"]}
