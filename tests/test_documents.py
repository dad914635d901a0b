"""The JSON documents components hand each other are read in one place
(common/documents.py): whatever the user passes, an error that names the
parameter and what to pass, never a traceback."""

from __future__ import annotations

import json

import pytest

from kfp_sagemaker_blackwell.common.documents import VERDICTS_SCHEMA, read_document
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.components.plan_training.run import read_verdicts
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
