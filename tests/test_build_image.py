"""build_image without AWS: the build context, its hash and zip, the base image, the buildspec."""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from kfp_sagemaker_blackwell.common import build_marks, cli
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.common.shipped import CHECKOUT
from kfp_sagemaker_blackwell.components.build_image import codebuild as cb
from kfp_sagemaker_blackwell.components.build_image import context as ctx
from kfp_sagemaker_blackwell.components.build_image import launcher as b
from kfp_sagemaker_blackwell.components.build_image.component import build_image

DOCKERFILE = """\
# syntax=docker/dockerfile:1
ARG BASE_IMAGE
FROM ${BASE_IMAGE} AS base
COPY --chown=1000:1000 trainer/ /opt/ml/code/trainer/
COPY ["requirements.txt", "/opt/ml/code/"]
ADD https://example.com/big.tar.gz /tmp/
COPY --from=base /etc/hosts /tmp/hosts
COPY scripts/*.sh \\
     /opt/ml/code/
COPY <<EOF /opt/ml/code/inline.txt
hello
EOF
"""

FILES = {
    "trainer/__init__.py": "",
    "trainer/train.py": "print('train')\n",
    "trainer/sub/model.py": "x = 1\n",
    "requirements.txt": "transformer_engine[pytorch]==2.11.0\n",
    "scripts/train.sh": "#!/bin/sh\ntorchrun train.py\n",
    "scripts/notes.txt": "not copied: not a .sh\n",
    "README.md": "not copied\n",
}

DLC_TAG = cli.defaults(build_image)["base_image_tag"]


def request(**given) -> b.BuildRequest:
    """The checked request for these parameters, the component's defaults for the rest."""
    return b.BuildRequest.from_parameters(cli.declared(build_image, **given))


def make_tree(root: Path, order: list[str] | None = None, umask_mode: int = 0o644) -> Path:
    (root / "docker").mkdir(parents=True)
    (root / "docker" / "Dockerfile").write_text(DOCKERFILE)
    for rel in order or list(FILES):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(FILES[rel])
        os.chmod(path, umask_mode)
    os.chmod(root / "scripts" / "train.sh", 0o755)
    return root


def test_dockerfile_copy_sources_decide_the_context(tmp_path):
    assert ctx.copy_sources(DOCKERFILE) == ["trainer/", "requirements.txt", "scripts/*.sh"]
    context = ctx.collect(make_tree(tmp_path / "a"), "docker/Dockerfile")
    assert [f.path for f in context.files] == [
        "docker/Dockerfile", "requirements.txt", "scripts/train.sh", "trainer/__init__.py",
        "trainer/sub/model.py", "trainer/train.py"]
    assert [f.path for f in context.files if f.executable] == ["scripts/train.sh"]


