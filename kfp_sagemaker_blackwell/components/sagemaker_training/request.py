"""The training job's configuration, its validation and the CreateTrainingJob request.

Everything here is pure: ``resolve`` checks every parameter and fails with a
``UserError`` (naming the field and the fix) before any AWS call, and
``build_request`` turns the resolved configuration into the exact request the
launcher sends (and ``--dry-run`` prints).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from kfp_sagemaker_blackwell.catalog.sagemaker import parse_image
from kfp_sagemaker_blackwell.catalog.spec import DIMENSION_BOUNDS
from kfp_sagemaker_blackwell.common import cli, naming, tags
from kfp_sagemaker_blackwell.common.errors import FieldError, UserError, unknown_name
from kfp_sagemaker_blackwell.common.s3 import split_s3_uri
from kfp_sagemaker_blackwell.common.training_job import MAX_RUNTIME_LIMIT_S
from kfp_sagemaker_blackwell.components.sagemaker_training import limits

MAX_VOLUME_SIZE_GB = 16384  # EBS gp2/gp3 ceiling (botocore has min 0 only)
CHECKPOINT_LOCAL_PATH = "/opt/ml/checkpoints"

ROLE_ARN_RE = re.compile(r"^arn:aws[a-z\-]*:iam::\d{12}:role/[\w+=,.@\-/]{1,512}$")
PLAN_ARN_RE = re.compile(
    r"^arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]+:\d{12}:training-plan/([a-z0-9](-*[a-z0-9]){0,62})$"
)
# A KMS key id, key ARN, alias name or alias ARN (what SageMaker accepts for both keys).
KMS_KEY_RE = re.compile(
    r"^(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|mrk-[0-9a-f]{32}"
    r"|alias/[a-zA-Z0-9/_-]{1,256}"
    r"|arn:aws[a-z-]*:kms:([a-z0-9-]+):\d{12}:(?:key/(?:mrk-)?[0-9a-f-]{32,36}"
    r"|alias/[a-zA-Z0-9/_-]{1,256}))$")
CHANNEL_RE = re.compile(r"^[A-Za-z0-9.\-_]{1,64}$")
# botocore's ChannelName pattern admits them, but a channel is the directory
# /opt/ml/input/data/<name>: "." and ".." would be data/ itself and input/.
DOT_NAMES = frozenset({".", ".."})

MODEL_DIMENSIONS = {name: name.replace("_", "-") for name in DIMENSION_BOUNDS}


# Environment keys the container contract or the execution role own: SM_* is how
# SageMaker tells the container its paths, hosts and hyperparameters (SM_HP_<NAME>
# would bypass the hyperparameter checks above); credentials in Environment travel in
# clear in the request, show in DescribeTrainingJob and override the execution role.
AWS_CREDENTIAL_VARIABLES = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                      "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"})
TRAINERS = ("in-repo", "custom")
CUSTOM_TRAINER = "custom"
# What a custom image's job is not checked for (said in a log line and the docstring).
CUSTOM_SKIPPED = ("custom image: skipped the in-repo trainer's checks (its flag table for "
                  "hyperparameters, the memory pre-flight for its model, the precision recipe "
                  "confirmation); still checked: SageMaker's limits, cost, capacity, tags, "
                  "reattach and stop")
SECRET_NAME_RE = re.compile(r"SECRET|PASSWORD|PASSWD|(^|_)TOKEN(_|$)|CREDENTIAL", re.IGNORECASE)


# The parameters whose declared defaults are KFP placeholders (the run's id, the task's
# and the pipeline's names) take these outside a pipeline; run_id is then required.
OUTSIDE_KFP_DEFAULTS = {"run_id": inspect.Parameter.empty, "task": "sagemaker-training",
                        "pipeline": ""}
_Declared: Any = cli.dataclass_of(cli.source_parameters(
    "kfp_sagemaker_blackwell.components.sagemaker_training.component", "sagemaker_training",
    defaults=OUTSIDE_KFP_DEFAULTS), "TrainingJobConfig")


class TrainingJobConfig(_Declared):  # type: ignore[misc]
    """The training component's parameters as values: a keyword-only dataclass derived
    from its signature (the one declaration: names, kinds, defaults; a parameter added
    there is a field here and a flag of the CLI). Nothing is checked here: ``resolve``
    parses and checks every field."""

    @property
    def custom(self) -> bool:
        """A bring-your-own-image job (``trainer="custom"``)."""
        return bool(self.trainer == CUSTOM_TRAINER)

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> TrainingJobConfig:
        """From the component's parameter values (``locals()`` of its body, the CLI's
        flags, a pipeline's argument check): the keys that are fields (not the output
        artifacts), a None container emptied, whole numbers inside lists and dicts ints
        again (``kfp_values.integral``: kfp.local hands them over as floats)."""
        from kfp_sagemaker_blackwell.common.kfp_values import integral

        kw = {}
        for f in dataclasses.fields(cls):
            if f.name not in values:
                continue
            value = integral(values[f.name])
            if value is None and f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            kw[f.name] = value
        return cls(**kw)


@dataclass(frozen=True)
class Budget:
    """``max_cost_usd`` parsed: the USD limit (0: none) for the worst cases of ``jobs``
    jobs together (the items of the ParallelFor this job is one of, ``budget_items``)."""

    limit_usd: float
    jobs: int = 1

    @classmethod
    def parse(cls, max_cost_usd: Any, budget_items: Any) -> Budget:
        if isinstance(max_cost_usd, bool) or not isinstance(max_cost_usd, int | float) or not (
                0 <= max_cost_usd < math.inf):
            raise UserError("max_cost_usd", f"{max_cost_usd!r} is not an amount.",
                            "pass USD as a number >= 0 (0: no limit).")
        # The loop's own list on a cluster, and locally too (kfp.local 2.17 handed the loop
        # item instead: fixed in pipelines/_kfp_local_fixes.py). Anything else would count
        # one job where the loop runs several: refused, not guessed.
        if budget_items is not None and not isinstance(budget_items, list):
            raise UserError("budget_items", f"{budget_items!r:.80} is not a list (the items of "
                            "the ParallelFor this job is one of).",
                            "pass the loop's list itself (budget_items=<the ParallelFor's "
                            "items>), not its item.")
        return cls(float(max_cost_usd), len(budget_items or []) or 1)

    def check(self, worst: Any, *, instance_type: str, jobs: int | None = None,
              missing: str = "", refuse_unknown: bool = True) -> None:
        """Refuses (UserError naming max_cost_usd) a worst case (a ``pricing.Cost``, None
        without a price) that, times the jobs sharing the budget, exceeds the limit; a
        budget with no price to check it against too, unless ``refuse_unknown`` is False
        (a check that does not look up the prices the launch will)."""
        from kfp_sagemaker_blackwell.planning import pricing

        if worst is None and not refuse_unknown:
            return

        pricing.check_budget(self.limit_usd, worst, instance_type=instance_type,
                             jobs=jobs or self.jobs, missing=missing)


@dataclass(frozen=True)
class ResolvedConfig:
    """A validated configuration plus what was derived from it."""

    config: TrainingJobConfig
    region: str
    job_name: str
    hyperparameters: dict[str, str]
    environment: dict[str, str]
    tags: dict[str, str]
    batch_size: int
    activation_checkpointing: bool
    notes: tuple[str, ...] = ()
    budget: Budget = Budget(0.0)

    @property
    def training_plan_name(self) -> str:
        m = PLAN_ARN_RE.match(self.config.training_plan_arn)
        return m.group(1) if m else ""


def _as_str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # KFP passes dict numbers as floats: 1 arrives as 1.0
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _check_s3(fld: str, uri: str, path: str = "OutputDataConfig.S3OutputPath") -> None:
    split_s3_uri(uri, fld)
    limits.check(fld, path, uri)


def resolve(cfg: TrainingJobConfig, *, region: str | None = None) -> ResolvedConfig:
    """Validates everything that can be checked without AWS; raises UserError.

    The steps, in order: identity (run, task, job name), where (region, image,
    role, output), the budget, hardware, model, the memory plan (or a pre-flight
    estimate), capacity (on-demand / plan / spot, limits, checkpoints), network (channels,
    VPC), then the hyperparameters as the trainer will parse them, and tags.
    """
    from kfp_sagemaker_blackwell.common.aws import resolve_region

    cfg = _identity(cfg)
    cfg = dataclasses.replace(cfg, precision_hyperparameters={}, hyperparameters=(
        merge_precision_hyperparameters(cfg.hyperparameters, cfg.precision_hyperparameters,
                                        cfg.precision)))
    resolved_region = _where(cfg, resolve_region(region or cfg.region or None))
    budget = Budget.parse(cfg.max_cost_usd, cfg.budget_items)
    _custom(cfg)
    cfg = _hardware(cfg)  # from here on cfg.precision is a parsed Precision, trusted
    notes: list[str] = []
    if cfg.custom:
        notes.append(CUSTOM_SKIPPED)
        batch_size, checkpointing = cfg.batch_size, cfg.activation_checkpointing
    else:
        model, overrides = _model(cfg)
        batch_size, checkpointing = _memory(cfg, model, notes)
    _capacity(cfg, resolved_region)
    _capacity_controls(cfg)
    if not cfg.custom:
        _fallback_memory(cfg, model, batch_size, checkpointing, notes)
    _network(cfg, resolved_region)
    if cfg.custom:
        hps = _free_hyperparameters(cfg.hyperparameters)
    else:
        hps = _hyperparameters(cfg, model_overrides=overrides, batch_size=batch_size,
                               checkpointing=checkpointing)
    env = _environment(cfg.environment)
    if not cfg.custom:
        _check_with_trainer(hps, env)
    merged_tags = _tags(cfg)
    job_name = cfg.job_name or derived_job_name(cfg, hps)
    if cfg.checkpoint_s3_prefix:  # the job's own prefix, named after the job
        cfg = dataclasses.replace(cfg, checkpoint_s3_prefix="", checkpoint_s3_uri=(
            f"{cfg.checkpoint_s3_prefix.rstrip('/')}/{job_name}"))
        _check_s3("checkpoint_s3_prefix", cfg.checkpoint_s3_uri, "CheckpointConfig.S3Uri")
    return ResolvedConfig(cfg, resolved_region, job_name, hps, env, merged_tags, batch_size,
                          checkpointing, tuple(notes), budget)


def _custom(cfg: TrainingJobConfig) -> None:
    """The trainer switch, and what only a custom image takes: its entry point
    (ContainerEntrypoint), its metric definitions (MetricDefinitions, each a Name and a
    Regex SageMaker and parse_logs search the log with) and the endpoint URL."""
    if cfg.trainer not in TRAINERS:
        raise UserError("trainer", f"{cfg.trainer!r} is not a trainer.",
                        'pass trainer="in-repo" (this project\'s trainer image) or '
                        'trainer="custom" (your own image, entry point and metrics).')
    if cfg.endpoint_url and not re.match(r"^https?://[^\s/]+", cfg.endpoint_url):
        raise UserError("endpoint_url", f"{cfg.endpoint_url!r} is not an http(s) URL.",
                        "pass e.g. http://127.0.0.1:8080 (python -m kfp_sagemaker_blackwell.local_backend serve), "
                        "or leave it empty for AWS.")
    if not cfg.custom:
        for fld in ("entry_point", "metric_definitions"):
            if getattr(cfg, fld):
                raise UserError(fld, "is only taken with trainer=\"custom\" (the in-repo "
                                "trainer has its own entry point and log format).",
                                f'pass trainer="custom", or drop {fld}.')
        return
    if cfg.memory_plan.strip():
        raise UserError("memory_plan", "is memory_estimate's plan for the in-repo trainer's "
                        "model; a custom image's memory is not modelled.",
                        'drop memory_plan with trainer="custom".')
    entry = cfg.entry_point
    if entry:
        if not isinstance(entry, list) or not all(isinstance(a, str) for a in entry):
            raise UserError("entry_point", f"{entry!r} is not a list of strings.",
                            'pass the argv, e.g. ["python", "/opt/ml/input/data/code/train.py"].')
        limits.check("entry_point", "AlgorithmSpecification.ContainerEntrypoint", entry,
                     "pass at most 100 arguments.")
        for arg in entry:
            limits.check("entry_point", "AlgorithmSpecification.ContainerEntrypoint[]", arg,
                         "one line of at most 256 characters each: put a longer script in "
                         "a file of an input channel.")
    defs = cfg.metric_definitions
    if not isinstance(defs, list):
        raise UserError("metric_definitions", f"{defs!r} is not a list.",
                        'pass [{"Name": "loss", "Regex": "loss=([0-9.]+)"}, ...].')
    limits.check("metric_definitions", "AlgorithmSpecification.MetricDefinitions", defs,
                 "pass at most 40 metric definitions.")
    names = set()
    for i, d in enumerate(defs):
        fld = f"metric_definitions[{i}]"
        if not isinstance(d, dict) or set(d) != {"Name", "Regex"}:
            raise UserError(fld, f"{d!r} is not {{Name, Regex}}.",
                            'pass {"Name": "loss", "Regex": "loss=([0-9.]+)"}.')
        limits.check(fld, "AlgorithmSpecification.MetricDefinitions[].Name", d["Name"])
        limits.check(fld, "AlgorithmSpecification.MetricDefinitions[].Regex", d["Regex"])
        try:
            re.compile(d["Regex"])
        except re.error as exc:
            raise UserError(fld, f"Regex {d['Regex']!r} is not a regular expression ({exc}).",
                            "capture the value in a group, e.g. loss=([0-9.]+).") from None
        if d["Name"] in names:
            raise UserError(fld, f"metric {d['Name']!r} is defined twice.",
                            "define each metric once.")
        names.add(d["Name"])


def _free_hyperparameters(hyperparameters: dict[str, Any]) -> dict[str, str]:
    """A custom image's hyperparameters: any names, within SageMaker's limits only."""
    hps: dict[str, str] = {}
    for key, value in (hyperparameters or {}).items():
        key, text = str(key), _as_str(value)
        limits.check("hyperparameters", "HyperParameters{key}", key)
        limits.check("hyperparameters", "HyperParameters{}", text,
                     f"shorten the value of {key!r}.")
        hps[key] = text
    if hps:
        limits.check("hyperparameters", "HyperParameters", hps, "pass fewer.")
    return hps


def _identity(cfg: TrainingJobConfig) -> TrainingJobConfig:
    """Run id, task and job name; an unresolved pipeline placeholder is dropped."""
    for fld in ("run_id", "task"):
        if "{{$" in getattr(cfg, fld):
            raise UserError(fld, f"{getattr(cfg, fld)!r} is an unresolved KFP placeholder (this "
                            "backend does not resolve placeholders in component defaults).",
                            f"pass {fld}=dsl.PIPELINE_"
                            f"{'JOB_ID' if fld == 'run_id' else 'TASK_NAME'}_PLACEHOLDER "
                            "explicitly from the pipeline.")
    if "{{$" in cfg.pipeline:
        cfg = dataclasses.replace(cfg, pipeline="")
    if not cfg.run_id or not cfg.run_id.strip():
        raise UserError("run_id", "is empty.", "pass the KFP run id "
                        "(dsl.PIPELINE_JOB_ID_PLACEHOLDER) or any id unique to this run.")
    try:
        tags.validate_run_id(cfg.run_id)
    except FieldError as exc:
        raise UserError(exc.field, exc.problem + ".",
                        "use letters, digits and . _ : - only.") from None
    if not cfg.task.strip():
        raise UserError("task", "is empty.", "pass the pipeline task name.")
    if cfg.job_name and not naming.is_valid_sagemaker_name(cfg.job_name):
        raise UserError(
            "job_name", f"{cfg.job_name!r} is not a valid training job name.",
            "use 1-63 letters, digits and hyphens, starting and ending with a letter or "
            "digit, or leave it empty for a name derived from the run, task and precision.")
    return cfg


def _where(cfg: TrainingJobConfig, region: str) -> str:
    """The region (known to botocore), the image (in ECR), the role and the output prefix."""
    from kfp_sagemaker_blackwell.common.aws import check_region

    check_region(region, "sagemaker")
    image = cfg.image_uri or ""
    parsed = parse_image(image)
    if parsed is None or not parsed.in_ecr:
        raise UserError("image_uri", f"{image!r} is not an image in Amazon ECR; SageMaker "
                        "training runs images from ECR only.",
                        "push the trainer with build_image and pass its image_uri output, "
                        "<account>.dkr.ecr.<region>.amazonaws.com/<repository>:<tag> or "
                        "...@sha256:<digest>.")
    limits.check("image_uri", "AlgorithmSpecification.TrainingImage", image)
    if not ROLE_ARN_RE.match(cfg.role_arn or ""):
        raise UserError("role_arn", f"{cfg.role_arn!r} is not an IAM role ARN.",
                        "use arn:aws:iam::<12-digit account>:role/<name> of a role SageMaker "
                        "can assume.")
    limits.check("role_arn", "RoleArn", cfg.role_arn)
    _check_s3("output_s3_uri", cfg.output_s3_uri)
    return region


def _hardware(cfg: TrainingJobConfig) -> TrainingJobConfig:
    """Checks the precision (parsed: the config returned carries the Precision), the
    instance type and count and the volume."""
    from kfp_sagemaker_blackwell.catalog import hardware
    from kfp_sagemaker_blackwell.catalog.precisions import parse_precision

    try:
        cfg = dataclasses.replace(cfg, precision=parse_precision(cfg.precision))
    except ValueError as exc:  # with a "did you mean" for a misspelling
        raise unknown_name("precision", exc) from None
    try:
        hardware.check_precision_for_instance(cfg.precision, cfg.instance_type)
    except hardware.UnsupportedPrecisionError as exc:
        raise UserError("precision", str(exc),
                        "choose a precision that GPU runs, or a Blackwell instance type "
                        "(ml.p6-b200.48xlarge).") from None
    except ValueError:
        raise UserError("instance_type", f"{cfg.instance_type!r} is not a known GPU instance "
                        "type.", f"choose one of {', '.join(hardware.INSTANCE_TYPES)}.") from None
    limits.check("instance_type", "ResourceConfig.InstanceType", cfg.instance_type)
    if isinstance(cfg.instance_count, bool) or not isinstance(cfg.instance_count, int) \
            or cfg.instance_count < 1:
        raise UserError("instance_count", f"{cfg.instance_count!r}: must be at least 1.",
                        "pass 1 for one ml.p6-b200.48xlarge (8 GPUs) or more for multi-node.")
    if isinstance(cfg.volume_size_gb, bool) or not isinstance(cfg.volume_size_gb, int) \
            or not 1 <= cfg.volume_size_gb <= MAX_VOLUME_SIZE_GB:
        raise UserError("volume_size_gb", f"{cfg.volume_size_gb!r}: must be 1-"
                        f"{MAX_VOLUME_SIZE_GB}.", "pass the EBS volume size in GB.")
    return cfg


def _model(cfg: TrainingJobConfig) -> tuple[Any, dict[str, int]]:
    """The model the job trains (preset + overrides), and the overrides."""
    from kfp_sagemaker_blackwell.catalog import spec

    for fld, low in (*((k, 0) for k in MODEL_DIMENSIONS if k != "vocab_size"),
                     ("vocab_size", -1)):
        value = getattr(cfg, fld)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            keep = "0" if low == 0 else "-1"
            raise UserError(fld, f"{value!r}: must be a positive integer, or {keep} for the "
                            "preset's.", f"pass {fld}={keep} to keep the preset's value.")
    overrides = {k: getattr(cfg, k) for k in MODEL_DIMENSIONS
                 if getattr(cfg, k) > (0 if k != "vocab_size" else -1)}
    try:
        model = spec.spec_from_values(cfg.model_preset or None, **overrides)
    except FieldError as exc:  # the field it names, when it is one of the parameters
        fld = exc.field if exc.field in ("model_preset", *MODEL_DIMENSIONS) else \
            "model dimensions"
        raise UserError(fld, str(exc) + ".", "pick a preset "
                        f"({', '.join(spec.PRESETS)}) or consistent dimensions.") from None
    for fld, value, low in (("batch_size", cfg.batch_size, 1), ("seq_length", cfg.seq_length, 2),
                            ("max_steps", cfg.max_steps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UserError(fld, f"{value!r}: must be an integer >= {low}.",
                            f"pass {fld}={max(low, 1)} or more.")
    return model, overrides


def _memory(cfg: TrainingJobConfig, model: Any, notes: list[str]) -> tuple[int, bool]:
    """Batch size and checkpointing: the plan's when one is given, else the configuration's,
    checked by a pre-flight memory estimate (refused when predicted not to fit)."""
    from kfp_sagemaker_blackwell.planning.memory_plan import MemoryPlan

    batch_size, checkpointing = cfg.batch_size, cfg.activation_checkpointing
    if not cfg.memory_plan.strip():
        if not cfg.override_memory_check:
            notes.append(preflight(cfg, model))
        else:
            notes.append("memory check skipped (override_memory_check): the job may run out "
                         "of GPU memory")
        return batch_size, checkpointing
    plan = MemoryPlan.from_json(cfg.memory_plan)
    if plan.instance_type and plan.instance_type != cfg.instance_type:
        raise UserError("memory_plan", f"was estimated for {plan.instance_type}, the job "
                        f"runs on {cfg.instance_type}.",
                        "estimate memory for the instance type you train on.")
    if plan.seq_length and plan.seq_length != cfg.seq_length:
        raise UserError("memory_plan", f"was estimated for seq_length {plan.seq_length}, "
                        f"the job uses {cfg.seq_length}.",
                        "estimate memory with the same sequence length.")
    planned = {k: plan.model.get(k) for k in MODEL_DIMENSIONS if k in plan.model}
    ours = {k: getattr(model, k) for k in planned}
    if planned and planned != ours:
        raise UserError("memory_plan", f"was estimated for another model ({planned}; the "
                        f"job trains {ours}).", "estimate memory for the same model.")
    entry = plan.entry_for(cfg.precision)
    if (entry.batch_size, entry.activation_checkpointing) != (batch_size, checkpointing):
        notes.append(
            f"memory plan: batch_size {batch_size} -> {entry.batch_size}, activation "
            f"checkpointing {checkpointing} -> {entry.activation_checkpointing} "
            f"(predicted peak {entry.peak_bytes / 2**30:.1f} GiB/GPU on {plan.gpu})")
    return entry.batch_size, entry.activation_checkpointing


def preflight(cfg: TrainingJobConfig, model: Any) -> str:
    """Estimates this configuration's peak GPU memory (memory_estimate's planner); a note,
    or a UserError with the numbers and the fixes when it is predicted not to fit."""
    from kfp_sagemaker_blackwell.planning import planner

    hw = planner.resolve_hardware(instance_type=cfg.instance_type,
                                  instance_count=cfg.instance_count)
    request = planner.Request(
        model=model, seq_length=cfg.seq_length, hardware=hw, precisions=(cfg.precision,),
        batch_sizes=(cfg.batch_size,),
        activation_checkpointing="on" if cfg.activation_checkpointing else "off")
    entry = planner.plan(request).plan.precisions[cfg.precision]
    if not entry.fits:
        fixes = []
        if entry.max_batch_size_without_checkpointing:
            fixes.append(f"batch_size={entry.max_batch_size_without_checkpointing}")
        if entry.max_batch_size_with_checkpointing and not cfg.activation_checkpointing:
            fixes.append("activation_checkpointing=True with batch_size="
                         f"{entry.max_batch_size_with_checkpointing}")
        elif entry.max_batch_size_with_checkpointing:
            fixes.append(f"batch_size={entry.max_batch_size_with_checkpointing}")
        fixes += ["a lower precision (fp8, mxfp8)", "more instances", "a shorter seq_length",
                  "or override_memory_check=True to launch anyway"]
        raise UserError("batch_size", f"predicted not to fit in GPU memory (memory_estimate, "
                        f"not measured): {entry.reason}", "use " + ", ".join(fixes) + ".")
    return (f"memory pre-flight: predicted peak {entry.peak_bytes / 2**30:.1f} GiB per GPU of "
            f"{hw.gpu.memory_bytes / 2**30:.0f} GiB on {hw.gpu.name} (memory_estimate's model, "
            "not measured)")


def _capacity(cfg: TrainingJobConfig, region: str) -> None:
    """On-demand, a training plan or managed spot; run-time limits; checkpoints."""
    if cfg.training_plan_arn:
        if not PLAN_ARN_RE.match(cfg.training_plan_arn):
            raise UserError("training_plan_arn", f"{cfg.training_plan_arn!r} is not a training "
                            "plan ARN.", "use arn:aws:sagemaker:<region>:<account>:"
                            "training-plan/<name> (from CreateTrainingPlan).")
        limits.check("training_plan_arn", "ResourceConfig.TrainingPlanArn",
                     cfg.training_plan_arn)
        if cfg.training_plan_arn.split(":")[3] != region:
            raise UserError("training_plan_arn", f"is in region "
                            f"{cfg.training_plan_arn.split(':')[3]}, the job in {region}.",
                            "run the job in the plan's region.")
        if cfg.use_spot:
            raise UserError("use_spot", "cannot be combined with a training plan.",
                            "choose either training_plan_arn or use_spot.")
    limits.check("max_runtime_seconds", "StoppingCondition.MaxRuntimeInSeconds",
                 cfg.max_runtime_seconds, "pass the longest the job may train, in seconds.")
    if cfg.max_runtime_seconds > MAX_RUNTIME_LIMIT_S:
        raise UserError("max_runtime_seconds", f"{cfg.max_runtime_seconds}: must be 1-"
                        f"{MAX_RUNTIME_LIMIT_S} (SageMaker's 28 days).",
                        "pass the longest the job may train.")
    if cfg.checkpoint_s3_uri and cfg.checkpoint_s3_prefix:
        raise UserError("checkpoint_s3_prefix", "is given together with checkpoint_s3_uri.",
                        "pass checkpoint_s3_prefix (the job's checkpoints at <prefix>/<job "
                        "name>) or checkpoint_s3_uri (exactly that prefix), not both.")
    if cfg.checkpoint_s3_prefix:
        _check_s3("checkpoint_s3_prefix", cfg.checkpoint_s3_prefix, "CheckpointConfig.S3Uri")
    if cfg.use_spot:
        if not (cfg.checkpoint_s3_uri or cfg.checkpoint_s3_prefix):
            raise UserError("checkpoint_s3_uri", "is required with use_spot: an interrupted spot "
                            "job resumes from its checkpoints.",
                            "pass checkpoint_s3_uri=s3://<bucket>/<prefix>/checkpoints.")
        if cfg.max_wait_seconds < cfg.max_runtime_seconds:
            raise UserError("max_wait_seconds", f"{cfg.max_wait_seconds} is less than "
                            f"max_runtime_seconds={cfg.max_runtime_seconds}.",
                            "set max_wait_seconds >= max_runtime_seconds (it includes the time "
                            "spent waiting for spot capacity).")
        limits.check("max_wait_seconds", "StoppingCondition.MaxWaitTimeInSeconds",
                     cfg.max_wait_seconds)
    elif cfg.max_wait_seconds:
        raise UserError("max_wait_seconds", "is only valid with use_spot=True.",
                        "set use_spot=True or leave max_wait_seconds at 0.")
    if cfg.checkpoint_s3_uri:
        _check_s3("checkpoint_s3_uri", cfg.checkpoint_s3_uri, "CheckpointConfig.S3Uri")
    if cfg.max_retry_attempts:
        limits.check("max_retry_attempts", "RetryStrategy.MaximumRetryAttempts",
                     cfg.max_retry_attempts, "pass 0 (no retries) to 30.")


def instance_choices(cfg: TrainingJobConfig) -> list[tuple[str, int]]:
    """The job's instance types in SageMaker's order of preference, each with its count:
    ``instance_type`` x ``instance_count`` first, then ``fallback_instances`` (each
    ``{"InstanceType": ..., "InstanceCount": ...}``, the count defaulting to
    ``instance_count``). One entry: no InstancePreferences in the request."""
    out = [(cfg.instance_type, cfg.instance_count)]
    for entry in cfg.fallback_instances or []:
        count = entry.get("InstanceCount", cfg.instance_count)  # an int: from_values
        out.append((str(entry.get("InstanceType", "")), count))
    return out


def _capacity_controls(cfg: TrainingJobConfig) -> None:
    """Fallback instance types (ResourceConfig.InstancePreferences), the pending time-out
    (StoppingCondition.MaxPendingTimeInSeconds) and warm pools (KeepAlivePeriodInSeconds),
    within botocore's limits and SageMaker's exclusions."""
    from kfp_sagemaker_blackwell.catalog import hardware

    fallbacks = cfg.fallback_instances or []
    if fallbacks:
        if not isinstance(fallbacks, list):
            raise UserError("fallback_instances", f"{fallbacks!r} is not a list.",
                            'pass [{"InstanceType": "ml.p5.48xlarge", "InstanceCount": 2}, ...].')
        limits.check("fallback_instances", "ResourceConfig.InstancePreferences",
                     [None, *fallbacks], "pass at most 4 fallbacks (5 types in all).")
        if cfg.use_spot:
            raise UserError("fallback_instances", "cannot be combined with use_spot: SageMaker "
                            "takes InstancePreferences with on-demand capacity and flexible "
                            "training plans only.", "choose use_spot or fallback_instances.")
        if cfg.training_plan_arn:
            raise UserError("fallback_instances", "cannot be combined with training_plan_arn "
                            "here (each preference would need its own plan).",
                            "choose training_plan_arn or fallback_instances.")
        for i, entry in enumerate(fallbacks):
            fld = f"fallback_instances[{i}]"
            if not isinstance(entry, dict) or set(entry) - {"InstanceType", "InstanceCount"} \
                    or "InstanceType" not in entry:
                raise UserError(fld, f"{entry!r} is not {{InstanceType, InstanceCount}}.",
                                'pass {"InstanceType": "ml.p5.48xlarge", "InstanceCount": 2} '
                                "(InstanceCount defaults to instance_count).")
        seen = set()
        for i, (itype, count) in enumerate(instance_choices(cfg)[1:]):
            fld = f"fallback_instances[{i}]"
            try:
                hardware.check_precision_for_instance(cfg.precision, itype)
            except hardware.UnsupportedPrecisionError as exc:
                raise UserError(fld, str(exc), "drop that type from the fallbacks or choose "
                                "a precision every type runs (bf16).") from None
            except ValueError:
                raise UserError(fld, f"{itype!r} is not a known GPU instance type.",
                                f"choose one of {', '.join(hardware.INSTANCE_TYPES)}.") from None
            limits.check(fld, "ResourceConfig.InstancePreferences[].InstanceType", itype)
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise UserError(fld, f"InstanceCount {count!r}: must be at least 1.",
                                "pass a count of instances >= 1.")
            if (itype, count) in seen or (itype, count) == (cfg.instance_type,
                                                            cfg.instance_count):
                raise UserError(fld, f"{count} x {itype} is already in the preferences.",
                                "list each instance type and count once.")
            seen.add((itype, count))
    for fld, path, value, fix in (
            ("max_pending_seconds", "StoppingCondition.MaxPendingTimeInSeconds",
             cfg.max_pending_seconds, "pass 0 (SageMaker's default) or 1800-2419200 s."),
            ("keep_alive_seconds", "ResourceConfig.KeepAlivePeriodInSeconds",
             cfg.keep_alive_seconds, "pass 0 (no warm pool) to 21600 s.")):
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(fld, f"{value!r} is not a number of seconds.", fix)
        if value:
            limits.check(fld, path, value, fix)
    if cfg.keep_alive_seconds and cfg.use_spot:
        raise UserError("keep_alive_seconds", "cannot be combined with use_spot: SageMaker "
                        "warm pools keep on-demand instances only.",
                        "choose use_spot or keep_alive_seconds.")


def _fallback_memory(cfg: TrainingJobConfig, model: Any, batch_size: int, checkpointing: bool,
                     notes: list[str]) -> None:
    """The memory pre-flight for every fallback type, with the batch size and checkpointing
    the job will run (refused, naming the type, where one is predicted not to fit)."""
    for i, (itype, count) in enumerate(instance_choices(cfg)[1:]):
        if cfg.override_memory_check:
            notes.append(f"memory check skipped for fallback {count} x {itype} "
                         "(override_memory_check)")
            continue
        other = dataclasses.replace(cfg, instance_type=itype, instance_count=count,
                                    batch_size=batch_size,
                                    activation_checkpointing=checkpointing)
        try:
            notes.append(f"fallback {count} x {itype}: " + preflight(other, model))
        except UserError as exc:
            raise UserError(f"fallback_instances[{i}]", f"{count} x {itype}: {exc.problem}",
                            "drop that fallback, give it more instances, or " + exc.fix) \
                from None


def _encryption(cfg: TrainingJobConfig, region: str) -> None:
    """KMS keys for the output and the training volume; the two isolation switches."""
    for fld, path in (("output_kms_key_id", "OutputDataConfig.KmsKeyId"),
                      ("volume_kms_key_id", "ResourceConfig.VolumeKmsKeyId")):
        key = getattr(cfg, fld)
        if not key:
            continue
        m = KMS_KEY_RE.match(key)
        if m is None:
            raise UserError(fld, f"{key!r} is not a KMS key.",
                            "pass a key id, a key ARN (arn:aws:kms:<region>:<account>:key/<id>), "
                            "an alias (alias/<name>) or an alias ARN.")
        if m.group(1) and m.group(1) != region:
            raise UserError(fld, f"is in region {m.group(1)}, the job in {region}.",
                            "use a KMS key of the job's region.")
        limits.check(fld, path, key)
    for fld in ("enable_network_isolation", "enable_inter_container_traffic_encryption"):
        if not isinstance(getattr(cfg, fld), bool):
            raise UserError(fld, f"{getattr(cfg, fld)!r} is not true or false.",
                            f"pass {fld}=True or False.")


def _network(cfg: TrainingJobConfig, region: str) -> None:
    """Input channels, encryption and isolation, VPC mode."""
    channels = cfg.input_channels or {}
    if channels:
        limits.check("input_channels", "InputDataConfig", channels)
    for name, uri in channels.items():
        if not CHANNEL_RE.match(name) or name in DOT_NAMES:
            raise UserError("input_channels", f"channel name {name!r} is invalid"
                            + (" (it would not be a directory of its own under "
                               "/opt/ml/input/data)." if name in DOT_NAMES else "."),
                            "use 1-64 letters, digits, '.', '-' or '_', not '.' or '..' "
                            "(e.g. train).")
        _check_s3(f"input_channels[{name}]", uri,
                  "InputDataConfig[].DataSource.S3DataSource.S3Uri")
    if bool(cfg.vpc_subnet_ids) != bool(cfg.vpc_security_group_ids):
        raise UserError("vpc_subnet_ids", "and vpc_security_group_ids must be given together.",
                        "pass both (or neither, for no VPC).")
    _encryption(cfg, region)
    if not cfg.vpc_subnet_ids:
        return
    for fld, ids, path, prefix in (
            ("vpc_subnet_ids", cfg.vpc_subnet_ids, "VpcConfig.Subnets", "subnet-"),
            ("vpc_security_group_ids", cfg.vpc_security_group_ids, "VpcConfig.SecurityGroupIds",
             "sg-")):
        limits.check(fld, path, ids, "use fewer (SageMaker's limit for a training job).")
        for item in ids:
            if not isinstance(item, str) or not item.startswith(prefix):
                raise UserError(fld, f"{item!r} is not a {prefix[:-1]} id.", f"use {prefix}...")
            limits.check(fld, path + "[]", item, f"use {prefix}<hex id>.")


def _check_with_trainer(hps: dict[str, str], env: dict[str, str]) -> None:
    """The request's hyperparameters as ``python -m kfp_sagemaker_blackwell.trainer`` will parse and check them."""
    from kfp_sagemaker_blackwell.catalog import flags as trainer_config

    try:
        trainer_config.check_hyperparameters(hps, env)
    except trainer_config.ConfigError as exc:  # a flag a parameter owns names that parameter
        fld = exc.field.replace("-", "_") if exc.field in owned_hyperparameters() \
            and exc.field != "preset" else "hyperparameters"
        raise UserError(fld, f"the trainer would refuse it: {exc.problem.rstrip('.')}.",
                        exc.fix or "fix the value, or see python -m kfp_sagemaker_blackwell.trainer --help for its flags."
                        ) from None
    except ValueError as exc:  # the trainer's own checks (precision names...)
        raise UserError("hyperparameters", f"the trainer would refuse it: {exc}.",
                        "see python -m kfp_sagemaker_blackwell.trainer --help.") from None


