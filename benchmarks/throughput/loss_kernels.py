"""Which cross-entropy each measured trainer run really ran: the compiled one, or eager.

The trainer's default loss (``--loss-kernel compiled``, trainer/loss.py) is
``torch.compile(_cross_entropy, dynamic=False)``: one compiled graph per logits shape. measure.py
ran every configuration of a split in one process, and dynamo compiles one code object at most
``torch._dynamo.config.recompile_limit`` (8) times per process; from the ninth distinct
(batch, sequence, vocabulary) on, it stops compiling and runs the new shapes **eager** (the
fp32 logits materialised: slower, and 2-3 fp32 copies of the logits more memory). A user's job
trains one shape in a fresh process and always runs the compiled loss, so those runs are not
like for like with what the planner prices. The logs say when it happened: dynamo prints
``hit config.recompile_limit (8)`` with ``function: '_cross_entropy'`` in the run that first
went eager.

This module replays each log's processes (a process starts at TransformerEngine's import
warning or after measure.py's "time budget reached" line), keeps the compiled shapes as dynamo
did, and labels every run; the label is checked against the log: each process's first eager
run must be the one whose output carries the warning, and no warning may be left unexplained.
``loss_kernel_runs.json`` beside this file holds the result for every measured file, and
``model_accuracy.py`` predicts each run with the loss it ran. measure.py resets dynamo before
each configuration since session v22 and marks its runs ``"compile_state": "fresh"``; the
replay counts those compiled.

    python benchmarks/throughput/loss_kernels.py             # write loss_kernel_runs.json
    python benchmarks/throughput/loss_kernels.py --check     # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
OUT = HERE / "loss_kernel_runs.json"
RECOMPILE_LIMIT = 8  # torch._dynamo.config.recompile_limit's default (torch 2.11, 2.13)
CE_FUNCTION = "function: '_cross_entropy'"
LIMIT_HIT = "hit config.recompile_limit"
PROCESS_START = "Detected a Jax installation"  # transformer_engine/__init__.py, once per process
PROCESS_END = "time budget reached after"  # measure.py's last line when its budget ends it
# The measured files (relative to this folder) and the kernel the trainer ran by default when
# each was measured. h200_grid.json (2026-12-01) predates the compiled loss.
DEFAULTS = {"h200_grid.json": "eager"}
DEFAULT_KERNEL = "compiled"
# (data file, the log measure.py wrote while measuring it) outside the session folders
TOP_LEVEL_LOGS = {"h200_grid.json": "raw/throughput_h200.log", "h200_heldout.json": "raw/heldout.log",
                  "h200_torch_grid.json": "raw/h200_torch.log"}


def processes(log_text: str) -> list[list[tuple[str, Any]]]:
    """The log's processes, each a list of ("run", record) and ("ce-limit", line) events."""
    out: list[list[tuple[str, Any]]] = []
    cur: list[tuple[str, Any]] = []
    ended = False
    for line in log_text.splitlines():
        if PROCESS_START in line or (ended and line.startswith('{"name"')):
            if cur:
                out.append(cur)
            cur, ended = [], False
        if line.startswith('{"name"'):
            try:
                cur.append(("run", json.loads(line)))
            except json.JSONDecodeError:
                continue
        elif CE_FUNCTION in line and "convert_frame" in line:
            cur.append(("ce-limit", line))
        elif line.startswith(PROCESS_END):
            ended = True
    if cur:
        out.append(cur)
    return out


def _shape(record: dict[str, Any]) -> tuple[int, int, int] | None:
    vocab = int(record.get("model", {}).get("vocab_size", 0))
    return (int(record["batch_size"]), int(record["seq_length"]), vocab) if vocab else None


def replay(data: dict[str, Any], log_text: str) -> dict[str, Any]:
    """Label every run of ``data`` (a measure.py document) from ``log_text``: {"eager": [names],
    "compiled": n, "unlogged": [names], "problems": [...]} (problems: where the replay and the
    warnings disagree)."""
    by_name = {r["name"]: r for r in data["results"]}
    eager: list[str] = []
    compiled = 0
    seen: set[str] = set()
    problems: list[str] = []
    for i, proc in enumerate(processes(log_text)):
        cache: list[tuple[int, int, int]] = []
        warned_pending = False
        first_eager = None
        warned_run = None
        for kind, x in proc:
            if kind == "ce-limit":
                warned_pending = True
                continue
            rec = by_name.get(x["name"])
            if warned_pending:
                warned_run, warned_pending = x["name"], False
            if rec is None:  # a run of another file (a resumed split) or of no vocabulary
                continue
            seen.add(x["name"])
            shape = _shape(rec)
            if shape is None:
                continue
            if rec.get("compile_state") == "fresh":  # measure.py emptied dynamo's caches first
                cache = [shape]
                compiled += 1
                continue
            if shape in cache or len(cache) < RECOMPILE_LIMIT:
                if shape not in cache:
                    cache.append(shape)
                compiled += 1
                continue
            eager.append(x["name"])
            first_eager = first_eager or x["name"]
        if first_eager != warned_run:
            problems.append(f"process {i}: replay's first eager run {first_eager!r}, "
                            f"the log's warning before {warned_run!r}")
    unlogged = [n for n, r in by_name.items() if n not in seen and _shape(r) is not None]
    return {"eager": eager, "compiled": compiled, "unlogged": unlogged, "problems": problems}


