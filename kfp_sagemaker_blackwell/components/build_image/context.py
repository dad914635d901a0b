"""The build context: which files an image build needs, its content hash and its zip.

The image tag is a hash of the build context, so the same sources give the same
tag on every machine and a rebuild happens only when something the image is
built from changed. What goes into the hash:

- the Dockerfile (its path relative to the context root and its bytes);
- every file the Dockerfile's ``COPY``/``ADD`` instructions read from the
  context (or the ``paths`` given explicitly), each as its relative POSIX path,
  whether it is executable, and the SHA-256 of its bytes;
- the build arguments (``--build-arg``, the base image among them).

Not in the hash: modification times, owners, permissions other than the
executable bit, the order the file system lists files in, the absolute location
of the checkout, and caches (``__pycache__``, ``*.pyc``, ``.pytest_cache``,
``.mypy_cache``, ``.ruff_cache``, ``*.egg-info``, ``.git``, ``.DS_Store``, ...)
or anything ``.dockerignore`` at the context root excludes.

``write_zip`` writes the same files as a deterministic zip (sorted entries, fixed
timestamps, normalised modes): CodeBuild's S3 source.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import os
import re
import shlex
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kfp_sagemaker_blackwell.common import build_marks
from kfp_sagemaker_blackwell.common.errors import UserError

HASH_VERSION = "1"  # bump when what goes into the hash changes
TAG_PREFIX = build_marks.CONTENT_TAG_PREFIX
TAG_HEX_CHARS = 24
ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can carry

# Directory and file names never part of a build context.
IGNORED_DIRS = frozenset(
    {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".git", ".hg", ".svn",
     ".tox", ".nox", ".venv", "venv", ".ipynb_checkpoints", "node_modules", ".te"}
)
IGNORED_FILE_PATTERNS = ("*.pyc", "*.pyo", ".DS_Store", "*.swp", "*~")
IGNORED_DIR_PATTERNS = ("*.egg-info",)


@dataclass(frozen=True)
class ContextFile:
    path: str  # relative POSIX path inside the context
    executable: bool
    sha256: str
    size: int


@dataclass(frozen=True)
class BuildContext:
    root: Path
    dockerfile: str  # relative POSIX path of the Dockerfile
    files: tuple[ContextFile, ...]  # sorted by path; includes the Dockerfile
    build_args: tuple[tuple[str, str], ...]  # sorted
    digest: str  # hex SHA-256 of the canonical manifest

    @property
    def tag(self) -> str:
        return f"{TAG_PREFIX}{self.digest[:TAG_HEX_CHARS]}"

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


# ---- Dockerfile parsing (only what decides which files are read) ----

_URL_RE = re.compile(r"^(https?|git)://|^git@")


def _logical_lines(text: str) -> list[str]:
    """Dockerfile instructions with ``\\`` continuations joined and comments dropped."""
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    if current.strip():
        lines.append(current.strip())
    return lines


def copy_sources(dockerfile_text: str) -> list[str]:
    """The context paths (possibly globs) that the Dockerfile's COPY/ADD read.

    ``COPY --from=<stage>`` reads another stage, ADD of a URL reads the network and
    a heredoc reads the Dockerfile itself: none of them reads the context.
    """
    sources: list[str] = []
    for line in _logical_lines(dockerfile_text):
        parts = line.split(None, 1)
        if len(parts) < 2 or parts[0].upper() not in ("COPY", "ADD"):
            continue
        rest = parts[1].strip()
        flags: list[str] = []
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            flags.append(flag)
            rest = rest.strip()
        if any(f.startswith("--from=") for f in flags) or rest.startswith("<<"):
            continue
        if rest.startswith("["):
            try:
                args = json.loads(rest)
            except json.JSONDecodeError as exc:
                raise UserError(
                    "dockerfile", f"cannot parse {line!r}: {exc}",
                    "fix the JSON form of the instruction, or pass context_paths explicitly.",
                ) from exc
        else:
            args = shlex.split(rest)
        for src in args[:-1]:
            if _URL_RE.match(src):
                continue
            if "$" in src:
                raise UserError(
                    "dockerfile",
                    f"{line!r} reads a path with a variable ({src}); the build context cannot "
                    "be worked out from the Dockerfile.",
                    "pass context_paths (the files and folders the build needs) explicitly.",
                )
            sources.append(src)
    return sources


# ---- .dockerignore ----

def _dockerignore_regex(pattern: str) -> re.Pattern[str]:
    """Docker's matching: Go filepath.Match per path element, plus ``**`` for any depth."""
    out = ""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            if i < len(pattern) and pattern[i] == "/":
                out = out[:-2] + "(?:.*/)?"
                i += 1
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        else:
            out += re.escape(c)
        i += 1
    # A pattern naming a directory also excludes everything below it.
    return re.compile(f"^{out}(?:/.*)?$")


