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

    code/                               the image's /opt/ml/code: train.sh, trainer/, catalog/

A job without ``ContainerEntrypoint`` starts as SageMaker starts the trainer
image: the image's entry point as PID 1 (``image_entry_point``), which runs the
sagemaker-training toolkit's ``train``, which reads ``input/config/*.json``, sets
``SM_*`` and runs ``SAGEMAKER_PROGRAM`` (train.sh) with the hyperparameters as
arguments. The toolkit finds this tree through ``SAGEMAKER_BASE_DIR`` (its own
variable for a base other than /opt/ml, sagemaker_training/environment.py). The
platform's environment (``platform_environment``) is what SageMaker sets plus the
image's ENV, and three local necessities: SM_CHECKPOINT_DIR (the trainer's default
is the constant /opt/ml/checkpoints), MASTER_ADDR/MASTER_PORT (jobs side by side on
one machine need their own rendezvous port).

A job with ``ContainerEntrypoint`` (or the backend's ``command``) runs that
command instead, as SageMaker does, and gets the SM_* variables from the executor
(``environment``), since no toolkit runs to set them.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The packages the trainer image COPYs into /opt/ml/code (images/trainer/Dockerfile).
CODE_PACKAGES = ("trainer", "catalog")
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


# Master ports come from below the kernel's ephemeral range. A port that the kernel picks for a
# bind to port 0 is ephemeral, and once released, any outgoing connection can take it as its local end
# before torchrun binds it (the launchers' and tests' HTTP polls make thousands). torchrun then
# exits 1 with EADDRINUSE: the likely cause of one two-host job's ExitCode 1 under load (its log
# was not kept, so not confirmed). A port below the range is only ever taken by an explicit bind.
MASTER_PORTS = (20000, 32767)
_given: list[int] = []  # ports this process handed out lately: never twice in a row of jobs


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default; macOS's range starts at 49152


def free_port() -> int:
    """A port for a job's MASTER_PORT: free now on 127.0.0.1, below the ephemeral range
    (``MASTER_PORTS``), not one handed out among this process's last 512; the kernel's
    choice if none is found in 200 tries."""
    import random

    low, high = MASTER_PORTS[0], min(MASTER_PORTS[1], _ephemeral_low() - 1)
    for _ in range(200 if high > low else 0):
        port = random.randint(low, high)
        if port in _given:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.append(port)
        del _given[:-512]
        return port
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


def is_channel_name(name: object) -> bool:
    """Whether ``name`` is one directory of its own under /opt/ml/input/data."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name \
        and "\0" not in name


CONTAINER_ROOT = "/opt/ml"  # what a HostLayout's root is inside SageMaker's container


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
    def code_dir(self) -> Path:
        return self.root / "code"

    @property
    def hosts_file(self) -> Path:
        return self.root / "hosts"

    @property
    def failure_file(self) -> Path:
        return self.output_dir / "failure"

    def channel_dir(self, channel: str) -> Path:
        """/opt/ml/input/data/<channel>; ``ValueError`` for a name that is not one directory
        under it (validation refuses those at Create: this is the second line)."""
        if not is_channel_name(channel):
            raise ValueError(f"channel name {channel!r} is not one directory under "
                             "/opt/ml/input/data")
        return self.data_dir / channel

    def create(self) -> None:
        for d in (self.config_dir, self.data_dir, self.model_dir, self.output_data_dir,
                  self.checkpoint_dir):
            d.mkdir(parents=True, exist_ok=True)

    def stage_code(self, repo_root: Path) -> None:
        """The image's /opt/ml/code (images/trainer/Dockerfile COPYs the same things):
        ``train.sh`` copied (the toolkit chmods it), ``kfp_sagemaker_blackwell/`` holding
        ``trainer/`` and ``catalog/`` (what the trainer imports) linked to the checkout's."""
        self.code_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo_root / "trainer" / "train.sh", self.code_dir / "train.sh")
        package_dir = self.code_dir / "kfp_sagemaker_blackwell"  # the image's /opt/ml/code/kfp_sagemaker_blackwell
        package_dir.mkdir(exist_ok=True)
        shutil.copy2(repo_root / "kfp_sagemaker_blackwell" / "__init__.py", package_dir / "__init__.py")
        for package in CODE_PACKAGES:
            link = package_dir / package
            if not link.exists():
                link.symlink_to(repo_root / "kfp_sagemaker_blackwell" / package, target_is_directory=True)

    def write_hosts(self, hosts: list[str]) -> None:
        """/etc/hosts for the container's mount namespace: every ``algo-<n>`` is this
        machine (the toolkit waits until each host resolves before it starts the program)."""
        lines = ["127.0.0.1 localhost", "::1 localhost"] + [f"127.0.0.1 {h}" for h in hosts]
        self.hosts_file.write_text("\n".join(lines) + "\n")

    def write_config(self, request: dict[str, Any], hosts: list[str]) -> None:
        hps = {str(k): str(v) for k, v in (request.get("HyperParameters") or {}).items()}
        (self.config_dir / "hyperparameters.json").write_text(json.dumps(hps, indent=1))
        (self.config_dir / "resourceconfig.json").write_text(json.dumps(
            {"current_host": self.host, "current_instance_type":
             _instance_type(request),
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
            "SM_CURRENT_INSTANCE_TYPE": _instance_type(request),
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


# ---------------------------------------------------------------- the container's PID 1
# The AWS PyTorch training DLC's repository; an image from it keeps the DLC's ENTRYPOINT.
DLC_IMAGE_RE = re.compile(r"^763104351884\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(\.cn)?/"
                          r"pytorch-training:")
# The DLC's ENTRYPOINT is ["bash", "-m", "start_with_right_hostname.sh"] with the argument
# "train": bash runs the toolkit's `train` as a child (no exec, no trap), so bash is PID 1
# and a SIGTERM it has no trap for is dropped by the kernel (PID 1 gets only the signals it
# handles) and forwarded to nobody. This stand-in behaves the same; the hostname
# workaround it leaves out is done by the container's UTS namespace (``container_command``).
DLC_ENTRY_POINT = ["bash", "-m", "-c", 'if [ "$1" = train ]; then train; exit $?; fi; '
                   'eval "$@"', "start_with_right_hostname.sh"]
# Environment the trainer image sets (images/trainer/Dockerfile ENV), for the image's code dir.
IMAGE_ENV = {"PYTHONUNBUFFERED": "1", "SAGEMAKER_PROGRAM": "train.sh",
             "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "110"}


def image_entry_point(image_uri: str, repo_root: Path) -> list[str]:
    """What PID 1 runs for ``image_uri``, with the argument SageMaker gives (``train``).

    The stock DLC keeps its bash entry point (``DLC_ENTRY_POINT``); any other image is this
    project's trainer image, whose ENTRYPOINT is images/trainer/entrypoint.py (run with this
    Python, where the toolkit is installed)."""
    if DLC_IMAGE_RE.match(image_uri or ""):
        return [*DLC_ENTRY_POINT, "train"]
    return [sys.executable, str(repo_root / "images" / "trainer" / "entrypoint.py"), "train"]


def toolkit_scripts_dir() -> Path:
    """Where pip put sagemaker-training's ``train`` console script for this Python."""
    return Path(sysconfig.get_path("scripts"))


def toolkit_missing() -> str:
    """'' when sagemaker-training is importable here, else what to install."""
    import importlib.util

    if importlib.util.find_spec("sagemaker_training") and (toolkit_scripts_dir() / "train").exists():
        return ""
    return ("the sagemaker-training toolkit is not installed for " + sys.executable +
            ": pip install -c constraints.txt -e '.[local]'")


@functools.lru_cache(maxsize=1)
def namespace_prefix() -> tuple[str, ...]:
    """The ``unshare`` that gives each host its own PID, mount and UTS namespaces, as a
    container has; () where this machine allows none (then see ``container_command``).

    As root the namespaces are made directly; otherwise inside a user namespace where
    the kernel allows unprivileged ones. ``--kill-child``: if unshare dies (it gets SIGKILL
    when the backend dies, ``processes.start_hosts``), the namespace's PID 1 is killed, and
    with it, by the kernel, every process of the container."""
    unshare = shutil.which("unshare")
    if not unshare:
        return ()
    import tempfile

    base: tuple[str, ...] = (unshare, "--pid", "--fork", "--mount-proc", "--mount", "--uts",
                             "--kill-child")
    candidates = [base] if os.geteuid() == 0 else []
    candidates.append((base[0], "--user", "--map-root-user", *base[1:]))

    with tempfile.NamedTemporaryFile("w", prefix="hosts-") as hosts:
        for prefix in candidates:
            try:
                probe = subprocess.run(
                    [*prefix, "sh", "-c", _CONTAINER_SETUP, "sh", "algo-0", hosts.name,
                     "sh", "-c", 'test "$$" = 1 && test "$(hostname)" = algo-0'],
                    capture_output=True, timeout=10)
            except (OSError, subprocess.SubprocessError):
                continue
            if probe.returncode == 0:
                return prefix
    return ()


# Run by the namespace's first process before it becomes the entry point (exec keeps PID 1):
# the hostname SageMaker's hosts answer to, and /etc/hosts resolving every host here.
_CONTAINER_SETUP = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'


def container_command(command: list[str], layout: HostLayout) -> tuple[list[str], bool]:
    """``command`` as a container's PID 1 on this machine; returns (argv, namespaced).

    With namespaces the entry point is PID 1 of its own PID namespace: the kernel drops a
    signal PID 1 does not handle, and SIGKILLs every process left when PID 1 exits, as in a
    container. Without (no ``unshare``, or no permission), the fallback runs the entry point
    as a session leader: the executor signals that process alone, kills the session's process
    group when it exits (processes that called setsid escape this), and a DLC-style bash
    stand-in is started with SIGTERM ignored (what the kernel's PID-1 rule does for bash; unlike
    in a namespace its children inherit the ignore, which the trainer and torchrun override
    with their own handlers); the hostname is this machine's and the toolkit is told to skip
    its wait for ``algo-<n>`` to resolve (SM_STUDIO_LOCAL_MODE)."""
    prefix = namespace_prefix()
    if not prefix:
        return list(command), False
    return [*prefix, "sh", "-c", _CONTAINER_SETUP, "sh", layout.host, str(layout.hosts_file),
            *command], True


def platform_environment(
    request: dict[str, Any],
    layout: HostLayout,
    *,
    master_port: int,
    num_gpus: int,
    base_env: dict[str, str],
    namespaced: bool,
) -> dict[str, str]:
    """The environment PID 1 starts with in the trainer image: the image's ENV, what
    SageMaker sets (TRAINING_JOB_NAME, TRAINING_JOB_ARN, the request's Environment last), and
    the local relocation of /opt/ml (SAGEMAKER_BASE_DIR, SM_CHECKPOINT_DIR) and rendezvous
    port. The toolkit sets the rest of SM_* from the files."""
    env = dict(base_env)
    env.update(IMAGE_ENV)
    env.update({
        "TRAINING_JOB_NAME": request["TrainingJobName"],
        "SAGEMAKER_BASE_DIR": str(layout.root),
        "SAGEMAKER_SUBMIT_DIRECTORY": str(layout.code_dir),
        "SM_CHECKPOINT_DIR": str(layout.checkpoint_dir),
        "PYTHONPATH": str(layout.code_dir),
        "PATH": os.pathsep.join([str(toolkit_scripts_dir()), base_env.get("PATH", os.defpath)]),
        "PYTHON": sys.executable,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        "TRAINER_NPROC_PER_NODE": str(num_gpus or 1),
    })
    if not namespaced:
        env["SM_STUDIO_LOCAL_MODE"] = "true"
    env.update({str(k): str(v) for k, v in (request.get("Environment") or {}).items()})
    return env


def _instance_type(request: dict[str, Any]) -> str:
    """The type the job runs on: SelectedInstanceType when the request has InstancePreferences."""
    rc = request.get("ResourceConfig", {})
    return str(rc.get("SelectedInstanceType") or rc.get("InstanceType") or "")
