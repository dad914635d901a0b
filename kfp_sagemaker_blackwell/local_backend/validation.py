"""What SageMaker checks in a request before acting on it, and how it pages its lists.

Every request the executor answers is first checked against its input shape in
botocore's model (``check_request``: required members, types, lengths, ranges,
patterns, enums), as SageMaker does whatever the client; what SageMaker refuses
beyond the model (spot/wait rules, resources that do not exist...) is checked
here too, with SageMaker's error codes and messages, and
SageMaker's documented defaults are filled in (``normalize_create_request``), so
that DescribeTrainingJob returns what SageMaker returns. Limits and enums come
from botocore's service model, not from copied constants.
"""

from __future__ import annotations

import base64
import binascii
import copy
import functools
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from kfp_sagemaker_blackwell.catalog.sagemaker import MAX_RUNTIME_SECONDS, parse_image
from kfp_sagemaker_blackwell.local_backend import container, storage
from kfp_sagemaker_blackwell.local_backend.api import ApiError, validation
from kfp_sagemaker_blackwell.local_backend.jobs import Job
from kfp_sagemaker_blackwell.local_backend.settings import ClientFactory

# SageMaker's documented defaults (CreateTrainingJob's API reference).
DEFAULT_INPUT_MODE = "File"  # AlgorithmSpecification.TrainingInputMode
DEFAULT_COMPRESSION = "GZIP"  # OutputDataConfig.CompressionType

ROLE_ARN_RE = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/(?:[\w+=,.@-]+/)*(?P<name>[\w+=,.@-]+)$")
# Training instance families with local NVMe instance storage (EC2's "Instance store volumes"):
# SageMaker refuses a VolumeKmsKeyId for them (botocore's ResourceConfig.VolumeKmsKeyId doc).
LOCAL_STORAGE_FAMILIES = frozenset({
    "p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "p6-b300", "p6e-gb200",
    "g4dn", "g5", "g6", "g6e", "trn1", "trn1n", "trn2", "c5d", "m5d", "r5d",
    "c6id", "m6id", "r6id",
})


@functools.lru_cache(maxsize=1)
def service_model() -> Any:
    import botocore.session

    return botocore.session.get_session().get_service_model("sagemaker")


def _camel(field: str) -> str:
    """``ResourceConfig.InstanceType`` -> ``resourceConfig.instanceType`` (SageMaker's paths)."""
    return ".".join(part[:1].lower() + part[1:] for part in field.split("."))


def constraint_error(field: str, value: Any, constraint: str) -> ApiError:
    """SageMaker's (Coral's) wording for a member that fails its model constraint."""
    shown = "null" if value is None else f"'{value}'"
    return validation(f"1 validation error detected: Value {shown} at '{_camel(field)}' "
                      f"failed to satisfy constraint: {constraint}")


def _required(field: str, value: Any) -> None:
    if value is None or value == {}:
        raise constraint_error(field, None, "Member must not be null")


# ---------------------------------------------------------------- botocore's model limits
# Why a walker of our own: botocore's ParamValidator (botocore.validate) checks required
# members, types and ``min``, but leaves ``max``, ``pattern`` and ``enum`` to the service,
# and a client other than botocore (curl, another SDK, a script posting JSON) skips client-side
# validation altogether. SageMaker (Coral) refuses all of them with a ValidationException
# before acting, so the executor must too: an 8 MiB hyperparameter or
# MaxRuntimeInSeconds "abc" must not reach a job. The walker checks what ParamValidator does
# not and drops members the model does not know (Coral ignores them, for newer clients);
# ParamValidator then checks the rest on that copy.
MAX_ERRORS = 10  # Coral lists every error; a few name the problem, a hundred drown it
SHOWN_CHARS = 80  # of an offending value in a message (an 8 MiB value must not come back)
# Java's Unicode property classes in the model's patterns, as Python character-class ranges
# (every \p{...} in the model sits inside [...]): Alnum is ASCII in Java; L and N become
# Python's \w (letters and numbers, and "_", which every such class in the model admits
# anyway); Z is Zs, Zl and Zp.
JAVA_CLASSES = {
    r"\p{Alnum}": "a-zA-Z0-9",
    r"\p{L}": r"\w",
    r"\p{N}": r"\w",
    r"\p{Z}": r"\u0020\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000",
}


