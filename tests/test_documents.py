"""The JSON documents components hand each other are read in one place
(common/documents.py): whatever the user passes, an error that names the
parameter and what to pass, never a traceback."""

from __future__ import annotations

import json

import pytest

from kfp_sagemaker_blackwell.common.documents import VERDICTS_SCHEMA, read_document
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.components.plan_training.launcher import read_verdicts
from kfp_sagemaker_blackwell.planning.memory_plan import MemoryPlan

DEEP = '{"a": ' * 100_000 + "1" + "}" * 100_000  # past what json.loads takes
READERS = [
    pytest.param(MemoryPlan.from_json, "memory_plan", "memory_estimate", id="memory_plan"),
    pytest.param(read_verdicts, "convergence_verdicts", "compare_convergence", id="verdicts"),
]


@pytest.mark.parametrize("reader, field, producer", READERS)
@pytest.mark.parametrize("text, problem", [
    ('{"schema": ', "is not valid JSON"),
    (DEEP, "is not valid JSON (nested too deeply)"),
    ('{"schema": "kfp-sagemaker/log-events/v1"}', "document"),
    ("{}", "document"),
])
def test_a_document_that_is_not_the_one_asked_for_names_the_parameter_and_the_fix(
        reader, field, producer, text, problem):
    with pytest.raises(UserError) as err:
        reader(text)
    assert err.value.field == field and problem in str(err.value)
    assert producer in str(err.value)


def test_a_json_value_that_is_not_an_object_is_not_a_document():
    for text in ("[1, 2]", '"kfp-sagemaker/convergence-verdicts/v1"', "null"):
        with pytest.raises(UserError, match=f"is not a {VERDICTS_SCHEMA} document"):
            read_document(text, schema=VERDICTS_SCHEMA, field="f", fix="pass a verdicts file.")


def test_the_document_comes_back_as_written():
    doc = {"schema": VERDICTS_SCHEMA, "precisions": [{"precision": "bf16"}]}
    assert read_document(json.dumps(doc), schema=VERDICTS_SCHEMA, field="f", fix="-") == doc


# ---- a document's keys: the reader's fields, or a UserError naming the key and the fix ----
def _plan() -> dict:
    from kfp_sagemaker_blackwell.components.memory_estimate import __main__ as cli
    from kfp_sagemaker_blackwell.components.memory_estimate.launcher import run_component

    out = run_component(**cli.with_defaults(
        {"model_preset": "tiny", "gpu": "H200", "world_size": 1, "precisions": ["bf16"]}))
    return json.loads(out.plan)


def _plan_error(change) -> UserError:
    doc = _plan()
    change(doc)
    with pytest.raises(UserError) as err:
        MemoryPlan.from_json(json.dumps(doc))
    assert err.value.field == "memory_plan"
    assert "pass the plan output of memory_estimate of this version" in err.value.fix
    return err.value


@pytest.mark.parametrize("text, says", [
    ('{"resources": [{"resourceType": "CodeBuildBuild", "resourceUri": "arn:b", "regoin": "x"}]}',
     "resources[0] has unknown key(s) 'regoin' (did you mean 'region'?); accepted keys: "
     "consoleUri, extra, name, region, resourceType, resourceUri."),
    ('{"resources": [{"resourceUri": "arn:b"}]}', "resources[0] lacks 'resourceType'"),
    ('{"resources": {"a": 1}}', "'resources' is dict, not a list"),
    ('{"resource": []}', "unknown key(s) 'resource' (did you mean 'resources'?)"),
    ('{"resources": [', "is not valid JSON"),
])
def test_an_aws_resources_record_with_an_unknown_key_is_a_user_error(text, says, capsys):
    from kfp_sagemaker_blackwell.common import resources
    from kfp_sagemaker_blackwell.common.errors import cli_errors

    with pytest.raises(UserError) as err:
        resources.loads(text)
    assert err.value.field == "aws_resources" and says in err.value.problem, err.value.problem
    assert cli_errors(resources.loads)(text) == 2  # a command line's exit: no traceback
    assert capsys.readouterr().err.startswith("error: aws_resources")


def test_an_aws_resources_record_comes_back_as_written():
    from kfp_sagemaker_blackwell.common import resources

    made = [resources.AwsResource("CodeBuildBuild", "arn:b", name="b", region="us-west-2",
                                  extra={"k": 1})]
    assert resources.loads(resources.dumps(made)) == made


def test_a_plan_comes_back_as_written():
    doc = _plan()
    assert json.loads(MemoryPlan.from_json(json.dumps(doc)).to_json()) == doc


def test_an_unknown_plan_key_is_named_with_its_close_match_and_the_accepted_keys():
    err = _plan_error(lambda d: d.update(headroom_frac=0.1))
    assert "the plan has unknown key(s) 'headroom_frac' (did you mean 'headroom_fraction'?)" \
        in err.problem
    assert "accepted keys: gpu, gpu_memory_bytes, headroom_fraction," in err.problem


def test_an_unknown_key_of_a_precisions_entry_is_named_with_the_entry():
    err = _plan_error(lambda d: d["precisions"]["bf16"].update(peak_byte=1))
    assert "the plan's precisions['bf16'] has unknown key(s) 'peak_byte' (did you mean " \
        "'peak_bytes'" in err.problem
    assert "max_batch_size_with_checkpointing" in err.problem  # the entry's keys, not the plan's


@pytest.mark.parametrize("change, says", [
    (lambda d: d.pop("gpu"), "the plan lacks 'gpu'"),
    (lambda d: d["precisions"]["bf16"].pop("fits"), "precisions['bf16'] lacks 'fits'"),
    (lambda d: d["precisions"].update(fp8=3), "precisions['fp8'] is int 3, not a JSON object"),
    (lambda d: d.update(precisions=["bf16"]), "the plan's precisions is list, not an object"),
])
def test_a_plan_missing_a_key_or_of_the_wrong_shape_is_a_user_error(change, says):
    assert says in _plan_error(change).problem


def test_an_unknown_probe_key_is_named_with_its_close_match():
    from kfp_sagemaker_blackwell.planning.probe import Probe

    probe = {"precision": "fp8", "batch_size": 2, "activation_checkpointing": False,
             "tokens_per_s_per_gpu": 9000.0, "gpu": "H200", "worldsize": 1}
    with pytest.raises(UserError) as err:
        Probe.from_dict(probe, field="probes")
    assert err.value.field == "probes"
    assert "a probe has unknown key(s) 'worldsize' (did you mean 'world_size'?)" in str(err.value)
    assert "accepted keys: activation_checkpointing, batch_size, gpu, instance_type, kind," \
        in str(err.value)
