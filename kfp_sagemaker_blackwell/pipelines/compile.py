"""Regenerates everything under ``compiled/``: ``python -m kfp_sagemaker_blackwell.pipelines.compile``.

- ``compiled/<pipeline>.yaml`` for each pipeline module in ``pipelines/`` that
  defines ``PIPELINE`` (a ``@dsl.pipeline`` function);
- ``compiled/components/<name>.yaml`` for each ``components/<name>/component.py``,
  so other teams can ``kfp.components.load_component_from_file`` them;
- in a checkout, docs/components.md's component reference (inputs, outputs, types,
  defaults), rendered from the same signatures, and docs/layout.md's module table.

Every file starts with a comment naming the components image it was compiled
for. For your own registry, one command builds and pushes the components image
(``images/components/Dockerfile``) with this project's ``build_image`` (AWS
CodeBuild; skipped when the content-addressed tag is already in ECR) and
compiles everything for it::

    python -m kfp_sagemaker_blackwell.pipelines.compile --build-components-image --s3-uri s3://<bucket>/kfp-sagemaker \\
        --region us-west-2 --codebuild-role-arn arn:aws:iam::<acct>:role/kfp-sagemaker-codebuild

or, with an image you built yourself, ``--components-image <registry>/<repo>:<tag>``.

Discovery is by convention, so adding a component or pipeline needs no registry
edit. Compilation is deterministic; ``tests/test_compiled.py`` fails when the
checked-in files differ from a fresh compile (ignoring the SDK version line).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

from kfp_sagemaker_blackwell.common.cli import ArgumentParser, plain
from kfp_sagemaker_blackwell.common.cli import output_dir as output_dir_type
from kfp_sagemaker_blackwell.common.errors import cli_errors
from kfp_sagemaker_blackwell.common.shipped import CHECKOUT, output_dir

COMPILED = output_dir()  # the checkout's compiled/, else ./compiled (never site-packages)
IMAGE_HEADER = "# Components image: "
COMPONENTS_DOCKERFILE = "images/components/Dockerfile"
COMPONENTS_REPOSITORY = "kfp-sagemaker-blackwell/components"


def header(image: str) -> str:
    from kfp_sagemaker_blackwell.common.component import DEFAULT_IMAGE_REPOSITORY

    note = ("the project's default name, NOT a published image: " if
            image.startswith(DEFAULT_IMAGE_REPOSITORY + ":") else "")
    return (f"{IMAGE_HEADER}{image}\n"
            f"# ({note}compile for your registry with `python -m kfp_sagemaker_blackwell.pipelines.compile "
            "--build-components-image ...`, docs/aws.md)\n")


def compiled_image(path: Path) -> str:
    """The components image named by a compiled file's header ("" when it has none)."""
    with path.open(encoding="utf-8") as f:
        first = f.readline()
    return first[len(IMAGE_HEADER):].strip() if first.startswith(IMAGE_HEADER) else ""


def discover_components() -> dict[str, object]:
    from kfp.dsl.base_component import BaseComponent

    import kfp_sagemaker_blackwell.components

    found: dict[str, object] = {}
    for info in sorted(pkgutil.iter_modules(kfp_sagemaker_blackwell.components.__path__), key=lambda i: i.name):
        if not info.ispkg or info.name.startswith("_") or info.name in ("common", "local"):
            continue
        if not (Path(kfp_sagemaker_blackwell.components.__path__[0]) / info.name / "component.py").exists():
            continue
        module = importlib.import_module(f"kfp_sagemaker_blackwell.components.{info.name}.component")
        comps = [v for v in vars(module).values() if isinstance(v, BaseComponent)]
        if len(comps) != 1:
            raise RuntimeError(
                f"components/{info.name}/component.py must define exactly one component "
                f"(found {len(comps)})"
            )
        found[info.name] = comps[0]
    return found


def discover_pipelines() -> dict[str, object]:
    import kfp_sagemaker_blackwell.pipelines

    found: dict[str, object] = {}
    for info in sorted(pkgutil.iter_modules(kfp_sagemaker_blackwell.pipelines.__path__), key=lambda i: i.name):
        if info.ispkg or info.name.startswith("_") or info.name in ("compile", "local"):
            continue
        module = importlib.import_module(f"kfp_sagemaker_blackwell.pipelines.{info.name}")
        if hasattr(module, "PIPELINE"):
            found[info.name] = module.PIPELINE
    return found


def compile_one(obj: object, path: Path, image: str, *,
                pipeline_parameters: dict[str, object] | None = None) -> None:
    """Compiles one component or pipeline to ``path``, with the image header."""
    from kfp import compiler

    compiler.Compiler().compile(obj, str(path), pipeline_parameters=pipeline_parameters)
    path.write_text(header(image) + path.read_text(encoding="utf-8"), encoding="utf-8")


