"""The training loop: ``run(config) -> summary`` builds a ``Trainer`` and runs it.

A ``Trainer`` holds one run (configuration, precision plan, world, log, stop signal, meter,
typed state, what it built) and reads top to bottom: ``start``, ``resume``, ``train`` (``step``
after step: ``forward_backward`` and the update; ``save`` as due), ``finish``. ``run`` can be
called repeatedly in one process (the GPU memory grid and the tests do); ``main`` is
``python -m kfp_sagemaker_blackwell.trainer``: it parses the configuration, calls ``run`` and
turns failures into SageMaker's failure file and exit code.
"""

from __future__ import annotations

import gc
import json
import math
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import record_function

from kfp_sagemaker_blackwell.catalog import flags as config_mod
from kfp_sagemaker_blackwell.catalog import logformat
from kfp_sagemaker_blackwell.catalog.errors import FieldError
from kfp_sagemaker_blackwell.catalog.flags import ConfigError, TrainConfig
from kfp_sagemaker_blackwell.trainer import (
    allocator,
    build,
    checkpoint,
    data,
    emulation,
    gc_schedule,
    metrics,
    parallel,
    precision,
)
from kfp_sagemaker_blackwell.trainer import loss as loss_mod

SUMMARY_KEYS = (
    "status", "steps", "final_loss", "tokens", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu",
    "mfu", "peak_allocated_bytes", "peak_reserved_bytes", "precision", "backend", "emulated",
    "world_size", "entropy_floor", "elapsed_s",
)


class TrainingFailed(RuntimeError):
    """Raised by ``run`` after it has logged the failure; carries the summary and the reason."""

    def __init__(self, reason: str, summary: dict[str, Any], kind: str):
        super().__init__(reason)
        self.reason, self.summary, self.kind = reason, summary, kind


class _Log:
    def __init__(self, is_main: bool, out=None):
        self.is_main = is_main
        self.out = out

    def line(self, text: str, all_ranks: bool = False) -> None:
        if self.is_main or all_ranks:
            print(text, file=self.out or sys.stdout, flush=True)

    def json(self, kind: str, payload: dict[str, Any], all_ranks: bool = False) -> None:
        self.line(logformat.format_json(kind, payload), all_ranks)

    def event(self, kind: str, message: str, all_ranks: bool = False, **extra: Any) -> None:
        self.json("event", {"kind": kind, "message": message, **extra}, all_ranks)


