"""Regenerates everything under ``compiled/``: ``python -m pipelines.compile``.

- ``compiled/<pipeline>.yaml`` for each pipeline module in ``pipelines/`` that
  defines ``PIPELINE`` (a ``@dsl.pipeline`` function);
- ``compiled/components/<name>.yaml`` for each ``components/<name>/component.py``,
  so other teams can ``kfp.components.load_component_from_file`` them.

Discovery is by convention, so adding a component or pipeline needs no registry
edit. Compilation is deterministic; ``tests/test_compiled.py`` fails when the
checked-in files differ from a fresh compile (ignoring the SDK version line).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPILED = ROOT / "compiled"


def discover_components() -> dict[str, object]:
    from kfp.dsl.base_component import BaseComponent

    import components

    found: dict[str, object] = {}
    for info in sorted(pkgutil.iter_modules(components.__path__), key=lambda i: i.name):
        if not info.ispkg or info.name.startswith("_") or info.name in ("common", "local"):
            continue
        if not (Path(components.__path__[0]) / info.name / "component.py").exists():
            continue
        module = importlib.import_module(f"components.{info.name}.component")
        comps = [v for v in vars(module).values() if isinstance(v, BaseComponent)]
        if len(comps) != 1:
            raise RuntimeError(
                f"components/{info.name}/component.py must define exactly one component "
                f"(found {len(comps)})"
            )
        found[info.name] = comps[0]
    return found


def discover_pipelines() -> dict[str, object]:
    import pipelines

    found: dict[str, object] = {}
    for info in sorted(pkgutil.iter_modules(pipelines.__path__), key=lambda i: i.name):
        if info.ispkg or info.name.startswith("_") or info.name == "compile":
            continue
        module = importlib.import_module(f"pipelines.{info.name}")
        if hasattr(module, "PIPELINE"):
            found[info.name] = module.PIPELINE
    return found


def compile_all(out_dir: Path = COMPILED, *, verbose: bool = True) -> list[Path]:
    from kfp import compiler

    written: list[Path] = []
    (out_dir / "components").mkdir(parents=True, exist_ok=True)
    for name, comp in discover_components().items():
        path = out_dir / "components" / f"{name}.yaml"
        compiler.Compiler().compile(comp, str(path))
        written.append(path)
    for name, pipeline in discover_pipelines().items():
        path = out_dir / f"{name}.yaml"
        compiler.Compiler().compile(pipeline, str(path))
        written.append(path)
    if verbose:
        for path in written:
            print(f"wrote {path.relative_to(out_dir.parent) if out_dir == COMPILED else path}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", type=Path, default=COMPILED, help="default: compiled/")
    args = parser.parse_args(argv)
    compile_all(args.output_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
