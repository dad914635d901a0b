"""S3 URIs: the one parser every component and the local backend use."""

from __future__ import annotations

import re

from kfp_sagemaker_blackwell.common.errors import UserError

# S3's bucket naming rules: 3-63 lowercase letters, digits, dots and hyphens, starting and
# ending with a letter or digit.
BUCKET_PATTERN = r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]"
S3_URI_RE = re.compile(rf"^s3://(?P<bucket>{BUCKET_PATTERN})(?:/(?P<key>.*))?$")


def split_s3_uri(uri: str, field: str = "s3_uri") -> tuple[str, str]:
    """``s3://bucket/key/prefix`` -> ``("bucket", "key/prefix")``; a UserError naming ``field``.

    The key is returned as written after the bucket's slash (a trailing slash kept:
    ``s3://b/run1/`` is not ``s3://b/run1``, which also matches ``run10``).
    """
    m = S3_URI_RE.match(uri or "")
    if not m:
        raise UserError(field, f"{uri!r} is not an S3 URI.",
                        "use s3://<bucket>/<prefix> (bucket: 3-63 lowercase letters, digits, "
                        "dots or hyphens).")
    return m.group("bucket"), m.group("key") or ""
