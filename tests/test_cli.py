"""The one-declaration command lines (components/common/cli.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from components.common import cli

ROOT = Path(__file__).resolve().parent.parent


def _example(
    name: str,
    use_spot: bool = False,
    precisions: list = ["bf16"],  # noqa: B006
    hyperparameters: dict = {},  # noqa: B006
    max_steps: int = 500,
    region: str = "",
) -> None:
    """An example.

    Args:
        name: The name
            of the thing.
        use_spot: Spot capacity.
        precisions: Precisions to run.
        hyperparameters: Extra flags.
        max_steps: Optimizer steps.
        region: AWS region (default: the environment's).

    Returns:
        nothing: not a parameter.
    """


def _parse(argv, **add):
    parser, params = cli.derived_parser(_example, prog="x", **add)
    return parser, params, parser.parse_args(argv)


def test_flags_defaults_and_help_come_from_the_signature_and_docstring():
    parser, params, _ = _parse(["--name", "a"])
    assert [p.flag for p in params] == ["--name", "--use-spot", "--precisions",
                                        "--hyperparameters", "--max-steps", "--region"]
    text = parser.format_help()
    assert "The name of the thing." in text
    assert "Optimizer steps. (default: 500)" in " ".join(text.split())
    assert '(default: ["bf16"])' in text
    assert "(default: )" not in text  # an empty default is not shown
    assert "nothing" not in text  # Returns: is not an argument


def test_values_fill_declared_defaults_and_given_tells_what_was_typed():
    _, params, args = _parse(["--name", "a", "--max-steps", "7"])
    assert cli.given(args, params) == {"name": "a", "max_steps": 7}
    assert cli.values(args, params) == {"name": "a", "use_spot": False, "precisions": ["bf16"],
                                        "hyperparameters": {}, "max_steps": 7, "region": ""}


@pytest.mark.parametrize("argv, expected", [
    (["--use-spot"], True), (["--use-spot", "true"], True), (["--use-spot", "no"], False),
    (["--no-use-spot"], False), ([], None),
])
def test_booleans_the_same_way_everywhere(argv, expected):
    _, _, args = _parse(["--name", "a", *argv])
    assert args.use_spot is expected


def test_lists_and_dicts():
    _, _, args = _parse(["--name", "a", "--precisions", "bf16,fp8", "--hyperparameters", "lr=1",
                         "--hyperparameters", '{"warmup-steps": "2"}'])
    assert args.precisions == ["bf16", "fp8"]
    assert args.hyperparameters == {"lr": "1", "warmup-steps": "2"}
    _, _, args = _parse(["--name", "a", "--precisions", '["fp8"]'])
    assert args.precisions == ["fp8"]


@pytest.mark.parametrize("argv", [["--max-steps", "x"], ["--use-spot", "maybe"],
                                  ["--hyperparameters", "novalue"], ["--no-use-spot", "true"], []])
def test_bad_values_and_missing_required_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        _parse((["--name", "a"] if argv else []) + argv)
    assert exc.value.code == 2


def test_deprecated_alias_still_works_and_says_so(capsys):
    _, _, args = _parse(["--name", "a", "--steps", "3"], aliases={"--steps": "max_steps"})
    assert args.max_steps == 3
    assert "--steps is deprecated; use --max-steps" in capsys.readouterr().err


def test_an_annotation_without_a_command_line_form_is_refused():
    def f(x: set) -> None: ...

    with pytest.raises(TypeError, match="no command-line form"):
        cli.parameters(f)


def test_kfp_artifacts_are_not_flags():
    from components.memory_estimate.component import memory_estimate

    names = [p.name for p in cli.parameters(memory_estimate)]
    assert "report" not in names and "metrics" not in names and "model_preset" in names


def _sweep(*argv):
    return subprocess.run([sys.executable, str(ROOT / "pipelines" / "precision_sweep.py"), *argv],
                          capture_output=True, text=True)


def test_pipeline_help_shows_the_local_run_defaults():
    out = " ".join(_sweep("--help").stdout.split())
    assert "(default: 8b; --run-local: small)" in out
    assert "(default: 500; --run-local: 60)" in out


def test_compile_applies_parameter_flags_as_the_compiled_defaults(tmp_path):
    import yaml

    out = tmp_path / "p.yaml"
    done = _sweep("--compile", "--max-steps", "10", "--precisions", "bf16,fp8", "--output", str(out))
    assert done.returncode == 0, done.stderr
    spec = yaml.safe_load(out.read_text())
    params = spec["root"]["inputDefinitions"]["parameters"]
    assert params["max_steps"]["defaultValue"] == 10
    assert params["precisions"]["defaultValue"] == ["bf16", "fp8"]
    assert params["seq_length"]["defaultValue"] == 2048  # the rest keep the declaration's


def test_mode_only_flags_are_refused_in_the_other_mode(tmp_path):
    done = _sweep("--compile", "--runs-dir", str(tmp_path))
    assert done.returncode == 2 and "--runs-dir goes with --run-local" in done.stderr
