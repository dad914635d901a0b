"""Where the files that installed code reads live: a source checkout, or the wheel's data.

Besides Python modules, the library reads the Dockerfiles and the trainer's sources
(``build_image``'s build contexts), the IAM policies (``iam_policy``) and the compiled
YAML. In a checkout they sit beside the packages; a wheel installs them, with the
same layout, under ``<prefix>/share/kfp-sagemaker-blackwell/`` (``setup.cfg``,
``[options.data_files]``). ``$KFP_SAGEMAKER_SOURCE_DIR`` names another tree.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from pathlib import Path

SOURCE_DIR_ENV = "KFP_SAGEMAKER_SOURCE_DIR"
DATA_DIR_NAME = "kfp-sagemaker-blackwell"
_PACKAGE = Path(__file__).resolve().parent.parent  # kfp_sagemaker_blackwell/
# A source checkout's root (the package's folder sits in it, beside setup.cfg), else the
# installed package's directory.
CHECKOUT = _PACKAGE.parent if (_PACKAGE.parent / "setup.cfg").is_file() else _PACKAGE


def is_checkout() -> bool:
    """Whether this code runs from a source checkout (not from an installed wheel)."""
    return (CHECKOUT / "setup.cfg").is_file()


def output_dir() -> Path:
    """Where compiled YAML is written unless a path is given: the checkout's ``compiled/``
    (what the docs and the freshness test read), else ``compiled/`` in the working
    directory. Never into an installed package (``site-packages``)."""
    return (CHECKOUT if is_checkout() else Path.cwd()) / "compiled"


def component_yaml(name: str) -> Path:
    """The compiled YAML this package ships for component ``name`` (e.g. ``"sagemaker_training"``):
    the checkout's ``compiled/components/<name>.yaml``, or the wheel's copy. FileNotFoundError
    naming the shipped components when there is none."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):  # a name, never a path out of compiled/
        raise ValueError(f"{name!r} is not a component name (e.g. 'sagemaker_training')")
    relative = f"compiled/components/{name}.yaml"
    if root_for(relative) is None:
        shipped = sorted(p.stem for r in roots() if (r / "compiled" / "components").is_dir()
                         for p in (r / "compiled" / "components").glob("*.yaml"))
        raise FileNotFoundError(f"no shipped component YAML named {name!r}; the package ships: "
                                f"{', '.join(sorted(set(shipped))) or 'none found'}")
    return path(relative)


def roots() -> list[Path]:
    """The trees searched, in order: $KFP_SAGEMAKER_SOURCE_DIR, the checkout, the wheel's data."""
    out = [Path(p) for p in (os.environ.get(SOURCE_DIR_ENV, ""),) if p]
    out.append(CHECKOUT)
    for prefix in (sysconfig.get_path("data"), sys.prefix):
        data = Path(prefix) / "share" / DATA_DIR_NAME
        if data not in out:
            out.append(data)
    return out


def root_for(relative: str) -> Path | None:
    """The first tree holding ``relative`` (a file or folder), or None."""
    return next((r for r in roots() if (r / relative).exists()), None)


def path(relative: str) -> Path:
    """``relative`` in the first tree holding it; FileNotFoundError naming where it looked."""
    root = root_for(relative)
    if root is None:
        raise FileNotFoundError(
            f"{relative} was not found under {', '.join(str(r) for r in roots())}: install the "
            f"package from its wheel (which ships it under share/{DATA_DIR_NAME}/) or set "
            f"{SOURCE_DIR_ENV} to a source checkout of kfp-sagemaker-blackwell.")
    return root / relative
