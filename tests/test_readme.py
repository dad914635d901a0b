"""The README and docs/ are true: their local shell commands run, their versions agree.

Every ```sh block in README.md and docs/*.md is preceded by a marker line:

- ``<!-- readme-test: local -->``: runs on this machine with no network; every command in it
  is run here (in a scratch directory beside links to the checkout), in order, and must exit 0,
  unless ``NOT_RUN`` below names it with the reason;
- ``<!-- readme-test: aws -->``: needs AWS credentials or a Kubeflow cluster; not run.

A ```sh block without a marker fails the test, so a new example cannot escape it; ```python
blocks take the same markers (tests/test_docs.py compiles every one and runs the local ones).
Links, anchors and the generated parts are tests/test_docs.py's. Nothing may
reach the network: AWS credentials are removed, the instance-metadata lookup and the Price List
API are off, and HTTP(S) proxies point at a closed loopback port.
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kfp_sagemaker_blackwell.common.component import DEFAULT_IMAGE_REPOSITORY
from kfp_sagemaker_blackwell.common.shipped import CHECKOUT
from kfp_sagemaker_blackwell.components import __version__
from kfp_sagemaker_blackwell.pipelines.compile import COMPILED, compiled_image

README = CHECKOUT / "README.md"
PAGES = [README, *sorted((CHECKOUT / "docs").glob("*.md"))]
MARKER_RE = re.compile(r"^<!-- readme-test: (local|aws) -->$")
ARTICLE_URL = ("https://aws.amazon.com/blogs/machine-learning/"
               "optimize-model-training-on-amazon-sagemaker-ai-with-nvidia-blackwell/")

# Commands of the local blocks (README.md or docs/) that are not run, each with its reason
# (exact text, comment cut).
NOT_RUN = {
    "make demo": "minutes of training (the whole local sweep); tests/test_pipelines.py runs the "
                 "pipelines on the local backend",
    "make test": "runs the whole test suite, this test included",
    "make install TORCH_INDEX=https://download.pytorch.org/whl/cpu":
        "downloads from the network; test_make_torch_index_adds_only_an_extra_index checks "
        "what it runs",
    "python pipelines/precision_sweep.py --compile":
        "writes compiled/precision_sweep.yaml in the checkout; the --output line runs the same "
        "compile and tests/test_compiled.py checks that file",
    "python pipelines/precision_sweep.py --run-local --precisions bf16,fp8 --max-steps 100":
        "minutes of training; tests/test_pipelines.py runs the sweep locally",
    "python pipelines/batch_tuning.py --run-local":
        "minutes of training; tests/test_batch_tuning_probe.py runs batch tuning locally",
    "python pipelines/plan_and_train.py --run-local":
        "minutes of training; tests/test_plan_training.py runs plan_and_train locally",
    "python -m kfp_sagemaker_blackwell.pipelines.compile":
        "rewrites compiled/ and docs/ in place; tests/test_compiled.py and "
        "tests/test_docs.py check what it would write",
    "python -m kfp_sagemaker_blackwell.trainer --model-preset small --precision fp8 --max-steps 200":
        "200 steps of the small model (minutes on 2 cores); the tiny trainer runs below and "
        "tests/test_trainer_training.py trains",
    "bash trainer/train.sh --model-preset 8b --precision mxfp8 --batch-size 4":
        "an 8B model in MXFP8: needs Blackwell GPUs (SageMaker's entry point)",
    "python -m kfp_sagemaker_blackwell.local_backend serve":
        "a server that runs until stopped; tests/test_local_backend_clients.py drives it",
    "export AWS_ENDPOINT_URL=http://127.0.0.1:<port> AWS_ACCESS_KEY_ID=LOCAL... "
    "AWS_SECRET_ACCESS_KEY=... AWS_REGION=us-west-2 ...":
        "an example of what serve prints, not a command",
}
# The README's placeholders, given example values (no AWS call is made with them).
PLACEHOLDERS = {
    "<ecr image>": "123456789012.dkr.ecr.us-west-2.amazonaws.com/kfp-sagemaker-blackwell/"
                   "trainer:0123456789ab",
    "<acct>": "123456789012",
    "<bucket>": "example-bucket",
}
# Input files the README's commands name as the user's own.
USER_FILES = {"corpus.txt": "The quick brown fox jumps over the lazy dog.\n" * 50}


def sh_blocks(text: str, fence: str = "```sh") -> list[tuple[str, str | None, list[str], int]]:
    """(heading, marker or None, the block's lines, line number) of every ``fence`` block."""
    blocks: list[tuple[str, str | None, list[str], int]] = []
    lines = text.splitlines()
    heading, i = "", 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#") and not line.startswith("#!"):
            heading = line.lstrip("#").strip()
        if line.startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            if line.strip() == fence:
                match = MARKER_RE.match(lines[i - 1]) if i else None
                blocks.append((heading, match.group(1) if match else None, lines[i + 1:end],
                               i + 1))
            i = end
        i += 1
    return blocks


def commands(block: list[str]) -> list[str]:
    """The block's commands: continuation lines joined, trailing comments cut."""
    out: list[str] = []
    pending = ""
    for line in block:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1].rstrip() + " "
            continue
        command = re.sub(r"\s+#\s.*$", "", pending + line).strip()
        pending = ""
        if command and not command.startswith("#"):
            out.append(" ".join(command.split()))
    return out