def test_tag_is_stable_across_machines_orderings_times_and_caches(tmp_path):
    a = ctx.collect(make_tree(tmp_path / "a"), "docker/Dockerfile", {"BASE_IMAGE": "x"})
    shuffled = list(FILES)
    random.Random(7).shuffle(shuffled)
    root_b = make_tree(tmp_path / "elsewhere" / "b", order=shuffled, umask_mode=0o600)
    for path in root_b.rglob("*"):  # different modification times
        os.utime(path, (1_000_000, 1_000_000))
    # Caches and bytecode that a developer's checkout accumulates.
    (root_b / "trainer" / "__pycache__").mkdir()
    (root_b / "trainer" / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0\1")
    (root_b / "trainer" / "sub" / "model.pyc").write_bytes(b"\0")
    (root_b / "trainer" / ".pytest_cache").mkdir()
    (root_b / "trainer" / ".pytest_cache" / "v").write_text("x")
    (root_b / "trainer" / ".DS_Store").write_bytes(b"\0")
    (root_b / "trainer" / "pkg.egg-info").mkdir()
    (root_b / "trainer" / "pkg.egg-info" / "PKG-INFO").write_text("x")
    b_ = ctx.collect(root_b, "docker/Dockerfile", {"BASE_IMAGE": "x"})
    assert a.digest == b_.digest and a.tag == b_.tag
    assert a.tag.startswith("ctx-") and len(a.tag) == 4 + ctx.TAG_HEX_CHARS
    assert ctx.write_zip(a) == ctx.write_zip(b_)


@pytest.mark.parametrize("change", ["source", "new_file", "dockerfile", "build_arg", "exec_bit",
                                    "rename"])
def test_tag_changes_when_what_the_image_is_built_from_changes(tmp_path, change):
    root = make_tree(tmp_path / "a")
    before = ctx.collect(root, "docker/Dockerfile", {"BASE_IMAGE": "x"}).tag
    args = {"BASE_IMAGE": "x"}
    if change == "source":
        (root / "trainer" / "train.py").write_text("print('train v2')\n")
    elif change == "new_file":
        (root / "trainer" / "extra.py").write_text("")
    elif change == "dockerfile":
        (root / "docker" / "Dockerfile").write_text(DOCKERFILE + "ENV X=1\n")
    elif change == "build_arg":
        args = {"BASE_IMAGE": "y"}
    elif change == "exec_bit":
        os.chmod(root / "trainer" / "train.py", 0o755)
    elif change == "rename":
        (root / "trainer" / "sub" / "model.py").rename(root / "trainer" / "sub" / "model2.py")
    assert ctx.collect(root, "docker/Dockerfile", args).tag != before


def test_files_outside_the_copied_paths_do_not_change_the_tag(tmp_path):
    root = make_tree(tmp_path / "a")
    before = ctx.collect(root, "docker/Dockerfile").tag
    (root / "README.md").write_text("changed\n")
    (root / "scripts" / "notes.txt").write_text("changed\n")
    assert ctx.collect(root, "docker/Dockerfile").tag == before


def test_dockerignore_excludes_and_reincludes_like_docker(tmp_path):
    root = make_tree(tmp_path / "a")
    (root / ".dockerignore").write_text("# comment\n**/sub/**\ntrainer/*.py\n!trainer/train.py\n")
    files = [f.path for f in ctx.collect(root, "docker/Dockerfile").files]
    assert "trainer/sub/model.py" not in files and "trainer/__init__.py" not in files
    assert "trainer/train.py" in files


def test_zip_is_deterministic_and_keeps_the_executable_bit(tmp_path):
    context = ctx.collect(make_tree(tmp_path / "a"), "docker/Dockerfile")
    data = ctx.write_zip(context)
    assert data == ctx.write_zip(context)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        infos = {i.filename: i for i in zf.infolist()}
        assert sorted(infos) == [f.path for f in context.files]
        assert {i.date_time for i in infos.values()} == {ctx.ZIP_DATE_TIME}
        mode = infos["scripts/train.sh"].external_attr >> 16
        assert mode & stat.S_IXUSR and not (infos["requirements.txt"].external_attr >> 16) & 0o111
        assert zf.read("trainer/train.py") == b"print('train')\n"


def test_a_file_changing_while_zipping_is_refused(tmp_path):
    root = make_tree(tmp_path / "a")
    context = ctx.collect(root, "docker/Dockerfile")
    (root / "trainer" / "train.py").write_text("changed after hashing\n")
    with pytest.raises(RuntimeError, match="changed while the build context was being packed"):
        ctx.write_zip(context)


def test_copy_of_a_variable_path_asks_for_context_paths(tmp_path):
    root = tmp_path / "a"
    root.mkdir()
    (root / "Dockerfile").write_text("FROM x\nARG SRC=trainer\nCOPY $SRC /app\n")
    with pytest.raises(UserError, match="context_paths"):
        ctx.collect(root, "Dockerfile")
    (root / "trainer").mkdir()
    (root / "trainer" / "a.py").write_text("")
    explicit = ctx.collect(root, "Dockerfile", paths=["trainer"])
    assert [f.path for f in explicit.files] == ["Dockerfile", "trainer/a.py"]


def test_copy_source_that_matches_nothing_or_escapes_the_context_is_refused(tmp_path):
    root = tmp_path / "a"
    root.mkdir()
    (root / "Dockerfile").write_text("FROM x\nCOPY missing/ /app\n")
    with pytest.raises(UserError, match="matches nothing"):
        ctx.collect(root, "Dockerfile")
    (root / "Dockerfile").write_text("FROM x\nCOPY ../secrets /app\n")
    with pytest.raises(UserError, match="outside the build context"):
        ctx.collect(root, "Dockerfile")


def test_the_real_dockerfiles_of_this_repository_have_a_context():
    root = CHECKOUT
    for dockerfile in ("images/components/Dockerfile", "images/trainer/Dockerfile"):
        if not (root / dockerfile).is_file():
            continue
        context = ctx.collect(root, dockerfile, {"BASE_IMAGE": "x"})
        paths = [f.path for f in context.files]
        assert dockerfile in paths and len(paths) > 3
        assert not any("__pycache__" in p or p.endswith(".pyc") for p in paths)


def test_base_image_comes_from_the_override_or_the_lookup_with_the_pinned_tag():
    req = request(run_id="r", base_image="example.com/base:1")
    assert b.resolve_base_image(req, "us-west-2", lookup=lambda r, i: pytest.fail("looked up")) \
        == "example.com/base:1"
    looked_up = "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:2.9-gpu-py312"
    req = request(run_id="r")
    assert b.resolve_base_image(req, "us-west-2", lookup=lambda r, i: looked_up) == (
        "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:" + DLC_TAG)
    req = request(run_id="r", base_image_tag="")
    assert b.resolve_base_image(req, "us-west-2", lookup=lambda r, i: looked_up) == looked_up


def test_without_the_sagemaker_sdk_the_error_names_the_base_image_override():
    code = ("import sys; sys.modules['sagemaker'] = None; "
            "from kfp_sagemaker_blackwell.components.build_image.launcher import lookup_dlc; lookup_dlc('us-west-2', "
            "'ml.p6-b200.48xlarge')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=CHECKOUT)
    assert out.returncode != 0
    assert "base_image:" in out.stderr and "sagemaker-core" in out.stderr
    assert "pytorch-training:" + DLC_TAG in out.stderr


def test_sdk_lookup_gives_the_regional_pytorch_dlc_when_installed():
    pytest.importorskip("sagemaker.core.image_uris",
                        reason="the sagemaker extra is not installed in this environment")
    uri = b.lookup_dlc("ap-east-1", "ml.p6-b200.48xlarge")
    assert uri.startswith("871362719292.dkr.ecr.ap-east-1.amazonaws.com/pytorch-training:2.9")


def test_base_image_is_passed_only_to_dockerfiles_that_declare_it():
    assert b.declares_arg("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\n", "BASE_IMAGE")
    assert b.declares_arg("arg BASE_IMAGE=x\nFROM ${BASE_IMAGE}\n", "BASE_IMAGE")
    assert not b.declares_arg("FROM python:3.11-slim\nARG BASE_IMAGES\n", "BASE_IMAGE")


def test_buildspec_logs_in_to_both_registries_builds_and_pushes_both_tags():
    target = cb.BuildTarget(
        context_location="bucket/key.zip", dockerfile="images/trainer/Dockerfile",
        build_args=(("BASE_IMAGE", "763104351884.dkr.ecr.us-west-2.amazonaws.com/p:1"),
                    ("NOTE", "it's \"quoted\" $HOME")),
        image="1.dkr.ecr.us-west-2.amazonaws.com/r:ctx-1",
        marker_image="1.dkr.ecr.us-west-2.amazonaws.com/r:run-1",
        base_registry=("763104351884.dkr.ecr.us-west-2.amazonaws.com", "us-west-2"),
        target_registry=("1.dkr.ecr.us-west-2.amazonaws.com", "us-west-2"))
    spec = yaml.safe_load(cb.render_buildspec(target))
    assert spec["version"] == 0.2
    pre, build = spec["phases"]["pre_build"], spec["phases"]["build"]
    assert pre["on-failure"] == build["on-failure"] == "ABORT"
    assert ["763104351884" in pre["commands"][0], "1.dkr" in pre["commands"][1]] == [True, True]
    docker_build = build["commands"][0]
    # The shell sees each build argument as one word, exactly as given.
    words = subprocess.run(["bash", "-c", "printf '%s\\n' " + docker_build.split(" ", 2)[2]],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert "NOTE=it's \"quoted\" $HOME" in words
    assert build["commands"][2:] == ["docker push 1.dkr.ecr.us-west-2.amazonaws.com/r:ctx-1",
                                     "docker push 1.dkr.ecr.us-west-2.amazonaws.com/r:run-1"]


def test_run_marker_is_a_valid_ecr_tag_distinct_per_run():
    a = build_marks.run_marker("run-1", "ctx-0123456789abcdef01234567")
    assert a.startswith(build_marks.run_marker_prefix("run-1"))
    assert not a.startswith(build_marks.run_marker_prefix("run-2"))
    import re

    assert re.match(r"^[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,127}$", a)


def test_builder_choice_on_aws_and_on_the_local_backend():
    assert b.choose_builder("auto", local=False, docker_ok=lambda: True) == "codebuild"
    assert b.choose_builder("auto", local=True, docker_ok=lambda: True) == "docker"
    assert b.choose_builder("auto", local=True, docker_ok=lambda: False) == "none"
    assert b.choose_builder("codebuild", local=True, docker_ok=lambda: False) == "codebuild"


def test_docker_cli_without_a_daemon_is_not_a_docker_daemon(tmp_path, monkeypatch):
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert shutil.which("docker") == str(fake)
    assert b.docker_daemon_available() is False


def test_failure_summary_names_failed_phases_and_messages():
    build = {"phases": [{"phaseType": "PRE_BUILD", "phaseStatus": "SUCCEEDED"},
                        {"phaseType": "BUILD", "phaseStatus": "FAILED",
                         "contexts": [{"message": "exit status 1"}]}]}
    assert cb.failure_summary(build) == "BUILD: FAILED (exit status 1)"
    assert json.dumps(cb.failure_summary({"phases": []})) == '"no failed phase reported"'


def test_cli_prints_the_tag_without_aws_and_exits_2_on_user_errors(tmp_path):
    root = make_tree(tmp_path / "a")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    base = [sys.executable, "-m", "kfp_sagemaker_blackwell.components.build_image", "--context-dir", str(root),
            "--dockerfile", "docker/Dockerfile", "--base-image", "example.com/base:1"]
    out = subprocess.run(base + ["--run-id", "r1", "--print-tag"], capture_output=True,
                         text=True, cwd=CHECKOUT, env=env)
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    expected = ctx.collect(root, "docker/Dockerfile", {"BASE_IMAGE": "example.com/base:1"})
    assert printed["tag"] == expected.tag and "trainer/train.py" in printed["files"]
    bad = subprocess.run(base + ["--run-id", "run-*"], capture_output=True, text=True,
                         cwd=CHECKOUT, env=env)
    assert bad.returncode == 2 and "run_id" in bad.stderr


def test_cli_pipeline_flag_tags_the_build_and_pipeline_name_is_its_old_spelling(capsys):
    from kfp_sagemaker_blackwell.components.build_image.__main__ import build_parser

    _, values = cli.parse(build_parser(), ["--run-id", "r", "--pipeline", "sweep"])
    assert b.BuildRequest.from_parameters(values).pipeline == "sweep"
    assert capsys.readouterr().err == ""
    _, old = cli.parse(build_parser(), ["--run-id", "r", "--pipeline-name", "sweep"])
    assert old == values
    assert capsys.readouterr().err == "warning: --pipeline-name is deprecated; use --pipeline\n"


def test_installed_package_finds_its_sources_through_the_environment(tmp_path, monkeypatch):
    root = make_tree(tmp_path / "src")
    req = request(run_id="r", dockerfile="docker/Dockerfile")
    with pytest.raises(UserError, match="KFP_SAGEMAKER_SOURCE_DIR"):
        b.context_root(req)
    monkeypatch.setenv(b.SOURCE_DIR_ENV, str(root))
    assert b.context_root(req) == root
    assert b.context_root(request(run_id="r", dockerfile="images/components/Dockerfile")) \
        == CHECKOUT
