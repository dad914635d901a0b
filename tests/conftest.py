import itertools
import os
import signal
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
# One compute thread per torch process (in-process runs and the trainers tests start
# themselves): make test runs a pytest worker per core, and torch's default (a thread per core
# in every process) only adds spinning threads, about a third more CPU for the same steps.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Prices come from the shipped table unless a test asks for the (local) Price List API.
os.environ.setdefault("KFP_SAGEMAKER_PRICE_LIST", "off")
# Tests send Ctrl-C to themselves and to the command lines they start. A test run started as a
# script's background job (`make test &`: SIGINT ignored, which children inherit and
# ExecutionContext keeps, as Python does) would see those signals vanish: Ctrl-C gets Python's
# default handler here, and the processes tests start get its default action.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# Seconds each of the longest files takes alone on a quiet 2-core machine (tests/README.md's
# table, issue 38). Only the order of the files depends on them: a stale figure costs seconds,
# never a result; a file not listed counts as its number of tests x 0.1 s.
FILE_SECONDS = {
    "test_pipelines.py": 95, "test_container_contract.py": 91, "test_launch_faults.py": 72,
    "test_terminate_unreachable.py": 66, "test_sagemaker_training.py": 65,
    "test_readme.py": 31, "test_batch_tuning_probe.py": 50, "test_plan_training.py": 49,
    "test_trainer_checkpoints.py": 45, "test_cleanup.py": 24, "test_local_backend.py": 27,
    "test_trainer_training.py": 24, "test_capacity.py": 20, "test_build_image_flow.py": 20,
    "test_local_backend_clients.py": 19, "test_trainer_launch.py": 18,
    "test_trainer_bad_data.py": 13, "test_perf_bad_inputs.py": 13, "test_local_security.py": 8,
    "test_parse_logs_trainer.py": 9, "test_trainer_levers.py": 9,
}


