"""Helpers shared by the components' command lines (``python -m components.<name>``)."""

from __future__ import annotations

from components.common.errors import UserError


def key_values(flag: str, items: list[str] | None) -> dict[str, str]:
    """Repeated ``FLAG KEY=VALUE`` arguments as a dict; a malformed item is a UserError naming the flag."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(flag, f"{item!r} is not KEY=VALUE.", f"write {flag} KEY=VALUE.")
        out[key] = value
    return out
