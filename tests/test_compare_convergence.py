"""compare_convergence: verdicts on constructed curves, bad input, the reports (no KFP)."""

import base64
import json
import math
import random
import shutil
import subprocess
import sys
from html.parser import HTMLParser

import pytest

from components.common.errors import UserError
from components.compare_convergence.compare import Settings, compare
from components.compare_convergence.report import html_report, markdown, metrics, verdicts_json
from components.compare_convergence.run import compare_files
from components.parse_logs.parser import parse_bytes
from components.parse_logs.report import write_outputs
from components.parse_logs.series import read_series
from trainer import logformat as lf

FLOOR = 1.149


def curve(steps=200, seed=1, offset=0.0, noise=0.01, diverge_at=None, nan_at=None):
    rng = random.Random(seed)  # same seed, same noise: what pairing relies on
    out = []
    for s in range(1, steps + 1):
        loss = FLOOR + 0.3 + 4 * math.exp(-s / 40) + rng.gauss(0, noise) + offset
        if diverge_at and s > diverge_at:
            loss += 0.03 * (s - diverge_at)
        if nan_at and s >= nan_at:
            loss = math.nan
        out.append(loss)
    return out


def write_run(tmp_path, precision, losses, *, seed=1, emulated=False, tps=1000.0, mem=40.0,
              status="completed", extra_lines=(), steps=None):
    lines = [lf.format_json("config", {"seed": seed, "batch_size": 8, "seq_length": 64,
                                       "grad_accum_steps": 1}),
             lf.format_recipe(lf.RecipeRecord(precision, "x", "torch" if emulated else "te",
                                              emulated)),
             lf.format_json("world", {"world_size": 1}),
             lf.format_json("data", {"entropy_floor": FLOOR})]
    steps = steps or list(range(1, len(losses) + 1))
    for s, loss in zip(steps, losses, strict=True):
        lines.append(lf.format_step(lf.StepRecord(s, loss, 1e-3, 1.0, tps, tps, 1.0, 0.3, mem,
                                                  mem + 5, precision, emulated)))
    lines += list(extra_lines)
    if status:
        lines.append(lf.format_json("summary", {"status": status, "steps": len(losses)}))
    parsed = parse_bytes(("\n".join(lines) + "\n").encode())
    path = tmp_path / f"{precision}-seed{seed}.csv"
    write_outputs(parsed, requested_precision=precision, run=f"{precision}-{seed}",
                  series_path=path)
    return path


def run_compare(paths, **settings):
    return compare_files(paths, Settings(**settings))


def test_identical_curves_pass_and_the_faster_precision_is_recommended(tmp_path):
    paths = [write_run(tmp_path, "bf16", curve(), tps=1000.0),
             write_run(tmp_path, "fp8", curve(), tps=1600.0)]
    cmp = run_compare(paths)
    fp8 = cmp.results["fp8"]
    assert fp8.verdict == "pass" and fp8.final_loss_diff == pytest.approx(0.0, abs=1e-12)
    assert fp8.speedup == pytest.approx(1.6) and fp8.speedup_source == "measured"
    assert cmp.recommended == "fp8" and cmp.passed and not cmp.partial
    assert fp8.gap_to_floor == pytest.approx(fp8.final_loss - FLOOR)
    assert fp8.memory_ratio == pytest.approx(1.0)


def test_a_small_offset_within_tolerance_passes_and_a_larger_one_fails(tmp_path):
    paths = [write_run(tmp_path, "bf16", curve()),
             write_run(tmp_path, "fp8", curve(offset=0.003), tps=1500.0),
             write_run(tmp_path, "nvfp4", curve(offset=0.06), tps=3000.0)]
    cmp = run_compare(paths)
    assert cmp.results["fp8"].verdict == "pass"
    assert cmp.results["fp8"].final_loss_diff == pytest.approx(0.003, abs=1e-9)
    nvfp4 = cmp.results["nvfp4"]
    assert nvfp4.verdict == "fail" and "above bf16" in nvfp4.reasons[0]
    assert nvfp4.final_loss_diff_rel == pytest.approx(0.06 / nvfp4.baseline_final_loss)
    assert cmp.recommended == "fp8"  # nvfp4 is faster but fails
    looser = run_compare(paths, loss_tolerance_rel=0.1)
    assert looser.results["nvfp4"].verdict == "pass" and looser.recommended == "nvfp4"


