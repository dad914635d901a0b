"""Checkpoints count only when complete; resume takes the newest complete one.

Real CPU training runs (tiny preset): a run is stopped at step 4 with checkpoints at steps
2 and 4, the newest is damaged the ways a spot restart or a cut S3 upload damage it, and the
resumed run must say why step 4 was skipped, resume from step 2 and still print exactly the
losses of an uninterrupted run. A checkpoint of another run, checkpoints none of which is
usable and a full disk fail with a message naming the checkpoint (or directory) and the fix.
"""

from __future__ import annotations

import errno
import io
import json
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest

from kfp_sagemaker_blackwell.catalog import flags as config
from kfp_sagemaker_blackwell.catalog import logformat
from kfp_sagemaker_blackwell.trainer import checkpoint, train

COMMON = dict(seq_length=32, batch_size=2, max_steps=6, warmup_steps=2, log_every=1)
STEP4, STEP2 = "step_00000004", "step_00000002"


def _run(**kw):
    out = io.StringIO()
    try:
        summary = train.run(config.make(kw.pop("model_preset", "tiny"), **{**COMMON, **kw}),
                            log_out=out)
    except train.TrainingFailed as exc:
        summary = {**exc.summary, "reason": exc.reason}
    lines = out.getvalue().splitlines()
    steps = {r.step: r.loss for r in map(logformat.parse_step, lines) if r is not None}
    records = [j for j in map(logformat.parse_json, lines) if j]
    return summary, steps, records


