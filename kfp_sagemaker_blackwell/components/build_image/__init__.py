"""Image build: the trainer (or components) image, content-addressed, built with CodeBuild.

``from kfp_sagemaker_blackwell.components.build_image import build_image`` gives the KFP component (kfp is
imported only then); ``build``, ``context``, ``codebuild`` and ``ecr`` are plain
Python. CLI: ``python -m kfp_sagemaker_blackwell.components.build_image --help``.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "build_image":
        from kfp_sagemaker_blackwell.components.build_image.component import build_image

        return build_image
    raise AttributeError(name)
