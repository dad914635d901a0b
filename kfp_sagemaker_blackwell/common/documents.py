"""The JSON documents components hand each other (a memory plan, convergence verdicts):
``{"schema": "kfp-sagemaker/<kind>/v1", ...}`` objects, read in one place.

A document that is not JSON, is nested past what the JSON reader takes, is another
kind of document, or has keys its reader does not know (``check_keys``) is the user's
input error: a UserError naming the parameter it came in and what to pass instead,
never a traceback.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
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


def check_keys(data: Any, accepted: Iterable[str], *, field: str, what: str, fix: str,
               required: Iterable[str] = ()) -> dict[str, Any]:
    """``data`` (a JSON object's keys are about to become a dataclass's fields), checked:
    a UserError naming ``field`` when it is not an object, has a key outside ``accepted``
    (each named with its close matches, as the catalog names a misspelt preset: difflib)
    or lacks one of ``required``; the accepted keys and ``fix`` end the message.

    Args:
        what: the object in the user's words (``"the plan"``, ``"precisions['fp8']"``).
    """
    names = sorted(accepted)
    listed = f"accepted keys: {', '.join(names)}."
    if not isinstance(data, dict):
        raise UserError(field, f"{what} is {type(data).__name__} {data!r:.80}, not a JSON "
                        "object.", fix)
    unknown = sorted(str(k) for k in set(data) - set(names))
    if unknown:
        said = []
        for key in unknown:
            close = difflib.get_close_matches(key, names, n=2, cutoff=0.5)
            said.append(repr(key) + (f" (did you mean {' or '.join(map(repr, close))}?)"
                                     if close else ""))
        raise UserError(field, f"{what} has unknown key(s) {', '.join(said)}; {listed}", fix)
    missing = [k for k in required if k not in data]
    if missing:
        raise UserError(field, f"{what} lacks {', '.join(map(repr, missing))}; {listed}", fix)
    return data
