import pytest

from kfp_sagemaker_blackwell.common import naming, resources, tags


@pytest.mark.parametrize(
    "run_id,task,precision",
    [
        ("run-1", "train", "bf16"),
        ("a" * 300, "train-precision-sweep-for-each", "fp8-current"),
        ("run_with_underscores__x", "task_name", "nvfp4"),
        ("ünïcødé-rün-日本", "tâsk", "mxfp8"),
        ("----", "___", "fp8"),
        ("日本語", "日本語", "日本語"),
    ],
)
def test_job_names_always_satisfy_sagemaker_rules(run_id, task, precision):
    name = naming.training_job_name(run_id, task, precision)
    assert naming.is_valid_sagemaker_name(name), name
    assert 1 <= len(name) <= 63


def test_job_name_is_stable_for_same_inputs_and_distinct_across_runs():
    a = naming.training_job_name("0f1e2d3c-run", "train", "bf16")
    assert a == naming.training_job_name("0f1e2d3c-run", "train", "bf16")
    assert a != naming.training_job_name("0f1e2d3c-rum", "train", "bf16")
    assert a != naming.training_job_name("0f1e2d3c-run", "train", "fp8")
    assert a != naming.training_job_name("0f1e2d3c-run", "train-2", "bf16")


def test_long_run_ids_sharing_a_prefix_get_different_names():
    base = "x" * 80
    assert naming.training_job_name(base + "1", "t", "bf16") != naming.training_job_name(
        base + "2", "t", "bf16"
    )


def test_inputs_that_slug_alike_still_get_different_names():
    assert naming.training_job_name("my_run", "t", "bf16") != naming.training_job_name(
        "my-run", "t", "bf16"
    )


def test_name_is_readable():
    assert naming.training_job_name("abc", "train", "fp8").startswith("fp8-train-abc-")


def test_empty_run_id_is_refused():
    with pytest.raises(ValueError, match="run_id"):
        naming.training_job_name(" ", "t", "bf16")


def test_run_tags_carry_run_pipeline_and_component():
    t = tags.run_tags("run-42", "precision-sweep", "sagemaker_training")
    assert t == {
        tags.RUN_ID_KEY: "run-42",
        tags.PIPELINE_KEY: "precision-sweep",
        tags.COMPONENT_KEY: "sagemaker_training",
    }
    assert {"Key": tags.RUN_ID_KEY, "Value": "run-42"} in tags.as_key_value(t)
    assert tags.from_key_value(tags.as_lower_key_value(t)) == t
    assert tags.belongs_to_run(t, "run-42") and not tags.belongs_to_run(t, "run-4")


@pytest.mark.parametrize("bad", ["", "  ", "*", "run-*", "run?", "a b", "x" * 200])
def test_empty_wildcard_or_malformed_run_ids_are_refused(bad):
    with pytest.raises(ValueError, match="run_id"):
        tags.run_tags(bad, "p", "c")


def test_standard_tags_win_over_user_tags_and_limits_are_enforced():
    base = tags.run_tags("r1", "p", "c")
    merged = tags.merge(base, {tags.RUN_ID_KEY: "spoof", "team": "llm"})
    assert merged[tags.RUN_ID_KEY] == "r1" and merged["team"] == "llm"
    with pytest.raises(ValueError, match="at most 50"):
        tags.merge(base, {f"k{i}": "v" for i in range(48)})
    with pytest.raises(ValueError, match="aws:"):
        tags.merge(base, {"aws:foo": "v"})


def test_tag_values_are_cleaned_to_allowed_characters():
    assert tags.clean_value("a,b;c") == "a_b_c"


def test_aws_resources_record_round_trips(tmp_path):
    path = tmp_path / "out" / "aws_resources"
    rec = resources.AwsResource(
        resources.TRAINING_JOB,
        "arn:aws:sagemaker:us-west-2:123456789012:training-job/j",
        name="j",
        region="us-west-2",
        consoleUri=resources.training_job_console_uri("us-west-2", "j"),
    )
    resources.write(str(path), [rec])
    assert resources.read(str(path)) == [rec]
    assert resources.read(str(tmp_path / "missing")) == []