@pytest.fixture(scope="module")
def reference():
    summary, steps, _ = _run()
    assert summary["status"] == "completed" and sorted(steps) == list(range(1, 7))
    return summary, steps


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A run stopped after step 4, checkpointed at steps 2 and 4."""
    ck = tmp_path_factory.mktemp("stopped") / "ck"
    summary, steps, _ = _run(checkpoint_dir=str(ck), checkpoint_every=2, stop_after_step=4)
    assert summary["status"] == "stopped"
    assert sorted(p.name for p in ck.iterdir()) == [STEP2, STEP4]
    return ck, steps


def _copy(stopped, tmp_path) -> Path:
    ck = tmp_path / "ck"
    shutil.copytree(stopped[0], ck)
    return ck


def _manifest(path: Path) -> dict:
    return json.loads((path / checkpoint.MANIFEST).read_text())


def _rewrite_manifest(path: Path, change) -> None:
    m = _manifest(path)
    change(m)
    (path / checkpoint.MANIFEST).write_text(json.dumps(m))


def _truncate(path: Path, size: int) -> None:
    with path.open("r+b") as f:
        f.truncate(size)


def _garbage(path: Path) -> None:
    # Fixed bytes: random ones unpickle into other errors now and then (IndexError...),
    # and the test names the error it expects. 0xff is no pickle opcode.
    path.write_bytes(b"\xff" * path.stat().st_size)


def test_a_checkpoint_has_a_manifest_of_every_file_written_last(stopped):
    ck, _ = stopped
    m = _manifest(ck / STEP4)
    assert m["format"] == checkpoint.FORMAT and m["step"] == 4
    files = sorted(p.name for p in (ck / STEP4).iterdir() if p.name != checkpoint.MANIFEST)
    assert sorted(m["files"]) == files
    assert {".metadata", "meta.json", "rng_rank00000.pt"} <= set(files)
    for name, entry in m["files"].items():
        assert entry["bytes"] == (ck / STEP4 / name).stat().st_size, name
        assert entry["crc32"] == checkpoint._crc32(ck / STEP4 / name), name  # all small here
    fp = m["fingerprint"]
    assert (fp["precision"], fp["world_size"], fp["model"]["hidden_size"]) == ("bf16", 1, 64)
    assert checkpoint.problem(ck / STEP4) is None and checkpoint.problem(ck / STEP2) is None


# (damage done to the newest checkpoint, the reason its skip must give)
DAMAGE = {
    "truncated-shard": (lambda p: _truncate(p / "__0_0.distcp", 1000),
                        "__0_0.distcp has 1,000 bytes, the manifest says"),
    "cut-meta-json": (lambda p: _truncate(p / "meta.json", 7),
                      "meta.json has 7 bytes, the manifest says"),
    "garbage-rng-file": (lambda p: _garbage(p / "rng_rank00000.pt"),
                         "rng_rank00000.pt does not match its checksum: damaged"),
    "missing-manifest": (lambda p: (p / "manifest.json").unlink(), "no manifest.json"),
    "size-mismatch": (lambda p: (p / ".metadata").open("ab").write(b"\0" * 10),
                      ".metadata has"),
    "cut-manifest": (lambda p: _truncate(p / "manifest.json", 40),
                     "manifest.json is unreadable"),
    "missing-shard": (lambda p: (p / "__0_0.distcp").unlink(), "__0_0.distcp is missing"),
    # A file too big to checksum (here: its checksum dropped), damaged at the same size:
    # only loading it finds out; the older checkpoint must then replace all it loaded.
    "unchecked-garbage": (lambda p: (_garbage(p / "rng_rank00000.pt"), _rewrite_manifest(
        p, lambda m: m["files"]["rng_rank00000.pt"].update(crc32=None))),
        "could not be loaded: UnpicklingError"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_newest_checkpoint_is_skipped_and_the_older_one_resumes_exactly(
        damage, stopped, reference, tmp_path):
    ck = _copy(stopped, tmp_path)
    spoil, reason = DAMAGE[damage]
    spoil(ck / STEP4)
    summary, steps, records = _run(checkpoint_dir=str(ck), checkpoint_every=2)
    assert summary["status"] == "completed", summary.get("reason")
    skipped = [p for k, p in records if k == "event" and p["kind"] == "checkpoint_unusable"]
    assert len(skipped) == 1 and skipped[0]["message"].startswith(f"{STEP4} skipped: ")
    assert reason in skipped[0]["message"], skipped[0]["message"]
    resumed = [p for k, p in records if k == "checkpoint" and p["action"] == "resumed"]
    assert resumed == [{"action": "resumed", "step": 2, "path": str(ck / STEP2),
                        "skipped": [STEP4]}]
    # Exact continuation: steps 3..6 are the uninterrupted run's, to the last digit.
    ref_summary, ref_steps = reference
    assert sorted(steps) == list(range(3, 7))
    assert [steps[s] for s in range(3, 7)] == [ref_steps[s] for s in range(3, 7)]
    assert summary["final_loss"] == ref_summary["final_loss"]
    assert stopped[1] == {s: ref_steps[s] for s in range(1, 5)}
    # The run's own checkpoints (steps 4 and 6) replaced the damaged one.
    assert sorted(p.name for p in ck.iterdir()) == [STEP4, "step_00000006"]
    assert all(checkpoint.problem(p) is None for p in ck.iterdir())


def test_an_unfinished_save_is_skipped_without_failing(stopped, reference, tmp_path):
    ck = _copy(stopped, tmp_path)
    shutil.copytree(ck / STEP4, ck / "step_00000006.tmp")
    summary, steps, records = _run(checkpoint_dir=str(ck))
    skipped = [p["message"] for k, p in records if k == "event"
               and p["kind"] == "checkpoint_unusable"]
    assert skipped == ["step_00000006.tmp skipped: an unfinished save (never renamed)"]
    assert summary["resumed_from_step"] == 4
    assert summary["final_loss"] == reference[0]["final_loss"]


def test_only_an_unfinished_save_means_a_fresh_start(stopped, reference, tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    shutil.copytree(stopped[0] / STEP2, ck / "step_00000002.tmp")
    summary, steps, _ = _run(checkpoint_dir=str(ck))
    assert summary["status"] == "completed" and summary["resumed_from_step"] is None
    assert steps == reference[1]


@pytest.mark.parametrize("change, expected, fix", [
    (dict(precision="fp8"), "(precision 'bf16' there, 'fp8' here)",
     "Fix: run with the checkpoint's settings (precision=bf16) to continue it, or start over"),
    (dict(model_preset="small"), "model.hidden_size 64 there, 128 here",
     "Fix: run the checkpoint's model to continue it, or start over with resume=false"),
    (dict(seed=7), "seed 1234 there, 7 here", "(seed=1234)"),
])
def test_a_checkpoint_of_another_run_is_refused_naming_it_and_the_fix(
        change, expected, fix, stopped, tmp_path):
    ck = _copy(stopped, tmp_path)
    summary, steps, _ = _run(checkpoint_dir=str(ck), **change)
    assert summary["status"] == "failed" and not steps
    reason = summary["reason"]
    assert reason.startswith(f"CheckpointError: checkpoint-dir={ck}: checkpoint {STEP4} was "
                             "written by a different run ("), reason
    assert expected in reason and fix in reason, reason
    assert "a new checkpoint-dir (on SageMaker a new checkpoint_s3_uri)" in reason


def test_a_checkpoint_written_by_another_world_size_is_refused(stopped, tmp_path):
    ck = _copy(stopped, tmp_path)
    _rewrite_manifest(ck / STEP4, lambda m: m["fingerprint"].update(world_size=16))
    summary, _, _ = _run(checkpoint_dir=str(ck))
    assert "world_size 16 there, 1 here" in summary["reason"]
    assert "(world_size=16)" in summary["reason"]


def test_a_bf16_checkpoint_is_not_resumed_as_mxfp8(stopped, tmp_path):
    # Before the fingerprint held the precision, this resumed and labelled the curve mxfp8.
    ck = _copy(stopped, tmp_path)
    summary, steps, _ = _run(checkpoint_dir=str(ck), precision="mxfp8")
    assert summary["status"] == "failed" and not steps
    assert "precision 'bf16' there, 'mxfp8' here" in summary["reason"]


def test_no_usable_checkpoint_names_each_one_and_the_fix(stopped, tmp_path):
    ck = _copy(stopped, tmp_path)
    _truncate(ck / STEP4 / "__0_0.distcp", 10)
    (ck / STEP2 / "manifest.json").unlink()
    summary, steps, _ = _run(checkpoint_dir=str(ck))
    reason = summary["reason"]
    assert summary["status"] == "failed" and not steps
    assert reason.startswith(f"CheckpointError: checkpoint-dir={ck}: no checkpoint there can be "
                             f"resumed ({STEP4}: __0_0.distcp has 10 bytes"), reason
    assert f"; {STEP2}: no manifest.json" in reason
    assert "Fix: delete the damaged checkpoints (their directories) or start over with " \
           "resume=false" in reason
    failure = summary.get("failure_reason")
    assert failure == reason


@contextmanager
def _full_disk(monkeypatch, suffix=".distcp"):
    """Writes of DCP's shard files go to /dev/full: the kernel's ENOSPC, mid-save."""
    from torch.distributed.checkpoint import filesystem

    real = filesystem.FileSystem.create_stream

    @contextmanager
    def create_stream(self, path, mode):
        if "w" in mode and str(path).endswith(suffix):
            with open("/dev/full", mode) as stream:
                yield stream
        else:
            with real(self, path, mode) as stream:
                yield stream

    monkeypatch.setattr(filesystem.FileSystem, "create_stream", create_stream)
    yield


def _node_bytes() -> int:
    """What the save of the tiny model needs: fp32 weights and AdamW's two moments."""
    return 3 * 4 * config.make("tiny").model.total_params()


