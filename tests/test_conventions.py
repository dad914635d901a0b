import json
import subprocess
import sys

import pytest

from kfp_sagemaker_blackwell.common import aws
from kfp_sagemaker_blackwell.common.errors import UserError


def test_import_components_is_fast_and_loads_no_heavy_library():
    code = (
        # CPU time, not wall time: the import's own cost, whatever else the machine runs
        "import time, sys, json; t=time.process_time(); import kfp_sagemaker_blackwell.components; "
        "d=time.process_time()-t; "
        "print(json.dumps({'s': d, 'mods': [m for m in ('torch','transformer_engine',"
        "'sagemaker','boto3','kfp') if m in sys.modules]}))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    data = json.loads(out.stdout)
    assert data["mods"] == []
    assert data["s"] < 1.5


def test_importing_every_component_module_loads_no_torch_or_sagemaker_sdk():
    code = (
        "import sys, json; from kfp_sagemaker_blackwell.pipelines.compile import discover_components, "
        "discover_pipelines; discover_components(); discover_pipelines(); "
        "print(json.dumps([m for m in ('torch','transformer_engine','sagemaker') "
        "if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert json.loads(out.stdout) == []


def test_component_helper_sets_image_no_kfp_install_and_no_cache_for_aws(tmp_path):
    from kfp import compiler, dsl

    from kfp_sagemaker_blackwell.common.component import component, components_image
    from kfp_sagemaker_blackwell.components import __version__

    @component(aws=True)
    def touches_aws(x: int) -> int:
        return x

    @component(aws=False)
    def pure(x: int) -> int:
        return x

    @dsl.pipeline
    def p(x: int = 1):
        a = touches_aws(x=x)
        pure(x=a.output)

    path = tmp_path / "p.yaml"
    compiler.Compiler().compile(p, str(path))
    text = path.read_text()
    assert components_image().endswith(f":{__version__}")
    assert f"image: {components_image()}" in text
    assert "pip install" not in text
    import yaml

    tasks = yaml.safe_load(text)["root"]["dag"]["tasks"]
    assert tasks["touches-aws"]["cachingOptions"] == {}
    assert tasks["pure"]["cachingOptions"] == {"enableCache": True}


def test_components_image_takes_a_repository_or_a_full_reference(monkeypatch):
    from kfp_sagemaker_blackwell.common.component import components_image
    from kfp_sagemaker_blackwell.components import __version__

    digest = "sha256:" + "ab" * 32
    for given, expected in (
            ("123456789012.dkr.ecr.us-west-2.amazonaws.com/kfp/components",
             f"123456789012.dkr.ecr.us-west-2.amazonaws.com/kfp/components:{__version__}"),
            ("example.com/x:ctx-1234", "example.com/x:ctx-1234"),
            (f"example.com:5000/team/x@{digest}", f"example.com:5000/team/x@{digest}")):
        monkeypatch.setenv("KFP_SAGEMAKER_COMPONENTS_IMAGE", given)
        assert components_image() == expected
    for bad in ("x y", "example.com/x@sha256:short", "Example.com/UPPER"):
        monkeypatch.setenv("KFP_SAGEMAKER_COMPONENTS_IMAGE", bad)
        with pytest.raises(ValueError, match="not an image reference"):
            components_image()


def test_client_factory_uses_region_retries_and_endpoint(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    c = aws.client("s3", "eu-west-1")
    assert c.meta.region_name == "eu-west-1"
    assert c.meta.endpoint_url == "http://127.0.0.1:9"
    assert c.meta.config.retries["mode"] == "adaptive"
    # botocore counts the first call too: max_attempts retries = max_attempts + 1 calls.
    assert c.meta.config.retries["total_max_attempts"] == aws.DEFAULT_MAX_ATTEMPTS + 1


def test_client_factory_without_region_names_the_fix(monkeypatch):
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    with pytest.raises(UserError, match="AWS_REGION"):
        aws.client("s3")


def test_the_package_version_is_declared_once():
    # setup.cfg reads the version from the package (setuptools' attr:), so the wheel's
    # version, the components image tag and the compiled YAML's images cannot disagree.
    import configparser
    from pathlib import Path

    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parent.parent / "setup.cfg")
    assert cfg["metadata"]["version"] == "attr: kfp_sagemaker_blackwell.catalog.release.__version__"
