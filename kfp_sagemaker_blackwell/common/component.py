"""How every component in this library is declared, and how its tasks are set up.

``@component(aws=True, retries=2)`` is ``kfp.dsl.component`` with the project's conventions:

- ``base_image`` is the components image (``components_image()``: by default the
  project's repository tagged with the package version; ``python -m kfp_sagemaker_blackwell.pipelines.compile
  --components-image <yours>`` compiles for your registry);
- ``install_kfp_package=False``: nothing is pip-installed at run time, the image
  (or, locally, the driver's environment) already has this package and kfp;
- steps that touch AWS get caching off by default: a cached "training job" that
  never ran is the surprise users complain about most. ``task.set_caching_options
  (True)`` still turns it back on per task;
- ``retries``: how often a task is retried, declared only where a retry is safe
  (it re-attaches to its job or build, reads only, or is idempotent);
  ``task.set_retry(...)`` still overrides it per task;
- the ``Args:`` entries of the parameter groups a component declares (the model, ...)
  come from ``catalog/parameters.py``, where each group is documented once.

Caching and retries are task settings in KFP's pipeline spec (``PipelineTaskSpec``'s
``cachingOptions`` and ``retryPolicy``), not part of a component: KFP 2.17's
``load_component_from_file`` keeps only a component's interface and container
(``structures.Implementation.from_pipeline_spec_dict``), and its tasks start with
caching on and no retry. :func:`load_component` loads the compiled YAML and gives
its tasks the same settings as the Python component's, so a component behaves the
same however it is obtained (``tests/test_pipelines.py`` compiles the snippet of
docs/components.md to check it).

Only the component function's body is embedded in compiled YAML, so component
functions import what they need from this package inside their body.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kfp import dsl
from kfp.dsl import python_component, yaml_component

from kfp_sagemaker_blackwell.catalog import parameters
from kfp_sagemaker_blackwell.catalog.release import __version__
from kfp_sagemaker_blackwell.catalog.sagemaker import parse_image

DEFAULT_IMAGE_REPOSITORY = "public.ecr.aws/kfp-sagemaker-blackwell/components"
IMAGE_ENV = "KFP_SAGEMAKER_COMPONENTS_IMAGE"


def components_image() -> str:
    """The components image every component runs in.

    ``KFP_SAGEMAKER_COMPONENTS_IMAGE`` (read when the components are defined, i.e. at
    import) is a repository, tagged with the package version, or a full reference
    with a tag or a digest (what ``python -m kfp_sagemaker_blackwell.pipelines.compile --components-image``
    and ``--build-components-image`` set); unset, the project's default repository.
    """
    reference = os.environ.get(IMAGE_ENV, "").strip() or DEFAULT_IMAGE_REPOSITORY
    image = parse_image(reference)
    if image is None:
        raise ValueError(
            f"{IMAGE_ENV}={reference!r} is not an image reference; give a repository "
            f"(<registry>/<name>, tagged {__version__}), <registry>/<name>:<tag> or "
            "<registry>/<name>@sha256:<digest>")
    if image.tag or image.digest:
        return reference
    return f"{reference}:{__version__}"


@dataclass(frozen=True)
class TaskDefaults:
    """What every task of a component gets unless its pipeline sets otherwise."""

    caching: bool = True
    retries: int = 0


def apply_task_defaults(task: dsl.PipelineTask, defaults: TaskDefaults) -> dsl.PipelineTask:
    """Sets ``defaults`` on a task being added to a pipeline."""
    # A task run eagerly by kfp.local (outside a pipeline) is already FINAL and
    # refuses configuration; there is nothing to cache or retry then anyway.
    final = getattr(getattr(task, "state", None), "name", "") == "FINAL"
    if final or task.pipeline_spec is not None:
        return task
    if not defaults.caching:
        task.set_caching_options(False)
    if defaults.retries:
        task.set_retry(defaults.retries)
    return task


class ProjectComponent(python_component.PythonComponent):
    """A Python component whose tasks get its ``TaskDefaults`` (caching off, retries)."""

    def __init__(self, *args: Any, task_defaults: TaskDefaults, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.task_defaults = task_defaults

    def __call__(self, *args: Any, **kwargs: Any) -> dsl.PipelineTask:
        return apply_task_defaults(super().__call__(*args, **kwargs), self.task_defaults)


class LoadedComponent(yaml_component.YamlComponent):
    """A component loaded from compiled YAML whose tasks get the project's ``TaskDefaults``."""

    def __init__(self, loaded: yaml_component.YamlComponent, task_defaults: TaskDefaults) -> None:
        super().__init__(component_spec=loaded.component_spec,
                         component_yaml=loaded.component_yaml)
        self.task_defaults = task_defaults

    def __call__(self, *args: Any, **kwargs: Any) -> dsl.PipelineTask:
        return apply_task_defaults(super().__call__(*args, **kwargs), self.task_defaults)


def component(
    func: Callable | None = None, *, aws: bool, retries: int = 0
) -> Any:
    """Declares a component the project's way (see the module docstring)."""
    defaults = TaskDefaults(caching=not aws, retries=retries)

    def decorate(f: Callable) -> python_component.PythonComponent:
        f = parameters.documented(f)  # the groups' Args: entries, written once in the catalog
        comp = dsl.component(f, base_image=components_image(), install_kfp_package=False)
        if defaults != TaskDefaults():
            return ProjectComponent(component_spec=comp.component_spec, python_func=comp.python_func,
                                task_defaults=defaults)
        return comp

    return decorate(func) if func is not None else decorate


def task_defaults(comp: Any) -> TaskDefaults:
    """The settings every task of ``comp`` (a component of this package) starts with."""
    return getattr(comp, "task_defaults", TaskDefaults())


def load_component(name_or_path: str | os.PathLike[str]) -> LoadedComponent:
    """One of this package's components from its compiled YAML, tasks set up as the
    Python component's are (caching off for AWS steps, retries where safe).

    ``name_or_path``: a component's name (``"sagemaker_training"``: the YAML this
    package ships, ``compiled/components/<name>.yaml``) or the path of a YAML compiled
    from it (e.g. for your registry, ``python -m kfp_sagemaker_blackwell.pipelines.compile --components-image``).
    The settings are the Python component's of the same KFP name, so a YAML of a
    component this package does not define is refused.
    """
    import importlib
    from pathlib import Path

    from kfp import components as kfp_components

    from kfp_sagemaker_blackwell.common import shipped

    text = str(name_or_path)
    is_path = text.endswith((".yaml", ".yml")) or os.sep in text or "/" in text
    if not is_path and not re.fullmatch(r"[a-z][a-z0-9_]*", text):
        raise ValueError(f"{text!r} is neither a component name (e.g. 'sagemaker_training') "
                         "nor a path to a component YAML")
    path = Path(text) if is_path else shipped.path(f"compiled/components/{text}.yaml")
    loaded = kfp_components.load_component_from_file(str(path))
    from kfp.dsl.base_component import BaseComponent

    name = loaded.component_spec.name
    try:  # by the design card's layout: components/<name>/component.py
        module = vars(importlib.import_module(f"kfp_sagemaker_blackwell.components.{name.replace('-', '_')}.component"))
    except ModuleNotFoundError:
        module = {}
    ours = next((c for c in module.values()
                 if isinstance(c, BaseComponent) and c.component_spec.name == name), None)
    if ours is None:
        raise ValueError(f"{path} holds component {loaded.component_spec.name!r}, which this "
                         "package does not define; load it with kfp.components."
                         "load_component_from_file and set its tasks' caching and retries "
                         "yourself")
    return LoadedComponent(loaded, task_defaults(ours))
