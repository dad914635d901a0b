"""The trainer's flag table (``TrainConfig``): CLI flags, SageMaker hyperparameters and
environment. ``python -m kfp_sagemaker_blackwell.trainer`` parses its start with it, and the training launcher
checks a job's hyperparameters against it before any AWS call (``check_hyperparameters``):
one declaration, torch-free, read by both sides.

Precedence: command-line flags > ``SM_HP_<NAME>`` variables and
``$SM_INPUT_CONFIG_DIR/hyperparameters.json`` (SM_HP_* wins over the file) >
defaults. A hyperparameter's name is its flag without the leading dashes
(``num-layers``; ``num_layers`` is accepted too); boolean flags take
true/false. SageMaker's own ``sagemaker_*`` hyperparameters are ignored; any
other unknown name, and any bad value, fails at start naming the parameter.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import typing
from collections.abc import Mapping
from dataclasses import Field, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from kfp_sagemaker_blackwell.catalog import spec
from kfp_sagemaker_blackwell.catalog.bounds import Bounds, unknown, within
from kfp_sagemaker_blackwell.catalog.errors import FieldError
from kfp_sagemaker_blackwell.catalog.precisions import (
    LOW_PRECISIONS,
    PRECISIONS,
    as_precision,
    parse_precision,
)
from kfp_sagemaker_blackwell.catalog.spec import ModelSpec

SM_DEFAULTS = {
    "SM_MODEL_DIR": "/opt/ml/model",
    "SM_OUTPUT_DIR": "/opt/ml/output",
    "SM_OUTPUT_DATA_DIR": "/opt/ml/output/data",
    "SM_INPUT_CONFIG_DIR": "/opt/ml/input/config",
    "SM_CHECKPOINT_DIR": "/opt/ml/checkpoints",
}


class ConfigError(FieldError):
    """A bad parameter: the message names it and what would be valid.

    ``name`` (``field``): the hyperparameter (flag without dashes) at fault, when one is;
    ``fix``: what to do instead, when known (the text is ``problem`` then "Fix: " and ``fix``).
    """

    def __init__(self, message: str, name: str = "", fix: str = "") -> None:
        super().__init__(name, message, fix, text=f"{message} Fix: {fix}" if fix else message)

    @property
    def name(self) -> str:
        return self.field


def sm_path(name: str, env: Mapping[str, str] | None = None) -> str:
    """The SageMaker path from the environment, else its /opt/ml default when /opt/ml exists
    (inside a SageMaker container), else "" (not written: a laptop run writes nothing there)."""
    values: Mapping[str, str] = os.environ if env is None else env
    if values.get(name):
        return values[name]
    return SM_DEFAULTS[name] if os.path.isdir("/opt/ml") else ""


TRAINING, DATA, OUTPUTS = "training", "data", "logging, checkpoints, outputs"
# How the cross-entropy runs (trainer/loss.py): torch.compile'd, or eager on an fp32 copy.
LOSS_KERNELS = ("compiled", "eager")
# The most steps any step-counting option takes: ten times a 1-trillion-token run of
# 1M-token batches, far beyond SageMaker's 28-day MaxRuntime at any step time seen.
MAX_STEPS = 10**8


def option(default: Any = None, help: str = "", *, group: str = TRAINING,
           choices: tuple[str, ...] | None = None, shown: str | None = None,
           sm_path_of: str = "", hidden: bool = False, valid: str = "",
           convert: Any = None) -> Any:
    """A TrainConfig field that is also a flag (``--name-with-dashes``) and a hyperparameter.

    The field is the one declaration: ``build_parser`` derives the flag's type (from the
    annotation), default, choices, valid range and help from it. ``shown``: the default as
    the help says it, when the flag's own default is None (the value is found at start).
    ``sm_path_of``: the SageMaker variable (``SM_MODEL_DIR``...) the default is read from
    (``sm_path``), at start for the command line and when the config is made in-process.
    ``hidden``: a test hook, absent from ``--help`` and from the hyperparameter names.
    ``valid``: a numeric option's range (``Bounds`` notation, ``[0, 1)``), enforced by the
    parser, by ``validate`` and so by the launcher (``check_hyperparameters``).
    ``convert``: the flag's argparse ``type`` (the parsed value ``validate`` trusts).
    """
    metadata = {"flag": True, "help": help, "group": group, "choices": choices, "convert": convert,
                "shown": shown, "sm_path_of": sm_path_of, "hidden": hidden,
                "valid": Bounds.parse(valid) if valid else None}
    if sm_path_of:
        return field(default_factory=lambda: sm_path(sm_path_of), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class TrainConfig:
    """Everything a training run is given; each field but the model is a flag of ``python -m
    kfp_sagemaker_blackwell.trainer`` and a SageMaker hyperparameter (the same name without dashes)."""

    model: ModelSpec
    # The model's flags (--model-preset and one per dimension) are ModelSpec's, in kfp_sagemaker_blackwell.catalog.spec.
    model_preset: str | None = None
    precision: str = option("bf16", "numerics of the GEMMs", choices=PRECISIONS,
                            convert=as_precision)
    backend: str = option(
        "auto", "te: TransformerEngine layers (GPU); torch: plain PyTorch, low precisions "
        "emulated; auto: te on a GPU with TE installed (every precision), torch otherwise",
        choices=("auto", "te", "torch"))
    device: str = option("auto", "where to train; auto: cuda when a GPU is visible",
                         choices=("auto", "cpu", "cuda"))
    batch_size: int = option(8, "micro-batch per GPU (process)", valid="[1, 65536]")
    seq_length: int = option(128, "tokens per sequence", valid="[2, 1048576]")
    grad_accum_steps: int = option(1, "micro-batches per optimizer step", valid="[1, 65536]")
    max_steps: int = option(200, "optimizer steps to train", valid=f"[1, {MAX_STEPS}]")
    lr: float | None = option(None, "peak learning rate", shown="min(1e-2, 0.64 / hidden-size)",
                              valid="(0, inf)")
    min_lr_ratio: float = option(0.1, "cosine floor as a fraction of lr", valid="[0, 1]")
    warmup_steps: int = option(10, "linear warm-up steps", valid=f"[0, {MAX_STEPS}]")
    weight_decay: float = option(0.1, "AdamW weight decay", valid="[0, inf)")
    # torch.optim.AdamW refuses betas outside [0, 1); beta 1 would never forget a gradient.
    beta1: float = option(0.9, "AdamW beta1", valid="[0, 1)")
    beta2: float = option(0.95, "AdamW beta2", valid="[0, 1)")
    grad_clip: float = option(1.0, "max global gradient norm (0: off)", valid="[0, inf)")
    seed: int = option(1234, "seed of the initial weights and the synthetic data",
                       valid=f"[0, {2**63 - 1}]")
    activation_checkpointing: bool = option(False, "recompute each block in backward")
    high_precision_lm_head: bool = option(
        True, "keep the LM head GEMM in bf16 (production FP8/FP4 recipes do)")
    high_precision_layers: int = option(0, "keep the first and last N blocks in bf16",
                                        valid="[0, 1024]")
    quantized_model_init: bool = option(
        False, "TE backend, FP8/FP4: keep primary weights in FP8 (te.quantized_model_init). "
        "Measured at 1b, batch 4, seq 4096, fp8: on an H200 0.98x plain fp8's speed alone, and with "
        "--no-single-gpu-fsdp 1.304x bf16's, with --cuda-graphs 1.299x (one session); on an H100 "
        "1.05x plain fp8's in six sessions (0.97x and 1.00x in two more), and with either lever "
        "1.31-1.33x bf16's, in four sessions; 2.2 GiB more "
        "peak memory (the estimate models it). Convergence (1b, vocabulary 8,192, batch 8, seq "
        "1024, 300 steps, two seeds, within 0.24 nats of the data's entropy floor): final loss "
        "+0.04% against bf16, plain fp8 +0.07%. Longer runs are not measured: check a new model with "
        "the precision sweep's convergence comparison")
    # TE checks no bound (recipe.DelayedScaling, delayed_scaling.cu): each FP8 module keeps a
    # float32 [len, 3 per GEMM] history on the GPU and the scale update walks it every step,
    # so 1e9 is 12 GB per GEMM at the first forward. 1024 is TE's default and its largest
    # documented use (Megatron-LM defaults to 1).
    fp8_amax_history_len: int = option(
        1024, "DelayedScaling amax history (32, TE fsdp.py's: 0.998x the default's speed on an "
        "H200 at te-fsdp-example batch 8, within the run-to-run spread)", valid="[1, 1024]")
    compile: bool = option(False, "torch.compile each block")
    loss_kernel: str = option(
        "compiled", "the cross-entropy: compiled (torch.compile on a GPU: no fp32 copy of the "
        "logits, 8-12% faster and ~9 bytes less per logit at vocabulary 128k on an H200) or "
        "eager (F.cross_entropy on an fp32 copy); on a CPU both run eager", choices=LOSS_KERNELS)
    # Speed levers (issue 26), measured like for like on one H200 on 2026-12-02 (te-fsdp-example
    # batch 8, seq 8192, no checkpointing, unless stated; benchmarks/trainer/README.md). No
    # default changed: the one that wins, --no-single-gpu-fsdp, costs memory (the estimate
    # models it since session v15: TrainingSetup.single_gpu_fsdp) and the throughput model's
    # calibration grids ran the default. Not measured with any lever: batch 16 with activation
    # checkpointing.
    single_gpu_fsdp: bool = option(
        True, "one GPU (world size 1): wrap the model in FSDP2 as on many (false: a plain module "
        "with the same numerics, fp32 weights and gradients and bf16 compute under torch.autocast, "
        "without FSDP2's per-layer copy-in/out and reduce copies; more GPUs always use FSDP2). "
        "Measured on an H200 (te-fsdp-example, batch 8, seq 8192, no checkpointing; not measured "
        "with checkpointing), false: 1.017x the speed in fp8, 1.011x in bf16; on an H100 (1b, batch 4, "
        "seq 4096) 1.05x in fp8. False holds every block's weight copy from its forward to its "
        "backward: 1.7 GiB more peak memory there, which the memory estimate models "
        "(single_gpu_fsdp)")
    fp8_weight_cache: bool = option(
        False, "TE backend, FP8/FP4 with grad-accum-steps > 1: quantise each weight once per "
        "optimizer step, on the first micro-batch (TE's is_first_microbatch), not once per "
        "micro-batch. Measured on an H200 (te-fsdp-example, batch 4 x 2 micro-batches, fp8): 1.001x, "
        "within the run-to-run spread")
    cuda_graphs: bool = option(
        False, "TE backend on one GPU with --no-single-gpu-fsdp and no activation checkpointing: "
        "capture each block's forward and backward as CUDA graphs (te.make_graphed_callables), "
        "for steps bound by kernel launches. Measured on an H200 on top of --no-single-gpu-fsdp "
        "(te-fsdp-example, batch 8): 1.001-1.003x in fp8, 1.001x in bf16; 1b preset, batch 4, seq "
        "4096: 0.966x fp8, 1.016x bf16 against the default path, within its 4-5% spread (a later H200 "
        "session: 1.053x fp8, 1.034x bf16); on an H100 (sessions v7 and v9) 0.97x there. At batch 1, "
        "seq 2048, where the host's launches bound the step: 2.8x fp8 and 2.5x bf16 on an H200, "
        "2.0-2.2x fp8 and 1.6-1.8x bf16 on an H100. At 1b b4 s4096 (H100) its allocated peak was 11 GiB "
        "lower but its reserved peak no lower (44.6-46.5 GiB against 44.2-46.3): the replays write the "
        "activations into the graphs' private pool, which the allocated peak leaves out (the summary "
        "reports the pool: graph_pool_free_bytes). The memory estimate models it (cuda_graphs: every "
        "block's weight gradients held through the step, 3.6 GiB at 1b): measured footprints "
        "(allocated peak + the pool's free part, 21 runs of the 1b and te-fsdp-example presets) "
        "0.6-15% under that estimate, none over")
    late_sync: bool = option(
        False, "read the step's loss and gradient norm on the host after the optimizer step, not "
        "before it (the GPU does not wait for the host between backward and the update; a "
        "non-finite loss still fails the run at that step); not with fp16, which skips the update "
        "on non-finite gradients. Measured on an H200 (te-fsdp-example, batch 8, fp8): 0.999x, "
        "within the run-to-run spread")
    data_prefetch: bool = option(
        False, "make the next step's first micro-batch on the host, and start its copy to the GPU, "
        "while the GPU runs this step's update, not after the step ends (the same batches: each "
        "is a function of seed, step, rank and micro-batch). For a data source slow on the host: the "
        "synthetic batch takes under 1 ms with the trainer's one host thread per GPU process, and "
        "on one H100 (1b b4 s4096, bf16 and fp8) the flag then changed the step rate by 0.0-0.1%, "
        "so false is the default")
    # Beyond 2**32 even a loss of 1e-5 overflows fp16's 65504 at once.
    loss_scale: float = option(2.0**16, "fp16: initial dynamic loss scale", valid="(0, 4294967296]")
    gc_every: int = option(
        50, "steps between the trainer's own garbage collections (generation 1, as torchtitan's "
        "gc_freq); Python's automatic collector is off during the steps, since its full "
        "collections stalled a step by up to 2x on an H200 (0: leave Python's collector on)",
        valid="[0, 1000000]")
    data_dir: str | None = option(
        None, "directory of token files (*.bin + meta.json, see trainer/README.md)", group=DATA,
        shown="$SM_CHANNEL_TRAIN, else synthetic data with a known entropy floor")
    synthetic_successors: int = option(
        4, "synthetic data: successors per token (entropy floor grows with it)", group=DATA,
        valid="[1, 64]")
    log_every: int = option(10, "steps between step lines", group=OUTPUTS,
                            valid=f"[1, {MAX_STEPS}]")
    timing_warmup_steps: int = option(3, "steps excluded from the steady-state tokens/s",
                                      group=OUTPUTS, valid=f"[0, {MAX_STEPS}]")
    checkpoint_dir: str = option(help="where checkpoints are written and resumed from",
                                 group=OUTPUTS, sm_path_of="SM_CHECKPOINT_DIR")
    checkpoint_every: int = option(100, "steps between checkpoints (0: only on SIGTERM)",
                                   group=OUTPUTS, valid=f"[0, {MAX_STEPS}]")
    keep_checkpoints: int = option(2, "checkpoints kept (the newest)", group=OUTPUTS,
                                   valid="[1, 1000]")
    resume: bool = option(
        True, "resume from the newest complete checkpoint of this run (false: start over; "
        "the first save then replaces the checkpoints of later steps)", group=OUTPUTS)
    model_dir: str = option(help="where the final model is written", group=OUTPUTS,
                            sm_path_of="SM_MODEL_DIR")
    output_dir: str = option(help="failure file", group=OUTPUTS, sm_path_of="SM_OUTPUT_DIR")
    output_data_dir: str = option(help="metrics.json", group=OUTPUTS,
                                  sm_path_of="SM_OUTPUT_DATA_DIR")
    save_model: bool = option(True, "write the final model to the model dir", group=OUTPUTS)
    # Test hooks: stop as if SIGTERM arrived after this step; simulate a CUDA OOM at a step.
    stop_after_step: int = option(0, group=OUTPUTS, hidden=True, valid=f"[0, {MAX_STEPS}]")
    simulate_oom_at_step: int = option(0, group=OUTPUTS, hidden=True, valid=f"[0, {MAX_STEPS}]")
    # Test hook: after this step's line, wait while hold_file exists and no stop was asked
    # (a test interrupts a job at a known step without racing the trainer).
    hold_after_step: int = option(0, group=OUTPUTS, hidden=True, valid=f"[0, {MAX_STEPS}]")
    hold_file: str = option("", group=OUTPUTS, hidden=True)

    def resolved_lr(self) -> float:
        if self.lr is not None:
            return self.lr
        # Peak lr shrinking with width (1e-2 at hidden 64, 3.1e-4 at 2048, 1.6e-4 at 4096).
        return min(1e-2, 0.64 / self.model.hidden_size)

    def validate(self) -> TrainConfig:
        """Checks every value."""
        parse_precision(self.precision)  # the --precision flag's parse: not checked again
        for f in flag_fields():
            bounds, value = f.metadata["valid"], getattr(self, f.name)
            if bounds is not None and value is not None and value not in bounds:
                name = f.name.replace("_", "-")
                raise ConfigError(f"{name}={value!r}: outside its valid range {bounds}.", name,
                                  range_fix(name))
        if self.backend not in ("auto", "te", "torch"):
            raise ConfigError(f"backend={self.backend!r}: choose auto, te or torch")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"device={self.device!r}: choose auto, cpu or cuda")
        if self.model.vocab_size and self.model.vocab_size <= self.synthetic_successors and not self.data_dir:
            raise ConfigError(
                f"vocab-size={self.model.vocab_size}: the synthetic data needs more than "
                f"synthetic-successors={self.synthetic_successors} tokens"
            )
        if self.data_dir and not self.model.vocab_size:
            raise ConfigError("data-dir: token files need a language model (vocab-size > 0)")
        if self.quantized_model_init and self.precision not in LOW_PRECISIONS:
            raise ConfigError(f"quantized-model-init: needs an FP8/FP4 precision, not {self.precision}")
        if self.fp8_weight_cache and self.precision not in LOW_PRECISIONS:
            raise ConfigError(f"fp8-weight-cache: caches FP8/FP4 weights; precision={self.precision} has "
                              "none", "fp8-weight-cache", "leave it off, or use an FP8/FP4 precision")
        if self.cuda_graphs and self.single_gpu_fsdp:
            raise ConfigError("cuda-graphs: the graphs cannot capture FSDP2's per-layer all-gathers",
                              "cuda-graphs", "add --no-single-gpu-fsdp (one GPU), or leave it off")
        if self.cuda_graphs and self.activation_checkpointing:
            raise ConfigError("cuda-graphs: not with activation checkpointing (the graphs capture "
                              "each block's forward and backward as they are)", "cuda-graphs",
                              "add --no-activation-checkpointing, or leave cuda-graphs off")
        if self.late_sync and self.precision == "fp16":
            raise ConfigError("late-sync: fp16 must read the gradient norm before the update (it "
                              "skips the update on non-finite gradients)", "late-sync",
                              "leave it off with fp16")
        return self

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["model"] = self.model.to_dict()
        d["lr"] = self.resolved_lr()
        return d


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        # argparse's "invalid choice" (e.g. --precision bf61) in the one unknown-name
        # message, with its "did you mean"
        m = re.match(r"argument (--[\w-]+): invalid choice: '([^']*)' \(choose from (.*)\)$",
                     message)
        if m:
            choices = re.findall(r"'([^']*)'", m.group(3))
            message = f"argument {m.group(1)}: " + unknown("x", m.group(2), choices)[2:]
        raise ConfigError(message)


def flag_fields() -> list[Field[Any]]:
    """The TrainConfig fields that are flags, in declaration order."""
    return [f for f in fields(TrainConfig) if f.metadata.get("flag")]


def flag_default(f: Field[Any]) -> Any:
    """A flag's own default: the field's, or None where the value is found at start."""
    return None if f.metadata["sm_path_of"] else f.default


def _help(f: Field[Any]) -> str:
    if f.metadata["hidden"]:
        return argparse.SUPPRESS
    default = flag_default(f)
    if f.metadata["shown"]:
        shown = f.metadata["shown"]
    elif f.metadata["sm_path_of"]:
        var = f.metadata["sm_path_of"]
        shown = f"${var}, or {SM_DEFAULTS[var]} inside a SageMaker container"
    else:
        shown = str(default).lower() if isinstance(default, bool) else str(default)
    bounds = f" in {f.metadata['valid']}" if f.metadata["valid"] else ""
    return f"{f.metadata['help']}{bounds} (default: {shown})".replace("%", "%%")


def _flag_type(f: Field[Any], hints: Mapping[str, Any]) -> type:
    kinds = [t for t in typing.get_args(hints[f.name]) if t is not type(None)] \
        or [hints[f.name]]  # Optional[X] -> X
    return kinds[0]  # type: ignore[no-any-return]


def bounds_of(name: str) -> Bounds | None:
    """The valid range declared for the option ``name`` (flag without dashes), if any: a
    TrainConfig field's ``valid``, or a model dimension's (kfp_sagemaker_blackwell.catalog.spec)."""
    attr = name.replace("-", "_")
    for f in flag_fields():
        if f.name == attr:
            return f.metadata["valid"]  # type: ignore[no-any-return]
    return spec.DIMENSION_BOUNDS.get(attr)


def range_fix(name: str) -> str:
    """What to do about a bad value of ``name``: its declared range and meaning."""
    bounds = bounds_of(name)
    if bounds is None:
        return ""
    f = next((f for f in flag_fields() if f.name == name.replace("-", "_")), None)
    if f is None:  # a model dimension: no default of its own (the preset's)
        return f"give {name} a value in {bounds}, or leave it to the model preset."
    return (f"give {name} a value in {bounds} ({f.metadata['help']}; default "
            f"{f.metadata['shown'] or flag_default(f)}).")


def build_parser() -> argparse.ArgumentParser:
    """``python -m kfp_sagemaker_blackwell.trainer``'s flags: the model's (kfp_sagemaker_blackwell.catalog.spec) and one per TrainConfig field."""
    p = _Parser(
        prog="python -m kfp_sagemaker_blackwell.trainer",
        description=(
            "Causal-LM trainer (FSDP2 + TransformerEngine, or plain PyTorch with emulated "
            "FP8/MXFP8/NVFP4 numerics). Every flag can also be given as a SageMaker hyperparameter "
            "(same name without dashes) through SM_HP_<NAME> or hyperparameters.json; flags win."
        ),
    )
    spec.add_model_args(p)
    groups: dict[str, Any] = {}
    hints = typing.get_type_hints(TrainConfig)
    for f in flag_fields():
        group = groups.get(f.metadata["group"]) or groups.setdefault(
            f.metadata["group"], p.add_argument_group(f.metadata["group"]))
        kind = _flag_type(f, hints)
        kwargs: dict[str, Any] = {"default": flag_default(f), "help": _help(f)}
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif f.metadata["valid"] is not None:
            kwargs["type"] = within(kind, f.metadata["valid"])
        elif f.metadata["convert"] is not None:
            kwargs["type"] = f.metadata["convert"]
        elif kind is not str:
            kwargs["type"] = kind
        if f.metadata["choices"]:
            kwargs["choices"] = f.metadata["choices"]
        group.add_argument("--" + f.name.replace("_", "-"), **kwargs)
    return p


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    out = {}
    for a in parser._actions:
        for s in a.option_strings:
            if s.startswith("--") and not s.startswith("--no-"):
                out[s[2:]] = a
    return out


def _decode_sm_hp(raw: str) -> Any:
    """SM_HP_* values are JSON-encoded except plain strings."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def hyperparameters(env: dict[str, str] | None = None) -> dict[str, str]:
    """Hyperparameters from hyperparameters.json, overridden by SM_HP_* (names use dashes)."""
    env = dict(os.environ if env is None else env)
    found: dict[str, Any] = {}
    config_dir = sm_path("SM_INPUT_CONFIG_DIR", env)
    path = Path(config_dir or SM_DEFAULTS["SM_INPUT_CONFIG_DIR"]) / "hyperparameters.json"
    if path.is_file():
        try:
            data = json.loads(path.read_text() or "{}")
        except ValueError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: must hold a JSON object of name -> value")
        found.update(data)
    for key, raw in env.items():
        if key.startswith("SM_HP_"):
            found[key[6:].lower()] = _decode_sm_hp(raw)
    return normalise_hyperparameters(found)


