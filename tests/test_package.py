"""The built wheel, installed into a fresh virtual environment, works outside the checkout.

Offline and fast: the wheel is built without build isolation, installed with
``--no-deps`` into a venv without pip, and the dependencies come from this
environment's site-packages (a ``.pth`` line, which adds the directory only: this
checkout's editable install is not picked up). Every command runs from an empty
directory, so only the installed package can answer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python of a fresh venv holding the installed wheel, the wheel's path)."""
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(tmp / "dist"), str(ROOT)], check=True,
                   capture_output=True, cwd=tmp)
    (wheel,) = (tmp / "dist").glob("*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                              "'purelib'))"], check=True, capture_output=True,
                             text=True).stdout.strip()
    (Path(purelib) / "_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python, wheel, tmp


def _run(python: Path, cwd: Path, *args: str, env: dict[str, str] | None = None,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    base = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-west-2"}
    out = subprocess.run([str(python), *args], cwd=cwd, env={**base, **(env or {})},
                         capture_output=True, text=True)
    if check:
        assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_the_wheel_ships_what_installed_code_reads(installed):
    _, wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    data = "kfp_sagemaker_blackwell-0.1.0.data/data/share/kfp-sagemaker-blackwell/"
    for path in ("images/trainer/Dockerfile", "images/components/Dockerfile",
                 "kfp_sagemaker_blackwell/trainer/train.sh", "kfp_sagemaker_blackwell/trainer/train.py",
                 "kfp_sagemaker_blackwell/catalog/flags.py", "kfp_sagemaker_blackwell/__init__.py",
                 "compiled/precision_sweep.yaml", "compiled/components/cleanup.yaml",
                 "LICENSE", "CHANGELOG.md"):
        assert data + path in names, path
    for package in ("catalog", "components", "pipelines", "trainer"):
        assert f"kfp_sagemaker_blackwell/{package}/py.typed" in names
    assert "kfp_sagemaker_blackwell/iam/pod-policy.json" in names  # beside its evaluator
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE")
               for n in names)


def test_the_installed_package_runs_outside_the_checkout(installed, tmp_path):
    python, _, _ = installed
    where = _run(python, tmp_path, "-c", "import kfp_sagemaker_blackwell.components; print(kfp_sagemaker_blackwell.components.__file__)")
    assert str(ROOT) not in where.stdout and "venv" in where.stdout

    estimate = _run(python, tmp_path, "-m", "kfp_sagemaker_blackwell.components.memory_estimate", "--preset", "tiny",
                    "--gpu", "H100", "--world-size", "1", "--batch-size", "1", "--seq-length",
                    "32", "--precision", "bf16", "--json")
    assert json.loads(estimate.stdout)

    policy = _run(python, tmp_path, "-c", "from kfp_sagemaker_blackwell.iam import policy; "
                  "print(len(policy.pod_policy(bucket='b')['Statement']))")
    assert int(policy.stdout) > 5

    tag_args = ("-m", "kfp_sagemaker_blackwell.components.build_image", "--run-id", "x", "--print-tag",
                "--base-image", "example.com/base:1")
    tag = json.loads(_run(python, tmp_path, *tag_args).stdout)
    checkout = json.loads(subprocess.run([sys.executable, *tag_args], cwd=ROOT,
                                         capture_output=True, text=True, check=True).stdout)
    assert tag["tag"] == checkout["tag"]  # the same build context as the checkout's


def test_the_installed_cleanup_dry_runs_against_the_local_backend(installed, tmp_path):
    from kfp_sagemaker_blackwell.local_backend import LocalBackend

    python, _, _ = installed
    with LocalBackend() as backend:
        out = _run(python, tmp_path, "-m", "kfp_sagemaker_blackwell.components.cleanup", "--run-id", "run-1",
                   "--region", backend.region, "--dry-run", env=backend.env())
    assert "Cleanup plan (dry run)" in out.stdout


def test_the_wheel_adds_one_import_package(installed):
    _, wheel, _ = installed
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith((".dist-info", ".data"))} == {
        "kfp_sagemaker_blackwell"}


def test_installed_outputs_go_to_the_working_directory(installed, tmp_path):
    """Installed, compiling writes ./compiled (not site-packages), and the shipped component
    YAML is found by name."""
    python, _, _ = installed
    _run(python, tmp_path, "-m", "kfp_sagemaker_blackwell.pipelines.precision_sweep",
         "--compile")
    assert (tmp_path / "compiled" / "precision_sweep.yaml").is_file()
    found = _run(python, tmp_path, "-c", "import kfp_sagemaker_blackwell as k; "
                 "print(k.component_yaml('sagemaker_training'))").stdout.strip()
    assert found.endswith("compiled/components/sagemaker_training.yaml") and Path(found).is_file()
    assert str(ROOT) not in found
    missing = _run(python, tmp_path, "-c", "import kfp_sagemaker_blackwell as k; "
                   "k.component_yaml('sagemaker_trainin')", check=False)
    assert missing.returncode == 1 and "sagemaker_training" in missing.stderr