class _StopFlag:
    """SIGTERM (SageMaker's StopTrainingJob, spot interruption) asks for a checkpoint and exit."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to the peak, cosine down to min_lr_ratio * peak at max_steps (step is 1-based)."""
    peak = cfg.resolved_lr()
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return peak * step / cfg.warmup_steps
    span = max(1, cfg.max_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = peak * cfg.min_lr_ratio
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def _fingerprint(cfg: TrainConfig, world: parallel.World) -> dict[str, Any]:
    """What a checkpoint must share with the run resuming it (the manifest records it):
    the model, the data order (world size, batch layout, seed) and the numerics (a bf16
    checkpoint resumed as mxfp8 would label a bf16 curve mxfp8)."""
    return {"model": cfg.model.to_dict(), "world_size": world.world_size, "batch_size": cfg.batch_size,
            "seq_length": cfg.seq_length, "grad_accum_steps": cfg.grad_accum_steps, "seed": cfg.seed,
            "precision": cfg.precision}


def _oom_reason(exc: BaseException, cfg: TrainConfig, world: parallel.World, step: int) -> str:
    text = str(exc)
    m = re.search(r"[Tt]ried to allocate ([\d.]+ [KMGT]i?B)", text)
    alloc = m.group(1) if m else "an unknown amount"
    where = "the CPU"
    total = ""
    if world.device.type == "cuda":
        props = torch.cuda.get_device_properties(world.device)
        where = f"{props.name}"
        total = f" (total {props.total_memory / 2**30:.1f} GiB, {torch.cuda.memory_allocated() / 2**30:.1f} GiB allocated by PyTorch)"
    else:
        g = re.search(r"total capacity of ([\d.]+ [KMGT]i?B)", text)
        total = f" (total {g.group(1)})" if g else ""
    return (
        f"CUDA out of memory: tried to allocate {alloc} on {where}{total} at step {step} with "
        f"precision={cfg.precision} batch-size={cfg.batch_size} seq-length={cfg.seq_length} "
        f"activation-checkpointing={str(cfg.activation_checkpointing).lower()} on {world.world_size} GPU(s). "
        "Fix: lower batch-size or seq-length, turn on activation-checkpointing, or use more GPUs "
        "(FSDP shards model and optimizer states across them)."
    )


def _failure(exc: BaseException, cfg: TrainConfig, world: parallel.World, step: int) -> tuple[str, str]:
    """A failure's kind (oom or error) and its one-line reason."""
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
        return "oom", _oom_reason(exc, cfg, world, step)
    if isinstance(exc, FieldError):  # names its field and the fix: said as it is
        return "error", str(exc)
    first = (str(exc).strip().splitlines() or [""])[0]
    return "error", f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _write_failure(output_dir: str | None, reason: str) -> None:
    """SageMaker's failure file (``<output>/failure``: the job's FailureReason), best effort."""
    if not output_dir:
        return
    try:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        (Path(output_dir) / "failure").write_text(reason[:1024])
    except OSError:
        pass


def _writable(path: str, log: _Log, what: str) -> str:
    if not path:
        return ""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        return path
    except OSError as exc:
        log.event("output_skipped", f"not writing {what}: {path} is not writable ({exc.strerror})")
        return ""


@dataclass
class TrainState:
    """What a run knows as it goes: the summary reports it, a checkpoint saves part of it."""

    step: int = 0  # the last optimizer step done
    loss: float | None = None  # its loss (None after a non-finite one)
    status: str = "failed"
    resumed_from: int | None = None  # the checkpoint's step, when resumed
    last_checkpoint: str | None = None
    loss_scale: float = 1.0  # fp16's dynamic loss scale (1 otherwise)
    good_steps: int = 0  # fp16: finite steps since the scale last changed
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, loss): metrics.json


@dataclass(frozen=True)
class _Outputs:
    """The writable output folders ("" = not written)."""

    checkpoints: str
    model: str
    data: str


@dataclass(frozen=True)
class _StepResult:
    lr: float
    loss: float
    grad_norm: float
    skipped: bool  # fp16: non-finite gradients, optimizer step skipped
    stop: bool  # SIGTERM (any rank) or --stop-after-step


def run(cfg: TrainConfig, log_out=None) -> dict[str, Any]:
    """Trains per ``cfg`` and returns the summary dict. Raises TrainingFailed (after logging the
    failure and writing the failure file) on OOM, a non-finite loss or any other error."""
    t_start = time.perf_counter()
    device_type = parallel.resolve_device(cfg.device)
    plan = precision.plan(cfg.precision, cfg.backend, device_type)  # refuses before any work
    alloc = allocator.configure() if device_type == "cuda" else None  # before the first CUDA allocation
    world = parallel.init(device_type)
    precision.check_levers(cfg, plan.backend, world.world_size)
    return Trainer(cfg, plan, world, _Log(world.is_main, log_out), alloc=alloc, t_start=t_start).run()


