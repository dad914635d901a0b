"""Parameter groups several components and pipelines declare, each written once.

KFP reads a component's interface from its function's source, so every component and
pipeline that takes a group writes the group out literally in its signature, as one block
(tests/test_declarations.py holds each block to the group here: the same names, in this
order, with these kinds and defaults). The group's documentation is written here only:
:func:`documented` puts its ``Args:`` entries into the docstring of a function that
declares the group (``common.component`` does it for every component, the pipelines for
theirs), so the KFP UI, the command lines and docs/components.md all show it.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from kfp_sagemaker_blackwell.catalog.spec import PRESETS

REQUIRED = inspect.Parameter.empty
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Parameter:
    """One declared parameter: name, value kind, default (``REQUIRED``: none), help: what a
    group holds here, and what ``common.cli`` reads off a signature and its docstring."""

    name: str
    kind: type
    default: Any
    help: str

    @property
    def flag(self) -> str:
        return flag_name(self.name)

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


def flag_name(name: str) -> str:
    """``model_preset`` -> ``--model-preset``: the one spelling of a parameter's flag."""
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class Group:
    name: str
    parameters: tuple[Parameter, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parameters)

    def taken_by(self, names: list[str]) -> bool:
        """Whether a signature of these parameter ``names`` takes the group: its parameters,
        in their order, as one block."""
        first = names.index(self.names[0]) if self.names[0] in names else -1
        return first >= 0 and tuple(names[first:first + len(self.names)]) == self.names


# The model the job trains: a preset, each dimension overriding it (catalog/spec.py).
MODEL = Group("model", (
    Parameter("model_preset", str, "8b",
              f"Model preset ({', '.join(PRESETS)}); the dimensions below override it."),
    Parameter("num_layers", int, 0, "Transformer blocks (0: the preset's)."),
    Parameter("hidden_size", int, 0, "Model width (0: the preset's)."),
    Parameter("num_heads", int, 0, "Attention heads, a divisor of hidden_size (0: the preset's)."),
    Parameter("num_kv_heads", int, 0,
              "Key/value heads for grouped-query attention (0: the preset's)."),
    Parameter("ffn_hidden_size", int, 0, "MLP inner size (0: the preset's)."),
    Parameter("vocab_size", int, -1, "Vocabulary size (-1: the preset's; 0: a bare block stack)."),
))

# How a training job's data is kept private.
ENCRYPTION = Group("encryption", (
    Parameter("output_kms_key_id", str, "",
              "KMS key (id, ARN, alias or alias ARN) SageMaker encrypts the model artifacts and "
              "output with (OutputDataConfig.KmsKeyId); the execution role needs "
              "kms:GenerateDataKey/Decrypt on it (iam). Empty: S3's default."),
    Parameter("volume_kms_key_id", str, "",
              "KMS key for the training instances' EBS volumes (ResourceConfig.VolumeKmsKeyId); "
              "the launching role needs kms:CreateGrant."),
    Parameter("enable_network_isolation", bool, False,
              "No network access for the training container (EnableNetworkIsolation); "
              "SageMaker still moves inputs, checkpoints and the model."),
    Parameter("enable_inter_container_traffic_encryption", bool, False,
              "Encrypt traffic between the instances of a multi-node job "
              "(EnableInterContainerTrafficEncryption; slower collectives)."),
))

# Where a pipeline run works: as whom, in which bucket, prefix and region.
PIPELINE_RUN = Group("pipeline run", (
    Parameter("role_arn", str, REQUIRED, "SageMaker execution role ARN the training jobs run as."),
    Parameter("bucket", str, REQUIRED,
              "S3 bucket for build contexts, checkpoints and model artifacts."),
    Parameter("region", str, "us-west-2",
              "AWS region of every resource (and of the prices and capacity looked up)."),
    Parameter("s3_prefix", str, "kfp-sagemaker-blackwell",
              "Prefix in the bucket; the run writes under <prefix>/<run id>/."),
))

# The capacity a sweep's jobs run on (sagemaker_training documents each in full).
CAPACITY = Group("capacity", (
    Parameter("training_plan_arn", str, "",
              "A SageMaker Flexible Training Plan to run in (reserved capacity)."),
    Parameter("use_spot", bool, False,
              "Managed Spot Training (checkpoints in S3, resumed after interruption)."),
    Parameter("max_wait_seconds", int, 0,
              "Spot only: the longest a job may wait plus run (>= max runtime)."),
    Parameter("fallback_instances", list, [],
              "Instance types to fall back to when SageMaker has no capacity for the first "
              "(ResourceConfig.InstancePreferences), e.g. [{\"InstanceType\": "
              "\"ml.p5.48xlarge\", \"InstanceCount\": 2}]; on-demand only."),
    Parameter("max_pending_seconds", int, 0,
              "How long a job may wait for capacity (1800-2419200 s; 0: SageMaker's default)."),
    Parameter("keep_alive_seconds", int, 0,
              "Warm pool: keep a job's instances this long for the next job (up to 21600 s; "
              "the retained time is billed and in the worst case)."),
))