def test_a_divergent_curve_fails_as_diverged(tmp_path):
    paths = [write_run(tmp_path, "bf16", curve()),
             write_run(tmp_path, "fp16", curve(diverge_at=120))]
    res = run_compare(paths).results["fp16"]
    assert res.verdict == "fail" and res.diverged
    assert any("diverged" in r for r in res.reasons)
    assert 120 < res.worst_divergence_at <= 200


def test_nan_loss_fails_with_its_step(tmp_path):
    paths = [write_run(tmp_path, "bf16", curve()),
             write_run(tmp_path, "fp8", curve(nan_at=150), status="failed",
                       extra_lines=[lf.format_json("event", {"kind": "nan_loss",
                                                             "message": "non-finite loss"})])]
    res = run_compare(paths).results["fp8"]
    assert res.verdict == "fail" and res.nan
    assert any("step 150" in r for r in res.reasons)


def test_an_oom_run_without_steps_fails_with_the_reason(tmp_path):
    oom = ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB."]
    paths = [write_run(tmp_path, "bf16", curve()),
             write_run(tmp_path, "mxfp8", [], status="", extra_lines=oom)]
    cmp = run_compare(paths)
    res = cmp.results["mxfp8"]
    assert res.verdict == "fail" and "oom" in res.reasons[0] and "20.00 GiB" in res.reasons[0]
    assert cmp.recommended == "bf16" and cmp.passed


def test_seed_spread_counts_when_several_seeds_exist(tmp_path):
    paths = []
    for seed in (1, 2, 3):
        base = curve(seed=seed, offset=0.02 * seed)  # seeds land 0.02 apart
        paths.append(write_run(tmp_path, "bf16", base, seed=seed))
        paths.append(write_run(tmp_path, "fp8", [x + 0.025 for x in base], seed=seed))
    fp8 = run_compare(paths).results["fp8"]
    assert fp8.seed_spread == pytest.approx(0.02, rel=0.05)
    assert fp8.final_loss_diff == pytest.approx(0.025, abs=1e-9)
    # 1% of the baseline (~0.015) < the seed spread (0.02) < the difference (0.025)
    assert fp8.tolerance == pytest.approx(fp8.seed_spread)
    assert fp8.verdict == "fail" and "seed spread" in fp8.reasons[0]
    raw = run_compare(paths, seed_spread_factor=0.0).results["fp8"]
    assert raw.tolerance == pytest.approx(0.01 * raw.baseline_final_loss)
    assert run_compare(paths, seed_spread_factor=2.0).results["fp8"].verdict == "pass"


def test_runs_are_paired_by_seed_and_an_unpaired_seed_fails(tmp_path):
    paths = [write_run(tmp_path, "bf16", curve(seed=1), seed=1),
             write_run(tmp_path, "fp8", curve(seed=2), seed=2)]
    res = run_compare(paths).results["fp8"]
    assert res.verdict == "fail" and "same seed" in res.reasons[0]


def test_a_run_that_stopped_early_is_incomplete(tmp_path):
    paths = [write_run(tmp_path, "bf16", curve()),
             write_run(tmp_path, "fp8", curve()[:120], status="stopped")]
    res = run_compare(paths).results["fp8"]
    assert res.verdict == "fail" and "incomplete" in res.reasons[0]


def test_curves_logged_at_different_steps_are_aligned_by_interpolation(tmp_path):
    base = curve()
    every5 = [base[s - 1] for s in range(5, 201, 5)]
    paths = [write_run(tmp_path, "bf16", every5, steps=list(range(5, 201, 5))),
             write_run(tmp_path, "fp8", base)]
    res = run_compare(paths).results["fp8"]
    assert res.verdict == "pass" and abs(res.final_loss_diff) < 1e-9


