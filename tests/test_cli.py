"""The one-declaration command lines (common/cli.py)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kfp_sagemaker_blackwell.common import cli

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


def test_declared_fills_the_signatures_defaults_and_refuses_an_undeclared_name():
    assert cli.declared(_example, name="a", max_steps=7) == {
        "name": "a", "use_spot": False, "precisions": ["bf16"], "hyperparameters": {},
        "max_steps": 7, "region": ""}
    cli.declared(_example, name="a")["precisions"].append("fp8")  # a fresh copy each time
    assert cli.declared(_example, name="a")["precisions"] == ["bf16"]
    with pytest.raises(TypeError, match=r"unknown parameters \['max_step'\]"):
        cli.declared(_example, name="a", max_step=7)
    with pytest.raises(TypeError, match=r"missing required \['name'\]"):
        cli.declared(_example, {"region": "us-west-2"})


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
    from kfp_sagemaker_blackwell.components.memory_estimate.component import memory_estimate

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


def _rank_series(tmp_path, run, batch, tps, status="completed"):
    import json

    from kfp_sagemaker_blackwell.common.step_series import COLUMN_NAMES, SERIES_SCHEMA

    meta = {"run": run, "precision": "fp8", "status": status, "emulated": False,
            "failure_reason": "" if tps else "CUDA out of memory",
            "training": {"batch_size": batch, "activation_checkpointing": False},
            "metrics": {"mean_tokens_per_s_per_gpu": tps, "peak_memory_gib": 50.0}}
    path = tmp_path / f"{run}.csv"
    path.write_text(f"# {SERIES_SCHEMA} {json.dumps(meta)}\n" + ",".join(COLUMN_NAMES) + "\n")
    return str(path)


def test_rank_throughput_has_a_cli_derived_from_its_component(tmp_path, capsys):
    from kfp_sagemaker_blackwell.components.rank_throughput.__main__ import build_parser, main
    from kfp_sagemaker_blackwell.components.rank_throughput.component import rank_throughput

    _, params = build_parser()
    assert [p.name for p in params] == [p.name for p in cli.parameters(rank_throughput)]
    series = [_rank_series(tmp_path, "b8", 8, 11000.0), _rank_series(tmp_path, "b16", 16, 12500.0)]
    html = tmp_path / "r.html"
    assert main([*series, "--html", str(html), "--run-context", "pipeline=batch-tuning"]) == 0
    out = capsys.readouterr().out
    assert "**Best: batch 16, checkpointing off**" in out
    assert "batch-tuning" in html.read_text()
    assert main([*series, "--json"]) == 0
    import json
    assert json.loads(capsys.readouterr().out)["best"]["run"] == "b16"
    # nothing completed: exit 1; no series contract: exit 2 with the file named
    assert main([_rank_series(tmp_path, "b32", 32, None, status="oom")]) == 1
    bad = tmp_path / "bad.csv"
    bad.write_text("not a series\n")
    assert main([str(bad)]) == 2
    assert "bad.csv" in capsys.readouterr().err


def test_rank_throughput_cli_runs_as_a_module(tmp_path):
    series = [_rank_series(tmp_path, "b4", 4, 9000.0), _rank_series(tmp_path, "b8", 8, 9500.0)]
    done = subprocess.run([sys.executable, "-m", "kfp_sagemaker_blackwell.components.rank_throughput", *series],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "**Best: batch 8" in done.stdout


COMPONENT_CLIS = ["build_image", "cleanup", "compare_convergence", "memory_estimate", "parse_logs",
                  "plan_training", "rank_throughput", "sagemaker_training"]
PIPELINE_CLIS = ["batch_tuning", "plan_and_train", "precision_sweep"]


def _pipeline_parser(name, monkeypatch):
    """The parser a pipeline module's main builds (caught as it is built, then --help)."""
    import importlib

    from kfp_sagemaker_blackwell.pipelines import _cli

    built = []
    real = _cli.build_parser

    def keep(**kwargs):
        built.append(real(**kwargs))
        return built[-1]

    monkeypatch.setattr(_cli, "build_parser", keep)
    with pytest.raises(SystemExit):
        importlib.import_module(f"kfp_sagemaker_blackwell.pipelines.{name}").main(["--help"])
    return built[0][0]


