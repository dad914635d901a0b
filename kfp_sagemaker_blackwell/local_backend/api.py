"""SageMaker's JSON protocol, as the executor speaks it.

Errors carry their code in ``__type`` (botocore reads it as ``Error.Code``);
timestamps are seconds since the epoch (botocore parses them to datetimes).
"""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any


class ApiError(Exception):
    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status

    def payload(self) -> dict[str, Any]:
        return {"__type": self.code, "message": self.message}


def validation(message: str) -> ApiError:
    return ApiError("ValidationException", message)


def not_found() -> ApiError:
    return ApiError("ValidationException", "Requested resource not found.")


def _default(value: Any) -> Any:
    if isinstance(value, _dt.datetime):
        return value.timestamp()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def encode(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, default=_default).encode("utf-8")
