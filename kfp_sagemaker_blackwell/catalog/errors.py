"""The error for a value that one named field cannot take (torch-free, imports nothing).

``FieldError(field, problem, fix)`` is the base of the components' ``UserError``
(``kfp_sagemaker_blackwell.common.errors``) and of the trainer's ``ConfigError``: whoever re-raises
or reports one reads ``exc.field`` instead of recovering the field from the text, and
the text is each subclass's own (a ``UserError`` reads ``field: problem Fix: fix``).
"""

from __future__ import annotations


class FieldError(ValueError):
    """``field``: the parameter at fault ("" when none is); ``problem``: what is wrong
    with its value; ``fix``: what to do instead ("" when not known)."""

    def __init__(self, field: str, problem: str, fix: str = "", *,
                 text: str | None = None) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        if text is None:
            text = f"{field}: {problem}" if field else problem
            if fix:
                text += f" Fix: {fix}"
        super().__init__(text)
