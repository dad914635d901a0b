"""The trainer's flags are TrainConfig's fields: one declaration, read by the parser.

``python -m kfp_sagemaker_blackwell.trainer``'s flags (and so its SageMaker hyperparameter names) come from the
TrainConfig fields declared with ``option()``, the model's from ModelSpec (kfp_sagemaker_blackwell.catalog.spec);
a flag added by hand, or a field declared without a flag, fails here.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys

import pytest

from kfp_sagemaker_blackwell.catalog import flags as config
from kfp_sagemaker_blackwell.catalog.flags import TrainConfig
from kfp_sagemaker_blackwell.catalog.spec import ModelSpec

MODEL_FLAGS = {f.name for f in dataclasses.fields(ModelSpec)} | {"model_preset"}


def _training_actions() -> dict[str, argparse.Action]:
    return {a.dest: a for a in config.build_parser()._actions
            if a.option_strings and a.dest != "help" and a.dest not in MODEL_FLAGS}


def test_every_trainer_flag_is_a_config_field_with_the_fields_default():
    actions = _training_actions()
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    assert set(actions) == set(fields) - {"model", "model_preset"}
    for name, action in actions.items():
        f = fields[name]
        assert action.option_strings[0] == "--" + name.replace("_", "-")
        if f.default_factory is not dataclasses.MISSING:  # a SageMaker path, found at start
            assert action.default is None
            var = f.metadata["sm_path_of"]
            assert f.default_factory() == config.sm_path(var), name
        else:
            assert action.default == f.default, name
        assert (action.choices or None) == (f.metadata["choices"] or None), name
        is_bool = isinstance(action, argparse.BooleanOptionalAction)
        assert is_bool == isinstance(f.default, bool), name


def test_the_trainer_help_shows_every_flags_default():
    missing = [a.dest for a in _training_actions().values()
               if a.help != argparse.SUPPRESS and "(default: " not in a.help]
    assert not missing
    out = subprocess.run([sys.executable, "-m", "trainer", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "(default: None)" not in out
    assert "tokens per sequence in [2, 1048576] (default: 128)" in out
    lr = _training_actions()["lr"].help
    assert lr == "peak learning rate in (0, inf) (default: min(1e-2, 0.64 / hidden-size))"


def test_test_hooks_are_flags_but_not_hyperparameter_names():
    names = config.hyperparameter_names()
    assert "stop-after-step" not in names and "simulate-oom-at-step" not in names
    assert {"seq-length", "max-steps", "activation-checkpointing", "model-preset"} <= set(names)
    assert "preset" not in names  # the deprecated spelling: accepted, not advertised
    assert config.parse(["--stop-after-step", "3"], env={}).stop_after_step == 3


def test_a_config_made_in_process_has_the_declared_defaults():
    made = config.make("tiny")
    parsed = config.parse(["--model-preset", "tiny", "--checkpoint-dir", "", "--model-dir", "",
                           "--output-dir", "", "--output-data-dir", ""], env={})
    assert made == parsed


@pytest.mark.parametrize("hps, name", [({"seq_length": "x"}, "seq-length"),
                                       ({"max-stepz": "3"}, "max-stepz"),
                                       ({"resume": "maybe"}, "resume"),
                                       ({"model-preset": "huge"}, "model-preset")])
def test_hyperparameters_are_checked_by_the_derived_parser(hps, name):
    with pytest.raises(config.ConfigError) as exc:
        config.check_hyperparameters(hps, env={})
    assert exc.value.name == name


DEPRECATED_PRESET = "warning: --preset is deprecated; use --model-preset"


def test_preset_is_the_deprecated_spelling_of_model_preset(capsys):
    paths = ["--checkpoint-dir", "", "--model-dir", "", "--output-dir", "", "--output-data-dir", ""]
    new = config.parse(["--model-preset", "1b", *paths], env={})
    assert capsys.readouterr().err == ""
    old = config.parse(["--preset", "1b", *paths], env={})
    assert old == new and old.model_preset == "1b"
    assert capsys.readouterr().err == DEPRECATED_PRESET + "\n"
    # A job launched by an older launcher sends the hyperparameter `preset`.
    assert config.check_hyperparameters({"preset": "1b"}, env={}).model == new.model
    assert DEPRECATED_PRESET in capsys.readouterr().err


def test_python_m_trainer_preset_still_trains_with_a_deprecation_note(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "trainer", "--preset", "tiny", "--max-steps", "2",
         "--seq-length", "32", "--batch-size", "2", "--log-every", "1", "--checkpoint-dir", "",
         "--model-dir", "", "--output-dir", str(tmp_path), "--output-data-dir", ""],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr.count(DEPRECATED_PRESET) == 1, out.stderr[-2000:]
    assert '"model_preset":"tiny"' in out.stdout  # the config record