def test_a_full_disk_at_the_first_checkpoint_says_so_and_leaves_nothing_half_written(
        monkeypatch, tmp_path):
    ck = tmp_path / "ck"
    with _full_disk(monkeypatch):
        summary, steps, records = _run(checkpoint_dir=str(ck), checkpoint_every=2)
    reason = summary["reason"]
    assert summary["status"] == "failed" and sorted(steps) == [1, 2]
    assert reason.startswith(f"CheckpointError: checkpoint-dir={ck}: no space left on its disk "
                             f"for checkpoint {STEP2} (it needs about "), reason
    need = int(reason.split("needs about ")[1].split(" bytes")[0].replace(",", ""))
    assert _node_bytes() <= need <= _node_bytes() + 4096, (need, _node_bytes())
    assert "Fix: give the job more disk (volume_size_gb), keep fewer checkpoints " \
           "(keep-checkpoints), or point checkpoint-dir at a larger disk." in reason
    assert "Traceback" not in reason and "CheckpointException" not in reason
    assert list(ck.iterdir()) == []  # the half-written step_00000002.tmp is gone


def test_too_little_free_space_is_refused_before_writing(monkeypatch, tmp_path):
    ck = tmp_path / "ck"
    real = shutil.disk_usage
    monkeypatch.setattr(checkpoint.shutil, "disk_usage",
                        lambda p: real(p)._replace(free=1000))
    summary, _, _ = _run(checkpoint_dir=str(ck), checkpoint_every=2)
    assert f"no space left on its disk for checkpoint {STEP2}" in summary["reason"]
    assert "1,000 bytes free" in summary["reason"]
    assert list(ck.iterdir()) == []


