"""Valid ranges of numeric options, written once where the option is declared.

Torch-free: the trainer's flags (kfp_sagemaker_blackwell.catalog.flags, kfp_sagemaker_blackwell.catalog.spec) and the launcher's
check of hyperparameters (through kfp_sagemaker_blackwell.catalog.flags) read the same declaration.
"""

from __future__ import annotations

import argparse
import difflib
import math
import re
from dataclasses import dataclass
from typing import Any

from kfp_sagemaker_blackwell.catalog.errors import FieldError


def unknown(field: str, name: str, choices: Any) -> str:
    """The one message for a name not among ``choices`` (a preset, a precision, an
    instance type): ``field='x': unknown; did you mean 'y'? choose one of ...``."""
    return str(UnknownName(field, name, choices))


class UnknownName(FieldError):
    """A name not among ``choices``, as a ValueError whose text is :func:`unknown`'s;
    ``problem``: the name and the "did you mean", ``fix``: the choices."""

    def __init__(self, field: str, name: str, choices: Any) -> None:
        names = [str(c) for c in choices]
        close = difflib.get_close_matches(str(name), names, n=2, cutoff=0.5)
        hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
        super().__init__(
            field, f"{name!r}: unknown; {hint.strip()}" if close else f"{name!r}: unknown.",
            f"choose one of {', '.join(names)}.",
            text=f"{field}={name!r}: unknown; {hint}choose one of {', '.join(names)}")


@dataclass(frozen=True)
class Bounds:
    """A numeric option's valid values: an interval written as in mathematics, ``[0, 1)``
    (0 included, 1 excluded), ``(0, inf)`` (any finite value above 0). A value that is not
    finite (inf, nan) is never inside, whatever the bounds."""

    text: str
    low: float
    high: float
    low_closed: bool
    high_closed: bool

    @classmethod
    def parse(cls, text: str) -> Bounds:
        m = re.fullmatch(r"\s*([\[(])\s*([^,\s]+)\s*,\s*([^,\s]+)\s*([\])])\s*", text)
        if not m:
            raise ValueError(f"bounds {text!r}: write them as [low, high], (low, high)...")
        low, high = _number(m.group(2)), _number(m.group(3))
        if not low < high:
            raise ValueError(f"bounds {text!r}: low must be below high")
        return cls(text.strip(), low, high, m.group(1) == "[", m.group(4) == "]")

    def __contains__(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if not math.isfinite(value):
            return False
        above = value >= self.low if self.low_closed else value > self.low
        below = value <= self.high if self.high_closed else value < self.high
        return above and below

    def __str__(self) -> str:
        return self.text


def _number(text: str) -> float:
    """An int when it is one (so 2**63 - 1 stays exact), else a float (inf, 1e-3)."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def within(kind: type, bounds: Bounds) -> Any:
    """An argparse ``type``: converts with ``kind``, then refuses a value outside ``bounds``."""

    def convert(text: str) -> Any:
        value = kind(text)  # ValueError: argparse says "invalid <kind> value"
        if value not in bounds:
            raise argparse.ArgumentTypeError(f"{text} is outside the valid range {bounds}")
        return value

    convert.__name__ = kind.__name__
    return convert


def count(low: int = 1) -> Any:
    """An argparse ``type`` for a count (GPUs, jobs, steps, instances...): an integer
    >= ``low``, so that ``0`` or ``-1`` is refused naming the flag, not taken as 1."""
    return within(int, Bounds.parse(f"[{low}, inf)"))
