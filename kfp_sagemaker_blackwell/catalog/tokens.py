"""The trainer's token-file format, and the one check that a directory holds it.

A directory of ``*.bin`` files, each a flat little-endian array of token ids, with an
optional ``meta.json``: ``{"dtype": "uint16" | "uint32", "vocab_size": N}`` (uint16
when absent; ``python -m kfp_sagemaker_blackwell.trainer.make_tokens`` also writes
``tokenizer``, ``separator``, ``tokens`` and ``files``). Written by ``make_tokens``,
read by the trainer (``trainer/data.py``), which runs :func:`check` once at start-up,
before the model is built, so that damaged data fails the job at once, naming the file,
what is wrong and what is expected, instead of a bare ``ValueError`` from numpy at the
first batch. Standard library only: whoever can reach the directory can check it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp_sagemaker_blackwell.catalog.errors import FieldError

FIELD = "data-dir"
DTYPES = {"uint16": 2, "uint32": 4}
DEFAULT_DTYPE = "uint16"
META = "meta.json"
# meta.json's count fields: name -> the smallest value it may take.
COUNTS = {"vocab_size": 1, "tokens": 0, "separator": 0}


class DataError(FieldError):
    """Token data the trainer cannot read: ``data-dir: <file>: <problem> Fix: <fix>``."""

    def __init__(self, path: Path | str, problem: str, fix: str) -> None:
        super().__init__(FIELD, f"{path}: {problem}", fix)


@dataclass(frozen=True)
class TokenFiles:
    """A checked directory: its shards (sorted), their token counts, dtype and meta."""

    directory: Path
    files: tuple[Path, ...]
    tokens: tuple[int, ...]
    dtype: str
    meta: dict[str, Any]

    @property
    def vocab_size(self) -> int | None:
        value = self.meta.get("vocab_size")
        return value if isinstance(value, int) else None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_meta(path: Path) -> dict[str, Any]:
    """``meta.json`` as a dict whose known fields have the types the format declares."""
    expected = ('a JSON object such as {"dtype": "uint16", "vocab_size": 256} (what '
                "make_tokens writes)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DataError(path, "is not UTF-8 text.", f"write {expected}.") from None
    except OSError as exc:
        raise DataError(path, f"cannot be read ({exc.strerror or exc}).",
                        f"make it a readable file holding {expected}.") from None
    try:
        meta = json.loads(text)
    except ValueError as exc:
        raise DataError(path, f"is not valid JSON ({getattr(exc, 'msg', exc)} at line "
                        f"{getattr(exc, 'lineno', '?')}).", f"write {expected}.") from None
    if not isinstance(meta, dict):
        raise DataError(path, f"holds a JSON {type(meta).__name__ if meta is not None else 'null'}"
                        ", not an object.", f"write {expected}.")
    dtype = meta.get("dtype", DEFAULT_DTYPE)
    if dtype not in DTYPES:
        raise DataError(path, f"dtype {json.dumps(dtype)} is not a token dtype.",
                        f"set dtype to one of {', '.join(DTYPES)} (the width of the ids in "
                        "the .bin files).")
    for name, low in COUNTS.items():
        if name in meta and meta[name] is not None and not (_count(meta[name])
                                                            and meta[name] >= low):
            raise DataError(path, f"{name} is {json.dumps(meta[name])[:80]}; it must be an "
                            f"integer >= {low}.", f"write {name} as a JSON number, e.g. "
                            f'"{name}": {max(low, 256) if name == "vocab_size" else low}.')
    files = meta.get("files")
    if files is not None and not (isinstance(files, list)
                                  and all(isinstance(f, str) for f in files)):
        raise DataError(path, f"files is {json.dumps(files)[:80]}; it must be a list of file "
                        "names.", 'write e.g. "files": ["train_000.bin"], or leave it out.')
    return meta


def check(directory: str | Path) -> TokenFiles:
    """The token files in ``directory``, or a DataError naming the first damaged file."""
    root = Path(directory)
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise DataError(root, f"{what}.", "point data-dir (or the train channel) at a "
                        "directory of *.bin token files.")
    meta_path = root / META
    meta = read_meta(meta_path) if meta_path.exists() else {}
    dtype = meta.get("dtype", DEFAULT_DTYPE)
    width = DTYPES[dtype]
    for name in meta.get("files") or []:
        if not (root / name).is_file():
            raise DataError(meta_path, f"lists {name!r}, which is not a file in {root}.",
                            "copy the shard there, or remove it from files.")
    files = tuple(sorted(p for p in root.glob("*.bin")))
    if not files:
        raise DataError(root, "holds no *.bin token files.", "write them with python -m "
                        "kfp_sagemaker_blackwell.trainer.make_tokens --out DIR TEXT_FILES, or "
                        "point data-dir at the directory that holds them.")
    tokens = []
    for f in files:
        if not f.is_file():
            raise DataError(f, "is not a file.", "a shard is a flat file of token ids.")
        if not os.access(f, os.R_OK):
            raise DataError(f, "cannot be read (permission denied).",
                            "make the shard readable by the trainer.")
        size = f.stat().st_size
        if size == 0:
            raise DataError(f, "is empty (0 bytes).", "remove it, or write its tokens again.")
        if size % width:
            raise DataError(f, f"is {size} bytes, not a whole number of {dtype} token ids "
                            f"({width} bytes each): it is cut short or of another dtype.",
                            f"write it again, or set meta.json's dtype to the ids' width "
                            f"({', '.join(DTYPES)}).")
        tokens.append(size // width)
    return TokenFiles(root, files, tuple(tokens), dtype, meta)
