"""The torch-free contracts shared by the trainer and the components."""

import math

import pytest

from kfp_sagemaker_blackwell.catalog import hardware, logformat, spec


def test_presets_have_the_advertised_sizes():
    sizes = {name: spec.preset(name).total_params() / 1e9 for name in spec.PRESETS}
    assert 1.1 < sizes["1b"] < 1.35  # Llama 3.2 1B: 1.24B
    assert 3.0 < sizes["3b"] < 3.4  # Llama 3.2 3B: 3.21B
    assert 7.8 < sizes["8b"] < 8.2  # Llama 3.1 8B: 8.03B
    assert 14.0 < sizes["14b"] < 15.0
    assert 32.0 < sizes["32b"] < 33.5
    assert 60 < sizes["64b"] < 66
    assert spec.preset("te-fsdp-example").embedding_params() == 0


def test_llama_8b_parameter_count_is_exact():
    # Llama 3.1 8B has 8,030,261,248 parameters.
    assert spec.preset("8b").total_params() == 8_030_261_248


def test_flops_per_token_follows_torchtitan():
    s = spec.preset("te-fsdp-example")
    assert s.flops_per_token(8192) == 6 * s.non_embedding_params() + 12 * 24 * 2048 * 8192


@pytest.mark.parametrize(
    "changes,field",
    [
        ({"num_heads": 3}, "num_heads"),
        ({"num_kv_heads": 3}, "num_kv_heads"),
        ({"num_layers": 0}, "num_layers"),
        ({"hidden_size": -1}, "hidden_size"),
        ({"mlp": "relu"}, "mlp"),
        ({"vocab_size": -5}, "vocab_size"),
    ],
)
def test_bad_model_dimensions_name_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        spec.preset("tiny").replace(**changes).validate()


def test_spec_from_values_applies_overrides_to_the_preset():
    s = spec.spec_from_values("8b", num_layers=2, vocab_size=0, tie_embeddings=None)
    assert (s.num_layers, s.hidden_size, s.vocab_size) == (2, 4096, 0)
    with pytest.raises(ValueError, match="preset"):
        spec.spec_from_values("13x")


def test_blackwell_only_precisions_are_refused_on_hopper_with_what_works():
    with pytest.raises(hardware.UnsupportedPrecisionError) as exc:
        hardware.check_precision_for_instance("mxfp8", "ml.p5e.48xlarge")
    text = str(exc.value)
    assert "mxfp8" in text and "H200" in text and "Blackwell" in text and "fp8-block" in text
    hardware.check_precision_for_instance("nvfp4", "ml.p6-b200.48xlarge")
    hardware.check_precision_for_gpu("fp8", "NVIDIA H200")
    with pytest.raises(hardware.UnsupportedPrecisionError):
        hardware.check_precision_for_gpu("fp8", "A100")


def test_unknown_instance_type_lists_known_ones():
    with pytest.raises(ValueError, match="ml.p6-b200.48xlarge"):
        hardware.instance_type("ml.p9.huge")


def test_step_line_round_trips_with_a_prefix_and_nan():
    rec = logformat.StepRecord(
        12, 2.5, 3e-4, 0.75, 1234.5, 617.2, 1.5, math.nan, 1.25, 2.0, "mxfp8", True
    )
    line = "[default0]:2026-11-29 " + logformat.format_step(rec)
    back = logformat.parse_step(line)
    assert back is not None and back.step == 12 and back.precision == "mxfp8" and back.emulated
    assert math.isnan(back.mfu) and back.loss == 2.5 and back.tokens_per_s == 1234.5


def test_recipe_line_confirms_in_te_words_and_labels_emulation():
    rec = logformat.RecipeRecord("fp8", "DelayedScaling", "torch", True)
    line = logformat.format_recipe(rec)
    assert "Using FP8 recipe: DelayedScaling" in line and "EMULATED" in line
    assert logformat.parse_recipe(line) == rec
    mx = logformat.format_recipe(logformat.RecipeRecord("mxfp8", "MXFP8BlockScaling", "te", False))
    assert "MXFP8 enabled" in mx and "EMULATED" not in mx


def test_json_lines_round_trip():
    line = logformat.format_json("summary", {"final_loss": 1.5, "steps": 10})
    assert logformat.parse_json(line) == ("summary", {"final_loss": 1.5, "steps": 10})
    assert logformat.parse_json("[trainer] summary {not json") is None