class Trainer:
    """One training run: its configuration, precision plan, world, log, stop signal (SIGTERM),
    meter and state, and what it builds (data source, sharded model, optimizer). ``run`` calls
    ``start``, ``resume``, ``train`` (``step`` after step: ``forward_backward`` and the update,
    ``save`` as due) and ``finish``; a failure is logged, summarised and raised."""

    def __init__(self, cfg: TrainConfig, plan: precision.Plan, world: parallel.World,
                 log: _Log | None = None, *, alloc: allocator.Settings | None = None,
                 t_start: float | None = None) -> None:
        self.cfg, self.plan, self.world = cfg, plan, world
        self.log = log or _Log(world.is_main)
        self.stop = _StopFlag()
        self.state = TrainState()
        self.allocator = alloc  # the CUDA allocator's configuration (GPU runs)
        self.t_start = time.perf_counter() if t_start is None else t_start
        self.fingerprint = _fingerprint(cfg, world)
        self.outputs = _Outputs(checkpoints="", model="", data="")
        self.source: Any = None  # the data source (its entropy floor goes into the summary)
        self.batches = _Batches(None, cfg, world, plan)  # the source's micro-batches (set by start)
        self.model: Any = None
        self.optimizer: Any = None
        self.amax_states: list[Any] = []  # emulated delayed-scaling histories
        self.meter: metrics.Meter | None = None
        self.collector: gc_schedule.GcSchedule | None = None  # the garbage collector's schedule

    def run(self) -> dict[str, Any]:
        """Start-up, resume, the steps, the outputs: the summary. Any failure is logged, its
        summary written and raised as TrainingFailed; the model is released either way."""
        self.stop.install()
        try:
            self.start()
            status = self.train(self.resume())
            return self.finish(status)
        except TrainingFailed:
            raise
        except BaseException as exc:  # noqa: BLE001 - every failure is reported the same way
            kind, reason = _failure(exc, self.cfg, self.world, self.state.step + 1)
            self.log.event(kind, reason, all_ranks=True)
            raise self._failed(reason, kind, measured=False) from exc
        finally:
            self.stop.restore()
            if self.collector is not None:
                self.collector.stop()
            self.model = self.optimizer = None
            gc.collect()
            if self.world.device.type == "cuda":
                torch.cuda.empty_cache()

    def start(self) -> None:
        """The start-up lines (config, recipe, world, data, model); builds the data source, the
        sharded model and the optimizer; opens the output folders."""
        cfg, plan, world, log = self.cfg, self.plan, self.world, self.log
        if world.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        log.json("config", cfg.to_dict())
        log.line(logformat.format_recipe(logformat.RecipeRecord(plan.precision, plan.recipe, plan.backend, plan.emulated)))
        log.json("world", _world_record(cfg, plan, world))
        self.source = data.make_source(cfg)
        self.batches = _Batches(self.source, cfg, world, plan)
        log.json("data", self.source.describe())
        self.model = build.model(cfg, world, plan)
        self.optimizer = build.optimizer(self.model, cfg, world)
        if cfg.data_prefetch:  # this optimizer's own hooks run before global ones (a timer's sync)
            self.optimizer.register_step_post_hook(self.batches.after_update)
        get_amax: Any = getattr(self.model, "amax_states", None)
        self.amax_states = get_amax() if get_amax is not None else []
        log.json("model", build.model_record(cfg, plan, world))
        self.outputs = _Outputs(
            checkpoints=_writable(cfg.checkpoint_dir, log, "checkpoints"),
            model=_writable(cfg.model_dir, log, "the model") if cfg.save_model else "",
            data=_writable(cfg.output_data_dir, log, "metrics"),
        )
        if self.outputs.data and world.is_main:  # a stale file must not speak for this run (train.sh reads it)
            (Path(self.outputs.data) / "metrics.json").unlink(missing_ok=True)

    def resume(self) -> int:
        """Loads the newest complete checkpoint when there is one to resume from (logging why
        newer ones were skipped); returns the step to continue after (0 for a fresh start). A
        checkpoint of another run, or checkpoints none of which is usable, is a CheckpointError."""
        cfg, state, checkpoints = self.cfg, self.state, self.outputs.checkpoints
        state.loss_scale = cfg.loss_scale if cfg.precision == "fp16" else 1.0
        if not (checkpoints and cfg.resume):
            return 0
        done = checkpoint.restore(checkpoints, self.fingerprint, self.model, self.optimizer, self.world.rank)
        for name, reason in done.skipped:
            self.log.event("checkpoint_unusable", f"{name} skipped: {reason}", path=str(Path(checkpoints) / name))
        if done.path is None:
            return 0
        meta = done.meta
        start_step = int(meta["step"])
        state.loss_scale = float(meta.get("loss_scale", state.loss_scale))
        state.good_steps = int(meta.get("good_steps", 0))
        state.step, state.loss, state.resumed_from = start_step, meta.get("loss"), start_step
        record: dict[str, Any] = {"action": "resumed", "step": start_step, "path": str(done.path)}
        if done.skipped:
            record["skipped"] = [name for name, _ in done.skipped]
        self.log.json("checkpoint", record)
        return start_step

    def train(self, start_step: int) -> str:
        """The steps after ``start_step`` up to max_steps, or until a stop; returns the status
        (completed or stopped). A non-finite loss raises TrainingFailed."""
        cfg, plan, world, log, state = self.cfg, self.plan, self.world, self.log, self.state
        tokens_per_step = world.world_size * cfg.batch_size * cfg.grad_accum_steps * cfg.seq_length
        peak = plan.gpu.peak_for(cfg.precision) if (plan.gpu and not plan.emulated) else None
        bf16_peak = plan.gpu.peak_for("bf16") if (plan.gpu and not plan.emulated) else None
        meter = self.meter = metrics.Meter(cfg.model, cfg.seq_length, tokens_per_step, world.world_size, peak,
                                           cfg.timing_warmup_steps, world.device.type == "cuda", bf16_peak)
        collector = self.collector = gc_schedule.GcSchedule(cfg.gc_every)
        collector.start()
        params = [p for p in self.model.parameters() if p.requires_grad]
        autocast = _autocast_factory(cfg, plan, world)
        flag = torch.zeros(2, dtype=torch.float64, device=world.device)
        step = start_step
        while step < cfg.max_steps:
            step += 1
            t0 = time.perf_counter()
            collector.before_step(step)
            result = self.step(step, params, autocast, flag)
            if not math.isfinite(result.loss):
                reason = f"non-finite loss ({result.loss}) at step {step}: lower lr or use a higher precision"
                log.event("nan_loss", reason)
                state.step, state.loss = step, None
                raise self._failed(reason, "nan_loss", measured=True)
            if world.device.type == "cuda":
                torch.cuda.synchronize()
            meter.record(step - start_step, time.perf_counter() - t0)
            state.step, state.loss = step, result.loss
            state.losses.append((step, result.loss))
            if step % cfg.log_every == 0 or step == cfg.max_steps or step == start_step + 1 or result.stop:
                rec, timing = meter.step_record(step, result.loss, result.lr, result.grad_norm,
                                                cfg.precision, plan.emulated, collector.take())
                log.line(logformat.format_step(rec, timing) + (" skipped=1" if result.skipped else ""))
            if result.stop:
                log.event("sigterm", f"stop requested at step {step}: saving a checkpoint and exiting")
                if self.outputs.checkpoints:
                    self.save()
                else:
                    log.event("checkpoint_skipped", "no writable checkpoint-dir: nothing saved")
                return "stopped"
            if cfg.hold_after_step and step == cfg.hold_after_step:  # a test's known step to stop at
                while cfg.hold_file and Path(cfg.hold_file).exists() and not self.stop.requested:
                    time.sleep(0.01)
            if self.outputs.checkpoints and cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                self.save()
        return "completed"

    def step(self, step: int, params: list[torch.Tensor], autocast, flag: torch.Tensor) -> _StepResult:
        """One optimizer step: forward and backward over the micro-batches, clipping, the update
        (fp16: skipped on non-finite gradients, loss scale adjusted), the loss averaged over ranks
        and whether any rank was asked to stop (``flag``: one all-reduce for both). The host reads
        the loss and the norm before the update, or after it with ``--late-sync``."""
        cfg, world, state = self.cfg, self.world, self.state
        if cfg.simulate_oom_at_step and step == cfg.simulate_oom_at_step:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 139.81 GiB "
                "(simulated by --simulate-oom-at-step)"
            )
        optimizer = self.optimizer
        lr = lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = self.forward_backward(step, autocast)
        if state.loss_scale != 1.0:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(1.0 / state.loss_scale)
        with record_function("trainer.clip_grad_norm"):
            gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
            if hasattr(gnorm, "full_tensor"):
                gnorm = gnorm.full_tensor()
        flag[0] = loss_sum / cfg.grad_accum_steps
        flag[1] = 1.0 if (self.stop.requested or (cfg.stop_after_step and step == cfg.stop_after_step)) else 0.0
        if world.world_size > 1:
            dist.all_reduce(flag)
        if cfg.late_sync:  # fp16 refused: nothing to skip, one read after the update
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss_total, stop_flag, grad_norm = torch.stack((flag[0], flag[1], gnorm.to(flag.dtype))).tolist()
            emulation.end_step(self.amax_states)
            return _StepResult(lr, loss_total / world.world_size, grad_norm, False, stop_flag > 0)
        loss_value = float(flag[0]) / world.world_size
        grad_norm = float(gnorm)
        skipped = False
        if cfg.precision == "fp16" and not math.isfinite(grad_norm):
            skipped, state.loss_scale, state.good_steps = True, state.loss_scale / 2, 0
            self.log.event("loss_scale", f"non-finite gradients at step {step}: step skipped, loss scale -> {state.loss_scale:g}")
        else:
            optimizer.step()
            if cfg.precision == "fp16":
                state.good_steps += 1
                if state.good_steps % 1000 == 0:
                    state.loss_scale *= 2
        optimizer.zero_grad(set_to_none=True)
        emulation.end_step(self.amax_states)
        return _StepResult(lr, loss_value, grad_norm, skipped, bool(flag[1] > 0))

    def forward_backward(self, step: int, autocast) -> torch.Tensor:
        """The micro-batches' forward and backward (gradients accumulated, synchronised on the last);
        returns the sum of their losses, on the device. ``--fp8-weight-cache`` tells TE which
        micro-batch is the step's first (it quantises the weights then, and reuses them after)."""
        cfg, model = self.cfg, self.model
        loss_sum = torch.zeros((), device=self.world.device, dtype=torch.float32)
        for micro in range(cfg.grad_accum_steps):
            set_sync: Any = getattr(model, "set_requires_gradient_sync", None)
            if set_sync is not None:
                set_sync(micro == cfg.grad_accum_steps - 1)
            inputs, targets = self.batches.get(step, micro)
            kwargs = {"is_first_microbatch": micro == 0} if cfg.fp8_weight_cache else {}
            with autocast():
                out = model(inputs, **kwargs)
            with record_function("trainer.loss"):  # named for benchmarks/trainer/profile_step.py
                loss = loss_mod.lm_loss(out, targets, cfg.loss_kernel)
            loss_sum += loss.detach()
            ((loss / cfg.grad_accum_steps) * self.state.loss_scale).backward()
            del out, loss
        return loss_sum

    def save(self) -> str:
        """A checkpoint of ``state.step`` (model, optimizer, loss scale) in the checkpoint dir."""
        cfg, world, state = self.cfg, self.world, self.state
        meta = {"loss": state.loss, "loss_scale": state.loss_scale, "good_steps": state.good_steps,
                "precision": cfg.precision}
        t0 = time.perf_counter()
        path = checkpoint.save(self.outputs.checkpoints, state.step, self.model, self.optimizer, meta,
                               cfg.keep_checkpoints, world.local_rank, world.rank,
                               fingerprint=self.fingerprint, local_world_size=world.local_world_size)
        state.last_checkpoint = str(path)
        self.log.json("checkpoint", {"action": "saved", "step": state.step, "path": str(path),
                                     "seconds": round(time.perf_counter() - t0, 3)})
        return str(path)

    def finish(self, status: str) -> dict[str, Any]:
        """The final model (completed runs), the summary line and metrics.json."""
        cfg, state, outputs = self.cfg, self.state, self.outputs
        if status == "completed" and outputs.model:
            extra = {"model": cfg.model.to_dict(), "precision": cfg.precision, "steps": state.step,
                     "backend": self.plan.backend,
                     "format": "torch.save of the full state dict (bf16 weights unless precision=fp32)"}
            checkpoint.save_final_model(self.model, outputs.model,
                                        torch.float32 if cfg.precision == "fp32" else torch.bfloat16,
                                        extra, self.world.rank)
        summary = self.summary(status)
        self.log.json("summary", summary)
        if outputs.data and self.world.is_main:
            payload = {**summary, "loss_curve": state.losses}
            (Path(outputs.data) / "metrics.json").write_text(json.dumps(payload, indent=1, default=str))
        state.status = status
        return summary

    def summary(self, status: str, *, measured: bool = True) -> dict[str, Any]:
        """The run's summary; ``measured``: with the meter's figures (throughput, MFU), else the
        peaks of memory only (a run that failed before or outside its steps)."""
        cfg, plan, world, state = self.cfg, self.plan, self.world, self.state
        tokens_per_step = world.world_size * cfg.batch_size * cfg.grad_accum_steps * cfg.seq_length
        out: dict[str, Any] = {
            "status": status,
            "steps": state.step,
            "final_loss": state.loss,
            "tokens": state.step * tokens_per_step,
            "precision": cfg.precision,
            "backend": plan.backend,
            "recipe": plan.recipe,
            "emulated": plan.emulated,
            "world_size": world.world_size,
            "device": world.device.type,
            "gpu": plan.gpu_name,
            "entropy_floor": getattr(self.source, "entropy_floor", None) if self.source is not None else None,
            "elapsed_s": round(time.perf_counter() - self.t_start, 3),
            "batch_size": cfg.batch_size,
            "seq_length": cfg.seq_length,
            "activation_checkpointing": cfg.activation_checkpointing,
            "params": cfg.model.total_params(),
            "resumed_from_step": state.resumed_from,
            "checkpoint": state.last_checkpoint,
            "host_threads": world.host_threads, "host_threads_source": world.host_threads_source,
            **(self.allocator.to_dict() if self.allocator is not None else {}),
        }
        if self.collector is not None:
            out.update(self.collector.summary())
        if measured and self.meter is not None:
            out.update(self.meter.summary(plan.emulated))
        else:
            for k in ("tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu",
                      "peak_allocated_bytes", "peak_reserved_bytes"):
                out.setdefault(k, None)
            if world.device.type == "cuda":
                out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
                out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        if cfg.cuda_graphs and world.device.type == "cuda":
            out.update(metrics.graph_pool_bytes())
        return out

    def _failed(self, reason: str, kind: str, *, measured: bool) -> TrainingFailed:
        """The failure's summary logged and its failure file written: the error to raise."""
        summary = self.summary("failed", measured=measured)
        summary["failure_reason"] = reason
        self.log.json("summary", summary)
        _write_failure(self.cfg.output_dir, reason)
        return TrainingFailed(reason, summary, kind)