def _tags(cfg: TrainingJobConfig) -> dict[str, str]:
    extra = {str(k): _as_str(v) for k, v in (cfg.tags or {}).items()}
    for key, value in extra.items():
        limits.check("tags", "Tags[].Key", key, "use letters, digits, spaces and _ . : / = + - @ "
                     "(1-128 characters).")
        limits.check("tags", "Tags[].Value", value, "use letters, digits, spaces and "
                     "_ . : / = + - @ (up to 256 characters).")
    try:
        merged = tags.merge(tags.run_tags(cfg.run_id, cfg.pipeline, "sagemaker_training"), extra)
    except FieldError as exc:
        raise UserError(exc.field, exc.problem + ".",
                        "SageMaker allows 50 tags, keys up to 128 and values up to 256 "
                        "characters; 3 are taken by the run's tags.") from None
    limits.check("tags", "Tags", merged, "pass fewer tags (3 are the run's own).")
    return merged


def derived_job_name(cfg: TrainingJobConfig, hyperparameters: dict[str, str]) -> str:
    """``naming.training_job_name(run_id, task, precision)``, the task qualified by a digest.

    The digest covers what the job trains (image, instances, hyperparameters), so
    two tasks of one run that differ only by a loop variable other than the
    precision (a batch-size sweep in a ParallelFor shares run id, task name and
    precision) get two jobs, while a retry of the same task (same inputs) gets
    the same name and re-attaches.
    """
    # fallbacks join the digest only when given, so the names of other jobs stay the same
    fallbacks = [instance_choices(cfg)[1:]] if cfg.fallback_instances else []
    variant = naming.short_hash(json.dumps(
        [cfg.image_uri, cfg.instance_type, cfg.instance_count, hyperparameters, *fallbacks],
        sort_keys=True), length=6)
    return naming.training_job_name(cfg.run_id, f"{cfg.task}-{variant}", cfg.precision)