def page_name(page: Path) -> str:
    return page.relative_to(CHECKOUT).as_posix()


def local_blocks() -> list[tuple[str, list[str]]]:
    return [(f"{page_name(page)} line {line} ({heading})", commands(body))
            for page in PAGES
            for heading, marker, body, line in sh_blocks(page.read_text(encoding="utf-8"))
            if marker == "local"]


def offline_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "KFP_SAGEMAKER_")) and k not in ("PYTHONPATH",)}
    bin_dir = tmp / ".bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("python", "python3"):  # this interpreter (a venv's: exec, not a symlink)
        wrapper = bin_dir / name
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n', encoding="utf-8")
        wrapper.chmod(0o755)
    dead = "http://127.0.0.1:9"  # the discard port: nothing listens, a connection fails at once
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
        PYTHONPATH=str(CHECKOUT), HOME=str(tmp), HTTP_PROXY=dead, HTTPS_PROXY=dead,
        http_proxy=dead, https_proxy=dead, NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost", AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=str(tmp / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp / "no-aws-credentials"),
        KFP_SAGEMAKER_PRICE_LIST="off", KFP_SAGEMAKER_CACHE_DIR=str(tmp / ".cache"),
        MPLBACKEND="Agg", NO_COLOR="1",
        # torch's intra-op threads spin when the cores are shared (the suite runs on 2): one
        # thread each cuts a tiny trainer run's CPU time 5x (36 s -> 7 s) and changes no result
        OMP_NUM_THREADS="1")
    return env


def scratch_dir(tmp: Path) -> Path:
    """A directory where the checkout's top-level entries are links, so that relative paths
    (``pipelines/precision_sweep.py``, ``trainer/train.sh``) resolve while the files the
    commands write (``my_sweep.yaml``, ``fp8.csv``, ``data/``) land in the scratch directory."""
    work = tmp / "work"
    work.mkdir()
    for entry in CHECKOUT.iterdir():
        if entry.name not in (".git", ".venv", "runs", "data"):
            (work / entry.name).symlink_to(entry)
    for name, text in USER_FILES.items():
        (work / name).write_text(text, encoding="utf-8")
    return work


def test_every_sh_block_says_whether_it_runs_locally():
    unmarked, local = [], 0
    for page in PAGES:
        blocks = sh_blocks(page.read_text(encoding="utf-8"))
        unmarked += [f"{page_name(page)} line {line} under {heading!r}"
                     for heading, marker, _, line in blocks if marker is None]
        local += sum(marker == "local" for _, marker, _, _ in blocks)
    assert not unmarked, (
        f"```sh blocks without a marker: {unmarked}; put `<!-- readme-test: local -->` "
        "(run by tests/test_readme.py) or `<!-- readme-test: aws -->` (needs AWS) on the line "
        "before the fence")
    assert local >= 10
    assert len(PAGES) >= 10, [page_name(p) for p in PAGES]


def test_the_readme_shows_the_two_commands_and_runs_a_local_block():
    blocks = sh_blocks(README.read_text(encoding="utf-8"))
    assert ["make demo", "make test"] == commands(blocks[0][2]) and blocks[0][1] == "local"
    assert sum(marker == "local" for _, marker, _, _ in blocks) >= 2


def test_every_command_not_run_is_still_in_the_docs():
    shown = {command for _, cmds in local_blocks() for command in cmds}
    stale = sorted(set(NOT_RUN) - shown)
    assert not stale, f"NOT_RUN names commands README.md and docs/ no longer show: {stale}"


@pytest.mark.slow
@pytest.mark.parametrize("where,cmds", local_blocks(), ids=[w for w, _ in local_blocks()])
def test_readme_local_commands_run(where, cmds, tmp_path):
    env, work = offline_env(tmp_path), scratch_dir(tmp_path)
    ran = 0
    for command in cmds:
        if command in NOT_RUN:
            continue
        for placeholder, value in PLACEHOLDERS.items():
            command = command.replace(placeholder, value)
        assert not re.search(r"<[a-z][^>]*>", command), (
            f"{where}: `{command}` has a placeholder without an example value in PLACEHOLDERS")
        done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=work, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (
            f"{where}: `{command}` exited {done.returncode}:\n"
            f"{(done.stdout + done.stderr)[-3000:]}")
        ran += 1
    assert ran or all(c in NOT_RUN for c in cmds)


