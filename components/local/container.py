"""The SageMaker training container contract, laid out under a local directory.

SageMaker gives each host of a training job an ``/opt/ml`` tree and a set of
environment variables; the training toolkit (and our ``train.sh``) read them.
Here each host gets ``<root>/<attempt>/algo-<n>/`` with the same layout::

    input/config/hyperparameters.json   all values strings, as in the request
    input/config/resourceconfig.json    {"current_host", "hosts", "network_interface_name"}
    input/config/inputdataconfig.json   the channels
    input/data/<channel>/               channels downloaded from S3
    model/                              SM_MODEL_DIR, tarred to model.tar.gz
    output/failure                      the trainer's failure reason
    output/data/                        SM_OUTPUT_DATA_DIR, tarred to output.tar.gz
    checkpoints/                        SM_CHECKPOINT_DIR, synced with CheckpointConfig.S3Uri

and the environment carries the SM_* variables plus what a multi-host launch
needs on loopback (MASTER_ADDR/MASTER_PORT, since ``algo-1`` does not resolve
here).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Values the toolkit parses as JSON keep their JSON form; anything else is passed raw,
# so SM_HP_PRECISION=bf16 while SM_HP_BATCH_SIZE=8 (sagemaker-training's behaviour).


def hp_env_value(value: str) -> str:
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if isinstance(parsed, str) else json.dumps(parsed)


def env_name(name: str) -> str:
    return name.upper().replace("-", "_").replace(".", "_")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def local_gpu_count() -> int:
    """GPUs visible here (0 on a CPU-only machine); nvidia-smi, so torch is not imported."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return 0
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


@dataclass
class HostLayout:
    host: str
    root: Path

    @property
    def input_dir(self) -> Path:
        return self.root / "input"

    @property
    def config_dir(self) -> Path:
        return self.root / "input" / "config"

    @property
    def data_dir(self) -> Path:
        return self.root / "input" / "data"

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def output_dir(self) -> Path:
        return self.root / "output"

    @property
    def output_data_dir(self) -> Path:
        return self.root / "output" / "data"

    @property
    def checkpoint_dir(self) -> Path:
        return self.root / "checkpoints"

    @property
    def failure_file(self) -> Path:
        return self.output_dir / "failure"

    def channel_dir(self, channel: str) -> Path:
        return self.data_dir / channel

    def create(self) -> None:
        for d in (self.config_dir, self.data_dir, self.model_dir, self.output_data_dir,
                  self.checkpoint_dir):
            d.mkdir(parents=True, exist_ok=True)

    def write_config(self, request: dict[str, Any], hosts: list[str]) -> None:
        hps = {str(k): str(v) for k, v in (request.get("HyperParameters") or {}).items()}
        (self.config_dir / "hyperparameters.json").write_text(json.dumps(hps, indent=1))
        (self.config_dir / "resourceconfig.json").write_text(json.dumps(
            {"current_host": self.host, "current_instance_type":
             request.get("ResourceConfig", {}).get("InstanceType", ""),
             "hosts": hosts, "network_interface_name": "lo"}, indent=1))
        channels = {c["ChannelName"]: {k: v for k, v in c.items() if k != "ChannelName"}
                    for c in request.get("InputDataConfig") or []}
        (self.config_dir / "inputdataconfig.json").write_text(json.dumps(channels, indent=1))

    def environment(
        self,
        request: dict[str, Any],
        hosts: list[str],
        *,
        repo_root: Path,
        master_port: int,
        num_gpus: int,
        base_env: dict[str, str],
    ) -> dict[str, str]:
        hps = {str(k): str(v) for k, v in (request.get("HyperParameters") or {}).items()}
        channels = [c["ChannelName"] for c in request.get("InputDataConfig") or []]
        env = dict(base_env)
        env.update({
            "TRAINING_JOB_NAME": request["TrainingJobName"],
            "SM_MODEL_DIR": str(self.model_dir),
            "SM_OUTPUT_DIR": str(self.output_dir),
            "SM_OUTPUT_DATA_DIR": str(self.output_data_dir),
            "SM_INPUT_DIR": str(self.input_dir),
            "SM_INPUT_CONFIG_DIR": str(self.config_dir),
            "SM_INPUT_DATA_CONFIG": (self.config_dir / "inputdataconfig.json").read_text(),
            "SM_CHECKPOINT_DIR": str(self.checkpoint_dir),
            "SM_CHANNELS": json.dumps(sorted(channels)),
            "SM_HOSTS": json.dumps(hosts),
            "SM_CURRENT_HOST": self.host,
            "SM_CURRENT_INSTANCE_TYPE": request.get("ResourceConfig", {}).get("InstanceType", ""),
            "SM_NUM_GPUS": str(num_gpus),
            "SM_NUM_CPUS": str(os.cpu_count() or 1),
            "SM_HPS": json.dumps({k: json.loads(v) if _is_json(v) else v
                                  for k, v in hps.items()}),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(master_port),
            "TRAINER_NPROC_PER_NODE": str(num_gpus or 1),
            "PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join(
                [str(repo_root)] + ([base_env["PYTHONPATH"]] if base_env.get("PYTHONPATH") else [])
            ),
            "PYTHONUNBUFFERED": "1",
        })
        for channel in channels:
            env[f"SM_CHANNEL_{env_name(channel)}"] = str(self.channel_dir(channel))
        for key, value in hps.items():
            env[f"SM_HP_{env_name(key)}"] = hp_env_value(value)
        # The request's Environment comes last, as SageMaker applies it over the image's.
        env.update({str(k): str(v) for k, v in (request.get("Environment") or {}).items()})
        return env

    def failure_reason(self) -> str:
        try:
            return self.failure_file.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            return ""


def _is_json(value: str) -> bool:
    try:
        json.loads(value)
    except ValueError:
        return False
    return True
