"""The catalog's facts, and one of each: one default instance type, one max runtime, one
image-reference grammar, read by every side (the import rules: tests/test_structure.py)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from kfp_sagemaker_blackwell.catalog import hardware, precisions
from kfp_sagemaker_blackwell.catalog.hardware import DEFAULT_INSTANCE_TYPE
from kfp_sagemaker_blackwell.catalog.sagemaker import MAX_RUNTIME_SECONDS, parse_image

ROOT = Path(__file__).resolve().parent.parent
ECR = "123456789012.dkr.ecr.us-west-2.amazonaws.com"
DIGEST = "sha256:" + "ab" * 32


def test_every_instance_type_has_a_known_gpu_and_a_price_with_a_source_or_none():
    assert DEFAULT_INSTANCE_TYPE in hardware.INSTANCE_TYPES
    for name, it in hardware.INSTANCE_TYPES.items():
        assert it.gpu_spec.name == it.gpu, name
        if it.price is not None:
            assert it.price.source, name
            assert it.price.usd_per_hour is None or it.price.usd_per_hour > 0, name
    assert hardware.INSTANCE_TYPES[DEFAULT_INSTANCE_TYPE].price.usd_per_hour == \
        pytest.approx(1.15 * 113.9328)


def test_precisions_split_into_high_and_low_and_every_one_has_a_risk_and_a_capability():
    assert set(precisions.HIGH_PRECISIONS) | set(precisions.LOW_PRECISIONS) == \
        set(precisions.PRECISIONS)
    assert set(precisions.RISK) == set(precisions.MIN_CC) == set(precisions.PRECISIONS)
    assert precisions.risk("nvfp5") > max(precisions.RISK.values())
    assert [p for p in precisions.PRECISIONS if precisions.risk(p) == 0] == ["fp32", "bf16"]
    assert {precisions.COMPUTE_DTYPE[p] for p in precisions.LOW_PRECISIONS} == {"bf16"}
    assert [precisions.COMPUTE_DTYPE[p] for p in precisions.HIGH_PRECISIONS] == \
        ["fp32", "bf16", "fp16"]


@pytest.mark.parametrize(("reference", "parts"), [
    (f"{ECR}/trainer:abc", ("trainer", "abc", "", "us-west-2")),
    (f"{ECR}/team/trainer@{DIGEST}", ("team/trainer", "", DIGEST, "us-west-2")),
    (f"{ECR}/trainer:1.0@{DIGEST}", ("trainer", "1.0", DIGEST, "us-west-2")),
    ("123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn/t:1", ("t", "1", "", "cn-north-1")),
    ("public.ecr.aws/kfp-sagemaker-blackwell/components",
     ("kfp-sagemaker-blackwell/components", "", "", "")),
    ("localhost:5000/x_y.z:v1", ("x_y.z", "v1", "", "")),
])
def test_an_image_reference_is_read_into_its_parts(reference, parts):
    ref = parse_image(reference)
    assert ref is not None
    assert (ref.repository, ref.tag, ref.digest, ref.region) == parts
    assert ref.in_ecr == bool(parts[3])


@pytest.mark.parametrize("reference", [
    "", "trainer", f"{ECR}/", f"{ECR}/Trainer:1", f"{ECR}/trainer:1 ", f"{ECR}/a//b",
    f"{ECR}/-a", f"{ECR}/a:-tag", f"{ECR}/a@sha256:abc", f"{ECR}/a:{'t' * 129}",
])
def test_what_is_not_an_image_reference(reference):
    assert parse_image(reference) is None


def test_the_components_image_setting_reads_the_catalogs_grammar(monkeypatch):
    from kfp_sagemaker_blackwell.common import component

    monkeypatch.setenv(component.IMAGE_ENV, f"{ECR}/components")
    assert component.components_image() == f"{ECR}/components:{component.__version__}"
    monkeypatch.setenv(component.IMAGE_ENV, f"{ECR}/components@{DIGEST}")
    assert component.components_image() == f"{ECR}/components@{DIGEST}"
    monkeypatch.setenv(component.IMAGE_ENV, f"{ECR}/Components:1")
    with pytest.raises(ValueError, match="is not an image reference"):
        component.components_image()


def _component_default(module: str, name: str, parameter: str) -> object:
    import importlib

    comp = getattr(importlib.import_module(module), name)
    return inspect.signature(comp.python_func).parameters[parameter].default


def test_kfp_definitions_default_to_the_catalogs_instance_type_and_runtime():
    """KFP embeds a component's source in its YAML, where a module's constants do not
    exist: a KFP definition writes the default as a literal, so this test holds it to
    the catalog's (everything else references the catalog)."""
    for module, name in (("kfp_sagemaker_blackwell.components.sagemaker_training.component", "sagemaker_training"),
                         ("kfp_sagemaker_blackwell.components.build_image.component", "build_image"),
                         ("kfp_sagemaker_blackwell.components.memory_estimate.component", "memory_estimate")):
        assert _component_default(module, name, "instance_type") == DEFAULT_INSTANCE_TYPE
    assert _component_default("kfp_sagemaker_blackwell.components.sagemaker_training.component",
                              "sagemaker_training", "max_runtime_seconds") == MAX_RUNTIME_SECONDS


def _literal_sites(pattern: str) -> set[str]:
    found = set()
    for package in ("common", "planning", "iam", "local_backend", "components", "pipelines",
                    "trainer"):
        for path in (ROOT / package).rglob("*.py"):
            for line in path.read_text(encoding="utf-8").splitlines():
                if re.search(pattern, line, re.IGNORECASE):
                    found.add(str(path.relative_to(ROOT)))
    return found


def test_the_default_instance_type_and_max_runtime_are_written_once():
    """Outside the catalog, only the KFP definitions (held to it above) spell them."""
    assert _literal_sites(r'(?:instance_type\w*\s*(?::\s*str\s*)?=\s*|\bor\s+)"ml\.') == {
        "components/sagemaker_training/component.py", "components/build_image/component.py",
        "components/memory_estimate/component.py"}
    # pricing.py's CACHE_SECONDS is a day of price cache, not a runtime
    assert _literal_sites(r"\b86400\b|(?<!\* )\b24 \* 3600\b") == {
        "components/sagemaker_training/component.py", "planning/pricing.py"}
