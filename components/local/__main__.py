"""``python -m components.local serve [--port N]``: run the local backend until interrupted."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from components.local.backend import DEFAULT_REGION, LocalBackend


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m components.local",
        description=(
            "The local backend: one endpoint on 127.0.0.1 that serves S3, ECR, CloudWatch Logs, "
            "IAM, CodeBuild and tagging (moto) and SageMaker training jobs that really run this "
            "checkout's trainer/train.sh as local processes. Point boto3 at it with "
            "AWS_ENDPOINT_URL=<the printed URL> and any credentials."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve until Ctrl-C / SIGTERM")
    serve.add_argument("--port", type=int, default=0, help="TCP port (0 or absent: a free one)")
    serve.add_argument("--region", default=DEFAULT_REGION, help=f"region to advertise "
                       f"(default {DEFAULT_REGION}; requests for any region are served)")
    serve.add_argument("--work-dir", default=None,
                       help="where jobs' /opt/ml-like roots go (default: a temporary directory)")
    serve.add_argument("--max-concurrent-jobs", type=int, default=2,
                       help="training jobs running at once (default 2)")
    serve.add_argument("--stop-grace", type=float, default=120.0,
                       help="seconds from SIGTERM to SIGKILL when a job is stopped (default 120)")
    args = parser.parse_args(argv)

    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    backend = LocalBackend(
        args.port, region=args.region, work_dir=args.work_dir,
        max_concurrent_jobs=args.max_concurrent_jobs, stop_grace_s=args.stop_grace,
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


if __name__ == "__main__":
    sys.exit(main())