def all_parsers(monkeypatch):
    """Every command line of the project: name -> its argparse parser."""
    import importlib

    from kfp_sagemaker_blackwell.catalog.flags import build_parser as trainer_parser

    out = {}
    for name in COMPONENT_CLIS:
        out[name] = importlib.import_module(f"kfp_sagemaker_blackwell.components.{name}.__main__").build_parser()[0]
    for name in PIPELINE_CLIS:
        out[f"pipelines/{name}"] = _pipeline_parser(name, monkeypatch)
    out["trainer"] = trainer_parser()
    return out


REST = re.compile(r"``|:(?:func|class|meth|mod|attr|data|obj|ref|doc):`|\w::$", re.M)


def test_every_help_renders_without_rest_markup(monkeypatch, capsys):
    parsers = all_parsers(monkeypatch)
    capsys.readouterr()
    assert len(parsers) == len(COMPONENT_CLIS) + len(PIPELINE_CLIS) + 1
    for name, parser in parsers.items():
        text = parser.format_help()
        assert not REST.findall(text), f"{name} --help shows reST markup: {REST.findall(text)}"
    assert not REST.findall(
        subprocess.run([sys.executable, "-m", "kfp_sagemaker_blackwell.pipelines.compile", "--help"], capture_output=True,
                       text=True, cwd=ROOT, timeout=120).stdout)


# A pointer at docstring text that --help does not show ("see above", "see X below").
POINTER = re.compile(r"\bsee\b[^.;)]*\b(?:above|below)\b", re.I)
# Flags of other commands that a help names on purpose (an example's other command, a
# container's argv, docker's flag).
FOREIGN_FLAGS = {"build_image": {"--build-arg"}, "parse_logs": {"--max-steps", "--model-preset"},
                 "plan_training": {"--verdicts"}, "sagemaker_training": {"--epochs"}}


def test_every_help_refers_only_to_what_it_shows(monkeypatch, capsys):
    parsers = all_parsers(monkeypatch)
    capsys.readouterr()
    for name, parser in parsers.items():
        text = re.sub(r"-\n\s+", "-", parser.format_help())  # argparse wraps at hyphens
        assert not POINTER.findall(text), f"{name} --help points at text it does not show"
        flags = {o for a in parser._actions for o in a.option_strings}
        named = set(re.findall(r"(?<![\w-])--[a-z][\w-]*[a-z0-9]", text))
        unknown = named - flags - FOREIGN_FLAGS.get(name, set())
        assert not unknown, f"{name} --help names flags it does not have: {sorted(unknown)}"


def test_plain_turns_rest_into_terminal_text():
    text = "See :func:`~components.a.best` and :class:`x.Y`; ``log_file`` or ``s3://b``.\nExamples::"
    assert cli.plain(text, ["log_file"]) == "See best and x.Y; --log-file or s3://b.\nExamples:"


