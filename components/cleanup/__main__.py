"""``python -m components.cleanup``: stop and delete what one pipeline run created.

Finds resources only by the run's tag (kfp-sagemaker:run-id); untagged resources
and other runs' are never touched. Use it when the pipeline's exit handler did
not run (a Terminate can kill it) or to delete what the defaults keep.

Examples::

    python -m components.cleanup --run-id 5f0c... --dry-run        # what would happen
    python -m components.cleanup --run-id 5f0c...                  # stop jobs, delete scratch
    python -m components.cleanup --run-id 5f0c... --s3-uri s3://my-bucket/kfp-sagemaker \\
        --policy artifacts=delete --policy checkpoints=delete --policy logs=delete \\
        --policy images=delete --report cleanup.md

Policies (KIND=ACTION, defaults first): training_jobs=stop|keep,
codebuild_builds=stop|keep, build_contexts=delete|keep, artifacts=keep|delete,
checkpoints=keep|delete, logs=keep|delete, images=keep|delete,
repositories=delete|keep (only a repository the run created, once empty),
codebuild_projects=keep|delete and iam_roles=keep|delete (only if the run created them).

Exit status: 0 when everything planned succeeded, 1 when something failed (the
report says what; the rest was still done), 2 for a bad argument (nothing listed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys

from components.cleanup import plan as plan_mod
from components.cleanup.run import DEFAULT_STOP_WAIT_S, cleanup
from components.common.errors import USER_ERROR_EXIT_CODE, UserError


def parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    p = argparse.ArgumentParser(
        prog="python -m components.cleanup", description=doc.split("Examples::")[0],
        epilog="Examples::" + doc.split("Examples::", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-id", required=True, help="the KFP run id (exact; no wildcards)")
    p.add_argument("--region", default="", help="default: AWS_REGION")
    p.add_argument("--dry-run", action="store_true", help="list what would be done; change nothing")
    p.add_argument("--policy", action="append", default=[], metavar="KIND=ACTION",
                   help="override one kind's policy (repeatable)")
    p.add_argument("--s3-uri", action="append", default=[], dest="s3_uris",
                   help="S3 prefix to search for objects tagged with the run (repeatable)")
    p.add_argument("--ecr-repository", action="append", default=[], dest="ecr_repositories",
                   help="also look for the run's images in this repository (repeatable); "
                   "repositories tagged by any run are searched anyway")
    p.add_argument("--codebuild-project", action="append", default=[], dest="codebuild_projects",
                   help="also look for the run's builds in this project (repeatable)")
    p.add_argument("--created-after", default="",
                   help="only training jobs created after this ISO time (bounds the scan)")
    p.add_argument("--max-objects", type=int, default=plan_mod.DEFAULT_MAX_OBJECTS,
                   help="objects whose tags are read per S3 prefix (default %(default)s)")
    p.add_argument("--stop-wait", type=float, default=DEFAULT_STOP_WAIT_S,
                   help="seconds to wait for stopped jobs before deleting their files")
    p.add_argument("--report", default="", help="also write the Markdown report to this file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        created_after = None
        if args.created_after:
            try:
                created_after = dt.datetime.fromisoformat(args.created_after)
            except ValueError as exc:
                raise UserError("created_after", f"{args.created_after!r} is not an ISO time.",
                                "write e.g. 2026-11-29T12:00:00+00:00.") from exc
        result = cleanup(
            args.run_id, args.region, dry_run=args.dry_run,
            policy=plan_mod.parse_policy(args.policy), s3_uris=args.s3_uris,
            ecr_repositories=args.ecr_repositories, codebuild_projects=args.codebuild_projects,
            created_after=created_after, max_objects=args.max_objects,
            stop_wait_s=args.stop_wait, log=lambda line: print(line, file=sys.stderr, flush=True))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT_CODE
    print(result.markdown)
    if args.report:
        with open(args.report, "w", encoding="utf-8") as f:
            f.write(result.markdown)
    return 1 if result.failures else 0


if __name__ == "__main__":
    sys.exit(main())
