"""The trainer as SageMaker runs it: configuration from SM_* / hyperparameters.json, and
train.sh (torchrun, 2 gloo processes, FSDP2) under a fake /opt/ml layout, SIGTERM included."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kfp_sagemaker_blackwell.catalog import flags as config
from kfp_sagemaker_blackwell.catalog import logformat
from kfp_sagemaker_blackwell.local_backend.container import free_port

ROOT = Path(__file__).resolve().parent.parent
TRAIN_SH = ROOT / "trainer" / "train.sh"


def _free_port() -> int:
    return free_port()  # the local backend's: below the ephemeral range


def _layout(tmp: Path, hyperparameters: dict) -> dict[str, str]:
    (tmp / "input" / "config").mkdir(parents=True)
    (tmp / "input" / "config" / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    (tmp / "input" / "config" / "resourceconfig.json").write_text(
        json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "RANK", "WORLD_SIZE", "MASTER_"))}
    env.update(
        SM_INPUT_CONFIG_DIR=str(tmp / "input" / "config"), SM_MODEL_DIR=str(tmp / "model"),
        SM_OUTPUT_DIR=str(tmp / "output"), SM_OUTPUT_DATA_DIR=str(tmp / "output" / "data"),
        SM_CHECKPOINT_DIR=str(tmp / "checkpoints"), SM_NUM_GPUS="0", PYTHON=sys.executable,
        MASTER_PORT=str(_free_port()),
    )
    return env


def test_hyperparameters_json_sm_hp_and_flags_take_precedence_in_that_order(tmp_path):
    cfg_dir = tmp_path / "config"
    cfg_dir.mkdir()
    (cfg_dir / "hyperparameters.json").write_text(json.dumps({
        "precision": "mxfp8", "num-layers": "3", "batch-size": "4", "seq-length": "96",
        "activation-checkpointing": "true", "sagemaker_program": "train.sh", "lr": "0.001",
    }))
    env = {"SM_INPUT_CONFIG_DIR": str(cfg_dir), "SM_HP_BATCH_SIZE": "6", "SM_HP_PRECISION": "fp8",
           "SM_HP_HIDDEN_SIZE": "96", "SM_CHANNEL_TRAIN": "", "SM_MODEL_DIR": "/x/model",
           "SM_CHECKPOINT_DIR": "/x/ck"}
    cfg = config.parse(["--seq-length", "32"], env=env)
    assert cfg.precision == "fp8"  # SM_HP beats the file
    assert cfg.batch_size == 6 and cfg.seq_length == 32  # the flag beats both
    assert cfg.model.num_layers == 3 and cfg.model.hidden_size == 96 and cfg.activation_checkpointing
    assert cfg.lr == 0.001 and cfg.model_dir == "/x/model" and cfg.checkpoint_dir == "/x/ck"
    assert config.parse(["--no-activation-checkpointing"], env=env).activation_checkpointing is False
    # The SageMaker training toolkit's form: hyperparameters as arguments, values after booleans.
    toolkit = config.parse(["--num_layers", "5", "--activation-checkpointing", "False",
                            "--high-precision-lm-head=false"], env=env)
    assert toolkit.model.num_layers == 5 and not toolkit.activation_checkpointing
    assert not toolkit.high_precision_lm_head


@pytest.mark.parametrize(
    "env_extra,needle",
    [
        ({"SM_HP_NUM_LAYERS": "two"}, "--num-layers"),
        ({"SM_HP_PRECISION": '"fp9"'}, "--precision"),
        ({"SM_HP_NUM_LAYRES": "2"}, "num-layres"),
        ({"SM_HP_ACTIVATION_CHECKPOINTING": "maybe"}, "activation-checkpointing"),
        ({"SM_HP_NUM_HEADS": "5"}, "num-heads=5 does not divide hidden-size=64"),
        ({"SM_HP_BATCH_SIZE": "0"}, "batch-size"),
    ],
)
def test_bad_hyperparameters_fail_naming_the_parameter(tmp_path, env_extra, needle):
    env = {"SM_INPUT_CONFIG_DIR": str(tmp_path), **env_extra}
    with pytest.raises(config.ConfigError, match=needle):
        config.parse([], env=env)


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("opt_ml")
    env = _layout(tmp, {"model-preset": "tiny", "seq-length": "64", "max-steps": "60", "log-every": "10",
                        "checkpoint-every": "30"})
    env["TRAINER_NPROC_PER_NODE"] = "2"
    env.pop("OMP_NUM_THREADS", None)  # torchrun's own choice for a multi-process job, checked below
    proc = subprocess.run(["bash", str(TRAIN_SH)], env=env, capture_output=True, text=True, timeout=240, cwd=tmp)
    return tmp, proc


def test_two_gloo_processes_under_fsdp2_lower_the_loss_toward_the_entropy_floor(two_process_run):
    tmp, proc = two_process_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    steps = [r for r in map(logformat.parse_step, lines) if r is not None]
    jsons = [j for j in map(logformat.parse_json, lines) if j]
    world = next(p for k, p in jsons if k == "world")
    floor = next(p for k, p in jsons if k == "data")["entropy_floor"]
    summary = next(p for k, p in jsons if k == "summary")
    assert world["world_size"] == 2 and world["dist_backend"] == "gloo"
    assert [r.step for r in steps] == [1, 10, 20, 30, 40, 50, 60]  # rank 0 only
    assert steps[0].loss > 5.0 and summary["final_loss"] < floor + 0.6, (steps[0].loss, summary)
    assert summary["final_loss"] > floor - 0.05
    assert summary["world_size"] == 2 and summary["tokens"] == 60 * 2 * 8 * 64
    # torchrun gives each process of a multi-process job one host thread; the summary says so
    assert (summary["host_threads"], summary["host_threads_source"]) == (1, "OMP_NUM_THREADS")


def test_train_sh_writes_model_metrics_and_checkpoints_in_the_sagemaker_layout(two_process_run):
    tmp, proc = two_process_run
    assert proc.returncode == 0
    assert "nproc_per_node=2 nnodes=1 node_rank=0" in proc.stdout
    assert (tmp / "model" / "model.pt").is_file() and (tmp / "model" / "config.json").is_file()
    metrics = json.loads((tmp / "output" / "data" / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["steps"] == 60
    assert sorted(p.name for p in (tmp / "checkpoints").iterdir()) == ["step_00000030", "step_00000060"]
    assert not (tmp / "output" / "failure").exists()


def test_train_sh_reads_multi_node_hosts(tmp_path):
    """The torchrun arguments for host 2 of 3 (the launch itself is not attempted)."""
    env = _layout(tmp_path, {})
    env.update(SM_HOSTS='["algo-3", "algo-1", "algo-2"]', SM_CURRENT_HOST="algo-2", SM_NUM_GPUS="8")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python").write_text('#!/bin/sh\nif [ "$1" = "-m" ]; then echo "ARGS $*"; exit 0; fi\n'
                                 f'exec {sys.executable} "$@"\n')
    (fake / "python").chmod(0o755)
    env["PYTHON"] = str(fake / "python")
    env.pop("MASTER_PORT")
    out = subprocess.run(["bash", str(TRAIN_SH), "--precision", "fp8"], env=env, capture_output=True, text=True,
                         timeout=60).stdout
    assert ("ARGS -m torch.distributed.run --nproc_per_node=8 --nnodes=3 --node_rank=1 "
            "--master_addr=algo-1 --master_port=29500 -m kfp_sagemaker_blackwell.trainer --precision fp8") in out


def test_sigterm_saves_a_checkpoint_and_exits_zero(tmp_path):
    # The trainer holds after step 3 (the hold_* test hook) until the SIGTERM: the stop lands
    # at a known step however slow the machine is, and the checkpoint is the next step's.
    hold = tmp_path / "hold"
    hold.touch()
    env = _layout(tmp_path, {"model-preset": "tiny", "seq-length": "32", "max-steps": "10", "log-every": "1",
                             "checkpoint-every": "0", "hold-after-step": "3", "hold-file": str(hold)})
    # Like the local backend and docker stop: the whole process group gets SIGTERM.
    proc = subprocess.Popen(["bash", str(TRAIN_SH)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines = []
    assert proc.stdout is not None
    deadline = time.time() + 120
    for line in proc.stdout:
        lines.append(line)
        if "step step=3 " in line or time.time() > deadline:
            break
    os.killpg(proc.pid, signal.SIGTERM)
    rest, _ = proc.communicate(timeout=120)
    lines += rest.splitlines()
    assert proc.returncode == 0, "".join(lines)[-3000:]
    jsons = [j for j in map(logformat.parse_json, lines) if j]
    assert any(k == "event" and p["kind"] == "sigterm" for k, p in jsons)
    saved = [p for k, p in jsons if k == "checkpoint" and p["action"] == "saved"]
    summary = [p for k, p in jsons if k == "summary"][-1]
    assert len(saved) == 1 and summary["status"] == "stopped" and summary["steps"] == saved[0]["step"] == 4
    assert (Path(saved[0]["path"]) / "meta.json").is_file()
    assert not (tmp_path / "output" / "failure").exists()