def normalise_hyperparameters(found: Mapping[str, Any]) -> dict[str, str]:
    """Names as flags without dashes (``num_layers`` -> ``num-layers``), values as strings;
    SageMaker's own ``sagemaker_*`` entries dropped."""
    out = {}
    for name, value in found.items():
        norm = str(name).strip().lower().replace("_", "-")
        if norm.startswith("sagemaker-") or norm.startswith("-"):
            continue
        out[norm] = value if isinstance(value, str) else json.dumps(value)
    return out


def hyperparameter_names(parser: argparse.ArgumentParser | None = None) -> list[str]:
    """The hyperparameters the trainer accepts (its documented flags without dashes)."""
    actions = _actions(parser or build_parser())
    return sorted(n for n, a in actions.items() if a.help != argparse.SUPPRESS and n != "help")


def check_hyperparameters(hps: Mapping[str, Any],
                          env: Mapping[str, str] | None = None) -> TrainConfig:
    """What the trainer will make of these hyperparameters at start, without starting it.

    The same parser and checks as ``python -m kfp_sagemaker_blackwell.trainer`` (so a launcher cannot drift
    from the trainer): the validated TrainConfig, or a ConfigError whose ``name`` is
    the hyperparameter at fault (unknown names get a "did you mean"). ``env``: the
    job's environment variables.
    """
    parser = build_parser()
    args = _parse_hyperparameters(parser, _hp_argv(normalise_hyperparameters(hps), parser))
    return from_namespace(args, dict(env or {}))


