"""Every numeric trainer option declares its valid range once (``option(valid=...)`` in
catalog/flags.py); the trainer's parser, its in-process ``make`` and the launcher's dry run
all refuse a value outside it, naming the option, the range and the fix."""

from __future__ import annotations

import argparse
import math
import typing

import pytest

from kfp_sagemaker_blackwell.catalog import flags as config
from kfp_sagemaker_blackwell.catalog.flags import Bounds, TrainConfig
from kfp_sagemaker_blackwell.common import aws

# (hyperparameter, value, range the message must quote): values that passed --dry-run and
# failed only once the instances were up (issue 28 item 9).
BAD = [("beta1", "1.5", "[0, 1)"), ("beta2", "1.0", "[0, 1)"), ("lr", "inf", "(0, inf)"),
       ("lr", "nan", "(0, inf)"), ("lr", "0", "(0, inf)"),
       ("weight-decay", "-1", "[0, inf)"),
       ("fp8-amax-history-len", "1000000000", "[1, 1024]")]
PATHS = ["--checkpoint-dir", "", "--model-dir", "", "--output-dir", "", "--output-data-dir", ""]


def _kind(f: typing.Any) -> type:
    hint = typing.get_type_hints(TrainConfig)[f.name]
    return ([t for t in typing.get_args(hint) if t is not type(None)] or [hint])[0]


def _numeric_flags() -> list[typing.Any]:
    return [f for f in config.flag_fields() if _kind(f) in (int, float)]


def test_bounds_read_like_intervals_and_refuse_non_finite_values():
    half_open = Bounds.parse("[0, 1)")
    assert 0 in half_open and 0.999 in half_open and 1 not in half_open and -0.1 not in half_open
    positive = Bounds.parse("(0, inf)")
    assert 1e300 in positive and 0 not in positive
    assert math.inf not in positive and math.nan not in positive and -math.inf not in positive
    assert True not in Bounds.parse("[0, 1]") and "0.5" not in Bounds.parse("[0, 1]")
    assert str(half_open) == "[0, 1)"
    for bad in ("0, 1", "[1, 0]", "[0; 1]"):
        with pytest.raises(ValueError):
            Bounds.parse(bad)


def test_every_numeric_option_declares_a_range_that_holds_its_default():
    numeric = _numeric_flags()
    assert {f.name for f in numeric} >= {"beta1", "beta2", "lr", "weight_decay",
                                          "fp8_amax_history_len", "batch_size", "max_steps"}
    missing = [f.name for f in numeric if f.metadata["valid"] is None]
    assert not missing, f"numeric options without valid=...: {missing}"
    for f in numeric:
        default = config.flag_default(f)
        assert default is None or default in f.metadata["valid"], f.name


def test_the_parser_enforces_each_declared_range_at_its_edges():
    actions = {a.dest: a for a in config.build_parser()._actions}
    for f in _numeric_flags():
        bounds, convert = f.metadata["valid"], actions[f.name].type
        assert callable(convert), f.name
        inside = bounds.low if bounds.low_closed else (bounds.high if bounds.high_closed
                                                       and math.isfinite(bounds.high)
                                                       else bounds.low + 1)
        kind = _kind(f)
        assert convert(str(kind(inside))) in bounds, f.name
        outside = [bounds.low - 1] + ([bounds.high + 1] if math.isfinite(bounds.high) else [])
        outside += [] if bounds.low_closed else [bounds.low]
        for value in outside:
            with pytest.raises(argparse.ArgumentTypeError):
                convert(str(kind(value)))


@pytest.mark.parametrize("name, value, shown", BAD)
def test_out_of_range_values_are_refused_by_the_trainer_naming_the_range_and_fix(
        name, value, shown):
    attr = name.replace("-", "_")
    # The command line, the hyperparameters the launcher checks, and SageMaker's SM_HP_*.
    with pytest.raises(config.ConfigError) as cli:
        config.parse([f"--{name}", value, *PATHS], env={})
    with pytest.raises(config.ConfigError) as hps:
        config.check_hyperparameters({name: value}, env={})
    with pytest.raises(config.ConfigError) as env:
        config.parse(PATHS, env={f"SM_HP_{attr.upper()}": value})
    for exc in (cli.value, hps.value, env.value):
        assert exc.name == name, str(exc)
        assert f"--{name}: {value} is outside the valid range {shown}" in str(exc)
        assert exc.fix.startswith(f"give {name} a value in {shown}"), exc.fix
    # A config made in-process goes through the same declaration.
    kind = int if attr == "fp8_amax_history_len" else float
    with pytest.raises(config.ConfigError) as made:
        config.make("tiny", **{attr: kind(value)})
    assert made.value.name == name and f"outside its valid range {shown}" in str(made.value)
    assert "Fix: give" in str(made.value)


