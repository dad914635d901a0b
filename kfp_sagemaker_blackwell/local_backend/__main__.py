"""``python -m kfp_sagemaker_blackwell.local_backend serve [...]``: run the local backend until interrupted;
``python -m kfp_sagemaker_blackwell.local_backend interrupt-spot JOB --endpoint-url URL``: reclaim a spot job's
capacity on a running backend."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

from kfp_sagemaker_blackwell.catalog.bounds import Bounds, count, within
from kfp_sagemaker_blackwell.common.cli import ArgumentParser, output_dir
from kfp_sagemaker_blackwell.local_backend import auth
from kfp_sagemaker_blackwell.local_backend.backend import DEFAULT_REGION, LocalBackend
from kfp_sagemaker_blackwell.local_backend.settings import (
    DEFAULT_LATENCY,
    DEFAULT_SPOT_SAVINGS,
    LATENCY_PROFILES,
    OfferingTemplate,
)


def _quota(text: str) -> tuple[str, int]:
    itype, sep, count = text.partition("=")
    if not sep or not count.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected INSTANCE_TYPE=COUNT, e.g. "
                                         "ml.p6-b200.48xlarge=1")
    return itype, int(count)


def _offerings(path: str) -> list[OfferingTemplate]:
    try:
        data = json.loads(Path(path).read_text())
        return [OfferingTemplate.from_dict(o) for o in data]
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        raise argparse.ArgumentTypeError(
            f"{path}: {exc}. Expected a JSON list like [{{\"instance_type\": "
            "\"ml.p6-b200.48xlarge\", \"max_instance_count\": 4}]") from None


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python -m kfp_sagemaker_blackwell.local_backend",
        description=(
            "The local backend: one endpoint on 127.0.0.1 that serves S3, ECR, CloudWatch Logs, "
            "IAM, KMS, CodeBuild and tagging (moto) and SageMaker training jobs and training "
            "plans that really run this checkout's trainer/train.sh as local processes. Point "
            "boto3, the AWS CLI or the SageMaker SDK at it with the printed export line: "
            "AWS_ENDPOINT_URL and this start's random credentials (every request must be "
            "SigV4-signed with them; unsigned, cross-origin and other-Host requests are "
            "refused). Local controls (signed too): GET <URL>/_local/settings."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve until Ctrl-C / SIGTERM",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    serve.add_argument("--port", type=within(int, Bounds.parse("[0, 65535]")), default=0, help="TCP port (0: a free one)")
    serve.add_argument("--region", default=DEFAULT_REGION, help="region to advertise "
                       "(requests for any region are served)")
    serve.add_argument("--work-dir", default=None, type=output_dir,
                       help="where jobs' /opt/ml-like roots go (default: a temporary directory)")
    serve.add_argument("--max-concurrent-jobs", type=count(), default=2,
                       help="training jobs running at once")
    serve.add_argument("--stop-grace", type=within(float, Bounds.parse("[0, inf)")), default=120.0,
                       help="seconds from SIGTERM to SIGKILL when a job is stopped")
    serve.add_argument("--latency-profile", choices=sorted(LATENCY_PROFILES),
                       default=DEFAULT_LATENCY, help="how long secondary statuses last at "
                       "least: short (well under a second per job) or realistic (minutes, for "
                       "tests of polling code)")
    serve.add_argument("--spot-savings", type=within(float, Bounds.parse("[0, 1]")), default=DEFAULT_SPOT_SAVINGS,
                       help="the saving managed spot jobs report (1 - Billable/Training)")
    serve.add_argument("--strict-resources", action=argparse.BooleanOptionalAction,
                       default=True, help="refuse at Create a role not in the local IAM, an "
                       "image not in the local ECR, a KMS key not in the local KMS (as "
                       "SageMaker does)")
    serve.add_argument("--quota", type=_quota, action="append", default=[],
                       metavar="INSTANCE_TYPE=COUNT", help="instances of a type in use at once "
                       "before CreateTrainingJob answers ResourceLimitExceeded (repeatable; "
                       "default: no quota; change while serving: PUT /_local/quotas)")
    serve.add_argument("--training-plan-offerings", type=_offerings, default=None,
                       metavar="FILE.json", help="what SearchTrainingPlanOfferings offers, a "
                       "JSON list of {instance_type, max_instance_count, availability_zone, "
                       "lead_time_hours, upfront_fee_per_instance_hour} (default: up to 4 "
                       "ml.p6-b200.48xlarge or ml.p5.48xlarge, no fee)")
    spot = sub.add_parser("interrupt-spot", help="reclaim a running managed spot job's "
                          "capacity, as EC2 does (the job restarts from its checkpoint)")
    spot.add_argument("job_name", help="the training job's name")
    spot.add_argument("--endpoint-url", required=True, help="the URL `serve` printed (its "
                      "credentials come from the environment: run its export line first)")
    spot.add_argument("--region", default=DEFAULT_REGION, help="the job's region")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "interrupt-spot":
        return _interrupt_spot(args.endpoint_url, args.job_name, args.region)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    kwargs = {} if args.training_plan_offerings is None else {
        "offerings": args.training_plan_offerings}
    backend = LocalBackend(
        args.port, region=args.region, work_dir=args.work_dir,
        max_concurrent_jobs=args.max_concurrent_jobs, stop_grace_s=args.stop_grace,
        latency=args.latency_profile, spot_savings=args.spot_savings,
        strict_resources=args.strict_resources, quotas=dict(args.quota), **kwargs,
    ).start()
    try:
        print(backend.endpoint_url, flush=True)
        print(
            "export " + " ".join(f"{k}={v}" for k, v in backend.env().items()),
            file=sys.stderr, flush=True,
        )
        done.wait()
    finally:
        backend.stop()
    return 0


def _interrupt_spot(endpoint_url: str, job_name: str, region: str) -> int:
    body = json.dumps({"TrainingJobName": job_name, "Region": region}).encode()
    url = f"{endpoint_url.rstrip('/')}/_local/spot-interruptions"
    try:
        headers = auth.signed_headers("POST", url, body, region)
    except RuntimeError as exc:
        print(f"interrupt-spot: {exc}", file=sys.stderr)
        return 2
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
            print(json.loads(response.read())["interrupted"])
    except urllib.error.HTTPError as err:
        answer = err.read()
        try:
            message = json.loads(answer).get("error") or json.loads(answer).get("message")
        except ValueError:  # a refusal in S3's XML shape
            message = answer.decode(errors="replace")
        print(f"interrupt-spot: {message or err}", file=sys.stderr)
        return 2
    except urllib.error.URLError as err:
        print(f"interrupt-spot: cannot reach {endpoint_url}: {err.reason}. Is "
              "`python -m kfp_sagemaker_blackwell.local_backend serve` running?", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