def merge_precision_hyperparameters(
    hyperparameters: dict[str, Any] | None,
    precision_hyperparameters: dict[str, Any] | None,
    precision: str,
) -> dict[str, Any]:
    """``hyperparameters`` plus the entry of ``precision_hyperparameters`` for ``precision``.

    A sweep passes one map for all its precisions (e.g. ``{"nvfp4":
    {"high-precision-lm-head": "true"}}``, as production FP4 recipes keep the LM
    head in high precision); each training task picks its own entry.
    """
    from kfp_sagemaker_blackwell.catalog.precisions import PRECISIONS

    merged = dict(hyperparameters or {})
    for key, extra in (precision_hyperparameters or {}).items():
        if key not in PRECISIONS:
            raise UserError("precision_hyperparameters", f"key {key!r} is not a precision.",
                            f"use one of {', '.join(PRECISIONS)}.")
        if not isinstance(extra, dict):
            raise UserError("precision_hyperparameters", f"the value for {key!r} must be a "
                            "mapping of hyperparameter name to value.",
                            f'e.g. {{"{key}": {{"high-precision-lm-head": "true"}}}}.')
        if key == precision:
            merged.update(extra)
    return merged


def _hyperparameters(cfg: TrainingJobConfig, *, model_overrides: dict[str, int],
                     batch_size: int, checkpointing: bool) -> dict[str, str]:
    hps: dict[str, str] = {"precision": cfg.precision}
    if cfg.model_preset:
        hps["model-preset"] = cfg.model_preset
    for key, value in model_overrides.items():
        hps[MODEL_DIMENSIONS[key]] = str(value)
    hps.update({
        "batch-size": str(batch_size),
        "seq-length": str(cfg.seq_length),
        "max-steps": str(cfg.max_steps),
        "activation-checkpointing": _as_str(checkpointing),
    })
    _check_container_paths(cfg.hyperparameters)
    for key, value in (cfg.hyperparameters or {}).items():
        key = str(key)
        canonical = key.replace("_", "-")
        if canonical in owned_hyperparameters():
            param = {"preset": "model_preset"}.get(canonical, canonical.replace("-", "_"))
            raise UserError("hyperparameters", f"{key!r} is set by the {param} parameter.",
                            f"pass {param}=... instead of hyperparameters[{key!r}].")
        text = _as_str(value)
        if not key:
            raise UserError("hyperparameters", "an empty name.", "name every hyperparameter.")
        limits.check("hyperparameters", "HyperParameters{key}", key)
        limits.check("hyperparameters", "HyperParameters{}", text,
                     f"shorten the value of {key!r}.")
        hps[key] = text
    limits.check("hyperparameters", "HyperParameters", hps,
                 f"pass fewer (this component sets {len(hps) - len(cfg.hyperparameters)} itself).")
    return hps


