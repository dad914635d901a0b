"""The supervisor: one thread per job, from capacity to its last status.

A job's thread (``_run``) acquires capacity, then runs ``_life_cycle``: one
``_attempt`` per start on fresh instances (download, train under ``_watch``, which
acts on stop, spot interruption, runtime limits and failed peers), then uploads and
finishes::

    InProgress: Starting -> Downloading -> Training -> Uploading
    Completed | Failed (FailureReason from output/failure) | Stopping -> Stopped
    spot:       Training -> Interrupted -> Restarting -> Starting -> Downloading -> Training ...

Stopping a job (StopTrainingJob, a spot interruption, the limits) sends SIGTERM to each
container's PID 1 alone, then SIGKILL after ``stop_grace_s``; /opt/ml/checkpoints is
synced to CheckpointConfig.S3Uri every ``CHECKPOINT_SYNC_S`` while the job runs and once
more when its processes have ended (however they ended). How hosts are laid out,
started and emptied is ``Instances``'; who may run is ``Capacity``'s.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from kfp_sagemaker_blackwell.catalog.sagemaker import MAX_RUNTIME_SECONDS
from kfp_sagemaker_blackwell.local_backend import container, processes
from kfp_sagemaker_blackwell.local_backend.capacity import (
    PENDING_TIMEOUT_MESSAGE,
    Capacity,
    PendingTimeout,
    Stopped,
    instance_list,
)
from kfp_sagemaker_blackwell.local_backend.instances import Instances
from kfp_sagemaker_blackwell.local_backend.jobs import Job, TrainingPlan, now
from kfp_sagemaker_blackwell.local_backend.processes import HostProcess
from kfp_sagemaker_blackwell.local_backend.state import ExecutorState

POLL_S = 0.1
CHECKPOINT_SYNC_S = 1.0
FAILED_PEER_GRACE_S = 10.0  # when one host fails, the others get this long after SIGTERM
SHUTDOWN_GRACE_S = 5.0  # a job stopped because the server is going away


class Supervisor:
    """Runs each job's life on its own thread; stops, interrupts and shuts jobs down."""

    def __init__(self, state: ExecutorState, capacity: Capacity, instances: Instances) -> None:
        self.state = state
        self.capacity = capacity
        self.instances = instances
        self.settings = state.settings

    def start(self, job: Job, plan: TrainingPlan | None) -> None:
        job.thread = threading.Thread(target=self._run, args=(job, plan),
                                      name=f"job-{job.name}", daemon=True)
        job.thread.start()

    def interrupt_spot(self, job_name: str, region: str) -> None:
        """Reclaims a training spot job's capacity: its hosts get SIGTERM, then it restarts."""
        with self.state.lock:
            job = self.state.local_job(region, job_name)
            if not job.spot:
                raise ValueError(f"{job_name} is not a managed spot job "
                                 "(EnableManagedSpotTraining is not set)")
            if job.status != "InProgress" or job.secondary_status != "Training":
                raise ValueError(f"{job_name} is not training (status {job.status}/"
                                 f"{job.secondary_status}); only a training spot job can be "
                                 "interrupted")
            job.interrupt_event.set()

    def host_dir(self, job_name: str, region: str, host: str = "algo-1") -> Path:
        """The /opt/ml-like root of ``host`` in the job's current (or last) attempt."""
        with self.state.lock:
            job = self.state.local_job(region, job_name)
            for layout in self.instances.layouts(job):
                if layout.host == host:
                    return layout.root
        raise ValueError(f"{job_name} has no host {host!r}")

    def shutdown(self) -> None:
        """Ends every running job quickly (the server is going away)."""
        state = self.state
        state.shutting_down.set()
        with state.lock:
            jobs = list(state.jobs.values())
            for job in jobs:
                job.stop_event.set()
            state.capacity.notify_all()
        for job in jobs:
            for host in list(job.hosts):
                host.terminate()
        deadline = time.monotonic() + 5
        for job in jobs:
            if job.thread is not None:
                job.thread.join(timeout=max(0.1, deadline - time.monotonic()))
        for job in jobs:
            self._kill(job)
            if job.thread is not None:
                job.thread.join(timeout=5)

    # ---------------------------------------------------------------- the job's life
    def _run(self, job: Job, plan: TrainingPlan | None) -> None:
        state = self.state
        try:
            self.capacity.acquire(job, plan)
        except Stopped:
            state.finish(job, "Stopped", "Stopped")
            return
        except PendingTimeout:
            # Stopped, not Failed, with no FailureReason: botocore's model (StoppingCondition.
            # MaxPendingTimeInSeconds: "can be pending before it is stopped"; SecondaryStatus
            # has no value of its own for it, Stopped's are MaxRuntimeExceeded,
            # MaxWaitTimeExceeded and Stopped) and AWS Batch's guide to SageMaker jobs
            # (docs.aws.amazon.com/batch/latest/userguide/sm_job_stuck_in_runnable_capacity.html:
            # "Training job times out waiting for capacity: STOPPED, secondaryStatus indicates
            # the job timed out in pending"): Stopped/Stopped, the transition's StatusMessage
            # saying so. (A capacity error, FailureReason "CapacityError: ...", is Failed on
            # AWS; not emulated here.)
            state.finish(job, "Stopped", "Stopped",
                         message=PENDING_TIMEOUT_MESSAGE.format(types=instance_list(job)))
            return
        try:
            self._life_cycle(job)
        except Exception as exc:  # a bug here must still end the job
            self._kill(job)
            state.finish(job, "Failed", "Failed", f"InternalServerError: {exc!r}")
        finally:
            self.capacity.release(job, plan)

    def _life_cycle(self, job: Job) -> None:
        state, latency = self.state, self.settings.latency
        sc = job.request.get("StoppingCondition") or {}
        max_runtime = float(sc.get("MaxRuntimeInSeconds") or MAX_RUNTIME_SECONDS)
        max_wait = float(sc.get("MaxWaitTimeInSeconds") or 0) if job.spot else 0.0
        while True:
            outcome, failure = self._attempt(job, max_runtime, max_wait)
            if outcome != "interrupted":
                break
            self._linger(job, latency.restarting_s)
            state.transition(job, "Restarting")
            self._linger(job, latency.restarting_s)
            job.attempt += 1
            state.transition(job, "Starting")
        s3 = state.client("s3", job.region)
        if outcome == "failed":
            self.instances.upload(s3, job, model=False)
            state.finish(job, "Failed", "Failed", failure)
            return
        state.transition(job, "Uploading")
        t0 = time.monotonic()
        upload_error = self.instances.upload(s3, job, model=True)
        time.sleep(latency.uploading_s)
        job.billable_s += time.monotonic() - t0
        if upload_error:
            state.finish(job, "Failed", "Failed", f"ClientError: {upload_error}")
        elif outcome == "completed":
            state.finish(job, "Completed", "Completed")
        elif outcome == "stopped":
            state.finish(job, "Stopped", "Stopped")
        elif outcome == "maxruntime":
            state.finish(job, "Stopped", "MaxRuntimeExceeded")
        else:
            state.finish(job, "Stopped", "MaxWaitTimeExceeded")

    def _attempt(self, job: Job, max_runtime: float, max_wait: float) -> tuple[str, str]:
        """One start of the job on fresh instances: ('completed'|'failed'|...,  failure)."""
        state, instances, latency = self.state, self.instances, self.settings.latency
        reused = job.attempt == 0 and job.warm_pool is not None and job.warm_pool.reused_from
        # a warm pool's instances are provisioned already: no Starting latency
        if self._linger(job, 0.0 if reused else latency.starting_s):
            return "stopped", ""
        state.transition(job, "Downloading")
        with state.lock:
            if job.training_start_time is None:
                job.training_start_time = job.last_modified_time
        started = time.monotonic()
        layouts = instances.layouts(job)
        s3 = state.client("s3", job.region)
        checkpoint_uri = (job.request.get("CheckpointConfig") or {}).get("S3Uri", "")
        try:
            instances.prepare(s3, job, layouts, checkpoint_uri)
            self._linger(job, latency.downloading_s)
        except Exception as exc:
            job.billable_s += time.monotonic() - started
            return "failed", f"ClientError: Data download failed: {exc}"
        if job.stop_event.is_set():
            job.billable_s += time.monotonic() - started
            return "stopped", ""

        state.transition(job, "Training")
        command, image = instances.command(job)
        missing = container.toolkit_missing() if image else ""
        if missing:
            job.billable_s += time.monotonic() - started
            return "failed", f"ClientError: cannot start the training image: {missing}"
        try:
            procs = instances.start(job, layouts, command, image)
        except OSError as exc:
            job.billable_s += time.monotonic() - started
            return "failed", f"ClientError: cannot start {command[0]}: {exc}"
        job.hosts = procs
        oom_kills = processes.oom_kill_count()
        reason, failed_host = self._watch(job, procs, checkpoint_uri, started, max_runtime,
                                          max_wait)
        processes.reap(procs)
        job.hosts = []
        refused = instances.sync_checkpoints(s3, layouts, checkpoint_uri, {}) \
            if checkpoint_uri else ""
        elapsed = time.monotonic() - started
        job.billable_s += elapsed
        job.training_s += elapsed
        if reason:
            return reason, ""
        if all(p.proc.returncode == 0 for p in procs):
            # a refused link fails the job: the local backend's own rule (on the host, a
            # link's target is the host's file, not the container's)
            return ("failed", f"ClientError: {refused}") if refused else ("completed", "")
        return "failed", processes.failure_reason(
            procs, failed_host, oom_kills=processes.oom_kill_count() - oom_kills)

    def _linger(self, job: Job, seconds: float) -> bool:
        """Stays in the current secondary status ``seconds`` (the latency profile), less if
        the job is stopped; returns whether it was."""
        return job.stop_event.wait(seconds) if seconds > 0 else job.stop_event.is_set()

    def _watch(self, job: Job, procs: list[HostProcess], checkpoint_uri: str,
               started: float, max_runtime: float, max_wait: float) -> tuple[str, int]:
        """Waits for the hosts, acting on stop, interruption, limits and failed peers;
        returns (why the job was ended, or '', the index of the failed host or -1)."""
        grace = self.settings.stop_grace_s
        reason = ""
        failed_host = -1
        kill_at: float | None = None
        seen: dict[str, tuple[int, int]] = {}
        last_sync = time.monotonic()
        s3 = self.state.client("s3", job.region)
        layouts = [p.layout for p in procs]

        def terminate(why: str, kill_after: float) -> None:
            nonlocal reason, kill_at
            reason = why
            kill_at = time.monotonic() + kill_after
            for p in procs:
                p.terminate()

        while any(p.proc.poll() is None for p in procs):
            time.sleep(POLL_S)
            t = time.monotonic()
            if kill_at is None:
                if job.stop_event.is_set():
                    terminate("stopped", SHUTDOWN_GRACE_S if self.state.shutting_down.is_set()
                              else grace)
                elif job.interrupt_event.is_set():
                    self.state.transition(job, "Interrupted")
                    terminate("interrupted", grace)
                elif job.training_s + (t - started) > max_runtime:
                    terminate("maxruntime", grace)
                elif max_wait and (now() - job.creation_time).total_seconds() > max_wait:
                    terminate("maxwait", grace)
                else:
                    for i, p in enumerate(procs):
                        if p.proc.returncode not in (None, 0):
                            failed_host = i
                            kill_at = t + FAILED_PEER_GRACE_S
                            for other in procs:
                                other.terminate()
                            break
            elif t >= kill_at:
                for p in procs:
                    p.signal(signal.SIGKILL)
            if t - last_sync >= CHECKPOINT_SYNC_S:
                for p in procs:
                    p.sample_memory()
                if checkpoint_uri:
                    self.instances.sync_checkpoints(s3, layouts, checkpoint_uri, seen)
                last_sync = t
        job.interrupt_event.clear()
        if not reason and failed_host < 0:
            bad = [i for i, p in enumerate(procs) if p.proc.returncode != 0]
            failed_host = bad[0] if bad else -1
        return reason, failed_host

    def _kill(self, job: Job) -> None:
        for host in list(job.hosts):
            host.signal(signal.SIGKILL)