@functools.cache
def model_pattern(pattern: str) -> re.Pattern[str]:
    for java, python in JAVA_CLASSES.items():
        pattern = pattern.replace(java, python)
    # DOTALL: in Java "." stops at line ends, but whether SageMaker refuses a newline in a
    # ".*" member (a multi-line entry-point script, a hyperparameter) is not verified, and
    # the local backend must not refuse what AWS may accept.
    return re.compile(pattern, re.DOTALL)


def _shown(value: Any) -> str:
    text = str(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} chars)"


def _limits(value: Any, shape: Any, path: str) -> list[str]:
    """Coral's messages for ``value`` breaking ``shape``'s max, pattern or enum."""
    meta = shape.metadata
    errors = []
    where = f"Value '{_shown(value)}' at '{path}' failed to satisfy constraint: Member must"
    if shape.type_name in ("string", "list", "map") and isinstance(value, (str, list, dict)):
        if "max" in meta and len(value) > meta["max"]:
            errors.append(f"{where} have length less than or equal to {meta['max']}")
    elif shape.type_name in ("integer", "long", "double", "float") and isinstance(
            value, (int, float)) and not isinstance(value, bool):
        if "max" in meta and value > meta["max"]:
            errors.append(f"{where} have value less than or equal to {meta['max']}")
    if shape.type_name == "string" and isinstance(value, str):
        if meta.get("enum") and value not in meta["enum"]:
            errors.append(f"{where} satisfy enum value set: [{', '.join(meta['enum'])}]")
        elif "pattern" in meta and not model_pattern(meta["pattern"]).fullmatch(value):
            errors.append(f"{where} satisfy regular expression pattern: {meta['pattern']}")
    return errors


# A JSON true/false where the model wants a number: botocore's ParamValidator lets it
# through (Python's bool is an int: a botocore client sends MaxRuntimeInSeconds=True as
# `true`), and the job would have run with a limit of 1 s. It is refused with
# ParamValidator's own wording for a value of the wrong type ("Invalid type for parameter
# StoppingCondition.MaxRuntimeInSeconds, value: abc, type: <class 'str'>, valid types:
# <class 'int'>", botocore/validate.py), which is what "abc" gets: client-side from a
# botocore client (ParamValidationError), from the executor for any other client.
NUMBER_TYPES = {"integer": "<class 'int'>", "long": "<class 'int'>",
                "float": "<class 'float'>, <class 'decimal.Decimal'>, <class 'int'>",
                "double": "<class 'float'>, <class 'decimal.Decimal'>, <class 'int'>"}


def _walk(value: Any, shape: Any, path: str, errors: list[str], name: str = "") -> Any:
    """``value`` without the members ``shape`` does not know; appends to ``errors`` what
    breaks a max, pattern or enum (Java's String.matches: the whole value must match), and
    a boolean where a number belongs. ``path`` is SageMaker's: camel-cased members, map
    keys as given; ``name`` is botocore's (ParamValidator's messages)."""
    errors.extend(_limits(value, shape, path))
    if shape.type_name in NUMBER_TYPES and isinstance(value, bool):
        errors.append(f"Invalid type for parameter {name}, value: {value}, type: "
                      f"{type(value)}, valid types: {NUMBER_TYPES[shape.type_name]}")
    if shape.type_name == "structure" and isinstance(value, dict):
        return {k: _walk(v, shape.members[k], f"{path}.{_camel(k)}" if path else _camel(k),
                         errors, f"{name}.{k}" if name else k)
                for k, v in value.items() if k in shape.members}
    if shape.type_name == "list" and isinstance(value, list):
        return [_walk(v, shape.member, f"{path}.{i + 1}", errors, f"{name}[{i}]")
                for i, v in enumerate(value)]
    if shape.type_name == "map" and isinstance(value, dict):
        return {_walk(k, shape.key, f"{path}.{k}.key", errors, f"{name} (key: {k})"):
                _walk(v, shape.value, f"{path}.{k}", errors, f"{name}.{k}")
                for k, v in value.items()}
    return value


def check_request(operation: str, request: Any) -> None:
    """Refuses, with SageMaker's ValidationException, a request that breaks its input shape in
    botocore's model (required members, types, lengths, ranges, patterns, enums)."""
    from botocore.validate import ParamValidator

    shape = service_model().operation_model(operation).input_shape
    if not isinstance(request, dict):
        raise ApiError("SerializationException", "The request body is not a JSON object.")
    if shape is None:
        return
    errors: list[str] = []
    known = _walk(request, shape, "", errors)
    report = ParamValidator().validate(known, shape)
    if report.has_errors():
        errors += [_shown_line(line) for line in report.generate_report().splitlines()]
    if errors:
        count = f"{len(errors)} validation error{'s' if len(errors) > 1 else ''} detected"
        raise validation(f"{count}: {'; '.join(errors[:MAX_ERRORS])}")