def pytest_collection_modifyitems(config, items):
    """The longest files first (FILE_SECONDS), a file's tests in their order: under make
    test's pytest-xdist (--dist loadfile: a file per worker at a time; --no-loadscope-reorder
    keeps this order, which xdist would otherwise replace by the test count) no long file
    starts last and ends the run alone."""
    count: dict[Path, int] = {}
    for item in items:
        count[item.path] = count.get(item.path, 0) + 1

    def seconds(path: Path) -> float:
        return FILE_SECONDS.get(path.name, 0.1 * count[path])

    items.sort(key=lambda item: -seconds(item.path))


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (make test): two pytest-xdist workers more than the CPUs this process may
    use. Many tests spend much of their time waiting (jobs polled, the product's own stop
    timeouts, a backend's grace period) rather than computing: with a worker per CPU a third
    of the CPU time sat idle (issue 38); two more keep the CPUs busy through those waits.
    PYTEST_XDIST_AUTO_NUM_WORKERS still decides when set (xdist's own hook reads it)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cpus or 1) + 2


def local_backend_with_bucket(bucket, **backend_kwargs):
    """A started LocalBackend, this process's environment pointed at it, and one bucket.

    A generator for module-scoped fixtures: ``yield from local_backend_with_bucket(...)``.
    """
    import pytest

    from kfp_sagemaker_blackwell.local_backend import LocalBackend

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
        # Written whole, then renamed: a test in another xdist worker never runs half a script.
        part = path.with_name(f"{path.name}.{os.getpid()}.part")
        part.write_text(code)
        os.replace(part, path)
    return [interpreter, str(path)]


def serve(*args, env=None):
    """Starts ``python -m kfp_sagemaker_blackwell.local_backend serve ARGS``; returns (process, url, environment):
    the environment is ``env`` (default: this one) plus what its ``export`` line printed
    (endpoint and this start's credentials). Its stderr is drained in a thread from then on."""
    import subprocess
    import threading

    proc = subprocess.Popen([sys.executable, "-m", "kfp_sagemaker_blackwell.local_backend", "serve", *args],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ if env is None else env))
    assert proc.stdout is not None and proc.stderr is not None
    url = proc.stdout.readline().strip()
    exports = proc.stderr.readline().strip().removeprefix("export ").split()
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    served = {**(os.environ if env is None else env), **dict(i.split("=", 1) for i in exports)}
    assert served.get("AWS_ENDPOINT_URL") == url, (url, exports)
    return proc, url, served


# ---- jobs that do not run the trainer (the launcher's fault and price tests) ---------------
TEST_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/kfp-sagemaker-trainer:test"
TEST_ROLE = "arn:aws:iam::123456789012:role/SageMakerTraining"
# What such a backend runs instead of the trainer: a line per step every 50 ms for the job's
# ``max-steps`` hyperparameter; SIGTERM ends it (exit 0) unless the hyperparameters say
# ``ignore-sigterm`` (a job that stays Stopping). A line written after the backend died
# breaks the pipe and ends the job.
STEP_SCRIPT = r"""
import json, signal, sys, time
hps = json.load(open("input/config/hyperparameters.json"))
if hps.get("ignore-sigterm") == "true":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
for step in range(1, int(hps["max-steps"]) + 1):
    print(f"step {step}", flush=True)
    time.sleep(0.05)
"""
_run_ids = itertools.count()


def training_config(bucket, run_prefix, **changes):
    """A TrainingJobConfig of the tiny model writing to ``bucket``, in a run of its own
    (``{run_prefix}-{pid}-{n}``), with ``changes`` applied."""
    from kfp_sagemaker_blackwell.components.sagemaker_training.request import TrainingJobConfig

    return TrainingJobConfig(
        image_uri=TEST_IMAGE, role_arn=TEST_ROLE, output_s3_uri=f"s3://{bucket}/out",
        run_id=f"{run_prefix}-{os.getpid()}-{next(_run_ids)}", task="train", pipeline="tests",
        **{"model_preset": "tiny", "batch_size": 2, "seq_length": 32, **changes})


def training_cli_args(cfg, *extra):
    """The training CLI's arguments for ``cfg`` (as training_config makes it), polling every
    0.1 s, then ``extra``."""
    return ["--run-id", cfg.run_id, "--task", cfg.task, "--image-uri", cfg.image_uri,
            "--role-arn", cfg.role_arn, "--output-s3-uri", cfg.output_s3_uri,
            "--model-preset", cfg.model_preset, "--batch-size", str(cfg.batch_size),
            "--seq-length", str(cfg.seq_length), "--max-steps", str(cfg.max_steps),
            "--poll-interval-seconds", "0.1", *extra]


def wait_for(predicate, timeout, what, *, interval=0.05, retry_on=(), max_interval=0.3):
    """``predicate()``'s first true value within ``timeout`` s (an exception of ``retry_on``
    counts as not yet); AssertionError naming ``what`` when none comes.

    Polled every ``interval`` s at first, then less often (x1.5 a poll, up to
    ``max_interval``): a predicate is a request or two to a backend in this process, and at 20
    a second through a job's start it took a fifth of a core from the job it waits for. So
    wait for a state that stays (a trainer held at its step, a status, a file), never for
    one that may pass between two polls."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except retry_on:
            value = None
        if value:
            return value
        time.sleep(interval)
        interval = min(interval * 1.5, max(interval, max_interval))
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def job_ended(sm, name, timeout=30):
    """The description of training job ``name`` (``sm``: a SageMaker client) once it is
    Completed, Failed or Stopped. Polled every 0.1 s throughout (one cheap request): the
    descriptions of every state are what test_local_backend checks against botocore's shapes."""
    def ended():
        job = sm.describe_training_job(TrainingJobName=name)
        return job if job["TrainingJobStatus"] in ("Completed", "Failed", "Stopped") else None

    return wait_for(ended, timeout, f"training job {name} to end", interval=0.1,
                    max_interval=0.1)


def losses(lines):
    """Loss per step of the trainer's step lines; a step logged again after a restart keeps
    its last value."""
    from kfp_sagemaker_blackwell.catalog import logformat

    found = {}
    for line in lines:
        rec = logformat.parse_step(line)
        if rec is not None:
            found[rec.step] = rec.loss
    return found


def client_hooks(monkeypatch, *modules):
    """Botocore event hooks on every client made through ``aws.client`` (and through the
    ``client`` name each of ``modules`` bound at its import): ``hooks.append((event,
    handler))`` registers ``handler`` on the clients made from then on."""
    from kfp_sagemaker_blackwell.common import aws

    registered = []
    real = aws.client

    def client(service, region=None, **kwargs):
        made = real(service, region, **kwargs)
        for event, handler in registered:
            made.meta.events.register(event, handler)
        return made

    monkeypatch.setattr(aws, "client", client)
    for module in modules:
        monkeypatch.setattr(module, "client", client)
    return registered