# What a sweep's jobs may cost together, at which prices.
SWEEP_BUDGET = Group("sweep budget", (
    Parameter("max_cost_usd", float, 0.0,
              "Budget for all training jobs together: no job starts when their worst cases "
              "(instances x max runtime x instance-hour price, summed) exceed it; 0: no limit."),
    Parameter("instance_hour_prices", dict, {},
              "Instance type -> USD per instance-hour for the cost figures and the budget (e.g. "
              "a Savings Plans rate); default: the AWS Price List API, else the shipped table "
              "(every cost names its price's source)."),
))

# The limits of a training plan: what plan_training searches within (plan_and_train hands
# them on).
PLAN_LIMITS = Group("plan limits", (
    Parameter("max_batch_size", int, 0,
              "Largest micro-batch per GPU to consider (0 = the largest that fits, capped at "
              "65,536 tokens per GPU and 4M tokens per step as the memory estimate caps it)."),
    Parameter("deadline_hours", float, 0.0,
              "The run must finish within this many hours (predicted time; 0: no deadline)."),
    Parameter("max_cost_usd", float, 0.0,
              "Budget: a configuration whose worst case exceeds it is never chosen, and it is "
              "the chosen configuration's spend guard (0: none; the guard is then the planned "
              "worst case)."),
    Parameter("instance_types", list, [],
              "Candidate SageMaker instance types (default: every GPU type in the catalog with a "
              "price; every one when training plans are searched)."),
    Parameter("max_instance_count", int, 16,
              "The most instances per job (counts tried: powers of two up to it, and it)."),
    Parameter("precisions", list, [],
              "Allowed precisions (default: every precision each GPU runs, but those the "
              "convergence comparison failed)."),
    Parameter("max_risk", str, "medium",
              "The risk ceiling (catalog/precisions.py's order: baseline, low, medium, higher, "
              "high, or 0-4): a precision above it is ranked only when the convergence "
              "comparison passed it; the report shows what the best such row would save. "
              "Default medium: the lowest level holding bf16 and FP8 with delayed or current "
              "scaling, the formats validated in practice."),
))

# The trainer image a pipeline builds and what its cleanup keeps.
PIPELINE_IMAGE_AND_CLEANUP = Group("pipeline image and cleanup", (
    Parameter("trainer_repository", str, "kfp-sagemaker-blackwell/trainer",
              "ECR repository of the trainer image."),
    Parameter("codebuild_role_arn", str, "",
              "CodeBuild service role (empty: the project's default)."),
    Parameter("cleanup_policy", dict, {},
              "Per-kind cleanup policy overrides, e.g. {\"checkpoints\": \"delete\"}."),
))

GROUPS = (MODEL, ENCRYPTION, PIPELINE_RUN, CAPACITY, SWEEP_BUDGET, PLAN_LIMITS,
          PIPELINE_IMAGE_AND_CLEANUP)

_ENTRY = re.compile(r"^(\s*)(\w+):")


def with_group_args(doc: str, names: list[str]) -> str:
    """``doc`` (a Google-style docstring) with an ``Args:`` entry for every parameter of
    ``names`` (a signature, in order) that belongs to a group the signature takes
    (:meth:`Group.taken_by`) and that the docstring leaves undocumented, each after the
    entry of the parameter before it."""
    helps = {p.name: p.help for g in GROUPS if g.taken_by(names) for p in g.parameters}
    lines = inspect.cleandoc(doc).splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Args:")
    except StopIteration:
        return doc
    entries: dict[str, int] = {}  # name -> the last line of its entry
    indent, i = None, start + 1
    while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
        match = _ENTRY.match(lines[i])
        depth = len(lines[i]) - len(lines[i].lstrip())
        if match and (indent is None or depth <= indent):
            indent, current = depth, match.group(2)
        if lines[i].strip():
            entries[current] = i
        i += 1
    pad = " " * (indent or 4)
    after: dict[int, list[str]] = {}
    last = start
    for name in names:
        if name in entries:
            last = entries[name]
        elif name in helps:
            after.setdefault(last, []).append(f"{pad}{name}: {helps[name]}")
    out: list[str] = []
    for n, line in enumerate(lines):
        out.append(line)
        out += after.get(n, [])
    return "\n".join(out)


def documented(func: F) -> F:
    """``func`` with its docstring's ``Args:`` completed from the groups it declares."""
    func.__doc__ = with_group_args(func.__doc__ or "", list(inspect.signature(func).parameters))
    return func