def _shown_line(line: str) -> str:
    """One line of ParamValidator's report, with any long value in it cut."""
    return line if len(line) <= 4 * SHOWN_CHARS else f"{line[:4 * SHOWN_CHARS]}..."


# ---------------------------------------------------------------- CreateTrainingJob
def normalize_create_request(req: dict[str, Any]) -> dict[str, Any]:
    """Validates a CreateTrainingJob request and returns it with SageMaker's defaults filled in."""
    validate_create_request(req)
    out = copy.deepcopy(req)
    sc = out.setdefault("StoppingCondition", {})
    sc.setdefault("MaxRuntimeInSeconds", MAX_RUNTIME_SECONDS)
    out["AlgorithmSpecification"].setdefault("TrainingInputMode", DEFAULT_INPUT_MODE)
    out["OutputDataConfig"].setdefault("CompressionType", DEFAULT_COMPRESSION)
    for key in ("EnableNetworkIsolation", "EnableInterContainerTrafficEncryption",
                "EnableManagedSpotTraining"):
        out[key] = bool(out.get(key, False))
    return out


def validate_create_request(req: dict[str, Any]) -> None:
    """What SageMaker refuses beyond the model's limits (``check_request`` has checked those:
    the name's pattern, enums, lengths, counts of hyperparameters, environment and tags)."""
    _required("AlgorithmSpecification", req.get("AlgorithmSpecification"))
    _required("ResourceConfig", req.get("ResourceConfig"))
    output = req.get("OutputDataConfig") or {}
    _required("OutputDataConfig.S3OutputPath", output.get("S3OutputPath"))
    for key, uri in (("OutputDataConfig.S3OutputPath", output["S3OutputPath"]),
                     ("CheckpointConfig.S3Uri", (req.get("CheckpointConfig") or {}).get("S3Uri"))):
        if uri is not None:
            try:
                storage.split_s3_uri(uri)
            except ValueError as exc:
                raise validation(f"{key}: {exc}") from None
    spec = req["AlgorithmSpecification"]
    if not spec.get("TrainingImage") and not spec.get("AlgorithmName"):
        raise validation("AlgorithmSpecification needs a TrainingImage or an AlgorithmName.")
    _check_channels(req.get("InputDataConfig") or [])
    _check_resource_config(req["ResourceConfig"])
    _check_kms(req)
    _check_spot(req)


def _check_channels(channels: list[dict[str, Any]]) -> None:
    """Each channel must be a directory of its own under /opt/ml/input/data: botocore's
    ChannelName pattern ([A-Za-z0-9\\.\\-_]+) admits "." and "..", which would be data/
    itself and input/. Whether SageMaker refuses them is not documented; the local backend
    refuses them before Create, so that no download lands outside the channel's tree."""
    for i, channel in enumerate(channels):
        name = channel.get("ChannelName")
        if not container.is_channel_name(name):
            raise constraint_error(f"InputDataConfig.{i + 1}.ChannelName", name,
                                   "Member must name one directory under "
                                   "/opt/ml/input/data (not '.' or '..')")


def _check_resource_config(rc: dict[str, Any]) -> None:
    if rc.get("InstanceGroups"):
        raise validation("ResourceConfig.InstanceGroups (heterogeneous clusters) is not "
                         "emulated by the local backend; use InstanceType and InstanceCount.")
    _required("ResourceConfig.VolumeSizeInGB", rc.get("VolumeSizeInGB"))
    for key in ("SelectedInstanceType", "SelectedInstanceCount"):
        if key in rc:
            raise validation(f"ResourceConfig.{key} is set by SageMaker, not by the request.")
    preferences = rc.get("InstancePreferences")
    if preferences:
        # botocore's documentation of InstancePreferences: mutually exclusive with these.
        for key in ("InstanceType", "InstanceCount", "InstanceGroups",
                    "InstancePlacementConfig"):
            if rc.get(key) is not None:
                raise validation(f"ResourceConfig.InstancePreferences and ResourceConfig.{key} "
                                 "are mutually exclusive.")
        for i, pref in enumerate(preferences):
            path = f"ResourceConfig.InstancePreferences.{i + 1}.InstanceCount"
            _required(path, pref.get("InstanceCount"))  # the local backend needs a count
            _check_count(path, pref["InstanceCount"])
        return
    _required("ResourceConfig.InstanceType", rc.get("InstanceType"))
    _required("ResourceConfig.InstanceCount", rc.get("InstanceCount"))
    _check_count("ResourceConfig.InstanceCount", rc["InstanceCount"])


