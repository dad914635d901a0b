"""Both HTML reports as a reader sees them: rendered by a headless Chromium (issue 29.6).

Each report is written from real parse_logs series, a copy of it gets a probe script
that, once the page has loaded, measures the rendered layout (the run context's place,
each figure's caption, that every image decoded, that no two blocks overlap) and writes
its findings into the DOM, which ``chromium --headless --dump-dom`` prints. The report
itself carries no script (test_compare_convergence checks that); only the copy does.

Chromium is not part of the default test environment: where ``chromium`` is missing the
tests are skipped with the install line (Debian: ``apt-get install -y chromium``).

The same Chromium also draws each report (the page itself, no probe) to a PNG small enough to
commit: with ``DOCS_IMAGES`` set to a folder (``make docs`` sets ``docs/images``) the pictures
land there, under the names the docs show; otherwise in the test's scratch folder, checked the
same way.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kfp_sagemaker_blackwell.catalog import logformat as lf
from kfp_sagemaker_blackwell.catalog.spec import PRESETS
from kfp_sagemaker_blackwell.common import cli
from kfp_sagemaker_blackwell.components.compare_convergence.compare import Settings
from kfp_sagemaker_blackwell.components.compare_convergence.component import compare_convergence
from kfp_sagemaker_blackwell.components.compare_convergence.launcher import compare_files
from kfp_sagemaker_blackwell.components.compare_convergence.launcher import (
    write_outputs as write_comparison,
)
from kfp_sagemaker_blackwell.components.parse_logs.parser import parse_bytes
from kfp_sagemaker_blackwell.components.parse_logs.report import write_outputs as write_series
from kfp_sagemaker_blackwell.components.rank_throughput.launcher import html_report as ranking_html
from kfp_sagemaker_blackwell.components.rank_throughput.launcher import load, rank

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="needs a headless Chromium to render the reports: "
    "apt-get install -y chromium (Debian), then run this file again")

CONTEXT = {"pipeline": "precision-sweep", "run_id": "run-7f3a", "instance_type":
           "ml.p6-b200.48xlarge", "instance_count": 1, "region": "us-west-2",
           "model_preset": "small"}

# Runs after load: what a reader sees, measured in the rendered page.
PROBE = """<script>
window.addEventListener('load', () => {
  const blocks = [...document.body.children].filter(e => e.tagName !== 'SCRIPT')
    .map(e => ({tag: e.tagName, cls: e.className, r: e.getBoundingClientRect()}));
  const overlaps = [];
  for (let i = 0; i < blocks.length; i++) for (let j = i + 1; j < blocks.length; j++) {
    const a = blocks[i].r, b = blocks[j].r;
    if (a.height && b.height && a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5 &&
        a.left < b.right - 0.5 && b.left < a.right - 0.5)
      overlaps.push([blocks[i].tag + '.' + blocks[i].cls, blocks[j].tag + '.' + blocks[j].cls]);
  }
  const figures = [...document.querySelectorAll('figure')].map(f => ({
    title: f.querySelector('h2').innerText,
    caption: f.querySelector('figcaption').innerText,
    width: f.querySelector('img').naturalWidth,
    shown: f.querySelector('img').getBoundingClientRect().width}));
  const ctx = document.querySelector('table.run-context');
  const out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = JSON.stringify({
    text: document.body.innerText, overlaps, figures,
    contextTop: ctx ? ctx.getBoundingClientRect().top : null,
    firstFigureTop: figures.length ?
      document.querySelector('figure').getBoundingClientRect().top : null,
    pageWidth: document.documentElement.scrollWidth,
    pageHeight: document.documentElement.scrollHeight,
    styled: getComputedStyle(document.body).fontFamily});
  document.body.appendChild(out);
});
</script>"""


def settings(**given) -> Settings:
    """The checked settings for these parameters, the component's defaults for the rest."""
    return Settings.from_parameters(cli.declared(compare_convergence, **given))


def rendered(tmp_path, page: str) -> dict:
    """The probe's findings about ``page`` as Chromium rendered it."""
    path = tmp_path / "probed.html"
    path.write_text(page.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    profile = tmp_path / "chromium-profile"
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={profile}", "--window-size=1280,1600",
         "--virtual-time-budget=5000", "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=120)
    m = re.search(r"<pre id=\"probe\">(.*?)</pre>", proc.stdout, re.S)
    assert m, f"Chromium printed no probe result (rc {proc.returncode}): {proc.stderr[-2000:]}"
    import html

    return json.loads(html.unescape(m.group(1)))


PICTURE_WIDTH = 1000  # pixels: readable on GitHub's page width, small enough to commit
PICTURE_MAX_BYTES = 300_000


def picture(tmp_path, page: str, height: int, name: str) -> Path:
    """``page`` drawn by Chromium at 1280 px wide and its full ``height``, scaled to
    ``PICTURE_WIDTH`` and reduced to a 128-colour palette: the PNG the docs show."""
    from PIL import Image

    folder = Path(os.environ.get("DOCS_IMAGES") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    path, raw = tmp_path / "page.html", tmp_path / f"raw-{name}"
    path.write_text(page, encoding="utf-8")
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'chromium-shot'}", "--hide-scrollbars",
         f"--window-size=1280,{height}", "--virtual-time-budget=5000",
         f"--screenshot={raw}", path.as_uri()], capture_output=True, text=True, timeout=120)
    assert raw.exists(), f"Chromium drew no picture (rc {proc.returncode}): {proc.stderr[-2000:]}"
    with Image.open(raw) as shot:
        assert shot.size == (1280, height), shot.size
        small = shot.convert("RGB").resize(
            (PICTURE_WIDTH, round(height * PICTURE_WIDTH / 1280)), Image.LANCZOS)
    out = folder / name
    small.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(out, optimize=True)
    assert out.stat().st_size < PICTURE_MAX_BYTES, (out, out.stat().st_size)
    return out


