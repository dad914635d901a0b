"""How every component in this library is declared.

``@component(aws=True)`` is ``kfp.dsl.component`` with the project's conventions:

- ``base_image`` is the components image whose tag equals the package version
  (override the repository with ``KFP_SAGEMAKER_COMPONENTS_IMAGE`` at compile time);
- ``install_kfp_package=False``: nothing is pip-installed at run time, the image
  (or, locally, the driver's environment) already has this package and kfp;
- steps that touch AWS get caching off by default: a cached "training job" that
  never ran is the surprise users complain about most. ``task.set_caching_options
  (True)`` still turns it back on per task.

Only the component function's body is embedded in compiled YAML, so component
functions import what they need from this package inside their body.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from kfp import dsl
from kfp.dsl import python_component

from components import __version__

DEFAULT_IMAGE_REPOSITORY = "public.ecr.aws/kfp-sagemaker-blackwell/components"
IMAGE_ENV = "KFP_SAGEMAKER_COMPONENTS_IMAGE"


def components_image() -> str:
    """The components image, ``<repository>:<package version>``."""
    repository = os.environ.get(IMAGE_ENV, DEFAULT_IMAGE_REPOSITORY)
    if ":" in repository.rsplit("/", 1)[-1]:
        raise ValueError(
            f"{IMAGE_ENV}={repository!r}: give the repository without a tag; the tag is the "
            f"package version ({__version__})"
        )
    return f"{repository}:{__version__}"


class AwsComponent(python_component.PythonComponent):
    """A Python component whose tasks have caching disabled by default."""

    def __call__(self, *args: Any, **kwargs: Any) -> dsl.PipelineTask:
        task = super().__call__(*args, **kwargs)
        # A task run eagerly by kfp.local (outside a pipeline) is already FINAL and
        # refuses configuration; there is nothing to cache then anyway.
        final = getattr(getattr(task, "state", None), "name", "") == "FINAL"
        if not final and task.pipeline_spec is None:
            task.set_caching_options(False)
        return task


def component(
    func: Callable | None = None, *, aws: bool
) -> Any:
    """Declares a component the project's way (see the module docstring)."""

    def decorate(f: Callable) -> python_component.PythonComponent:
        comp = dsl.component(f, base_image=components_image(), install_kfp_package=False)
        if aws:
            comp.__class__ = AwsComponent
        comp.aws = aws  # type: ignore[attr-defined]
        return comp

    return decorate(func) if func is not None else decorate
