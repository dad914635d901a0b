"""Issue 28.4: labels, job names, failure reasons and parameters reach the Markdown the
KFP UI renders (with raw HTML on) and the HTML reports as text, never as markup, and a
``|`` or a line break in them does not break the table they sit in."""

import json
import math
from html.parser import HTMLParser

import pytest

from kfp_sagemaker_blackwell.catalog import logformat as lf
from kfp_sagemaker_blackwell.common import cli
from kfp_sagemaker_blackwell.common import markdown as md
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.components.compare_convergence.compare import Settings
from kfp_sagemaker_blackwell.components.compare_convergence.component import compare_convergence
from kfp_sagemaker_blackwell.components.compare_convergence.launcher import compare_files
from kfp_sagemaker_blackwell.components.compare_convergence.report import (
    MARKDOWN_COLUMNS,
    html_report,
    markdown,
)
from kfp_sagemaker_blackwell.components.parse_logs.parser import parse_bytes
from kfp_sagemaker_blackwell.components.parse_logs.report import write_outputs

LABEL = "<img src=x onerror=alert(1)>|x\ny"
REASON = "<script>alert(2)</script> | **bold** [link](javascript:alert(3)) `code`"
# What a hostile value may never put in a rendered page.
FORBIDDEN_TAGS = {"img", "script", "a", "iframe", "svg", "style", "b"}
# The HTML reports' own markup has <b> and <style>; a label may add none of these.
FORBIDDEN_IN_HTML = {"img", "script", "a", "iframe", "svg"}


class _Tags(HTMLParser):
    """Tags, attributes and table cells of an HTML page."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def settings(**given) -> Settings:
    """The checked settings for these parameters, the component's defaults for the rest."""
    return Settings.from_parameters(cli.declared(compare_convergence, **given))


def _render(markdown_text: str) -> _Tags:
    """The Markdown as a CommonMark renderer with raw HTML on shows it (the KFP UI's
    setting), tables on."""
    markdown_it = pytest.importorskip("markdown_it")
    page = _Tags()
    page.feed(markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table")
              .render(markdown_text))
    return page


def _table_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("|")]


def _cells(line: str) -> int:
    """Cells of a Markdown table line (``\\|`` is a pipe inside a cell)."""
    return len(line.replace("\\\\", "").replace("\\|", "").strip().strip("|").split("|"))


def _assert_text_not_markup(text: str, rendered: _Tags, *literals: str,
                            forbidden: set[str] = FORBIDDEN_TAGS) -> None:
    assert "<img" not in text and "<script" not in text, text
    assert not forbidden & {tag for tag, _ in rendered.tags}, rendered.tags
    assert not [a for _, attrs in rendered.tags for a in attrs if a.startswith("on")]
    shown = "".join(rendered.text)
    for literal in literals:
        assert literal in shown, (literal, shown)


def test_inline_escapes_html_markup_pipes_and_line_breaks():
    assert md.inline(LABEL) == "&lt;img src=x onerror=alert(1)&gt;\\|x y"
    assert md.inline("a_b*c`d[e](f)~g\\h") == "a\\_b\\*c\\`d\\[e\\](f)\\~g\\\\h"
    assert md.inline("&lt;") == "&amp;lt;"  # an entity in a label stays text
    assert md.line("# title") == "\\# title" and md.line("1. item") == "1\\. item"
    assert md.line("- item") == "\\- item" and md.inline("fp8-current") == "fp8-current"
    assert md.inline("x" * 10, limit=5) == "xxxx…"
    page = _render(f"| a |\n|---|\n| {md.inline(LABEL)} |\n\n{md.line('# ' + REASON)}\n")
    _assert_text_not_markup("", page, "<img src=x onerror=alert(1)>|x y", "# <script>")
    assert page.rows == [["a"], ["<img src=x onerror=alert(1)>|x y"]]


def _run(tmp_path, precision, *, run, steps=60, oom=""):
    lines = [lf.format_json("config", {"seed": 1, "batch_size": 2, "seq_length": 8}),
             lf.format_recipe(lf.RecipeRecord(precision, "x", "torch", True))]
    for s in range(1, steps + 1):
        loss = 2.0 + 2.0 * math.exp(-s / 20)
        lines.append(lf.format_step(lf.StepRecord(s, loss, 1e-3, 1.0, 100.0, 100.0, 1.0, 0.1,
                                                  1.0, 2.0, precision, True)))
    if oom:
        lines.append(lf.format_json("summary", {"status": "failed", "failure_reason": oom}))
    else:
        lines.append(lf.format_json("summary", {"status": "completed", "steps": steps}))
    path = tmp_path / f"{precision}.csv"
    write_outputs(parse_bytes(("\n".join(lines) + "\n").encode()), requested_precision=precision,
                  run=run, series_path=path)
    return path