@pytest.mark.parametrize("argv, expected", [
    (["pipelines/precision_sweep.py", "--run-local", "--model-preset", "smal"],
     "error: model_preset: 'smal': unknown; did you mean 'small'? Fix: choose one of tiny,"),
    (["pipelines/precision_sweep.py", "--run-local", "--model-preset", "7b"],
     "model_preset: '7b': unknown; did you mean '8b'"),
    (["-m", "kfp_sagemaker_blackwell.components.memory_estimate", "--model-preset", "small", "--precisions", "bf61"],
     "precisions: 'bf61': unknown; did you mean 'bf16'"),
    (["-m", "kfp_sagemaker_blackwell.components.memory_estimate", "--model-preset", "small", "--instance-type",
      "ml.p5.48xlarg"], "instance_type: 'ml.p5.48xlarg': unknown; did you mean 'ml.p5.48xlarge'"),
])
def test_a_misspelt_name_gets_a_did_you_mean_under_its_current_flag(argv, expected, tmp_path):
    done = subprocess.run([sys.executable, *[str(ROOT / a) if a.endswith(".py") else a
                                             for a in argv]],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode != 0
    assert expected in done.stderr, done.stderr
    assert "preset='" not in done.stderr  # the old parameter name is gone


def test_the_one_place_each_name_is_checked_suggests_the_closest():
    from kfp_sagemaker_blackwell.catalog import hardware, spec
    from kfp_sagemaker_blackwell.catalog.precisions import parse_precision
    from kfp_sagemaker_blackwell.common.errors import UserError
    from kfp_sagemaker_blackwell.components.plan_training.launcher import _instance_types
    from kfp_sagemaker_blackwell.planning import pricing

    with pytest.raises(ValueError, match=r"model_preset='smal': unknown; did you mean 'small'\?"):
        spec.preset("smal")
    with pytest.raises(ValueError, match=r"did you mean 'nvfp4'"):
        parse_precision("nvfp5")
    with pytest.raises(ValueError, match=r"did you mean 'ml.g6e.xlarge'"):
        hardware.instance_type("ml.g6e.xlarg")
    with pytest.raises(ValueError, match=r"unknown; choose one of"):  # nothing close: no guess
        hardware.instance_type("zzz")
    with pytest.raises(UserError, match=r"instance_types: 'ml.p5en.48xlarg': unknown; did you mean"):
        _instance_types(["ml.p5en.48xlarg"], pricing.PriceBook(), plans=False)


def _syntax(parser):
    """Every visible flag of a parser -> how it is written: a switch (--x, --x BOOL, --no-x),
    a plain flag (--x alone), or a value (--x VALUE)."""
    flags = {o for a in parser._actions for o in a.option_strings}
    # a pipeline's modes (--compile | --run-local) say what to do, not a value
    modes = {a for g in parser._mutually_exclusive_groups if g.required for a in g._group_actions}
    out = {}
    for a in parser._actions:
        if a.help == argparse.SUPPRESS or not a.option_strings or a.dest == "help" or a in modes:
            continue
        flag = a.option_strings[0]
        if isinstance(a, argparse.BooleanOptionalAction):
            out[flag] = "switch"  # the trainer: --x true also (normalise_argv)
        elif a.nargs == "?" and "--no-" + flag[2:] in flags:
            out[flag] = "switch"
        elif a.nargs == 0:
            out[flag] = "flag"
        else:
            out[flag] = "value"
    return out


def _same_idea(a, b):
    """Two spellings of one flag: word by word, one a prefix of the other
    (--grad-accum-steps, --gradient-accumulation-steps); a plural is another idea."""
    wa, wb = a[2:].split("-"), b[2:].split("-")
    return (a != b and len(wa) == len(wb) and a.rstrip("s") != b.rstrip("s")
            and all(x.startswith(y) or y.startswith(x) for x, y in zip(wa, wb, strict=True)))


def test_one_idea_has_one_spelling_and_one_value_syntax_across_every_cli(monkeypatch, capsys):
    syntax = {name: _syntax(p) for name, p in all_parsers(monkeypatch).items()}
    capsys.readouterr()
    seen = {}
    for name, flags in syntax.items():
        for flag, form in flags.items():
            seen.setdefault(flag, {})[name] = form
    differing = {f: by for f, by in seen.items() if len(set(by.values())) > 1}
    assert not differing, f"one flag, several value syntaxes: {differing}"
    spellings = sorted(seen)
    twins = [(a, b) for i, a in enumerate(spellings) for b in spellings[i + 1:] if _same_idea(a, b)]
    assert not twins, f"one idea, several spellings: {twins}"
    # the ideas the issue named, by what each CLI has
    assert set(seen["--activation-checkpointing"].values()) == {"switch"}
    assert len(seen["--activation-checkpointing"]) >= 5
    assert set(seen["--dry-run"].values()) == {"switch"} and len(seen["--dry-run"]) >= 2
    assert "--grad-accum-steps" in syntax["memory_estimate"] and "--grad-accum-steps" in syntax[
        "trainer"]


def test_switches_take_the_same_words_everywhere():
    from kfp_sagemaker_blackwell.catalog.flags import build_parser as trainer_parser
    from kfp_sagemaker_blackwell.catalog.flags import normalise_argv
    from kfp_sagemaker_blackwell.components.memory_estimate.__main__ import (
        build_parser as memory_parser,
    )

    parser, _ = memory_parser()
    for argv, expected in [([], None), (["--activation-checkpointing"], "on"),
                           (["--activation-checkpointing", "true"], "on"),
                           (["--activation-checkpointing", "off"], "off"),
                           (["--no-activation-checkpointing"], "off"),
                           (["--activation-checkpointing", "auto"], "auto")]:
        assert parser.parse_args(argv).activation_checkpointing == expected, argv
    trainer = trainer_parser()
    for argv, expected in [(["--activation-checkpointing"], True),
                           (["--activation-checkpointing", "on"], True),
                           (["--activation-checkpointing", "false"], False),
                           (["--no-activation-checkpointing"], False)]:
        assert trainer.parse_args(normalise_argv(argv, trainer)).activation_checkpointing is expected


def test_old_spellings_still_work_with_a_note(capsys):
    from kfp_sagemaker_blackwell.components.memory_estimate.__main__ import (
        build_parser as memory_parser,
    )
    from kfp_sagemaker_blackwell.components.sagemaker_training.__main__ import (
        build_parser as training_parser,
    )

    parser, _ = memory_parser()
    assert parser.parse_args(["--gradient-accumulation-steps", "4"]).grad_accum_steps == 4
    assert "--gradient-accumulation-steps is deprecated; use --grad-accum-steps" in (
        capsys.readouterr().err)
    assert "--gradient-accumulation-steps" not in parser.format_help()
    parser, _ = training_parser()
    for argv, expected in [([], False), (["--dry-run"], True), (["--dry-run", "no"], False),
                           (["--no-dry-run"], False)]:
        required = ["--run-id", "r", "--image-uri", "i", "--role-arn", "r", "--output-s3-uri", "s3://b"]
        assert parser.parse_args([*required, *argv]).dry_run is expected


def test_the_trainer_suggests_the_closest_precision_too():
    from kfp_sagemaker_blackwell.catalog import flags as config

    with pytest.raises(config.ConfigError, match=r"--precision: 'bf61': unknown; did you mean "
                                                 r"'bf16' or 'fp16'\? choose one of fp32"):
        config.parse(["--precision", "bf61"], env={})


def test_a_declaration_read_from_source_is_the_imported_signatures():
    """The training config reads its component's signature from source (the KFP executor
    cannot import a component module): the same parameters, kinds, defaults and help."""
    from kfp_sagemaker_blackwell.common import cli as common_cli
    from kfp_sagemaker_blackwell.components.sagemaker_training.component import sagemaker_training

    placeholders = {"run_id": "r", "task": "t", "pipeline": "p"}
    read = common_cli.source_parameters("kfp_sagemaker_blackwell.components.sagemaker_training.component",
                                        "sagemaker_training", defaults=placeholders)
    imported = common_cli.parameters(sagemaker_training)
    assert [p.name for p in read] == [p.name for p in imported]
    assert [(p.kind, p.help) for p in read] == [(p.kind, p.help) for p in imported]
    assert {p.name: p.default for p in read} == {
        p.name: placeholders.get(p.name, p.default) for p in imported}


@pytest.mark.parametrize("name", ["cleanup", "parse_logs"])
def test_defaults_read_from_source_are_the_imported_components(name):
    """What cleanup's and parse_logs's plain modules take as their defaults (read from
    the signature's source, as the KFP executor must) is the component's declaration."""
    import importlib

    from kfp_sagemaker_blackwell.common import cli as common_cli

    module = f"kfp_sagemaker_blackwell.components.{name}.component"
    component = getattr(importlib.import_module(module), name)
    assert common_cli.source_defaults(module, name) == common_cli.defaults(component)