@functools.cache
def owned_hyperparameters() -> frozenset[str]:
    """The trainer's flags that a parameter of the same name (with underscores) sets: a
    hyperparameter of that name is refused (pass the parameter). ``preset`` is the
    trainer's deprecated spelling of ``model-preset``."""
    from kfp_sagemaker_blackwell.catalog import flags as trainer_config

    flags = {f.name for f in trainer_config.flag_fields()} | {"model_preset", *DIMENSION_BOUNDS}
    return frozenset({"preset"} | {f.name.replace("_", "-")
                                   for f in dataclasses.fields(TrainingJobConfig)
                                   if f.name in flags})


def container_paths() -> dict[str, str]:
    """The trainer's hyperparameters that are container-contract paths, and the SM_*
    variable each is read from (the trainer's declarations: ``sm_path_of``)."""
    from kfp_sagemaker_blackwell.catalog import flags as trainer_config

    return {f.name.replace("_", "-"): f.metadata["sm_path_of"]
            for f in trainer_config.flag_fields() if f.metadata.get("sm_path_of")}


def _check_container_paths(hyperparameters: dict[str, Any]) -> None:
    """The launcher owns where the model, checkpoints and outputs go: SageMaker uploads
    only /opt/ml/model and syncs only the checkpoint dir of CheckpointConfig."""
    paths = container_paths()
    for key in hyperparameters or {}:
        canonical = str(key).replace("_", "-")
        if canonical in paths:
            raise UserError(
                "hyperparameters", f"{key!r} is a path of the SageMaker container contract "
                f"(${paths[canonical]}), owned by the launcher: elsewhere nothing uploads it "
                "(the job would Complete with an empty model.tar.gz).",
                f"drop hyperparameters[{key!r}]; use output_s3_uri for the model and "
                "checkpoint_s3_uri for checkpoints.")


