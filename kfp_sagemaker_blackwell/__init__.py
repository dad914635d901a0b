"""kfp-sagemaker-blackwell's one import package.

Its subpackages are the repository's top-level folders of the design card's layout
(``components``, ``pipelines``, ``trainer``, and ``catalog``, ``common``, ``planning``,
``local_backend``, ``iam``): their files live here, and each folder at the repository's root is a
relative symbolic link into this one, so that the checkout reads as the layout while every import,
tool and wheel sees one package. The trainer image holds ``trainer`` and ``catalog`` only.
Import from here (``from kfp_sagemaker_blackwell.components.sagemaker_training.component import
...``), never from the folders' bare names, so that installing the package claims one top-level name.

``load_component`` and ``component_yaml`` are the entry points for a team that imports single
components into its own pipelines.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing this package stays cheap: no kfp until a function is called
    from pathlib import Path

    from kfp_sagemaker_blackwell.common.component import LoadedComponent


def component_yaml(name: str) -> Path:
    """The path of the compiled YAML this package ships for component ``name``
    (``"sagemaker_training"``, ``"memory_estimate"``, ...), for
    ``kfp.components.load_component_from_file`` or to copy elsewhere."""
    from kfp_sagemaker_blackwell.common.shipped import component_yaml as find

    return find(name)


def load_component(name_or_path: str) -> LoadedComponent:
    """A component from its YAML (a shipped one by name, or a path), its tasks set up as the
    Python component's are: caching off for steps that touch AWS, retries where safe."""
    from kfp_sagemaker_blackwell.common.component import load_component as load

    return load(name_or_path)