def test_tokens_alignment_uses_the_tokens_column(tmp_path):
    paths = [write_run(tmp_path, "bf16", curve()), write_run(tmp_path, "fp8", curve())]
    res = run_compare(paths, align_by="tokens").results["fp8"]
    assert res.pairs[0].x_name == "tokens" and res.verdict == "pass"


def test_emulated_runs_use_the_target_gpus_expected_speedup(tmp_path):
    paths = [write_run(tmp_path, "bf16", curve(), emulated=True, tps=5000.0),
             write_run(tmp_path, "fp8", curve(offset=0.001), emulated=True, tps=900.0),
             write_run(tmp_path, "nvfp4", curve(offset=0.002), emulated=True, tps=300.0)]
    cmp = run_compare(paths)
    fp8, nvfp4 = cmp.results["fp8"], cmp.results["nvfp4"]
    assert fp8.speedup == pytest.approx(4500 / 2250) and fp8.speedup_source.startswith("expected")
    assert nvfp4.speedup == pytest.approx(9000 / 2250)
    assert cmp.recommended == "nvfp4"
    assert any("emulated" in n for n in cmp.notes)
    hopper = run_compare(paths, target_gpu="H200")
    assert hopper.results["nvfp4"].verdict == "fail"  # not runnable on Hopper
    assert hopper.recommended == "fp8"


def test_a_missing_baseline_gives_a_partial_report_without_recommendation(tmp_path):
    paths = [write_run(tmp_path, "fp8", curve()), write_run(tmp_path, "mxfp8", curve())]
    cmp = run_compare(paths)
    assert cmp.partial and not cmp.passed and cmp.recommended == ""
    assert "baseline precision bf16 is not among" in cmp.problems[0]
    assert all(r.verdict == "fail" for r in cmp.results.values())
    assert "PARTIAL REPORT" in markdown(cmp) and "PARTIAL REPORT" in html_report(cmp)


def test_a_failed_baseline_gives_a_partial_report(tmp_path):
    paths = [write_run(tmp_path, "bf16", curve(nan_at=10), status="failed"),
             write_run(tmp_path, "fp8", curve())]
    cmp = run_compare(paths)
    assert cmp.partial and cmp.recommended == "" and "baseline bf16 run failed" in cmp.problems[0]


def test_a_baseline_shorter_than_the_others_makes_the_report_partial(tmp_path):
    paths = [write_run(tmp_path, "bf16", curve()[:100]), write_run(tmp_path, "fp8", curve())]
    cmp = run_compare(paths)
    assert cmp.partial and "compared on the baseline's steps only" in cmp.problems[0]


def test_no_series_and_duplicate_runs_are_clear_errors(tmp_path):
    with pytest.raises(UserError, match="no series"):
        compare([])
    a = write_run(tmp_path, "bf16", curve())
    b = tmp_path / "copy.csv"
    b.write_text(a.read_text())
    with pytest.raises(UserError, match="two series for precision bf16"):
        run_compare([a, b])
    with pytest.raises(UserError, match="loss_tolerance_rel"):
        run_compare([a], loss_tolerance_rel=-1)


def test_an_unreadable_series_file_makes_the_report_partial(tmp_path):
    bad = tmp_path / "broken.csv"
    bad.write_text("this is not a series\n")
    paths = [write_run(tmp_path, "bf16", curve()), write_run(tmp_path, "fp8", curve()), bad]
    cmp = run_compare(paths)
    assert cmp.partial and "broken.csv" in cmp.problems[0] and cmp.recommended == ""
    with pytest.raises(UserError, match="broken.csv"):
        run_compare([bad])


class _Images(HTMLParser):
    def __init__(self):
        super().__init__()
        self.srcs = []
        self.text = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.srcs.append(dict(attrs).get("src", ""))

    def handle_data(self, data):
        self.text.append(data)