def _parse_hyperparameters(parser: argparse.ArgumentParser, hp_argv: list[str]) -> argparse.Namespace:
    """The hyperparameters' flags parsed; an error names them as hyperparameters."""
    try:
        return parser.parse_args(hp_argv)
    except ConfigError as exc:
        raise _named(exc, "hyperparameters: ") from None


def _named(exc: ConfigError, prefix: str = "") -> ConfigError:
    """The parser's error (``argument --beta1: ...``) naming the option and its fix."""
    m = re.search(r"argument --([\w-]+)", str(exc))
    name = m.group(1) if m else exc.name
    return ConfigError(f"{prefix}{exc.problem.rstrip('.')}.", name, exc.fix or range_fix(name))


def _hp_argv(hps: dict[str, str], parser: argparse.ArgumentParser) -> list[str]:
    actions = _actions(parser)
    argv: list[str] = []
    for name, value in sorted(hps.items()):
        action = actions.get(name)
        if action is None or name == "help":
            valid = hyperparameter_names(parser)
            close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            raise ConfigError(
                f"hyperparameter {name!r}: unknown; {hint}valid names: {', '.join(valid)}", name)
        text = value.strip()
        if isinstance(action, argparse.BooleanOptionalAction):
            low = text.lower()
            if low in _TRUE:
                argv.append(f"--{name}")
            elif low in _FALSE:
                argv.append(f"--no-{name}")
            else:
                raise ConfigError(f"hyperparameter {name!r}={value!r}: must be true or false", name)
        elif text.lower() in ("", "none", "null") and action.default is None:
            continue
        else:
            argv += [f"--{name}", text]
    return argv


