"""The docs hold together: README.md and docs/*.md link only to what exists, their anchors are
GitHub's, their Python compiles, their generated parts are what the generators write, and their
pictures are there and small.

Links: every relative ``[text](target)`` and ``![alt](target)`` outside code must name a file or
folder of the checkout, and a ``#anchor`` must be a heading of the page it points to, slugged
as GitHub does (``_reference.anchor``: lower case, punctuation dropped, spaces as hyphens, a
repeated heading numbered ``-1``, ``-2``). The shell blocks are run by tests/test_readme.py; the
Python blocks marked ``<!-- readme-test: local -->`` are run there too.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from kfp_sagemaker_blackwell.common.shipped import CHECKOUT
from kfp_sagemaker_blackwell.pipelines import _reference
from kfp_sagemaker_blackwell.pipelines.compile import discover_components

README = CHECKOUT / "README.md"
DOCS = CHECKOUT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
MAX_README_LINES = 250
MAX_PICTURE_BYTES = 300_000

_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code spans blanked."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, _CODE_SPAN.sub("``", line)))
    return out


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every Markdown link and image outside code. A link's text may
    wrap onto the next line, so lines are joined in pairs and each match kept once."""
    lines = prose(text)
    found: dict[tuple[int, int], str] = {}
    for i, (number, line) in enumerate(lines):
        joined = line + (" " + lines[i + 1][1] if i + 1 < len(lines) else "")
        for match in _LINK.finditer(joined):
            if match.start() < len(line):  # starts on this line
                found[(number, match.start())] = match.group(1)
    return [(number, target) for (number, _), target in sorted(found.items())]


def _through_symlink(target: Path, root: Path) -> str:
    """The first symlink on the way from ``root`` to ``target`` (unresolved), or ''."""
    path = root
    for part in Path(os.path.normpath(target)).relative_to(root).parts:
        path = path / part
        if path.is_symlink():
            return path.relative_to(root).as_posix()
    return ""


