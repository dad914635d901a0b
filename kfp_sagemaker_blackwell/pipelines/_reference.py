"""The README's generated parts: the per-component reference and the table of contents.

Each component's inputs and outputs (name, KFP type, default, the docstring's
``Args:``/``Returns:`` text) come from its ``component_spec``, the same source the
compiled YAML and the KFP UI use, so the README cannot drift from the code; the
table of contents lists the README's ``##`` and ``###`` headings with GitHub's
anchors. ``python -m kfp_sagemaker_blackwell.pipelines.compile`` rewrites both between their marker
comments, and ``tests/test_readme.py`` fails when the checked-in README differs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

BEGIN = ("<!-- component-reference: generated from each component's signature and "
         "docstring by `python -m kfp_sagemaker_blackwell.pipelines.compile`; do not edit by hand -->")
END = "<!-- end component-reference -->"
TOC_BEGIN = ("<!-- toc: generated from the headings by `python -m kfp_sagemaker_blackwell.pipelines.compile`; "
             "do not edit by hand -->")
TOC_END = "<!-- end toc -->"

_REST_LITERAL = re.compile(r"``([^`]+)``")
_ARTIFACT = re.compile(r"^system\.(\w+)@[\d.]+$")


def _text(description: str | None) -> str:
    """One Markdown table cell: reST literals as code, one line, pipes escaped, and outside
    code spans ``<``, ``>`` and ``*`` escaped (GitHub would take ``<name>`` for an HTML tag)."""
    text = _REST_LITERAL.sub(r"`\1`", " ".join((description or "").split()))
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*")
    return "`".join(parts).replace("|", "\\|")


def _type(spec: Any) -> str:
    match = _ARTIFACT.match(spec.type)
    name = spec.type if not match else (
        "Artifact" if match.group(1) == "Artifact" else f"{match.group(1)} artifact")
    return f"list of {name}s" if getattr(spec, "is_artifact_list", False) else name


def _default(spec: Any) -> str:
    if not spec.optional:
        return "required"
    if spec.default is None:
        return "optional"
    return "`" + json.dumps(spec.default) + "`"


def render_component(name: str, comp: Any) -> str:
    spec = comp.component_spec
    summary = _text((spec.description or "").split("\n", 1)[0])
    lines = [f"### `{name}`", "",
             f"{summary} Full description: the docstring of `components/{name}/component.py` "
             f"(shown in the KFP UI); YAML: `compiled/components/{name}.yaml`.", "",
             "| input | type | default | description |", "|---|---|---|---|"]
    for key, value in spec.inputs.items():
        lines.append(f"| `{key}` | {_type(value)} | {_default(value)} | "
                     f"{_text(value.description)} |")
    lines += ["", "| output | type | description |", "|---|---|---|"]
    for key, value in (spec.outputs or {}).items():
        lines.append(f"| `{key}` | {_type(value)} | {_text(value.description)} |")
    return "\n".join(lines) + "\n"


def render(components: dict[str, Any]) -> str:
    """The whole generated section, markers included (``components``: name -> component)."""
    body = "\n".join(render_component(name, comp) for name, comp in components.items())
    return f"{BEGIN}\n\n{body}\n{END}"


def headings(readme: str) -> list[tuple[int, str]]:
    """The ``##`` and ``###`` headings (level, text), outside fenced code blocks."""
    found: list[tuple[int, str]] = []
    fenced = False
    for line in readme.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"^(#{2,3}) (.+?)\s*$", line)):
            found.append((len(match.group(1)), match.group(2)))
    return found


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def render_toc(readme: str) -> str:
    seen: dict[str, int] = {}
    lines = [TOC_BEGIN, "", "**Contents**", ""]
    for level, text in headings(readme):
        slug = anchor(text)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        label = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
        lines.append(f"{'  ' * (level - 2)}- [{label}](#{slug}{f'-{count}' if count else ''})")
    return "\n".join(lines + ["", TOC_END])


def replace_section(readme: str, section: str, begin: str = BEGIN, end: str = END) -> str:
    """``readme`` with the text between the markers (markers included) replaced."""
    start, stop = readme.find(begin), readme.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"the README has no markers {begin!r} ... {end!r}")
    return readme[:start] + section + readme[stop + len(end):]


def regenerate(readme: str, components: dict[str, Any]) -> str:
    """``readme`` with its component reference and then its table of contents rendered."""
    readme = replace_section(readme, render(components))
    return replace_section(readme, render_toc(readme), TOC_BEGIN, TOC_END)


def update(readme_path: Path, components: dict[str, Any]) -> bool:
    """Rewrites the README's generated parts; True when they changed."""
    old = readme_path.read_text(encoding="utf-8")
    new = regenerate(old, components)
    if new != old:
        readme_path.write_text(new, encoding="utf-8")
    return new != old