def _world_record(cfg: TrainConfig, plan: precision.Plan, world: parallel.World) -> dict[str, Any]:
    """The start-up's world line: ranks, nodes, device, versions, the GPU and its peaks."""
    te_version = None
    if plan.backend == "te":
        import transformer_engine

        te_version = transformer_engine.__version__
    world_info: dict[str, Any] = {
        "world_size": world.world_size, "nodes": world.nodes, "local_world_size": world.local_world_size,
        "device": world.device.type, "torch": torch.__version__, "transformer_engine": te_version,
        "dist_backend": dist.get_backend(),
    }
    if world.device.type == "cuda":
        props = torch.cuda.get_device_properties(world.device)
        world_info.update(gpu=props.name, gpu_memory_bytes=props.total_memory,
                          compute_capability=f"{props.major}.{props.minor}",
                          peak_tflops=plan.gpu.peak_for(cfg.precision) if plan.gpu else None,
                          peak_tflops_bf16=plan.gpu.peak_for("bf16") if plan.gpu else None)
    return world_info


def _autocast_factory(cfg: TrainConfig, plan: precision.Plan, world: parallel.World):
    """The forward's context: the unsharded model's compute autocast (``parallel.compute_autocast``)
    around TE's recipe autocast (TE backend)."""
    import contextlib

    compute = parallel.compute_autocast(world, plan.param_dtype, parallel.shards(world, cfg.single_gpu_fsdp))
    recipe: Any = contextlib.nullcontext
    if plan.backend == "te":
        from kfp_sagemaker_blackwell.trainer import te_backend

        recipe = te_backend.autocast_factory(cfg, plan)

    @contextlib.contextmanager
    def both():
        with compute(), recipe():
            yield

    return both


