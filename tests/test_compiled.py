"""compiled/ must equal a fresh compile (modulo the SDK version line)."""

from pathlib import Path

from pipelines.compile import COMPILED, compile_all


def _normalise(text: str) -> list[str]:
    return [line for line in text.splitlines() if "sdkVersion:" not in line]


def test_compiled_directory_is_fresh(tmp_path):
    written = compile_all(tmp_path, verbose=False)
    fresh = {p.relative_to(tmp_path) for p in written}
    checked_in = {p.relative_to(COMPILED) for p in COMPILED.rglob("*.yaml")}
    assert checked_in == fresh, (
        "compiled/ has stale or missing files; run `make compile` "
        f"(missing: {sorted(map(str, fresh - checked_in))}, "
        f"extra: {sorted(map(str, checked_in - fresh))})"
    )
    stale = [
        str(rel)
        for rel in sorted(fresh)
        if _normalise((tmp_path / rel).read_text()) != _normalise((COMPILED / rel).read_text())
    ]
    assert not stale, f"stale compiled files {stale}; run `make compile`"


def test_compile_ignores_only_the_sdk_version_line(tmp_path):
    a = "sdkVersion: kfp-2.17.3\nx: 1\n"
    b = "sdkVersion: kfp-2.18.0\nx: 1\n"
    assert _normalise(a) == _normalise(b)
    assert _normalise(a) != _normalise(a.replace("x: 1", "x: 2"))
    assert Path(COMPILED).name == "compiled"