def test_the_article_is_named_and_linked_once():
    text = README.read_text(encoding="utf-8")
    assert text.count(ARTICLE_URL) == 1
    assert "Optimize model training on Amazon SageMaker AI with NVIDIA Blackwell" in text


def local_python_blocks() -> list[tuple[str, str]]:
    return [(f"{page_name(page)} line {line} ({heading})", "\n".join(body) + "\n")
            for page in PAGES
            for heading, marker, body, line in sh_blocks(page.read_text(encoding="utf-8"),
                                                         "```python")
            if marker == "local"]


def test_the_readme_runs_its_python_examples():
    assert sum(where.startswith("README.md") for where, _ in local_python_blocks()) >= 2


@pytest.mark.parametrize("where,source", local_python_blocks(),
                         ids=[w for w, _ in local_python_blocks()])
def test_local_python_blocks_run_as_written(where, source, tmp_path):
    env, work = offline_env(tmp_path), scratch_dir(tmp_path)
    script = tmp_path / "snippet.py"
    script.write_text(source, encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{where} exited {done.returncode}:\n{done.stderr[-3000:]}"


def test_compile_help_shows_its_whole_example_as_plain_text():
    done = subprocess.run([sys.executable, "-m", "kfp_sagemaker_blackwell.pipelines.compile", "--help"], cwd=CHECKOUT,
                          capture_output=True, text=True, check=True)
    assert "--codebuild-role-arn arn:aws:iam::<acct>:role/kfp-sagemaker-codebuild" in done.stdout
    assert "or, with an image you built yourself, --components-image" in done.stdout
    assert "``" not in done.stdout and "::" not in done.stdout.replace("arn:aws:iam::", "")


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_torch_index_adds_only_an_extra_index(tmp_path):
    def pip_line(*args: str) -> str:
        out = subprocess.run(["make", "-n", "install", f"VENV={tmp_path}/venv", *args],
                             cwd=CHECKOUT, capture_output=True, text=True, check=True).stdout
        return next(line for line in out.splitlines() if "-c constraints.txt" in line)

    url = "https://download.pytorch.org/whl/cpu"
    assert f"--extra-index-url {url} -c constraints.txt" in pip_line(f"TORCH_INDEX={url}")
    assert "index-url" not in pip_line()


def changelog_releases() -> list[str]:
    text = (CHECKOUT / "CHANGELOG.md").read_text(encoding="utf-8")
    return re.findall(r"^## (\d+\.\d+\.\d+)\b", text, re.MULTILINE)


def test_version_image_tag_and_changelog_agree():
    releases = changelog_releases()
    assert releases, "CHANGELOG.md has no `## X.Y.Z` release heading"
    assert releases[0] == __version__, (
        f"the CHANGELOG's latest release is {releases[0]} but the package version is "
        f"{__version__}: a release renames `## Unreleased` to `## {__version__} (date)`")
    for path in sorted(COMPILED.rglob("*.yaml")):
        image = compiled_image(path)
        assert image == f"{DEFAULT_IMAGE_REPOSITORY}:{__version__}", (
            f"{path.relative_to(CHECKOUT)} was compiled for {image!r}, not the package "
            f"version's image: run `python -m kfp_sagemaker_blackwell.pipelines.compile`")


def test_changelog_keeps_unreleased_changes_above_the_latest_release():
    text = (CHECKOUT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    if "Unreleased" in headings:
        assert headings.index("Unreleased") == 0, headings


def test_the_extras_a_local_run_needs_are_extras_make_installs():
    text = (CHECKOUT / "docs" / "versions.md").read_text(encoding="utf-8")
    (listed,) = set(re.findall(r"A \*\*local run\*\*.*?-e\s+'\.\[([a-z,]+)\]'", text, re.S))
    cfg = configparser.ConfigParser()
    cfg.read(CHECKOUT / "setup.cfg")
    extras = set(cfg["options.extras_require"])
    make_extras = re.search(r"^EXTRAS := (.+)$", (CHECKOUT / "Makefile").read_text(),
                            re.MULTILINE)
    assert make_extras and set(listed.split(",")) <= extras & set(make_extras.group(1).split(","))
    # what a local run needs beyond kfp (the backend, the executor's toolkit, the trainer, the
    # reports, build_image's DLC lookup), and the extra that must provide it
    for requirement, extra in (("moto", "local"), ("sagemaker-training", "local"),
                               ("torch", "trainer"), ("matplotlib", "report"),
                               ("sagemaker-core", "sagemaker")):
        assert extra in listed.split(","), (requirement, extra)
        assert requirement in cfg["options.extras_require"][extra], (requirement, extra)


