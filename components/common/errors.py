"""Error types shared by all components.

A ``UserError`` is a problem the user can fix (a bad parameter, a precision the
GPU cannot run...). It is raised before any AWS call and its message names the
field and the fix. Command-line entry points exit with ``USER_ERROR_EXIT_CODE``
for it, so that a retry policy can tell it from an internal failure.
"""

from __future__ import annotations

USER_ERROR_EXIT_CODE = 2
# The AWS endpoint stayed unreachable past the step's outage budget (sysexits'
# EX_UNAVAILABLE): distinct from 1 (the remote work failed) and 2 (a user error).
AWS_UNREACHABLE_EXIT_CODE = 69


class UserError(ValueError):
    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        text = f"{field}: {problem}"
        if fix:
            text += f" Fix: {fix}"
        super().__init__(text)