def _check_environment_key(key: str) -> None:
    if key.upper().startswith("SM_"):
        raise UserError("environment", f"{key!r}: SM_* variables are SageMaker's container "
                        "contract (paths, hosts, SM_HP_* hyperparameters), set by SageMaker.",
                        "drop it; pass trainer settings as hyperparameters and outputs "
                        "through output_s3_uri / checkpoint_s3_uri.")
    if key.upper() in AWS_CREDENTIAL_VARIABLES or SECRET_NAME_RE.search(key):
        raise UserError("environment", f"{key!r} looks like a credential or secret: "
                        "Environment travels in clear in the CreateTrainingJob request and "
                        "shows in DescribeTrainingJob (AWS keys also override the role).",
                        "drop it; grant AWS access through the execution role (role_arn) "
                        "and read other secrets from AWS Secrets Manager in the job.")


def _environment(environment: dict[str, Any]) -> dict[str, str]:
    env = {str(k): _as_str(v) for k, v in (environment or {}).items()}
    limits.check("environment", "Environment", env, "pass fewer.")
    for key in env:
        _check_environment_key(key)
    for key, value in env.items():
        limits.check("environment", "Environment{key}", key,
                     "use letters, digits and _ (not starting with a digit).")
        limits.check("environment", "Environment{}", value,
                     f"shorten the value of {key} or pass a file in S3.")
    return env


