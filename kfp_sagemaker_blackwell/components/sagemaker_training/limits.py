"""SageMaker's own limits for CreateTrainingJob, read from botocore's service model.

botocore checks types and required members before it sends a request, but not
the lengths, patterns, list sizes or enums the model declares: SageMaker
answers those with a ValidationException, after the call. ``check`` applies
them before any AWS call, naming the component's parameter, so the limits are
botocore's (updated with botocore) instead of constants copied by hand.

A member is addressed by its path in the request, e.g.
``VpcConfig.Subnets`` (the list), ``VpcConfig.Subnets[]`` (one element),
``HyperParameters{}`` / ``HyperParameters{key}`` (a map's values / keys),
``Tags[].Key``.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from kfp_sagemaker_blackwell.common.errors import UserError

OPERATION = "CreateTrainingJob"


@dataclass(frozen=True)
class Limit:
    path: str
    type_name: str
    min: int | None = None
    max: int | None = None
    pattern: str | None = None
    enum: tuple[str, ...] = ()


@functools.lru_cache(maxsize=1)
def _input_shape() -> Any:
    import botocore.session

    from kfp_sagemaker_blackwell.common import aws

    session = botocore.session.get_session()
    session.register_component("data_loader", aws._shared_loader())
    return session.get_service_model("sagemaker").operation_model(OPERATION).input_shape


@functools.cache
def limit(path: str) -> Limit:
    """The limits botocore's model declares for the member at ``path``."""
    shape = _input_shape()
    for part in re.findall(r"[^.\[\]{}]+|\[\]|\{\}|\{key\}", path):
        if part == "[]":
            shape = shape.member
        elif part == "{}":
            shape = shape.value
        elif part == "{key}":
            shape = shape.key
        else:
            shape = shape.members[part]
    md = shape.metadata
    return Limit(path, shape.type_name, md.get("min"), md.get("max"), md.get("pattern"),
                 tuple(getattr(shape, "enum", None) or ()))


_UNICODE_CLASS = re.compile(r"\\p\{([A-Z])\}")


def matches(pattern: str, text: str) -> bool:
    """Whether ``text`` matches a botocore pattern in full (Java regex syntax).

    Python's ``re`` has no ``\\p{L}`` (Unicode category) classes; the one form
    botocore uses them in, a repeated character class such as
    ``([\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*)``, is checked character by character.
    """
    categories = _UNICODE_CLASS.findall(pattern)
    if not categories:
        return re.fullmatch(pattern, text) is not None
    m = re.fullmatch(r"\^?\(?\[(.*)\]\*\)?\$?", pattern)
    if m is None:  # not a form we can translate: let SageMaker judge
        return True
    rest = "[" + _UNICODE_CLASS.sub("", m.group(1)) + "]"
    return all(unicodedata.category(c)[0] in categories or re.fullmatch(rest, c) for c in text)


def check(fld: str, path: str, value: Any, fix: str = "") -> None:
    """Raises a UserError naming ``fld`` when ``value`` breaks the model's limits at ``path``."""
    lim = limit(path)
    what = path.replace("[]", "").replace("{}", "").replace("{key}", "")
    if lim.type_name in ("list", "map"):
        size = len(value)
        if lim.max is not None and size > lim.max:
            raise UserError(fld, f"{size} entries; SageMaker allows at most {lim.max} ({what}).",
                            fix or f"pass at most {lim.max}.")
        if lim.min is not None and size < lim.min:
            raise UserError(fld, f"{size} entries; SageMaker needs at least {lim.min} ({what}).",
                            fix or f"pass at least {lim.min}.")
        return
    if lim.type_name == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(fld, f"{value!r} is not an integer.", fix or "pass a whole number.")
        if lim.min is not None and value < lim.min or lim.max is not None and value > lim.max:
            bounds = f"{lim.min}-{lim.max}" if lim.max is not None else f">= {lim.min}"
            raise UserError(fld, f"{value}: SageMaker allows {bounds} ({what}).",
                            fix or f"pass a value {bounds}.")
        return
    text = str(value)
    if lim.enum and text not in lim.enum:
        raise UserError(fld, f"{text!r} is not one of SageMaker's {len(lim.enum)} values for "
                        f"{what}.", fix or "check the spelling (aws sagemaker help).")
    if lim.max is not None and len(text) > lim.max or lim.min is not None and len(text) < lim.min:
        raise UserError(fld, f"{text[:80]!r}: SageMaker allows {lim.min or 0}-{lim.max} "
                        f"characters ({what}); this has {len(text)}.", fix or "shorten it.")
    if lim.pattern and not matches(lim.pattern, text):
        raise UserError(fld, f"{text[:80]!r} does not match SageMaker's pattern {lim.pattern} "
                        f"({what}).", fix)