@dataclass(frozen=True)
class _IgnoreRules:
    rules: tuple[tuple[bool, re.Pattern[str]], ...]  # (is_exception, regex), in file order

    @classmethod
    def load(cls, root: Path) -> _IgnoreRules:
        path = root / ".dockerignore"
        if not path.is_file():
            return cls(())
        rules = []
        for raw in path.read_text(encoding="utf-8").splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            exception = line.startswith("!")
            pattern = os.path.normpath(line[1:] if exception else line).lstrip("/")
            if pattern in (".", ""):
                continue
            rules.append((exception, _dockerignore_regex(pattern.replace(os.sep, "/"))))
        return cls(tuple(rules))

    def excludes(self, rel: str) -> bool:
        excluded = False
        for exception, regex in self.rules:  # the last matching rule wins, as in Docker
            if regex.match(rel):
                excluded = not exception
        return excluded


def _ignored_name(name: str, is_dir: bool) -> bool:
    if is_dir:
        return name in IGNORED_DIRS or any(fnmatch.fnmatch(name, p) for p in IGNORED_DIR_PATTERNS)
    return any(fnmatch.fnmatch(name, p) for p in IGNORED_FILE_PATTERNS)


# ---- collecting and hashing ----

def _file_entry(root: Path, path: Path) -> ContextFile:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    mode = path.stat().st_mode
    return ContextFile(
        path=path.relative_to(root).as_posix(),
        executable=bool(mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)),
        sha256=digest.hexdigest(),
        size=size,
    )


def _expand(root: Path, source: str) -> list[Path]:
    """Files a COPY source names: a file, every file under a folder, or a glob."""
    rel = os.path.normpath(source.lstrip("/"))
    if rel.startswith(".."):
        raise UserError("context_paths", f"{source!r} is outside the build context {root}.",
                        "keep every path the build reads under the context folder.")
    if any(ch in rel for ch in "*?["):
        matches = sorted(root.glob(rel))
    else:
        matches = [root / rel] if rel != "." else [root]
    files: list[Path] = []
    for match in matches:
        if match.is_file():
            files.append(match)
        elif match.is_dir():
            for dirpath, dirnames, filenames in os.walk(match, followlinks=False):
                dirnames[:] = sorted(d for d in dirnames if not _ignored_name(d, True))
                files.extend(Path(dirpath) / n for n in sorted(filenames)
                             if not _ignored_name(n, False))
    if not matches or (not files and not any(m.is_dir() for m in matches)):
        raise UserError(
            "context_paths", f"{source!r} matches nothing under {root}.",
            "check the Dockerfile's COPY/ADD sources against the context folder.",
        )
    return files


def collect(
    root: str | os.PathLike[str],
    dockerfile: str,
    build_args: dict[str, str] | None = None,
    paths: list[str] | None = None,
) -> BuildContext:
    """The build context rooted at ``root`` for ``dockerfile`` (relative to ``root``).

    ``paths`` overrides what is read from the Dockerfile's COPY/ADD instructions.
    """
    root_path = Path(root).resolve()
    dockerfile_rel = PurePosixPath(Path(dockerfile).as_posix())
    dockerfile_path = root_path / dockerfile_rel
    if dockerfile_rel.is_absolute() or ".." in dockerfile_rel.parts:
        raise UserError("dockerfile", f"{dockerfile!r} must be a path inside the context.",
                        f"give it relative to {root_path}.")
    if not dockerfile_path.is_file():
        raise UserError("dockerfile", f"{dockerfile_path} does not exist.",
                        "pass the Dockerfile's path relative to the context folder.")
    sources = paths if paths else copy_sources(dockerfile_path.read_text(encoding="utf-8"))
    ignore = _IgnoreRules.load(root_path)
    chosen: dict[str, Path] = {dockerfile_rel.as_posix(): dockerfile_path}
    for source in sources:
        for path in _expand(root_path, source):
            rel = path.relative_to(root_path).as_posix()
            if not ignore.excludes(rel):
                chosen[rel] = path
    files = tuple(_file_entry(root_path, chosen[rel]) for rel in sorted(chosen))
    args = tuple(sorted((build_args or {}).items()))
    return BuildContext(
        root=root_path,
        dockerfile=dockerfile_rel.as_posix(),
        files=files,
        build_args=args,
        digest=_digest(dockerfile_rel.as_posix(), files, args),
    )


def _digest(
    dockerfile: str, files: tuple[ContextFile, ...], build_args: tuple[tuple[str, str], ...]
) -> str:
    manifest = {
        "version": HASH_VERSION,
        "dockerfile": dockerfile,
        "files": [[f.path, "x" if f.executable else "-", f.sha256] for f in files],
        "build_args": [list(a) for a in build_args],
    }
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def write_zip(context: BuildContext) -> bytes:
    """The context as a deterministic zip (same files -> same bytes with the same zlib)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for entry in context.files:
            info = zipfile.ZipInfo(entry.path, date_time=ZIP_DATE_TIME)
            info.create_system = 3  # Unix, so that the mode below is honoured on extraction
            info.external_attr = ((0o100755 if entry.executable else 0o100644) & 0xFFFF) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            data = (context.root / entry.path).read_bytes()
            if hashlib.sha256(data).hexdigest() != entry.sha256:
                raise RuntimeError(
                    f"{entry.path} changed while the build context was being packed; "
                    "run the build again once the checkout is stable."
                )
            zf.writestr(info, data)
    return buffer.getvalue()