def compile_all(out_dir: Path = COMPILED, *, verbose: bool = True,
                components_image: str | None = None) -> list[Path]:
    """Compiles every component and pipeline into ``out_dir``.

    The components image is fixed when the component modules are imported, so a
    ``components_image`` other than this process's is compiled in a fresh process.
    """
    from kfp_sagemaker_blackwell.common import component as declaration

    if components_image and components_image != declaration.components_image():
        subprocess.run([sys.executable, "-m", "kfp_sagemaker_blackwell.pipelines.compile", "--output-dir", str(out_dir),
                        "--components-image", components_image] + ([] if verbose else ["-q"]),
                       check=True, cwd=CHECKOUT)
        return sorted(out_dir.rglob("*.yaml"))
    image = declaration.components_image()
    written: list[Path] = []
    (out_dir / "components").mkdir(parents=True, exist_ok=True)
    for name, comp in discover_components().items():
        path = out_dir / "components" / f"{name}.yaml"
        compile_one(comp, path, image)
        written.append(path)
    for name, pipeline in discover_pipelines().items():
        path = out_dir / f"{name}.yaml"
        compile_one(pipeline, path, image)
        written.append(path)
    if verbose:
        for path in written:
            print(f"wrote {path.relative_to(out_dir.parent) if out_dir == COMPILED else path}")
        print(f"components image: {image}")
    return written


def build_components_image(args: argparse.Namespace) -> str:
    """Builds and pushes the components image with build_image; returns its URI (digest)."""
    from kfp_sagemaker_blackwell.catalog.release import __version__
    from kfp_sagemaker_blackwell.common.cli import declared
    from kfp_sagemaker_blackwell.components.build_image import launcher as b
    from kfp_sagemaker_blackwell.components.build_image.component import build_image

    result = b.build_image(b.BuildRequest.from_parameters(declared(
        build_image, run_id=f"components-image-{__version__}", region=args.region,
        s3_uri=args.s3_uri, repository=args.repository, dockerfile=COMPONENTS_DOCKERFILE,
        codebuild_role_arn=args.codebuild_role_arn, pipeline="compile")),
        log=lambda line: print(line, file=sys.stderr, flush=True))
    if result.outcome == "not-built":
        from kfp_sagemaker_blackwell.common.errors import UserError

        raise UserError("build_components_image", result.message,
                        "run it against AWS (not the local backend) or with a Docker daemon.")
    return result.image_uri


def parser() -> argparse.ArgumentParser:
    # The module docstring is the help, as plain text: reST literals unquoted and the
    # example kept whole (RawDescriptionHelpFormatter keeps its line breaks).
    text = plain(__doc__ or "").split("\n\n")
    p = ArgumentParser(
        prog="python -m kfp_sagemaker_blackwell.pipelines.compile", description=text[0],
        epilog="\n\n".join(text[1:5]), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output-dir", type=output_dir_type, default=COMPILED,
                   help="default: compiled/ (the checkout's; installed: in the working directory)")
    image = p.add_mutually_exclusive_group()
    image.add_argument("--components-image", default="",
                       help="compile for this components image (<registry>/<repo>:<tag> or "
                       "@sha256:<digest>; a bare repository gets the package version as tag)")
    image.add_argument("--build-components-image", action="store_true",
                       help="first build and push images/components/Dockerfile with build_image "
                       "(CodeBuild), then compile for the image it pushed")
    p.add_argument("--s3-uri", default="", help="--build-components-image: s3://bucket/prefix "
                   "for the build context")
    p.add_argument("--region", default="", help="--build-components-image: default AWS_REGION")
    p.add_argument("--repository", default=COMPONENTS_REPOSITORY,
                   help="--build-components-image: ECR repository (default %(default)s)")
    p.add_argument("--codebuild-role-arn", default="",
                   help="--build-components-image: CodeBuild service role, needed to create "
                   "the CodeBuild project the first time (iam/)")
    p.add_argument("--docs", action="store_true",
                   help="rewrite only the generated parts of docs/ in this checkout, the "
                   "planner's worked example included (it runs the planner; `make docs`)")
    p.add_argument("-q", "--quiet", action="store_true", help="do not list the files written")
    return p


def update_docs(*, plan: bool, quiet: bool) -> int:
    """Rewrites docs/'s generated parts in a checkout (``_reference``); 2 outside one."""
    from kfp_sagemaker_blackwell.pipelines import _reference

    if not (CHECKOUT / _reference.DOCS).is_dir():
        print(f"error: --docs: {CHECKOUT / _reference.DOCS} does not exist: docs are "
              "generated in a source checkout", file=sys.stderr)
        return 2
    for path in _reference.update_docs(CHECKOUT, discover_components(), plan=plan):
        if not quiet:
            print(f"wrote {path.relative_to(CHECKOUT)} (generated from the code)")
    return 0


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.docs:
        return update_docs(plan=True, quiet=args.quiet)
    image = args.components_image
    if args.build_components_image:
        from kfp_sagemaker_blackwell.common.errors import USER_ERROR_EXIT_CODE, UserError

        try:
            image = build_components_image(args)
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return USER_ERROR_EXIT_CODE
    if image:
        from kfp_sagemaker_blackwell.common.component import IMAGE_ENV

        os.environ[IMAGE_ENV] = image  # read when the component modules are imported
    try:
        compile_all(Path(args.output_dir), verbose=not args.quiet)
    except ValueError as exc:  # a malformed image reference
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if Path(args.output_dir) == COMPILED and (CHECKOUT / "docs").is_dir():  # a checkout: its docs
        return update_docs(plan=False, quiet=args.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