def algorithm_specification(c: TrainingJobConfig) -> dict[str, Any]:
    """The image, and for a custom one its entry point and metric definitions."""
    spec: dict[str, Any] = {"TrainingImage": c.image_uri, "TrainingInputMode": "File"}
    if c.entry_point:
        spec["ContainerEntrypoint"] = list(c.entry_point)
    if c.metric_definitions:
        spec["MetricDefinitions"] = [{"Name": d["Name"], "Regex": d["Regex"]}
                                     for d in c.metric_definitions]
    return spec


def build_request(r: ResolvedConfig) -> dict[str, Any]:
    """The CreateTrainingJob request for a resolved configuration."""
    c = r.config
    choices = instance_choices(c)
    resource: dict[str, Any] = ({
        "InstancePreferences": [{"InstanceType": t, "InstanceCount": n} for t, n in choices]}
        if len(choices) > 1 else {"InstanceType": c.instance_type,
                                  "InstanceCount": c.instance_count})
    resource["VolumeSizeInGB"] = c.volume_size_gb
    if c.keep_alive_seconds:
        resource["KeepAlivePeriodInSeconds"] = c.keep_alive_seconds
    if c.training_plan_arn:
        resource["TrainingPlanArn"] = c.training_plan_arn
    if c.volume_kms_key_id:
        resource["VolumeKmsKeyId"] = c.volume_kms_key_id
    stopping: dict[str, int] = {"MaxRuntimeInSeconds": c.max_runtime_seconds}
    if c.max_pending_seconds:
        stopping["MaxPendingTimeInSeconds"] = c.max_pending_seconds
    request: dict[str, Any] = {
        "TrainingJobName": r.job_name,
        "RoleArn": c.role_arn,
        "AlgorithmSpecification": algorithm_specification(c),
        "HyperParameters": r.hyperparameters,
        "OutputDataConfig": {"S3OutputPath": c.output_s3_uri,
                             **({"KmsKeyId": c.output_kms_key_id} if c.output_kms_key_id else {})},
        "ResourceConfig": resource,
        "StoppingCondition": stopping,
        # The article's launch disables the profiler: it costs throughput and we log our own.
        "ProfilerConfig": {"DisableProfiler": True},
        "Tags": tags.as_key_value(r.tags),
    }
    if c.enable_network_isolation:
        request["EnableNetworkIsolation"] = True
    if c.enable_inter_container_traffic_encryption:
        request["EnableInterContainerTrafficEncryption"] = True
    if c.enable_infra_check:
        request["InfraCheckConfig"] = {"EnableInfraCheck": True}
    if c.use_spot:
        request["EnableManagedSpotTraining"] = True
        stopping["MaxWaitTimeInSeconds"] = c.max_wait_seconds
    if c.checkpoint_s3_uri:
        request["CheckpointConfig"] = {"S3Uri": c.checkpoint_s3_uri,
                                       "LocalPath": CHECKPOINT_LOCAL_PATH}
    if c.input_channels:
        request["InputDataConfig"] = [
            {"ChannelName": name, "InputMode": "File",
             "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri,
                                             "S3DataDistributionType": "FullyReplicated"}}}
            for name, uri in sorted(c.input_channels.items())
        ]
    if r.environment:
        request["Environment"] = r.environment
    if c.max_retry_attempts:
        request["RetryStrategy"] = {"MaximumRetryAttempts": c.max_retry_attempts}
    if c.vpc_subnet_ids:
        request["VpcConfig"] = {"Subnets": list(c.vpc_subnet_ids),
                                "SecurityGroupIds": list(c.vpc_security_group_ids)}
    return request


def config_fields() -> list[str]:
    return [f.name for f in dataclasses.fields(TrainingJobConfig)]