def broken_links(page: Path, root: Path) -> list[str]:
    """What is wrong with ``page``'s relative links and anchors (empty: nothing)."""
    text = page.read_text(encoding="utf-8")
    problems = []
    for number, target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not checked here
            continue
        path_part, _, fragment = target.partition("#")
        where = f"{page.relative_to(root).as_posix()}:{number}: {target}"
        dest = (page.parent / path_part).resolve() if path_part else page
        try:
            dest.relative_to(root.resolve())
        except ValueError:
            problems.append(f"{where}: points outside the repository")
            continue
        if not dest.exists():
            problems.append(f"{where}: no such file or folder")
            continue
        if path_part and (link := _through_symlink(page.parent / path_part, root)):
            problems.append(f"{where}: goes through the symlink {link} (GitHub does not follow "
                            f"it): link {dest.relative_to(root.resolve()).as_posix()}")
            continue
        if fragment:
            if dest.suffix != ".md" or dest.is_dir():
                problems.append(f"{where}: an anchor into a file that is not Markdown")
            elif fragment not in _reference.anchors(dest.read_text(encoding="utf-8")):
                problems.append(f"{where}: {dest.name} has no heading with anchor #{fragment}")
    return problems


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, source) of every ```python block."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)]


# ---- the pages as they are -----------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(CHECKOUT).as_posix() for p in PAGES])
def test_every_link_and_anchor_resolves(page):
    assert not broken_links(page, CHECKOUT), "\n".join(broken_links(page, CHECKOUT))


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / target.partition("#")[0]).resolve()
              for _, target in links(README.read_text(encoding="utf-8"))}
    missing = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, f"docs pages the README's map does not link: {missing}"


def test_the_readme_is_short_and_shows_the_three_ways_in():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_README_LINES
    headings = [h for h in re.findall(r"^### (.+)$", text, re.M)]
    assert headings[:3] == ["1. Upload a compiled pipeline to a Kubeflow cluster",
                            "2. Import components into your own pipeline",
                            "3. Compile and run locally"], headings
    assert "load_component_from_file(\"compiled/components/" in text
    assert "python pipelines/precision_sweep.py --compile" in text


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(CHECKOUT).as_posix() for p in PAGES])
def test_every_python_snippet_compiles(page):
    text = page.read_text(encoding="utf-8")
    for line, source in python_blocks(text):
        compile(source, f"{page.name}:{line}", "exec")


def test_the_generated_parts_are_what_the_generators_write():
    fresh = _reference.regenerate_docs(CHECKOUT, discover_components())
    stale = [path.relative_to(CHECKOUT).as_posix() for path, text in fresh.items()
             if _reference.comparable(path.read_text(encoding="utf-8"))
             != _reference.comparable(text)]
    assert not stale, f"{stale} differ from what the generators write: run `make docs`"
    assert len(fresh) == 3


def test_the_layout_table_lists_every_module_of_the_package():
    text = (DOCS / "layout.md").read_text(encoding="utf-8")
    package = CHECKOUT / _reference.PACKAGE
    for path in package.rglob("*.py"):
        shown = path.relative_to(package).as_posix()
        if path.name == "__init__.py" and path.parent.parent == package:
            assert f"### `{path.parent.name}/`" in text, shown
        elif path.parent != package:
            assert f"| [`{shown}`](../{_reference.PACKAGE}/{shown}) |" in text, shown
    assert "| [`planning/throughput.py`]" in text  # the package the old table left out


def test_the_pictures_are_shown_and_small():
    pictures = sorted((DOCS / "images").glob("*.png"))
    assert {p.name for p in pictures} >= {"precision_sweep_report.png",
                                          "batch_tuning_report.png"}
    shown = {(page.parent / target).resolve() for page in PAGES
             for _, target in links(page.read_text(encoding="utf-8"))}
    for picture in pictures:
        assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", picture.name
        assert picture.stat().st_size < MAX_PICTURE_BYTES, (picture.name,
                                                            picture.stat().st_size)
        assert picture.resolve() in shown, f"{picture.name} is not shown by any page"


# ---- the checks themselves -------------------------------------------------------------------


def _page(tmp_path: Path, text: str, name: str = "page.md") -> Path:
    (tmp_path / "docs").mkdir(exist_ok=True)
    path = tmp_path / "docs" / name
    path.write_text(text, encoding="utf-8")
    return path


def test_the_link_check_fails_on_a_broken_link(tmp_path):
    (tmp_path / "real.txt").write_text("x")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("x")
    (tmp_path / "short").symlink_to(tmp_path / "pkg")
    _page(tmp_path, "# Other page\n\n## Second `part`: here\n", "other.md")
    page = _page(tmp_path, "\n".join([
        "# Title", "", "## Title", "",
        "[ok](../real.txt) [ok](other.md#second-part-here) [ok](#title-1) [web](https://x.y/z)",
        "[missing](../gone.txt) and ![picture](images/none.png)",
        "[bad anchor](other.md#second-part) [bad local](#nowhere) [up](../../outside.md)",
        "[a link whose text",
        "wraps](../also-gone.md)",
        "`[in code](../gone.txt)`", "```", "[in a block](../gone.txt)", "```",
        "[real](../pkg/mod.py) [via a link](../short/mod.py)", ""]))
    problems = broken_links(page, tmp_path)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "../gone.txt: no such file or folder",
        "images/none.png: no such file or folder",
        "other.md#second-part: other.md has no heading with anchor #second-part",
        "#nowhere: page.md has no heading with anchor #nowhere",
        "../../outside.md: points outside the repository",
        "../also-gone.md: no such file or folder",
        "../short/mod.py: goes through the symlink short (GitHub does not follow it): link "
        "pkg/mod.py"], problems
    assert problems[0].startswith("docs/page.md:6: ")


def test_anchors_follow_githubs_rules():
    assert _reference.anchor("The local backend (AWS on 127.0.0.1)") == \
        "the-local-backend-aws-on-127001"
    assert _reference.anchor("`build_image`") == "build_image"
    assert _reference.anchor("4. Upload and run on a Kubeflow cluster (backend 2.14 or later)") \
        == "4-upload-and-run-on-a-kubeflow-cluster-backend-214-or-later"
    assert _reference.anchors("# A\n```sh\n# not a heading\n```\n## A\n### B ###\n") == \
        {"a", "a-1", "b"}
    toc = _reference.render_toc("## A\n```sh\n## not a heading\n```\n### A\n")
    assert "- [A](#a)" in toc and "  - [A](#a-1)" in toc and "not a heading" not in toc


