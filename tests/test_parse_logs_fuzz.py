"""Fuzz: random and hostile lines never crash the parser, never slow it to a crawl, and the
bulk parser reads exactly the step lines kfp_sagemaker_blackwell.catalog.logformat's own expression reads."""

import math
import random
import time

from kfp_sagemaker_blackwell.catalog import logformat as lf
from kfp_sagemaker_blackwell.components.parse_logs.analysis import analyse
from kfp_sagemaker_blackwell.components.parse_logs.parser import LogParser, feed_blocks, parse_bytes
from kfp_sagemaker_blackwell.components.parse_logs.report import events_document, markdown

SEED = 20261129
ALPHABET = "0123456789.-+eEnaif =[]{}\":,_steploss\r\t|x"


def _step_line(rng: random.Random) -> str:
    def num() -> float:
        return rng.choice([rng.uniform(-10, 10), rng.uniform(0, 1e7), math.nan, math.inf,
                           -math.inf, 0.0, 1e-30, 1e30])

    rec = lf.StepRecord(rng.randrange(10**6), num(), num(), num(), num(), num(), num(), num(),
                        num(), num(), rng.choice(["fp8", "bf16", "mxfp8", "fp8-block", "x_y"]),
                        rng.random() < 0.5)
    prefix = rng.choice(["", "[default0]:", "2026-11-29T12:00:00Z ", "junk\r", "[trainer] "])
    return prefix + lf.format_step(rec)


def _mutate(line: str, rng: random.Random) -> str:
    chars = list(line)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(3)
        i = rng.randrange(len(chars) + 1)
        if op == 0 and chars:
            del chars[min(i, len(chars) - 1)]
        elif op == 1:
            chars.insert(i, rng.choice(ALPHABET))
        elif chars:
            chars[min(i, len(chars) - 1)] = rng.choice(ALPHABET)
    return "".join(chars)


def _random_line(rng: random.Random) -> str:
    kind = rng.randrange(8)
    if kind == 0:
        return _step_line(rng)
    if kind == 1:
        return _mutate(_step_line(rng), rng)
    if kind == 2:
        payload = {"status": rng.choice(["completed", "failed"]), "steps": rng.randrange(100)}
        line = lf.format_json(rng.choice(["summary", "config", "event", "checkpoint", "data"]),
                              payload)
        return _mutate(line, rng) if rng.random() < 0.5 else line
    if kind == 3:
        return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(200)))
    if kind == 4:
        return lf.format_recipe(lf.RecipeRecord("fp8", "DelayedScaling", "te", False))[
            : rng.randrange(120)]
    if kind == 5:
        return rng.choice([
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1e999 GiB.",
            "Tried to allocate nan GiB out of memory",
            "[GPU-0] Avg. Iter. Time: 1e400s", "[GPU-0] Peak Memory Use: -.-MBs",
            "NCCL error Error: Exception: SIGTERM", "Using FP8 recipe: NotARecipe",
            "MXFP8 enabled: ", "[trainer] checkpoint {\"action\": 5, \"step\": [1]}",
            "[trainer] event {\"kind\": null}", "[trainer] event {\"kind\": \"oom\"}",
            "[trainer] summary {\"status\": 1, \"precision\": 5, \"emulated\": \"x\"}",
            "[trainer] data {\"entropy_floor\": \"abc\"}",
        ])
    return "".join(chr(rng.randrange(32, 127)) for _ in range(rng.randrange(80)))


def _exact_reference(lines: list[str]) -> list[int]:
    """The steps kfp_sagemaker_blackwell.catalog.logformat's own expression finds, line by line."""
    return [int(m.group(1)) for line in lines for m in lf.STEP_RE.finditer(line)]


def test_random_lines_never_crash_and_steps_match_the_contract_expression():
    rng = random.Random(SEED)
    lines = [_random_line(rng) for _ in range(4000)]
    lines = [ln.replace("\n", " ") for ln in lines]
    data = ("\n".join(lines) + "\n").encode()
    parser = LogParser()
    feed_blocks(parser, [data[i:i + 4096] for i in range(0, len(data), 4096)], block=8192)
    parsed = parser.result()
    # The parser keeps one row per step (the last one); compare the set of steps read.
    want = _exact_reference([ln.replace("\r", "\n") for ln in lines])
    assert sorted(set(want)) == parsed.series["step"]
    report = analyse(parsed, requested_precision="fp8")
    events_document(report)  # JSON-serialisable (NaN-free)
    markdown(report)


def test_mutated_step_lines_alone_are_read_as_the_contract_reads_them():
    # One line per buffer: a single bad value must not hide behind another bad line
    # that sends the whole buffer to the exact pattern.
    rng = random.Random(SEED + 2)
    for _ in range(3000):
        line = _mutate(_step_line(rng), rng).replace("\n", " ")
        parsed = parse_bytes(line.encode())
        want = _exact_reference(line.replace("\r", "\n").split("\n"))
        assert parsed.series["step"] == sorted(set(want)), line


def test_random_bytes_never_crash():
    rng = random.Random(SEED + 1)
    for _ in range(200):
        blob = bytes(rng.randrange(256) for _ in range(rng.randrange(2000)))
        blob += lf.format_step(lf.StepRecord(1, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0,
                                             "fp8", False)).encode()[: rng.randrange(300)]
        parsed = parse_bytes(blob)
        analyse(parsed)


def _timed(data: bytes) -> float:
    t0 = time.process_time()
    parsed = parse_bytes(data)
    analyse(parsed)
    return time.process_time() - t0


def test_hostile_lines_are_read_in_linear_time():
    digits = "1" * 200_000
    hostile = [
        # a huge run of digits where the contract's expression would backtrack quadratically
        f"[trainer] step step=1 loss={digits} lr=1",
        f"[trainer] step step={digits}",
        # the tag repeated on one enormous line
        "[trainer] step step=1 loss=" * 20_000,
        "[trainer] summary {" * 20_000,
        # JSON nested deeper than Python's recursion limit
        "[trainer] event " + "{\"a\":" * 50_000 + "1" + "}" * 50_000,
        "x" * 2_000_000,
        "out of memory rror SIGTERM [GPU- FP8 recipe enabled\r" * 5_000,
    ]
    for line in hostile:
        seconds = _timed(line.encode() + b"\n" + lf.format_step(lf.StepRecord(
            2, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, "fp8", False)).encode())
        assert seconds < 3.0, (line[:40], seconds)


def test_many_interesting_lines_keep_bounded_events():
    lines = [f"ValueError: boom {i}" for i in range(5000)]
    parsed = parse_bytes(("\n".join(lines)).encode())
    assert parsed.event_counts["error"] >= 2000
    assert len([e for e in parsed.events if e["kind"] == "error"]) <= 50


def test_a_step_number_too_long_for_an_integer_is_counted_not_fatal():
    tail = (" loss=1.0 lr=1e-3 grad_norm=1.0 tokens_per_s=1.0 tokens_per_s_per_gpu=1.0 "
            "tflops_per_gpu=1.0 mfu=nan mem_alloc_gib=nan mem_reserved_gib=nan precision=bf16 "
            "emulated=0")
    good = "[trainer] step step=7" + tail
    hostile = "[trainer] step step=" + "9" * 5000 + tail  # int() refuses > 4300 digits
    parsed = parse_bytes(f"{good}\n{hostile}\n".encode())
    assert parsed.series["step"] == [7]
    assert parsed.stats["unparsed_trainer_records"] == 1
    assert lf.parse_step(hostile) is None and lf.parse_step(good).step == 7
