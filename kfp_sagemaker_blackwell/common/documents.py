"""The JSON documents components hand each other (a memory plan, convergence verdicts):
``{"schema": "kfp-sagemaker/<kind>/v1", ...}`` objects, read in one place.

A document that is not JSON, is nested past what the JSON reader takes, or is another
kind of document is the user's input error: a UserError naming the parameter it came
in and what to pass instead, never a traceback.
"""

from __future__ import annotations

import json
from typing import Any

from kfp_sagemaker_blackwell.common.errors import UserError

# compare_convergence writes it, plan_training reads it.
VERDICTS_SCHEMA = "kfp-sagemaker/convergence-verdicts/v1"


def read_document(text: str, *, schema: str, field: str, fix: str) -> dict[str, Any]:
    """The JSON object ``text`` holds, checked to be a ``schema`` document.

    Args:
        text: the document (the string a component output it as).
        schema: the ``"schema"`` value the document must carry.
        field: the parameter it was passed in (names the error).
        fix: what to pass instead (ends the error).
    """
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else exc
        raise UserError(field, f"is not valid JSON ({why}).", fix) from None
    if not isinstance(doc, dict) or doc.get("schema") != schema:
        raise UserError(field, f"is not a {schema} document.", fix)
    return doc
