"""S3 transfers the executor does on a job's behalf (channels, checkpoints, artifacts)."""

from __future__ import annotations

import errno
import io
import os
import stat
import tarfile
from collections.abc import Iterator
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


class LinkRefused(ValueError):
    """Symbolic links found where files are uploaded: named, never followed."""


def regular_files(src: Path, label: str) -> Iterator[tuple[str, int, os.stat_result]]:
    """(path relative to ``src``, an open read-only descriptor, its stat) of each regular file
    under ``src``, never following a symbolic link; then ``LinkRefused`` naming each link
    found (as ``label``/relative path -> target), if any.

    A job writes these directories while the executor reads them, so the walk is
    ``os.fwalk`` (each directory opened by descriptor, links not entered) and each file is
    opened with ``O_NOFOLLOW`` relative to its directory's descriptor: a link swapped in
    after the listing is refused by the kernel, not followed. The caller closes each fd.
    """
    links: list[str] = []
    if src.is_symlink():
        raise LinkRefused(f"refused {label}: it is a symbolic link (-> {os.readlink(src)}), "
                          "not the job's directory. Leave the directory in place.")
    if not src.is_dir():
        return
    for dirpath, dirnames, filenames, dirfd in os.fwalk(src, follow_symlinks=False):
        rel_dir = Path(dirpath).relative_to(src)
        for name in sorted(dirnames + filenames):
            rel = (rel_dir / name).as_posix()
            try:
                st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            except FileNotFoundError:  # removed while we walked (a checkpoint being rotated)
                continue
            if stat.S_ISLNK(st.st_mode):
                try:
                    target = os.readlink(name, dir_fd=dirfd)
                except OSError:
                    target = "?"
                links.append(f"{label.rstrip('/')}/{rel} -> {target}")
                continue
            if not stat.S_ISREG(st.st_mode):
                continue  # directories are walked; fifos, sockets and devices hold no data
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dirfd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno == errno.ELOOP:  # became a link after the listing
                    links.append(f"{label.rstrip('/')}/{rel} -> (replaced by a link)")
                    continue
                raise
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
                continue
            yield rel, fd, st
    if links:
        raise LinkRefused(
            f"refused symbolic link{'s' if len(links) > 1 else ''} {', '.join(sorted(links))}: "
            f"{label} is uploaded file by file and a link's target is not the job's to "
            "upload. Write regular files (copy instead of linking).")


def upload_dir(s3: Any, src: Path, uri: str, seen: dict[str, tuple[int, int]] | None = None,
               label: str = "") -> int:
    """Uploads the regular files under ``src`` to ``uri``; with ``seen``, only files changed
    since last time. Symbolic links are never followed: every regular file is uploaded,
    then ``LinkRefused`` names the links (``label``: how ``src`` is shown, e.g.
    /opt/ml/checkpoints)."""
    bucket, prefix = split_s3_uri(uri)
    count = 0
    for rel, fd, st in regular_files(src, label or str(src)):
        with os.fdopen(fd, "rb") as f:
            stamp = (st.st_mtime_ns, st.st_size)
            if seen is not None and seen.get(rel) == stamp:
                continue
            key = f"{prefix.rstrip('/')}/{rel}" if prefix else rel
            s3.upload_fileobj(f, bucket, key)
        if seen is not None:
            seen[rel] = stamp
        count += 1
    return count


def tar_gz_bytes(src: Path, label: str = "") -> bytes:
    """The contents of ``src`` (not the directory itself) as a .tar.gz, like SageMaker's.

    Symbolic links are archived as links (``dereference=False``, and ``tarfile`` reads
    each member with ``lstat``), never as their targets' contents."""
    buf = io.BytesIO()
    if src.is_symlink():
        raise LinkRefused(f"refused {label or src}: it is a symbolic link "
                          f"(-> {os.readlink(src)}), not the job's directory. Leave the "
                          "directory in place.")
    with tarfile.open(fileobj=buf, mode="w:gz", dereference=False) as tar:
        if src.is_dir():
            for path in sorted(src.iterdir()):
                tar.add(str(path), arcname=path.name)
    return buf.getvalue()


def upload_tar(s3: Any, src: Path, uri: str, label: str = "") -> None:
    bucket, key = split_s3_uri(uri)
    s3.put_object(Bucket=bucket, Key=key, Body=tar_gz_bytes(src, label))