def instance_types(rc: dict[str, Any]) -> list[tuple[str, int]]:
    """The request's (instance type, count) choices, in SageMaker's order of preference."""
    if rc.get("InstancePreferences"):
        return [(p["InstanceType"], int(p["InstanceCount"])) for p in rc["InstancePreferences"]]
    return [(rc["InstanceType"], int(rc["InstanceCount"]))]


def _check_count(path: str, count: Any) -> None:
    if not isinstance(count, int) or count < 1:
        raise constraint_error(path, count, "Member must have value greater than or equal to 1")


def instance_family(instance_type: str) -> str:
    """``ml.p6-b200.48xlarge`` -> ``p6-b200``."""
    parts = instance_type.split(".")
    return parts[1] if len(parts) == 3 else instance_type


def _check_kms(req: dict[str, Any]) -> None:
    rc = req["ResourceConfig"]
    volume_key = rc.get("VolumeKmsKeyId")
    local = [t for t, _ in instance_types(rc) if instance_family(t) in LOCAL_STORAGE_FAMILIES]
    if volume_key and local:
        raise validation(
            f"Instance type {local[0]} is not supported with a VolumeKmsKeyId: its "
            "storage is local NVMe instance storage, encrypted by a hardware module on the "
            "instance. Remove ResourceConfig.VolumeKmsKeyId for this instance type.")
    for field, key in (("OutputDataConfig.KmsKeyId", req["OutputDataConfig"].get("KmsKeyId")),
                       ("ResourceConfig.VolumeKmsKeyId", volume_key)):
        if key is not None and not isinstance(key, str):
            raise constraint_error(field, key, "Member must be a string")


def _check_spot(req: dict[str, Any]) -> None:
    sc = req.get("StoppingCondition") or {}
    wait = sc.get("MaxWaitTimeInSeconds")
    if req.get("EnableManagedSpotTraining"):
        rc = req.get("ResourceConfig") or {}
        if rc.get("InstancePreferences"):
            raise validation("ResourceConfig.InstancePreferences and EnableManagedSpotTraining "
                             "are mutually exclusive: InstancePreferences supports only "
                             "Flexible Training Plans and On-Demand capacity.")
        if rc.get("KeepAlivePeriodInSeconds"):
            raise validation("Warm pools (ResourceConfig.KeepAlivePeriodInSeconds) are not "
                             "supported with managed spot training.")
        if wait is None:
            raise validation("MaxWaitTimeInSeconds is required for managed spot training.")
        if wait < sc.get("MaxRuntimeInSeconds", MAX_RUNTIME_SECONDS):
            raise validation("MaxWaitTimeInSeconds must be greater than or equal to "
                             "MaxRuntimeInSeconds.")
    elif wait is not None:
        raise validation("MaxWaitTimeInSeconds is only valid with EnableManagedSpotTraining.")


# ---------------------------------------------------------------- resources the request names
def check_resources(req: dict[str, Any], region: str, clients: ClientFactory, *,
                    strict: bool) -> None:
    """The resources SageMaker looks up at Create: the output bucket always; with ``strict``
    also the role (local IAM), the training image (local ECR) and the KMS keys (local KMS)."""
    bucket, _ = storage.split_s3_uri(req["OutputDataConfig"]["S3OutputPath"])
    if not _exists(lambda: clients("s3", region).head_bucket(Bucket=bucket)):
        raise validation(f"The S3 bucket {bucket} of OutputDataConfig.S3OutputPath does not "
                         f"exist (or is not in {region}). Create it, or name an existing bucket.")
    if not strict:
        return
    role = req.get("RoleArn") or ""
    m = ROLE_ARN_RE.match(role)
    if not m or not _exists(lambda: clients("iam", region).get_role(RoleName=m.group("name"))):
        raise validation(f"Could not assume role {role}. Please ensure that the role exists and "
                         "allows principal 'sagemaker.amazonaws.com' to assume the role.")
    image = (req["AlgorithmSpecification"].get("TrainingImage") or "")
    if image:
        _check_image(image, region, clients)
    rc = req["ResourceConfig"]
    kms = clients("kms", region)
    for field, key in (("OutputDataConfig.KmsKeyId", req["OutputDataConfig"].get("KmsKeyId")),
                       ("ResourceConfig.VolumeKmsKeyId", rc.get("VolumeKmsKeyId"))):
        if key and not _exists(functools.partial(kms.describe_key, KeyId=key)):
            raise validation(f"{field}: KMS key {key} does not exist in {region} (or is not "
                             "accessible); name a key ID, key ARN, alias name or alias ARN.")


