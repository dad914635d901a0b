"""Network and encryption: input channels, VPC, KMS keys, isolation."""

from __future__ import annotations

import re

from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.components.sagemaker_training import limits
from kfp_sagemaker_blackwell.components.sagemaker_training.request.config import (
    TrainingJobConfig,
    check_s3,
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


def check(cfg: TrainingJobConfig, region: str) -> None:
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
        check_s3(f"input_channels[{name}]", uri,
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
