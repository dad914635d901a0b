"""S3 transfers the executor does on a job's behalf (channels, checkpoints, artifacts)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

from kfp_sagemaker_blackwell.common.s3 import split_s3_uri


def join_s3(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts)])


def list_keys(s3: Any, bucket: str, prefix: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out.extend(page.get("Contents", []))
    return out


def download_prefix(s3: Any, uri: str, dest: Path) -> int:
    """Copies every object under ``uri`` into ``dest`` (relative paths kept); returns the count.

    A URI naming one object downloads that object into ``dest`` under its base name,
    as SageMaker does for an S3Prefix channel pointing at a file. Raises ``ValueError``
    naming the first key that would land outside ``dest`` (``../``, a leading ``/`` after
    the prefix, ``..`` as the name) before anything is written: a bucket's keys are data,
    never paths to trust.
    """
    bucket, prefix = split_s3_uri(uri)
    dest.mkdir(parents=True, exist_ok=True)
    plan = [(key, contained(dest, rel, f"s3://{bucket}/{key}", uri))
            for key, rel in _relative_keys(list_keys(s3, bucket, prefix), prefix)]
    for key, target in plan:
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(bucket, key, str(target))
    return len(plan)


def _relative_keys(objects: list[dict[str, Any]], prefix: str) -> list[tuple[str, str]]:
    """(key, path relative to the prefix) of each object that is not a folder marker."""
    out = []
    for obj in objects:
        key = obj["Key"]
        if key.endswith("/"):
            continue
        if key == prefix:
            rel = key.rsplit("/", 1)[-1]
        else:
            base = prefix if prefix.endswith("/") or not prefix else prefix + "/"
            if prefix and not key.startswith(base):
                continue  # "data" must not match "data2/..."
            rel = key[len(base):] if prefix else key
        out.append((key, rel))
    return out


def contained(dest: Path, rel: str, what: str, uri: str) -> Path:
    """``dest / rel``, refused unless it stays inside ``dest`` (symbolic links resolved)."""
    root = dest.resolve()
    target = (root / rel).resolve()
    parts = rel.split("/")
    if rel.startswith("/") or ".." in parts or "\0" in rel or not target.is_relative_to(root) \
            or target == root:
        raise ValueError(
            f"{what} (under {uri}) would be written to {root / rel}, outside the job's "
            f"{dest.name}/ directory: S3 keys with '../', '..' or a leading '/' after the "
            "prefix are refused. Rename or delete that object.")
    return target


def upload_dir(s3: Any, src: Path, uri: str, seen: dict[str, tuple[int, int]] | None = None) -> int:
    """Uploads files under ``src`` to ``uri``; with ``seen``, only files changed since last time."""
    bucket, prefix = split_s3_uri(uri)
    count = 0
    if not src.exists():
        return 0
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = path.relative_to(src).as_posix()
        try:
            st = path.stat()
        except FileNotFoundError:  # removed while we walked (a checkpoint being rotated)
            continue
        stamp = (st.st_mtime_ns, st.st_size)
        if seen is not None and seen.get(rel) == stamp:
            continue
        key = f"{prefix.rstrip('/')}/{rel}" if prefix else rel
        try:
            s3.upload_file(str(path), bucket, key)
        except FileNotFoundError:
            continue
        if seen is not None:
            seen[rel] = stamp
        count += 1
    return count


def tar_gz_bytes(src: Path) -> bytes:
    """The contents of ``src`` (not the directory itself) as a .tar.gz, like SageMaker's."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        if src.exists():
            for path in sorted(src.iterdir()):
                tar.add(str(path), arcname=path.name)
    return buf.getvalue()


def upload_tar(s3: Any, src: Path, uri: str) -> None:
    bucket, key = split_s3_uri(uri)
    s3.put_object(Bucket=bucket, Key=key, Body=tar_gz_bytes(src))
