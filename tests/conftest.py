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


def entrypoint(interpreter, code):
    """A ContainerEntrypoint running ``code`` (a shell or Python script): ``-c`` when it fits
    SageMaker's 256 characters per entrypoint string, else a script file (content-named, in
    this session's temporary directory) the local job runs."""
    import hashlib
    import tempfile

    if len(code) <= 256:
        return [interpreter, "-c", code]
    folder = Path(tempfile.gettempdir()) / f"kfp-sm-test-scripts-{os.getuid()}"
    folder.mkdir(exist_ok=True)
    path = folder / hashlib.sha256(code.encode()).hexdigest()[:16]
    if not path.exists():
        path.write_text(code)
    return [interpreter, str(path)]


def serve(*args, env=None):
    """Starts ``python -m components.local serve ARGS``; returns (process, url, environment):
    the environment is ``env`` (default: this one) plus what its ``export`` line printed
    (endpoint and this start's credentials). Its stderr is drained in a thread from then on."""
    import subprocess
    import threading

    proc = subprocess.Popen([sys.executable, "-m", "components.local", "serve", *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ if env is None else env))
    assert proc.stdout is not None and proc.stderr is not None
    url = proc.stdout.readline().strip()
    exports = proc.stderr.readline().strip().removeprefix("export ").split()
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    served = {**(os.environ if env is None else env), **dict(i.split("=", 1) for i in exports)}
    assert served.get("AWS_ENDPOINT_URL") == url, (url, exports)
    return proc, url, served