def test_values_inside_the_ranges_still_parse():
    cfg = config.parse(["--beta1", "0", "--beta2", "0.999", "--lr", "3e-4", "--weight-decay", "0",
                        "--fp8-amax-history-len", "1024", *PATHS], env={})
    assert (cfg.beta1, cfg.beta2, cfg.lr, cfg.weight_decay, cfg.fp8_amax_history_len) == (
        0.0, 0.999, 3e-4, 0.0, 1024)


DRY_RUN = ["--dry-run", "--run-id", "ranges", "--task", "train",
           "--image-uri", "123456789012.dkr.ecr.us-west-2.amazonaws.com/kfp-sagemaker-trainer:t",
           "--role-arn", "arn:aws:iam::123456789012:role/SageMakerTraining",
           "--output-s3-uri", "s3://kfp-sagemaker-ranges/out", "--region", "us-west-2",
           "--model-preset", "tiny", "--batch-size", "2", "--seq-length", "32",
           "--max-steps", "2"]


@pytest.mark.parametrize("name, value, shown", BAD)
def test_launcher_dry_run_refuses_out_of_range_hyperparameters_before_any_aws_call(
        name, value, shown, capsys, monkeypatch):
    from kfp_sagemaker_blackwell.components.sagemaker_training.__main__ import main

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    with aws.record_calls() as recording:
        code = main(DRY_RUN + ["--hyperparameters", f"{name}={value}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert recording.calls() == []
    assert err.startswith("error: hyperparameters: the trainer would refuse it"), err
    assert f"--{name}: {value} is outside the valid range {shown}" in err
    assert f"Fix: give {name} a value in {shown}" in err


def test_launcher_dry_run_accepts_in_range_hyperparameters(capsys, monkeypatch):
    from kfp_sagemaker_blackwell.components.sagemaker_training.__main__ import main

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    code = main(DRY_RUN + ["--hyperparameters", "beta1=0.8", "--hyperparameters", "beta2=0.99",
                           "--hyperparameters", "lr=1e-3", "--hyperparameters", "weight-decay=0",
                           "--hyperparameters", "fp8-amax-history-len=16"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert '"beta1": "0.8"' in out.out and '"fp8-amax-history-len": "16"' in out.out


@pytest.mark.parametrize("name, value, shown", [("num-layers", "5000", "[1, 1024]"),
                                                ("vocab-size", "-1", "[0, 4194304]"),
                                                ("hidden-size", "1000000", "[1, 131072]")])
def test_model_dimensions_have_their_ranges_too(name, value, shown):
    from kfp_sagemaker_blackwell.catalog import spec

    with pytest.raises(config.ConfigError) as hps:
        config.check_hyperparameters({name: value}, env={})
    assert hps.value.name == name
    assert f"--{name}: {value} is outside the valid range {shown}" in str(hps.value)
    assert hps.value.fix.startswith(f"give {name} a value in {shown}")
    attr = name.replace("-", "_")
    with pytest.raises(ValueError, match=rf"^{attr}={value}: "):
        spec.spec_from_values("tiny", **{attr: int(value)})
    assert set(spec.DIMENSION_BOUNDS) == set(spec._DIM_FLAGS)  # every dimension flag


def test_launcher_dry_run_refuses_a_model_dimension_out_of_range(capsys, monkeypatch):
    from kfp_sagemaker_blackwell.components.sagemaker_training.__main__ import main

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    with aws.record_calls() as recording:
        code = main(DRY_RUN + ["--num-layers", "5000"])
    err = capsys.readouterr().err
    assert code == 2 and recording.calls() == []
    assert err.startswith("error: num_layers: num_layers=5000: outside its valid range [1, 1024]")