def label_without_log(data: dict[str, Any]) -> dict[str, Any] | None:
    """A file measure.py wrote in one process per invocation whose runs have at most
    RECOMPILE_LIMIT distinct loss shapes never ran eager; None where that cannot be told."""
    shapes = {_shape(r) for r in data["results"] if r.get("compile_state") != "fresh"} - {None}
    if len(shapes) > RECOMPILE_LIMIT:
        return None
    return {"eager": [], "compiled": sum(1 for r in data["results"] if _shape(r)), "unlogged": [],
            "problems": []}


def measured_files() -> list[tuple[str, str | None]]:
    """(data file, its log or None), relative to this folder: the top-level files and every
    measure.py document in the session folders."""
    out: list[tuple[str, str | None]] = [(f, TOP_LEVEL_LOGS.get(f)) for f in
                                         ("h200_grid.json", "h200_heldout.json", "h200_torch_grid.json")]
    for path in sorted((HERE / "raw").glob("session_*/*.json")):
        doc = json.loads(path.read_text())
        if not (isinstance(doc, dict) and "measure.py" in str(doc.get("command", ""))):
            continue
        log = path.with_suffix(".log")
        out.append((str(path.relative_to(HERE)), str(log.relative_to(HERE)) if log.exists() else None))
    return out


def build() -> dict[str, Any]:
    files: dict[str, Any] = {}
    for name, log in measured_files():
        data = json.loads((HERE / name).read_text())
        default = DEFAULTS.get(name, DEFAULT_KERNEL)
        if default == "eager":  # no compiled loss to fall back from
            files[name] = {"default": default, "eager": [], "how": "the trainer's default then"}
            continue
        if log is not None:
            got = replay(data, (HERE / log).read_text(errors="replace"))
            how = f"replayed from {log}"
        else:
            got = label_without_log(data)
            how = f"at most {RECOMPILE_LIMIT} loss shapes in the file (no log kept)"
            if got is None:
                raise SystemExit(f"{name}: more than {RECOMPILE_LIMIT} loss shapes and no log: "
                                 "its runs' loss kernel cannot be told")
        if got["problems"]:
            raise SystemExit(f"{name}: the replay disagrees with {log}: {got['problems']}")
        files[name] = {"default": default, "eager": got["eager"], "how": how,
                       **({"unlogged": got["unlogged"]} if got["unlogged"] else {})}
    return {"what": "the cross-entropy each measured trainer run ran (benchmarks/throughput/"
                    "loss_kernels.py): a file's 'default', except the runs in 'eager', which "
                    "measure.py's process ran eager after dynamo's recompile limit",
            "recompile_limit": RECOMPILE_LIMIT, "files": files}


_TABLE: dict[str, Any] | None = None


def _table() -> dict[str, Any]:
    global _TABLE
    if _TABLE is None:
        _TABLE = json.loads(OUT.read_text())["files"]
    return _TABLE


def labelled(file: str) -> bool:
    """Whether loss_kernel_runs.json labels the runs of ``file`` (relative to this folder)."""
    return file in _table()


def kernel_of(file: str, record: dict[str, Any]) -> str:
    """The cross-entropy ``record``, a run of the labelled ``file``, ran."""
    entry = _table()[file]
    return "eager" if record["name"] in entry["eager"] else str(entry["default"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with loss_kernel_runs.json, write nothing")
    args = ap.parse_args(argv)
    doc = build()
    text = json.dumps(doc, indent=1) + "\n"
    if args.check:
        same = OUT.exists() and OUT.read_text() == text
        print("loss_kernel_runs.json is " + ("up to date" if same else "out of date: rerun without --check"))
        return 0 if same else 1
    OUT.write_text(text)
    n = sum(len(v["eager"]) for v in doc["files"].values())
    print(f"wrote {OUT.name}: {len(doc['files'])} files, {n} runs ran the eager loss")
    for name, v in doc["files"].items():
        if v["eager"]:
            print(f"  {name}: {len(v['eager'])} eager ({v['how']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
