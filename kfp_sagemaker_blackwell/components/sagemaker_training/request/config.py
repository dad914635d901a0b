"""The training component's parameters as values (``TrainingJobConfig``, derived from its
signature) and the trainer they run: the in-repo one or a custom image."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from typing import Any

from kfp_sagemaker_blackwell.common import cli
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.common.s3 import split_s3_uri
from kfp_sagemaker_blackwell.components.sagemaker_training import limits

TRAINERS = ("in-repo", "custom")
CUSTOM_TRAINER = "custom"

# What a custom image's job is not checked for (said in a log line and the docstring).
CUSTOM_SKIPPED = ("custom image: skipped the in-repo trainer's checks (its flag table for "
                  "hyperparameters, the memory pre-flight for its model, the precision recipe "
                  "confirmation); still checked: SageMaker's limits, cost, capacity, tags, "
                  "reattach and stop")

# The parameters whose declared defaults are KFP placeholders (the run's id, the task's
# and the pipeline's names) take these outside a pipeline; run_id is then required.
OUTSIDE_KFP_DEFAULTS = {"run_id": inspect.Parameter.empty, "task": "sagemaker-training",
                        "pipeline": ""}


def _as_given(config: Any) -> None:
    """The values as every caller hands them over (the component's arguments, the CLI's
    flags, a pipeline's argument check): a None container emptied, whole numbers inside
    lists and dicts ints again (``kfp_values.integral``: kfp.local hands them over as
    floats)."""
    from kfp_sagemaker_blackwell.common.kfp_values import integral

    for f in dataclasses.fields(config):
        value = integral(getattr(config, f.name))
        if value is None and f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        setattr(config, f.name, value)


_Declared: Any = cli.dataclass_of(cli.source_parameters(
    "kfp_sagemaker_blackwell.components.sagemaker_training.component", "sagemaker_training",
    defaults=OUTSIDE_KFP_DEFAULTS), "TrainingJobConfig", namespace={"__post_init__": _as_given})


class TrainingJobConfig(_Declared):  # type: ignore[misc]
    """The training component's parameters as values: a keyword-only dataclass derived
    from its signature (the one declaration: names, kinds, defaults; a parameter added
    there is a field here and a flag of the CLI), made the same by whoever hands them over
    (``_as_given``). Nothing is checked here: ``resolve`` parses and checks every field."""

    @property
    def custom(self) -> bool:
        """A bring-your-own-image job (``trainer="custom"``)."""
        return bool(self.trainer == CUSTOM_TRAINER)

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> TrainingJobConfig:
        """From a dict of parameter values (the CLI's, a pipeline's argument check): the
        keys that are fields; the others (the output artifacts) left out."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


def as_str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # KFP passes dict numbers as floats: 1 arrives as 1.0
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def check_s3(fld: str, uri: str, path: str = "OutputDataConfig.S3OutputPath") -> None:
    split_s3_uri(uri, fld)
    limits.check(fld, path, uri)


def check_trainer(cfg: TrainingJobConfig) -> None:
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


def config_fields() -> list[str]:
    return [f.name for f in dataclasses.fields(TrainingJobConfig)]