class _Batches:
    """A step's micro-batches from the data source; with ``--data-prefetch`` the next step's first
    one is made right after the optimizer step is launched (``after_update``, the optimizer's
    step post-hook), while the GPU still runs the update, pinned and copied without blocking the
    host on a GPU: the next step does not start with the GPU waiting for the host. A source that
    fails while prefetching is asked again when the step needs the batch, and fails there as it
    would have without the flag. A skipped update (fp16) prefetches nothing."""

    def __init__(self, source, cfg: TrainConfig, world: parallel.World, plan) -> None:
        self.source, self.cfg, self.world, self.plan = source, cfg, world, plan
        self.ready: tuple[int, Any] | None = None  # (step, its first micro-batch), made early
        self.step = 0  # the step whose batches were asked for last

    def after_update(self, *_: Any) -> None:
        self.prefetch(self.step + 1)

    def get(self, step: int, micro: int):
        self.step = step
        ready, self.ready = self.ready, None
        if ready is not None and micro == 0 and ready[0] == step:
            return ready[1]
        return _batch(self.source, self.cfg, self.world, step, micro, self.plan)

    def prefetch(self, step: int) -> None:
        cfg = self.cfg
        self.ready = None
        if not cfg.data_prefetch or step > cfg.max_steps or isinstance(self.source, data.RandomHidden):
            return
        try:
            self.ready = (step, _batch(self.source, cfg, self.world, step, 0, self.plan, pin=True))
        except Exception:  # noqa: BLE001 - raised again, in its place, by the step that needs it
            self.ready = None