def test_a_full_disk_while_finishing_is_named_too(monkeypatch, tmp_path):
    ck = tmp_path / "ck"
    real = checkpoint._write_json

    def full(path, payload):
        if path.name == checkpoint.MANIFEST:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, payload)

    monkeypatch.setattr(checkpoint, "_write_json", full)
    summary, _, _ = _run(checkpoint_dir=str(ck), checkpoint_every=2)
    assert f"no space left on its disk for checkpoint {STEP2}" in summary["reason"]
    assert list(ck.iterdir()) == []


def test_a_save_after_resuming_from_an_older_checkpoint_drops_the_abandoned_newer_ones(
        stopped, tmp_path):
    ck = _copy(stopped, tmp_path)
    _truncate(ck / STEP4 / "__0_0.distcp", 10)
    shutil.copytree(ck / STEP2, ck / "step_00000006")  # a later step of another timeline
    (ck / "step_00000006" / "manifest.json").unlink()
    summary, _, _ = _run(checkpoint_dir=str(ck), checkpoint_every=3, max_steps=3,
                         keep_checkpoints=2)
    assert summary["status"] == "completed" and summary["resumed_from_step"] == 2
    assert sorted(p.name for p in ck.iterdir()) == [STEP2, "step_00000003"]


@pytest.mark.slow
def test_two_ranks_agree_to_skip_a_damaged_checkpoint_and_resume_exactly(tmp_path):
    """torchrun with 2 gloo processes (train.sh): rank 1's RNG file of the newest checkpoint
    is damaged; both ranks skip it and repeat steps 3 and 4 with the first run's losses."""
    import subprocess

    from test_trainer_launch import TRAIN_SH, _layout

    env = _layout(tmp_path, {"model-preset": "tiny", "seq-length": "32", "batch-size": "2",
                             "max-steps": "6", "log-every": "1", "checkpoint-every": "2",
                             "warmup-steps": "2"})
    env["TRAINER_NPROC_PER_NODE"] = "2"

    def train_sh(*argv):
        proc = subprocess.run(["bash", str(TRAIN_SH), *argv], env=env, capture_output=True,
                              text=True, timeout=240, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        lines = proc.stdout.splitlines()
        return ({r.step: r.loss for r in map(logformat.parse_step, lines) if r is not None},
                [j for j in map(logformat.parse_json, lines) if j])

    first, _ = train_sh("--stop-after-step", "4")
    ck = tmp_path / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == [STEP2, STEP4]
    assert {"rng_rank00000.pt", "rng_rank00001.pt"} <= set(_manifest(ck / STEP4)["files"])
    assert _manifest(ck / STEP4)["fingerprint"]["world_size"] == 2
    _garbage(ck / STEP4 / "rng_rank00001.pt")
    second, records = train_sh()
    skipped = [p["message"] for k, p in records if k == "event"
               and p["kind"] == "checkpoint_unusable"]
    assert skipped == [f"{STEP4} skipped: rng_rank00001.pt does not match its checksum: damaged"]
    resumed = [p for k, p in records if k == "checkpoint" and p["action"] == "resumed"]
    assert [(p["step"], p["skipped"]) for p in resumed] == [(2, [STEP4])]
    assert sorted(second) == [3, 4, 5, 6]
    assert (second[3], second[4]) == (first[3], first[4])