def _series(tmp_path, precision, *, batch=8, ac=False, offset=0.0, tps=1000.0,
            run=None) -> str:
    config = {"seed": 1, "batch_size": batch, "seq_length": 128, "grad_accum_steps": 1,
              "max_steps": 60, "activation_checkpointing": ac,
              "model": PRESETS["small"].to_dict()}
    lines = [lf.format_json("config", config),
             lf.format_recipe(lf.RecipeRecord(precision, "x", "torch", True)),
             lf.format_json("world", {"world_size": 1})]
    for s in range(1, 61):
        loss = 1.5 + 4 * math.exp(-s / 15) + offset
        lines.append(lf.format_step(lf.StepRecord(s, loss, 1e-3, 1.0, tps, tps, 1.0,
                                                  float("nan"), float("nan"), float("nan"),
                                                  precision, True)))
    lines.append(lf.format_json("summary", {"status": "completed", "steps": 60}))
    name = run or f"{precision}-b{batch}-{'ac' if ac else 'noac'}"
    path = tmp_path / f"{name}.csv"
    write_series(parse_bytes(("\n".join(lines) + "\n").encode()), requested_precision=precision,
                 run=name, series_path=path)
    return str(path)


def _assert_stands_alone(seen: dict, *, expect_text: list[str]) -> None:
    text = seen["text"]
    for wanted in expect_text:
        assert wanted in text, f"{wanted!r} not on the rendered page"
    # the run context is on top: above the first figure, its rows before everything else
    assert seen["contextTop"] is not None and seen["contextTop"] < seen["firstFigureTop"]
    assert text.index("report written") < text.index("Best" if "Best" in text else "Verdicts")
    for fig in seen["figures"]:
        assert fig["caption"].startswith(("Measured", "Predicted")), fig
        assert fig["width"] > 300 and 300 < fig["shown"] <= 1100, fig  # decoded, fits the page
    assert seen["overlaps"] == [], "blocks drawn over each other"
    assert seen["pageWidth"] <= 1280, "the page scrolls sideways"
    assert "system-ui" in seen["styled"]  # the shared style applied


def test_precision_sweep_report_stands_alone_in_a_browser(tmp_path):
    paths = [_series(tmp_path, "bf16", run="sweep-bf16"),
             _series(tmp_path, "fp8", offset=0.002, run="sweep-fp8")]
    cmp = compare_files(paths, settings())
    write_comparison(cmp, html_path=tmp_path / "report.html", context=CONTEXT)
    seen = rendered(tmp_path, (tmp_path / "report.html").read_text(encoding="utf-8"))
    _assert_stands_alone(seen, expect_text=[
        "precision-sweep", "run-7f3a", "ml.p6-b200.48xlarge", "us-west-2", "small",
        "sweep-bf16, sweep-fp8", "sequence length\t128", "steps\t60"])
    titles = [f["title"] for f in seen["figures"]]
    assert titles == ["Loss curves", "Difference to the baseline", "Throughput"]
    speed = seen["figures"][2]["caption"]
    assert speed.startswith("Predicted for B200 by the throughput model")  # emulated runs
    picture(tmp_path, (tmp_path / "report.html").read_text(encoding="utf-8"),
            seen["pageHeight"], "precision_sweep_report.png")


def test_batch_tuning_report_stands_alone_in_a_browser(tmp_path):
    paths = [_series(tmp_path, "fp8", batch=b, ac=ac, tps=100.0 * b + (50 if ac else 0))
             for b in (1, 2, 4, 8) for ac in (False, True)]
    plan = [{"precision": "fp8", "batch_size": b, "activation_checkpointing": ac,
             "predicted_tokens_per_s_per_gpu": 1000.0 * b + ac} for b in (1, 2, 4, 8)
            for ac in (False, True)]
    context = {**CONTEXT, "pipeline": "batch-tuning"}
    page = ranking_html(rank(load(paths, plan)), context)
    seen = rendered(tmp_path, page)
    _assert_stands_alone(seen, expect_text=[
        "batch-tuning", "run-7f3a", "ml.p6-b200.48xlarge", "1, 2, 4, 8",
        "ranks this machine, not the target GPU",
        "predicted for ml.p6-b200.48xlarge by the plan", "No memory chart"])
    assert [f["title"] for f in seen["figures"]] == ["Throughput"]  # no empty memory chart
    assert "n/a" not in seen["text"]
    assert "8,001" in seen["text"]  # the plan's prediction for batch 8 with checkpointing
    picture(tmp_path, page, seen["pageHeight"], "batch_tuning_report.png")
