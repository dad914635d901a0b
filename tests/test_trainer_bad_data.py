"""Issue 44: damaged token data (``--data-dir`` / the train channel) fails the job once, at
start-up, before the model is built: exit 1, one line naming the file, what is wrong and what
is expected, and that line in SageMaker's failure file (the job's FailureReason). It used to
be a bare ValueError / JSONDecodeError / AttributeError from numpy or json at the first batch,
naming neither data-dir nor the file."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from test_trainer_launch import TRAIN_SH, _layout

from kfp_sagemaker_blackwell.catalog import logformat, tokens
from kfp_sagemaker_blackwell.trainer import make_tokens, train

SHARD = "train_000.bin"


def _good(d: Path) -> None:
    (d / SHARD).write_bytes(bytes(range(200)) * 2)  # 200 uint16 ids
    (d / "meta.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": 256}))


def _meta(text: str) -> Callable[[Path], None]:
    def make(d: Path) -> None:
        _good(d)
        (d / "meta.json").write_text(text)
    return make


def _shard(name: str, data: bytes) -> Callable[[Path], None]:
    def make(d: Path) -> None:
        _good(d)
        (d / name).write_bytes(data)
    return make


def _no_bins(d: Path) -> None:
    (d / "meta.json").write_text("{}")


def _dir_shard(d: Path) -> None:
    _good(d)
    (d / "z.bin").mkdir()


# (id, how the directory is damaged, the file the message names, text it must hold)
CASES: list[tuple[str, Callable[[Path], None], str, str]] = [
    ("odd-sized-shard", _shard(SHARD, b"\x01\x02\x03"), SHARD, "not a whole number of uint16"),
    ("odd-sized-second-shard", _shard("train_001.bin", b"\x01" * 5), "train_001.bin",
     "is 5 bytes"),
    ("uint32-shard-of-6-bytes", lambda d: (_meta('{"dtype": "uint32"}')(d),
                                           (d / SHARD).write_bytes(b"\0" * 6)), SHARD,
     "not a whole number of uint32"),
    ("empty-shard", _shard(SHARD, b""), SHARD, "is empty"),
    ("empty-second-shard", _shard("train_001.bin", b""), "train_001.bin", "is empty"),
    ("shard-is-a-directory", _dir_shard, "z.bin", "is not a file"),
    ("meta-not-json", _meta('{"dtype": "uint16",'), "meta.json", "is not valid JSON"),
    ("meta-empty", _meta(""), "meta.json", "is not valid JSON"),
    ("meta-not-utf8", lambda d: (_good(d), (d / "meta.json").write_bytes(b"\xff\xfe{")),
     "meta.json", "is not UTF-8"),
    ("meta-a-list", _meta('[{"dtype": "uint16"}]'), "meta.json", "holds a JSON list, not an object"),
    ("meta-null", _meta("null"), "meta.json", "holds a JSON null"),
    ("meta-a-number", _meta("3"), "meta.json", "holds a JSON int"),
    ("vocab-size-a-string", _meta('{"vocab_size": "256"}'), "meta.json",
     'vocab_size is "256"; it must be an integer >= 1'),
    ("vocab-size-not-a-number", _meta('{"vocab_size": "lots"}'), "meta.json", "vocab_size"),
    ("vocab-size-a-float", _meta('{"vocab_size": 256.5}'), "meta.json", "vocab_size is 256.5"),
    ("vocab-size-true", _meta('{"vocab_size": true}'), "meta.json", "vocab_size is true"),
    ("vocab-size-zero", _meta('{"vocab_size": 0}'), "meta.json", "vocab_size is 0"),
    ("vocab-size-negative", _meta('{"vocab_size": -5}'), "meta.json", "vocab_size is -5"),
    ("tokens-not-a-number", _meta('{"tokens": "many"}'), "meta.json", "tokens is \"many\""),
    ("separator-a-list", _meta('{"separator": [0]}'), "meta.json", "separator is [0]"),
    ("dtype-unknown", _meta('{"dtype": "float32"}'), "meta.json", 'dtype "float32"'),
    ("dtype-a-number", _meta('{"dtype": 16}'), "meta.json", "dtype 16"),
    ("files-not-a-list", _meta('{"files": "train_000.bin"}'), "meta.json", "files is"),
    ("files-names-a-missing-shard", _meta('{"files": ["train_000.bin", "train_009.bin"]}'),
     "meta.json", "lists 'train_009.bin'"),
    ("no-bin-files", _no_bins, "", "holds no *.bin token files"),
    ("shard-shorter-than-a-window", _shard(SHARD, b"\0\0" * 10), "",
     "fewer than a training window"),
]


def _main(data_dir: str, out: Path) -> int:
    return train.main(["--model-preset", "tiny", "--max-steps", "2", "--seq-length", "32",
                       "--batch-size", "2", "--vocab-size", "256", "--data-dir", data_dir,
                       "--output-dir", str(out), "--checkpoint-dir", "", "--model-dir", "",
                       "--output-data-dir", ""])


def _records(out: str) -> list[tuple[str, dict]]:
    return [r for r in map(logformat.parse_json, out.splitlines()) if r]


@pytest.mark.parametrize(("damage", "name", "text"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_damaged_token_data_fails_at_start_up_naming_the_file(tmp_path, capsys, damage, name,
                                                                text):
    data = tmp_path / "data"
    data.mkdir()
    damage(data)
    code = _main(str(data), tmp_path / "out")
    out = capsys.readouterr().out
    assert code == 1, out[-2000:]
    failure = (tmp_path / "out" / "failure").read_text()
    assert "\n" not in failure and failure.startswith(f"data-dir: {data / name}".rstrip("/"))
    assert text in failure and " Fix: " in failure, failure
    kinds = [k for k, _ in _records(out)]
    assert "model" not in kinds, kinds  # refused before the model was built
    assert "step step=" not in out
    summary = [p for k, p in _records(out) if k == "summary"][-1]
    assert summary["status"] == "failed" and summary["failure_reason"] == failure
    assert "Traceback" not in out


@pytest.mark.parametrize("where", ["missing", "a-file"])
def test_a_data_dir_that_is_not_a_directory_fails_naming_it(tmp_path, capsys, where):
    path = tmp_path / "data"
    if where == "a-file":
        path.write_text("tokens")
    code = _main(str(path), tmp_path / "out")
    capsys.readouterr()
    failure = (tmp_path / "out" / "failure").read_text()
    assert code == 1 and failure.startswith(f"data-dir: {path}: ")
    assert ("does not exist" if where == "missing" else "is not a directory") in failure


def test_make_tokens_output_passes_the_check(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("hello world " * 50)
    meta = make_tokens.convert([text], tmp_path / "tokens")
    checked = tokens.check(tmp_path / "tokens")
    assert checked.tokens == (meta["tokens"],) and checked.dtype == "uint16"
    assert checked.vocab_size == 256 and [f.name for f in checked.files] == meta["files"]


def test_on_sagemaker_the_reason_is_the_failure_file_and_the_exit_is_1(tmp_path):
    """train.sh under the SageMaker layout, the data in the train channel: the container
    exits 1 and /opt/ml/output/failure (the job's FailureReason) names the shard."""
    channel = tmp_path / "input" / "data" / "train"
    channel.mkdir(parents=True)
    _good(channel)
    (channel / "train_001.bin").write_bytes(b"\x07")
    env = _layout(tmp_path, {"model-preset": "tiny", "seq-length": "32", "max-steps": "2",
                             "vocab-size": "256"})
    env["SM_CHANNEL_TRAIN"] = str(channel)
    proc = subprocess.run(["bash", str(TRAIN_SH)], env=env, capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    failure = (tmp_path / "output" / "failure").read_text()
    assert failure.startswith(f"data-dir: {channel / 'train_001.bin'}: is 1 bytes"), failure
    # (torchrun still prints its own ChildFailedError for any rank that exits 1; the trainer
    # itself raises nothing past its failure report)
    assert "kfp_sagemaker_blackwell/trainer" not in proc.stdout + proc.stderr
    events = [p for k, p in _records(proc.stdout) if k == "event" and p["kind"] == "error"]
    assert [e["message"] for e in events] == [failure]