_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def normalise_argv(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """Accepts the forms the SageMaker training toolkit passes hyperparameters in:
    ``--num_layers 4`` (underscores) and ``--activation-checkpointing true`` (a value after a
    boolean flag), besides the plain ``--num-layers 4`` / ``--activation-checkpointing``."""
    actions = _actions(parser)
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        value = None
        if token.startswith("--"):
            name, eq, inline = token[2:].partition("=")
            name = name.replace("_", "-")
            token = f"--{name}" + (f"={inline}" if eq else "")
            action = actions.get(name)
            if isinstance(action, argparse.BooleanOptionalAction):
                if eq:
                    value = inline
                elif i + 1 < len(argv) and argv[i + 1].lower() in _TRUE + _FALSE:
                    value = argv[i + 1]
                    i += 1
                if value is not None:
                    if value.lower() not in _TRUE + _FALSE:
                        raise ConfigError(f"argument --{name}: {value!r} must be true or false")
                    token = f"--{name}" if value.lower() in _TRUE else f"--no-{name}"
        out.append(token)
        i += 1
    return out


def parse(argv: list[str] | None = None, env: dict[str, str] | None = None) -> TrainConfig:
    """Builds the validated configuration from hyperparameters, env and the command line."""
    env = dict(os.environ if env is None else env)
    parser = build_parser()
    hp_args = _parse_hyperparameters(parser, _hp_argv(hyperparameters(env), parser))
    try:
        args = parser.parse_args(normalise_argv(list(argv or []), parser), namespace=hp_args)
    except ConfigError as exc:
        raise _named(exc) from None
    return from_namespace(args, env)


def from_namespace(args: argparse.Namespace, env: dict[str, str] | None = None) -> TrainConfig:
    env = dict(os.environ if env is None else env)
    try:
        model = spec.spec_from_args(args)
    except ValueError as exc:
        # Name the flags / hyperparameters (num-heads), not the dataclass fields (num_heads);
        # spec.preset()'s "model_preset='x': unknown" is the --model-preset flag.
        flags = {f: f.replace("_", "-") for f in ModelSpec.__dataclass_fields__}
        flags["model_preset"] = flags["preset"] = "model-preset"
        text = re.sub(rf"\b({'|'.join(flags)})\b", lambda m: flags[m.group(1)], str(exc))
        named = re.search(rf"\b({'|'.join(flags.values())})\b", text)
        raise ConfigError(text, named.group(1) if named else "") from None
    values = {k: v for k, v in vars(args).items()
              if k in TrainConfig.__dataclass_fields__ and k not in ("model",)}
    values["data_dir"] = values.get("data_dir") or env.get("SM_CHANNEL_TRAIN") or None
    for f in flag_fields():
        if f.metadata["sm_path_of"] and values.get(f.name) is None:  # "" turns the output off
            values[f.name] = sm_path(f.metadata["sm_path_of"], env)
    return TrainConfig(model=model, **values).validate()


def make(model_preset: str | None = None, **kwargs: Any) -> TrainConfig:
    """A validated config for in-process use: model fields (num_layers, vocab_size...) and
    training fields in one call; paths default to nothing written unless given."""
    model_fields = {f for f in ModelSpec.__dataclass_fields__}
    model_kw = {k: kwargs.pop(k) for k in list(kwargs) if k in model_fields}
    model = kwargs.pop("model", None) or spec.spec_from_values(model_preset, **model_kw)
    kwargs.setdefault("checkpoint_dir", "")
    kwargs.setdefault("model_dir", "")
    kwargs.setdefault("output_dir", "")
    kwargs.setdefault("output_data_dir", "")
    return TrainConfig(model=model, model_preset=model_preset, **kwargs).validate()
