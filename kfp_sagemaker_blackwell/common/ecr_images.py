"""Images in Amazon ECR: which registry (and region) an image reference names.

build_image writes images there and sagemaker_training runs only images from there
(SageMaker training pulls from ECR); both read an image reference the same way.
"""

from __future__ import annotations

from kfp_sagemaker_blackwell.catalog.sagemaker import ECR_HOST_RE


def ecr_registry_of(image: str) -> tuple[str, str] | None:
    """``(registry host, region)`` when ``image`` lives in a private ECR registry."""
    host = image.split("/", 1)[0] if "/" in image else ""
    match = ECR_HOST_RE.match(host)
    return (host, match["region"]) if match else None