def _sweep(tmp_path):
    paths = []
    for seed in (1, 2):
        paths.append(write_run(tmp_path, "bf16", curve(seed=seed), seed=seed, emulated=True))
        paths.append(write_run(tmp_path, "fp8", curve(seed=seed, offset=0.002), seed=seed,
                               emulated=True))
        paths.append(write_run(tmp_path, "nvfp4", curve(seed=seed, offset=0.08), seed=seed,
                               emulated=True))
    return run_compare(paths)


def test_html_report_embeds_decodable_png_images_and_the_verdicts(tmp_path):
    cmp = _sweep(tmp_path)
    page = html_report(cmp)
    parsed = _Images()
    parsed.feed(page)
    assert len(parsed.srcs) == 4
    for src in parsed.srcs:
        assert src.startswith("data:image/png;base64,")
        png = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    text = " ".join(parsed.text)
    assert "Recommended precision: fp8 (emulated)" in text
    assert "nvfp4 (emulated)" in text and "FAIL" in text and "PASS" in text
    assert "expected" in text and "http" not in page  # nothing fetched when viewed offline


def test_markdown_metrics_and_json_verdicts_agree(tmp_path):
    cmp = _sweep(tmp_path)
    md = markdown(cmp)
    assert "**Recommended precision: fp8 (emulated)**" in md
    m = metrics(cmp)
    assert m["fp8_pass"] == 1.0 and m["nvfp4_pass"] == 0.0 and m["passed"] == 2.0
    assert m["recommended_speedup"] == 2.0 and all(math.isfinite(v) for v in m.values())
    doc = json.loads(verdicts_json(cmp))
    assert doc["recommended_precision"] == "fp8" and doc["passed"] is True
    rows = {r["precision"]: r for r in doc["precisions"]}
    assert rows["nvfp4"]["verdict"] == "fail" and rows["fp8"]["emulated"] is True


CHROMIUM = "/usr/bin/chromium"


@pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="needs /usr/bin/chromium")
def test_html_report_renders_its_images_in_headless_chromium(tmp_path):
    page = html_report(_sweep(tmp_path))
    # After load, write how many images decoded into the DOM, which --dump-dom prints.
    probe = ("<script>window.addEventListener('load',()=>{const ok=[...document.images]"
             ".filter(i=>i.complete&&i.naturalWidth>100).length;"
             "document.body.setAttribute('data-images-ok',String(ok));});</script>")
    path = tmp_path / "report.html"
    path.write_text(page.replace("</body>", probe + "</body>"))
    out = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000",
         "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert 'data-images-ok="4"' in out.stdout, out.stderr[-2000:]


def test_cli_writes_the_reports_and_exits_by_outcome(tmp_path):
    ok = [write_run(tmp_path, "bf16", curve()), write_run(tmp_path, "fp8", curve(), tps=2000.0)]
    cmd = [sys.executable, "-m", "components.compare_convergence"]
    out = subprocess.run(cmd + [str(p) for p in ok] + ["--html", str(tmp_path / "r.html"),
                                                       "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["recommended_precision"] == "fp8"
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    partial = subprocess.run(cmd + [str(ok[1])], capture_output=True, text=True)
    assert partial.returncode == 1 and "PARTIAL" in partial.stdout
    usage = subprocess.run(cmd + [str(ok[0]), str(ok[0])], capture_output=True, text=True)
    assert usage.returncode == 2 and "two series" in usage.stderr


def test_series_round_trip_keeps_what_compare_needs(tmp_path):
    path = write_run(tmp_path, "fp8", curve(), emulated=True, seed=9)
    s = read_series(path)
    assert s.precision == "fp8" and s.meta["emulated"] is True and s.meta["seed"] == 9
    assert s.meta["entropy_floor"] == FLOOR and s.meta["metrics"]["mean_tokens_per_s"] == 1000.0
