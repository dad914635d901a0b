"""A job's instances: their /opt/ml trees, what they run, and their data in and out.

``Instances`` lays out each host's tree for an attempt (``layouts``), downloads the
channels and checkpoints (``prepare``), starts one process group per host with the
image's environment (``start``), syncs /opt/ml/checkpoints to CheckpointConfig.S3Uri
(``sync_checkpoints``) and uploads ``model.tar.gz`` / ``output.tar.gz`` (``upload``).
The ``Supervisor`` decides when; this class knows how.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from kfp_sagemaker_blackwell.local_backend import container, processes, storage
from kfp_sagemaker_blackwell.local_backend.container import HostLayout, free_port, local_gpu_count
from kfp_sagemaker_blackwell.local_backend.jobs import Job
from kfp_sagemaker_blackwell.local_backend.logship import ensure_log_group
from kfp_sagemaker_blackwell.local_backend.processes import HostProcess
from kfp_sagemaker_blackwell.local_backend.state import ExecutorState


class Instances:
    """How a job's hosts are laid out, fed, started and emptied on this machine."""

    def __init__(self, state: ExecutorState) -> None:
        self.state = state
        self.settings = state.settings
        self.num_gpus = local_gpu_count()
        self._log_groups: set[str] = set()

    def layouts(self, job: Job) -> list[HostLayout]:
        root = self.settings.work_dir / job.region / job.name / f"attempt-{job.attempt}"
        return [HostLayout(f"algo-{i + 1}", root / f"algo-{i + 1}")
                for i in range(job.instance_count)]

    def command(self, job: Job) -> tuple[list[str], bool]:
        """(argv of the container's PID 1, whether it is the image's own entry point).

        What runs is what a training image would run (``jobs_api.check_entry_point``): the
        image's entry point (``container.image_entry_point``: this project's init, or the DLC's
        bash for the stock DLC image) running the toolkit's ``train``, which runs train.sh; or
        the request's ContainerEntrypoint, whose program must be one the trainer image has; or
        the in-process backend's ``command`` (its owner's own choice, not a request's)."""
        spec = job.request.get("AlgorithmSpecification") or {}
        entry = spec.get("ContainerEntrypoint")
        args = [str(a) for a in spec.get("ContainerArguments") or []]
        if entry:
            return [str(a) for a in entry] + args, False
        if self.settings.command:
            return list(self.settings.command) + args, False
        image = container.image_entry_point(str(spec.get("TrainingImage") or ""),
                                            self.settings.repo_root)
        return image + args, True

    def prepare(self, s3: Any, job: Job, layouts: list[HostLayout], checkpoint_uri: str) -> None:
        """Lays out each host's /opt/ml tree, downloads the channels and the checkpoints."""
        hosts = [lay.host for lay in layouts]
        for lay in layouts:
            lay.create()
            lay.write_config(job.request, hosts)
            lay.write_hosts(hosts)
            lay.stage_code(self.settings.repo_root)
            for channel in job.request.get("InputDataConfig") or []:
                self._download_channel(s3, channel, lay)
            if checkpoint_uri:
                storage.download_prefix(s3, checkpoint_uri, lay.checkpoint_dir)

    def start(self, job: Job, layouts: list[HostLayout], command: list[str],
              image: bool) -> list[HostProcess]:
        """One process group per host, its output shipped to new log streams."""
        self._ensure_log_group(job.region)
        epoch = max(int(time.time()), job.last_stream_epoch + 1)
        job.last_stream_epoch = epoch
        hosts = [lay.host for lay in layouts]
        master_port = free_port()
        base_env = self._base_env(job)
        commands, envs = [], []
        for lay in layouts:
            argv, namespaced = container.container_command(command, lay)
            # Outside a namespace, the DLC's bash gets the PID-1 treatment of SIGTERM by hand.
            ignore = not namespaced and command[:len(container.DLC_ENTRY_POINT)] == \
                container.DLC_ENTRY_POINT
            commands.append((argv, namespaced, ignore))
            if image:
                envs.append(container.platform_environment(
                    job.request, lay, master_port=master_port, num_gpus=self.num_gpus,
                    base_env=base_env, namespaced=namespaced))
            else:
                envs.append(lay.environment(
                    job.request, hosts, repo_root=self.settings.repo_root,
                    master_port=master_port, num_gpus=self.num_gpus, base_env=base_env))
        # The trainer image's WORKDIR is /opt/ml/code.
        return processes.start_hosts(job.name, commands, layouts, envs,
                                     self.state.client("logs", job.region), epoch,
                                     self.settings.log_flush_s, cwd="code" if image else "")

    def sync_checkpoints(self, s3: Any, layouts: list[HostLayout], uri: str,
                         seen: dict[str, tuple[int, int]]) -> str:
        """Uploads each host's new checkpoint files; returns the symbolic links refused
        (a message naming them, or ''). Other failures are logged: SageMaker keeps training
        when a sync fails."""
        refused = ""
        for lay in layouts:
            try:
                storage.upload_dir(s3, lay.checkpoint_dir, uri, seen,
                                   label=f"{lay.host}:{container.CONTAINER_ROOT}/checkpoints")
            except storage.LinkRefused as exc:
                refused = refused or f"Checkpoint upload to {uri} {exc}"
                print(f"local backend: checkpoint sync to {uri}: {exc}", file=sys.stderr)
            except Exception as exc:
                print(f"local backend: checkpoint sync to {uri} failed: {exc}", file=sys.stderr)
        return refused

    def upload(self, s3: Any, job: Job, *, model: bool) -> str:
        """Uploads algo-1's model and output data; returns an error message or ''."""
        layout = self.layouts(job)[0]
        try:
            if model:
                storage.upload_tar(s3, layout.model_dir, job.model_uri,
                                   f"{container.CONTAINER_ROOT}/model")
            storage.upload_tar(s3, layout.output_data_dir, job.output_uri,
                               f"{container.CONTAINER_ROOT}/output/data")
        except Exception as exc:
            return f"Uploading the model to {job.model_uri} failed: {exc}"
        return ""

    def _download_channel(self, s3: Any, channel: dict[str, Any], lay: HostLayout) -> None:
        name = channel["ChannelName"]
        source = (channel.get("DataSource") or {}).get("S3DataSource")
        if not source:
            raise ValueError(f"channel {name}: only S3DataSource channels are emulated locally")
        if source.get("S3DataType", "S3Prefix") != "S3Prefix":
            raise ValueError(f"channel {name}: S3DataType {source.get('S3DataType')} is not "
                             "emulated locally (use S3Prefix)")
        count = storage.download_prefix(s3, source["S3Uri"], lay.channel_dir(name))
        if count == 0:
            raise ValueError(f"channel {name}: no objects under {source['S3Uri']}")

    def _ensure_log_group(self, region: str) -> None:
        if region in self._log_groups:
            return
        ensure_log_group(self.state.client("logs", region))
        self._log_groups.add(region)

    def _base_env(self, job: Job) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AWS_", "SM_", "TRAINER_", "MASTER_"))}
        env.update(self.settings.endpoint_env)
        env["AWS_REGION"] = env["AWS_DEFAULT_REGION"] = job.region
        user_env = job.request.get("Environment") or {}
        if "OMP_NUM_THREADS" not in user_env and not self.num_gpus:
            # Each local "instance" gets its share of this machine's cores, or of the threads
            # the backend's own OMP_NUM_THREADS allows (a test run with a process per core).
            own = os.environ.get("OMP_NUM_THREADS", "").strip()
            cores = int(own) if own.isdigit() and int(own) > 0 else os.cpu_count() or 1
            share = max(1, cores // max(1, job.instance_count))
            env["OMP_NUM_THREADS"] = str(share)
        return env
