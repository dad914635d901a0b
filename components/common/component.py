"""How every component in this library is declared.

``@component(aws=True)`` is ``kfp.dsl.component`` with the project's conventions:

- ``base_image`` is the components image (``components_image()``: by default the
  project's repository tagged with the package version; ``python -m pipelines.compile
  --components-image <yours>`` compiles for your registry);
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
import re
from collections.abc import Callable
from typing import Any

from kfp import dsl
from kfp.dsl import python_component

from components import __version__

DEFAULT_IMAGE_REPOSITORY = "public.ecr.aws/kfp-sagemaker-blackwell/components"
IMAGE_ENV = "KFP_SAGEMAKER_COMPONENTS_IMAGE"
IMAGE_REFERENCE_RE = re.compile(
    r"^[a-z0-9.\-]+(?::\d+)?(?:/[a-z0-9._\-]+)+(?::[\w][\w.\-]{0,127}|@sha256:[0-9a-f]{64})?$")


def components_image() -> str:
    """The components image every component runs in.

    ``KFP_SAGEMAKER_COMPONENTS_IMAGE`` (read when the components are defined, i.e. at
    import) is a repository, tagged with the package version, or a full reference
    with a tag or a digest (what ``python -m pipelines.compile --components-image``
    and ``--build-components-image`` set); unset, the project's default repository.
    """
    reference = os.environ.get(IMAGE_ENV, "").strip() or DEFAULT_IMAGE_REPOSITORY
    if not IMAGE_REFERENCE_RE.match(reference):
        raise ValueError(
            f"{IMAGE_ENV}={reference!r} is not an image reference; give a repository "
            f"(<registry>/<name>, tagged {__version__}), <registry>/<name>:<tag> or "
            "<registry>/<name>@sha256:<digest>")
    if "@" in reference or ":" in reference.rsplit("/", 1)[-1]:
        return reference
    return f"{reference}:{__version__}"


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
            return AwsComponent(component_spec=comp.component_spec, python_func=comp.python_func)
        return comp

    return decorate(func) if func is not None else decorate