def _batch(source, cfg: TrainConfig, world: parallel.World, step: int, micro: int, plan, pin: bool = False):
    if isinstance(source, data.RandomHidden):
        dtype = plan.param_dtype or torch.float32
        x = source.batch_on(step, world.rank, micro, cfg.batch_size, cfg.seq_length, world.device, dtype)
        return x, None
    tokens = source.batch(step, world.rank, micro, cfg.batch_size, cfg.seq_length)
    if pin and world.device.type == "cuda":
        tokens = tokens.pin_memory()  # the copy below then leaves the host free at once
    tokens = tokens.to(world.device, non_blocking=True)
    return tokens[:, :-1], tokens[:, 1:]


def main(argv: list[str] | None = None) -> int:
    """``python -m kfp_sagemaker_blackwell.trainer``: 0 when completed or stopped after a checkpoint, 1 on failure
    (with $SM_OUTPUT_DIR/failure written), 2 on a configuration error."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        config_mod.build_parser().print_help()
        return 0
    try:
        cfg = config_mod.parse(argv)
    except (ConfigError, ValueError) as exc:
        reason = f"configuration error: {exc}"
        print(logformat.format_json("event", {"kind": "config_error", "message": reason}), flush=True)
        _write_failure(config_mod.sm_path("SM_OUTPUT_DIR"), reason)
        return 2
    code = 0
    try:
        summary = run(cfg)
        code = 0 if summary["status"] in ("completed", "stopped") else 1
    except TrainingFailed:
        code = 1
    except (ConfigError, ValueError) as exc:  # refused before any work (e.g. the capability check)
        reason = f"{exc}"
        print(logformat.format_json("event", {"kind": "config_error", "message": reason}), flush=True)
        _write_failure(cfg.output_dir, reason)
        code = 2
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass
    return code