def test_a_stale_generated_part_is_rewritten_once(tmp_path):
    for name in ("components.md", "layout.md"):
        _page(tmp_path, (DOCS / name).read_text(encoding="utf-8"), name)
    (tmp_path / _reference.PACKAGE).symlink_to(CHECKOUT / _reference.PACKAGE)
    page = tmp_path / "docs" / "components.md"
    fresh = page.read_text(encoding="utf-8")
    page.write_text(fresh.replace("| `image_uri` | String | required |",
                                  "| `image_uri` | String | `\"stale\"` |"), encoding="utf-8")
    comps = discover_components()
    assert _reference.update_docs(tmp_path, comps, plan=False) == [page]
    assert page.read_text(encoding="utf-8") == fresh
    assert _reference.update_docs(tmp_path, comps, plan=False) == []
    with pytest.raises(ValueError, match="no markers"):
        _reference.replace_section("# no markers here\n", "x")


def test_a_module_without_a_docstring_stops_the_layout(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text('"""A package."""\n')
    (tmp_path / "pkg" / "bare.py").write_text("x = 1\n")
    with pytest.raises(ValueError, match="bare.py has no module docstring"):
        _reference.render_layout(tmp_path)
    (tmp_path / "pkg" / "bare.py").write_text('"""Says what it is.\n\nMore."""\n')
    assert "| [`pkg/bare.py`](../kfp_sagemaker_blackwell/pkg/bare.py) | Says what it is. |" in \
        _reference.render_layout(tmp_path)


def test_the_worked_example_is_its_commands_output_and_refuses_aws():
    text = (DOCS / "planning.md").read_text(encoding="utf-8")
    argv = _reference.plan_command(text)
    assert argv[:2] == ["--model-preset", "8b"]
    assert "| 1 |" in _reference.render_plan_example(argv)
    with pytest.raises(ValueError, match="--region"):
        _reference.render_plan_example([*argv, "--region", "us-west-2"])
    with pytest.raises(ValueError, match="must be one"):
        _reference.plan_command("```sh\nls\n```\n" + _reference.PLAN_BEGIN)
    assert _reference.comparable("searched in 0.3 s.") == _reference.comparable(
        "searched in 12.0 s.")


def test_component_reference_lists_every_input_with_type_and_default():
    section = _reference.render(discover_components())
    for name, comp in discover_components().items():
        assert f"### `{name}`" in section
        for key in comp.component_spec.inputs:
            assert f"| `{key}` |" in section, (name, key)
    assert '| `instance_type` | String | `"ml.p6-b200.48xlarge"` |' in section
    assert "| `image_uri` | String | required |" in section
    assert "| `series` | list of Dataset artifacts | required |" in section


def test_reference_cells_escape_what_markdown_would_eat():
    cell = _reference._text("to /opt/ml/input/data/<name>, the\n``<x>|y`` tags kfp:* a|b")
    assert cell == "to /opt/ml/input/data/&lt;name&gt;, the `<x>\\|y` tags kfp:\\* a\\|b"


def test_compile_docs_refuses_outside_a_checkout(tmp_path, monkeypatch, capsys):
    from kfp_sagemaker_blackwell.pipelines import compile as compile_module

    monkeypatch.setattr(compile_module, "CHECKOUT", tmp_path)
    assert compile_module.main(["--docs"]) == 2
    assert "--docs: " in capsys.readouterr().err
