"""Turn text files into the trainer's token-file format (byte-level: vocab 256).

    python -m kfp_sagemaker_blackwell.trainer.make_tokens --out data/ corpus1.txt corpus2.txt

Writes ``data/train_000.bin`` (little-endian uint16 token ids, one flat array:
every file's UTF-8 bytes, documents separated by token 0) and ``data/meta.json``
(``{"dtype": "uint16", "vocab_size": 256, "tokenizer": "bytes"}``). Train with
``--data-dir data/ --vocab-size 256`` (or point SageMaker's ``train`` channel at
it: ``SM_CHANNEL_TRAIN``). Any tokenizer can write the same format: a flat
array of ids in uint16 (vocab <= 65536) or uint32, and a meta.json naming it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from kfp_sagemaker_blackwell.catalog.paths import input_file, output_dir

SEPARATOR = 0


def convert(paths: list[Path], out: Path, shard_tokens: int = 1 << 30) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    chunks: list[np.ndarray] = []
    total = 0
    for p in paths:
        data = np.frombuffer(Path(p).read_bytes(), dtype=np.uint8).astype(np.uint16)
        chunks += [data, np.array([SEPARATOR], dtype=np.uint16)]
        total += len(data) + 1
    tokens = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint16)
    files = []
    for i, start in enumerate(range(0, max(len(tokens), 1), shard_tokens)):
        name = f"train_{i:03d}.bin"
        tokens[start:start + shard_tokens].astype("<u2").tofile(out / name)
        files.append(name)
    meta = {"dtype": "uint16", "vocab_size": 256, "tokenizer": "bytes", "separator": SEPARATOR,
            "tokens": int(total), "files": files}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kfp_sagemaker_blackwell.trainer.make_tokens", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", type=input_file, help="text files")
    ap.add_argument("--out", required=True, type=output_dir, help="output directory")
    args = ap.parse_args(argv)
    meta = convert([Path(p) for p in args.inputs], Path(args.out))
    print(f"wrote {meta['tokens']} tokens to {args.out} ({', '.join(meta['files'])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
