import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Tests never talk to real AWS: fake credentials and a region, and no endpoint
# unless a test starts the local backend and sets AWS_ENDPOINT_URL itself.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-west-2")
os.environ.pop("AWS_PROFILE", None)
# Prices come from the shipped table unless a test asks for the (local) Price List API.
os.environ.setdefault("KFP_SAGEMAKER_PRICE_LIST", "off")


def local_backend_with_bucket(bucket, **backend_kwargs):
    """A started LocalBackend, this process's environment pointed at it, and one bucket.

    A generator for module-scoped fixtures: ``yield from local_backend_with_bucket(...)``.
    """
    import pytest

    from components.local import LocalBackend

    with LocalBackend(**backend_kwargs) as b, pytest.MonkeyPatch.context() as mp:
        for key, value in b.env().items():
            mp.setenv(key, value)
        b.client("s3").create_bucket(
            Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": b.region})
        yield b
