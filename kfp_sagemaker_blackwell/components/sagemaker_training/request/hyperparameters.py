"""The hyperparameters and environment as the trainer will parse them."""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

from kfp_sagemaker_blackwell.catalog.spec import DIMENSION_BOUNDS
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.components.sagemaker_training import limits
from kfp_sagemaker_blackwell.components.sagemaker_training.request.config import (
    TrainingJobConfig,
    as_str,
)
from kfp_sagemaker_blackwell.components.sagemaker_training.request.model import (
    MODEL_DIMENSIONS,
    Memory,
)

# Environment keys the container contract or the execution role own: SM_* is how
# SageMaker tells the container its paths, hosts and hyperparameters (SM_HP_<NAME>
# would bypass the hyperparameter checks); credentials in Environment travel in
# clear in the request, show in DescribeTrainingJob and override the execution role.
AWS_CREDENTIAL_VARIABLES = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                      "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"})
SECRET_NAME_RE = re.compile(r"SECRET|PASSWORD|PASSWD|(^|_)TOKEN(_|$)|CREDENTIAL", re.IGNORECASE)


def pick_precision(cfg: TrainingJobConfig) -> TrainingJobConfig:
    """The configuration with its precision's entry of ``precision_hyperparameters`` merged
    into ``hyperparameters`` (``merge_precision_hyperparameters``), the map emptied."""
    return dataclasses.replace(cfg, precision_hyperparameters={}, hyperparameters=(
        merge_precision_hyperparameters(cfg.hyperparameters, cfg.precision_hyperparameters,
                                        cfg.precision)))


def for_trainer(cfg: TrainingJobConfig, memory: Memory) -> tuple[dict[str, str], dict[str, str]]:
    """The request's hyperparameters and environment: the in-repo trainer's as it will parse
    and check them (with the model and memory the job runs), a custom image's within
    SageMaker's limits only."""
    if cfg.custom:
        return _free_hyperparameters(cfg.hyperparameters), _environment(cfg.environment)
    hps = _hyperparameters(cfg, model_overrides=memory.overrides, batch_size=memory.batch_size,
                           checkpointing=memory.activation_checkpointing)
    env = _environment(cfg.environment)
    _check_with_trainer(hps, env)
    return hps, env


def _free_hyperparameters(hyperparameters: dict[str, Any]) -> dict[str, str]:
    """A custom image's hyperparameters: any names, within SageMaker's limits only."""
    hps: dict[str, str] = {}
    for key, value in (hyperparameters or {}).items():
        key, text = str(key), as_str(value)
        limits.check("hyperparameters", "HyperParameters{key}", key)
        limits.check("hyperparameters", "HyperParameters{}", text,
                     f"shorten the value of {key!r}.")
        hps[key] = text
    if hps:
        limits.check("hyperparameters", "HyperParameters", hps, "pass fewer.")
    return hps


def _check_with_trainer(hps: dict[str, str], env: dict[str, str]) -> None:
    """The request's hyperparameters as ``python -m kfp_sagemaker_blackwell.trainer`` will parse and check them."""
    from kfp_sagemaker_blackwell.catalog import flags as trainer_config

    try:
        trainer_config.check_hyperparameters(hps, env)
    except trainer_config.ConfigError as exc:  # a flag a parameter owns names that parameter
        fld = (exc.field.replace("-", "_") if exc.field in owned_hyperparameters()
               and exc.field != "preset" else "hyperparameters")
        raise UserError(fld, f"the trainer would refuse it: {exc.problem.rstrip('.')}.",
                        exc.fix or "fix the value, or see python -m kfp_sagemaker_blackwell.trainer --help for its flags."
                        ) from None
    except ValueError as exc:  # the trainer's own checks (precision names...)
        raise UserError("hyperparameters", f"the trainer would refuse it: {exc}.",
                        "see python -m kfp_sagemaker_blackwell.trainer --help.") from None


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
        "activation-checkpointing": as_str(checkpointing),
    })
    _check_container_paths(cfg.hyperparameters)
    for key, value in (cfg.hyperparameters or {}).items():
        key = str(key)
        canonical = key.replace("_", "-")
        if canonical in owned_hyperparameters():
            param = {"preset": "model_preset"}.get(canonical, canonical.replace("-", "_"))
            raise UserError("hyperparameters", f"{key!r} is set by the {param} parameter.",
                            f"pass {param}=... instead of hyperparameters[{key!r}].")
        text = as_str(value)
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
    env = {str(k): as_str(v) for k, v in (environment or {}).items()}
    limits.check("environment", "Environment", env, "pass fewer.")
    for key in env:
        _check_environment_key(key)
    for key, value in env.items():
        limits.check("environment", "Environment{key}", key,
                     "use letters, digits and _ (not starting with a digit).")
        limits.check("environment", "Environment{}", value,
                     f"shorten the value of {key} or pass a file in S3.")
    return env
