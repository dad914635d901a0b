"""compiled/ must equal a fresh compile (modulo the SDK version line) and say its image."""

import subprocess
import sys

import yaml

from kfp_sagemaker_blackwell.common.component import components_image
from kfp_sagemaker_blackwell.common.shipped import CHECKOUT
from kfp_sagemaker_blackwell.pipelines.compile import COMPILED, compile_all, compiled_image


def _normalise(text: str) -> list[str]:
    return [line for line in text.splitlines() if "sdkVersion:" not in line]


def _executor_images(path) -> set[str]:
    doc = yaml.safe_load(path.read_text())
    return {e["container"]["image"] for e in doc["deploymentSpec"]["executors"].values()}


def test_compiled_directory_is_fresh(tmp_path):
    written = compile_all(tmp_path, verbose=False)
    fresh = {p.relative_to(tmp_path) for p in written}
    checked_in = {p.relative_to(COMPILED) for p in COMPILED.rglob("*.yaml")}
    assert checked_in == fresh, (
        "compiled/ has stale or missing files; run `make compile` "
        f"(missing: {sorted(map(str, fresh - checked_in))}, "
        f"extra: {sorted(map(str, checked_in - fresh))})"
    )
    stale = [
        str(rel)
        for rel in sorted(fresh)
        if _normalise((tmp_path / rel).read_text()) != _normalise((COMPILED / rel).read_text())
    ]
    assert not stale, f"stale compiled files {stale}; run `make compile`"


def test_every_compiled_file_names_the_image_its_steps_run_in():
    files = sorted(COMPILED.rglob("*.yaml"))
    assert len(files) >= 9
    for path in files:
        image = compiled_image(path)
        assert image == components_image(), path
        assert _executor_images(path) == {image}, path
        assert "NOT a published image" in path.read_text().split("\n", 2)[1]


def test_compiling_for_another_image_changes_only_the_image(tmp_path):
    mine = "123456789012.dkr.ecr.us-west-2.amazonaws.com/team/components@sha256:" + "0f" * 32
    out = subprocess.run([sys.executable, "-m", "kfp_sagemaker_blackwell.pipelines.compile", "--output-dir",
                          str(tmp_path), "--components-image", mine], cwd=CHECKOUT,
                         capture_output=True, text=True, check=True).stdout
    assert f"components image: {mine}" in out
    for path in sorted(COMPILED.rglob("*.yaml")):
        theirs = tmp_path / path.relative_to(COMPILED)
        assert compiled_image(theirs) == mine and _executor_images(theirs) == {mine}
        ours = _normalise(path.read_text())[2:]
        assert _normalise(theirs.read_text().replace(mine, components_image()))[2:] == ours
    bad = subprocess.run([sys.executable, "-m", "kfp_sagemaker_blackwell.pipelines.compile", "--output-dir",
                          str(tmp_path), "--components-image", "not an image"], cwd=CHECKOUT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "not an image reference" in bad.stderr


def test_normalise_ignores_only_the_sdk_version_line():
    a = "sdkVersion: kfp-2.17.3\nx: 1\n"
    assert _normalise(a) == _normalise(a.replace("2.17.3", "2.18.0"))
    assert _normalise(a) != _normalise(a.replace("x: 1", "x: 2"))