def _check_image(image: str, region: str, clients: ClientFactory) -> None:
    m = parse_image(image)
    if m is None or not m.in_ecr:
        raise validation(f"TrainingImage {image} is not an Amazon ECR image URI "
                         "(<account>.dkr.ecr.<region>.amazonaws.com/<repository>[:tag|@digest]); "
                         "SageMaker pulls training images from ECR only.")
    ident = {"imageDigest": m.digest} if m.digest else {"imageTag": m.tag or "latest"}
    ecr = clients("ecr", m.region)
    if not _exists(lambda: ecr.describe_images(repositoryName=m.repository,
                                               imageIds=[ident])):
        raise validation(f"Requested image {image} not found in ECR (repository "
                         f"{m.repository} in {m.region}). Push it first.")


def _exists(call: Callable[[], Any]) -> bool:
    from botocore.exceptions import ClientError

    try:
        call()
    except ClientError:
        return False
    return True


# ---------------------------------------------------------------- ListTrainingJobs
def validate_list_request(req: dict[str, Any], operation: str) -> None:
    """Enums and bounds of a List request: its input shape in botocore's model."""
    check_request(operation, req)


def matches(job: Job, req: dict[str, Any]) -> bool:
    """Whether ``job`` passes ListTrainingJobs' filters in ``req``."""
    if req.get("NameContains") and req["NameContains"].lower() not in job.name.lower():
        return False
    if req.get("StatusEquals") and job.status != req["StatusEquals"]:
        return False
    if req.get("TrainingPlanArnEquals") and job.plan_arn != req["TrainingPlanArnEquals"]:
        return False
    created = job.creation_time.timestamp()
    modified = (job.last_modified_time or job.creation_time).timestamp()
    for key, value, after in (("CreationTimeAfter", created, True),
                              ("CreationTimeBefore", created, False),
                              ("LastModifiedTimeAfter", modified, True),
                              ("LastModifiedTimeBefore", modified, False)):
        if key in req:
            bound = float(req[key])
            if (after and not value > bound) or (not after and not value < bound):
                return False
    return True


# ---------------------------------------------------------------- pages
def _filter_digest(req: dict[str, Any]) -> str:
    """What a NextToken is bound to: every member of the request but the paging ones."""
    rest = {k: v for k, v in req.items() if k not in ("NextToken", "MaxResults")}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, default=str).encode()).hexdigest()[:16]


def page(items: Sequence[dict[str, Any]], req: dict[str, Any], key: str, default_max: int,
         cursor: Callable[[dict[str, Any]], list[Any]], descending: bool) -> dict[str, Any]:
    """One page of ``items`` (sorted by ``cursor``) under ``key``.

    The NextToken is opaque: it holds the cursor of the last item returned (so an item
    created or deleted between two pages neither repeats nor shifts the next page) and
    a digest of the filters (a token is refused with different filters).
    """
    token = req.get("NextToken")
    start = 0
    if token:
        try:
            state = json.loads(base64.urlsafe_b64decode(token.encode()))
            digest, after = state["f"], state["after"]
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise validation("Invalid NextToken.") from None
        if digest != _filter_digest(req):
            raise validation("Invalid NextToken: it was issued for a request with other "
                             "filters or sort order.")
        start = next((i for i, item in enumerate(items)
                      if (cursor(item) < after if descending else cursor(item) > after)),
                     len(items))
    size = int(req.get("MaxResults") or default_max)
    chosen = list(items[start:start + size])
    out: dict[str, Any] = {key: chosen}
    if start + size < len(items):
        state = {"f": _filter_digest(req), "after": cursor(chosen[-1])}
        out["NextToken"] = base64.urlsafe_b64encode(json.dumps(state).encode()).decode()
    return out