def test_compare_convergence_summary_shows_labels_and_reasons_as_text(tmp_path):
    paths = [_run(tmp_path, "bf16", run="base"),
             _run(tmp_path, "fp8", run=LABEL, steps=0, oom=REASON)]
    cmp = compare_files(paths, settings())
    text = markdown(cmp)
    table = _table_lines(text)
    assert len(table) == 2 + len(cmp.results)  # header, delimiter, one line per precision
    assert {_cells(ln) for ln in table} == {len(MARKDOWN_COLUMNS)}, table
    page = _render(text)
    _assert_text_not_markup(text, page, "run <img src=x onerror=alert(1)>|x y did not train",
                            "<script>alert(2)</script> | **bold** [link]")
    assert [len(r) for r in page.rows] == [len(MARKDOWN_COLUMNS)] * (1 + len(cmp.results))
    _assert_text_not_markup("", _tags(html_report(cmp, figs={})),
                            "<img src=x onerror=alert(1)>", "<script>alert(2)</script>",
                            forbidden=FORBIDDEN_IN_HTML)


def test_a_hostile_file_name_is_text_in_the_summary_and_a_hostile_baseline_is_refused(
        tmp_path):
    base = _run(tmp_path, "bf16", run="base")
    hostile = tmp_path / "<b onmouseover=alert(1)>bf16<b>|x.csv"
    hostile.write_text("# heading\n")
    cmp = compare_files([base, hostile], settings())
    text = markdown(cmp)
    page = _render(text)
    _assert_text_not_markup(text, page, "<b onmouseover=alert(1)>bf16<b>|x.csv")
    assert [t for t, _ in page.tags].count("h2") == 1  # the title only, no injected heading
    _assert_text_not_markup("", _tags(html_report(cmp, figs={})), "<b onmouseover",
                            forbidden=FORBIDDEN_IN_HTML)
    with pytest.raises(UserError, match="baseline: '<b>bf16</b>' is not a precision"):
        compare_files([base], settings(baseline="<b>bf16</b>"))


def _tags(html: str) -> _Tags:
    page = _Tags()
    page.feed(html)
    return page


def test_rank_throughput_summary_and_page_show_run_labels_as_text(tmp_path):
    from kfp_sagemaker_blackwell.common.step_series import COLUMN_NAMES, SERIES_SCHEMA
    from kfp_sagemaker_blackwell.components.rank_throughput.launcher import html_report as rank_html
    from kfp_sagemaker_blackwell.components.rank_throughput.launcher import load, rank
    from kfp_sagemaker_blackwell.components.rank_throughput.launcher import (
        markdown as rank_markdown,
    )

    paths = []
    for run, status, reason, tps in ((LABEL, "oom", REASON, None), ("ok|run", "completed", "",
                                                                   900.0)):
        meta = {"run": run, "precision": "fp8", "status": status, "failure_reason": reason,
                "emulated": False, "training": {"batch_size": 4},
                "metrics": {"mean_tokens_per_s_per_gpu": tps, "peak_memory_gib": 3.0}}
        path = tmp_path / f"{len(paths)}.csv"
        path.write_text(f"# {SERIES_SCHEMA} {json.dumps(meta)}\n" + ",".join(COLUMN_NAMES)
                        + "\n")
        paths.append(str(path))
    ranking = rank(load(paths))
    text = rank_markdown(ranking)
    table = _table_lines(text)
    # no prediction exists for these runs: no prediction columns (issue 29.6)
    assert len(table) == 4 and {_cells(ln) for ln in table} == {7}, table
    page = _render(text)
    _assert_text_not_markup(text, page, "<img src=x onerror=alert(1)>|x y", "ok|run",
                            "oom: <script>alert(2)</script>")
    assert [len(r) for r in page.rows] == [7, 7, 7]
    html = _tags(rank_html(ranking))
    charts = [a for t, a in html.tags if t == "img"]  # the charts only: throughput, memory
    assert len(charts) == 2 and all(set(chart) == {"alt", "src"} and chart["src"].startswith(
        "data:image/png;base64,") for chart in charts)
    _assert_text_not_markup("", html, forbidden=FORBIDDEN_IN_HTML - {"img"})
    assert "<img src=x onerror=alert(1)>|x\ny" in "".join(html.text)


def test_parse_logs_summary_shows_the_run_label_and_the_log_as_text(tmp_path):
    lines = [lf.format_json("event", {"kind": "error", "message": REASON}),
             lf.format_json("summary", {"status": "failed", "failure_reason": REASON})]
    out = write_outputs(parse_bytes(("\n".join(lines) + "\n").encode()),
                        requested_precision="fp8", run=LABEL, markdown_path=tmp_path / "s.md")
    assert out.report["run"] == LABEL
    text = (tmp_path / "s.md").read_text()
    page = _render(text)
    _assert_text_not_markup(text, page, "<img src=x onerror=alert(1)>|x y",
                            "<script>alert(2)</script> | **bold**")
    assert text.splitlines()[0].startswith("## &lt;img")  # one heading line, label included
