"""Text from users and logs made safe to put in the Markdown the KFP UI renders.

A run label, a job name, a failure reason or a file path is data, never markup: the KFP
UI renders a Markdown artifact with raw HTML enabled, so ``<img src=x onerror=...>`` in
a label ran in the viewer's browser, and a ``|`` or a newline broke the table it sat in.

Hand-written because neither the standard library nor a dependency we ship escapes
Markdown (``html.escape`` covers HTML only; tabulate, which kfp brings, escapes nothing).
The rules are CommonMark's and GitHub's: ``&``, ``<`` and ``>`` become entities (text
in every renderer, so no tag or entity can start), ASCII punctuation that opens inline
markup gets a backslash (CommonMark section 2.4: any ASCII punctuation may be escaped),
``|`` gets one too (GFM tables), control characters and line breaks become spaces (one
value stays on its line and in its cell), and where the text starts a line, what would
start a block there (``#``, ``-``, ``+``, ``=``, ``1.``) is escaped as well.
"""

from __future__ import annotations

import re
from typing import Any

# Inline markup: emphasis, code, links and images, strikethrough, tables, escapes.
_INLINE = re.compile(r"([\\`*_\[\]|~!])")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]+")
# What opens a block when it starts a line (headings, lists, setext underlines, ordered
# lists).
_LEADING = re.compile(r"^(\s*)([#+=-])")
_ORDERED = re.compile(r"^(\s*\d+)([.)])")


def inline(value: Any, limit: int | None = None) -> str:
    """``value`` as literal text inside a Markdown line or table cell (not at its start).

    ``limit`` cuts the text (before escaping) to that many characters, marking the cut.
    """
    text = str(value)
    if limit is not None and len(text) > limit:
        text = text[: max(0, limit - 1)] + "…"
    text = _CONTROL.sub(" ", text)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _INLINE.sub(r"\\\1", text)


def line(value: Any, limit: int | None = None) -> str:
    """``value`` as literal text that starts a line (a paragraph or a list item's text)."""
    text = inline(value, limit)
    text = _LEADING.sub(r"\1\\\2", text, count=1)
    return _ORDERED.sub(r"\1\\\2", text, count=1)
