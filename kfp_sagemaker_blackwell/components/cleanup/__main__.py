"""``python -m kfp_sagemaker_blackwell.components.cleanup``: stop and delete what one pipeline run created.

Finds resources only by the run's tag (kfp-sagemaker:run-id); untagged resources
and other runs' are never touched. Use it when the pipeline's exit handler did
not run (a Terminate can kill it) or to delete what the defaults keep.

Examples::

    python -m kfp_sagemaker_blackwell.components.cleanup --run-id 5f0c... --dry-run        # what would happen
    python -m kfp_sagemaker_blackwell.components.cleanup --run-id 5f0c...                  # stop jobs, delete scratch
    python -m kfp_sagemaker_blackwell.components.cleanup --run-id 5f0c... --s3-uris s3://my-bucket/kfp-sagemaker \\
        --policy artifacts=delete --policy checkpoints=delete --policy logs=delete \\
        --policy images=delete --report cleanup.md

Policies (KIND=ACTION, defaults first): training_jobs=stop|keep,
codebuild_builds=stop|keep, build_contexts=delete|keep, artifacts=keep|delete,
checkpoints=keep|delete, logs=keep|delete, images=keep|delete,
repositories=delete|keep (only a repository the run created, once empty),
codebuild_projects=keep|delete and iam_roles=keep|delete (only if the run created them).

The flags and their defaults are the cleanup component's parameters.

Exit status: 0 when everything planned succeeded, 1 when something failed (the
report says what; the rest was still done; 0 with --no-fail-on-error), 2 for a bad argument (nothing listed),
143 when terminated (SIGTERM/SIGINT: the message says, per job and build, whether its stop
was accepted, or the command that stops it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys

from kfp_sagemaker_blackwell.common import cli
from kfp_sagemaker_blackwell.common.errors import UserError, cli_errors
from kfp_sagemaker_blackwell.components.cleanup.launcher import cleanup

# The component's signature, read from its source: importing component.py would import kfp
# (0.4 s at every start) for a parser.
COMPONENT = "kfp_sagemaker_blackwell.components.cleanup.component:cleanup"

# Old spellings, still accepted with a deprecation message.
ALIASES = {"--s3-uri": "s3_uris", "--ecr-repository": "ecr_repositories",
           "--codebuild-project": "codebuild_projects", "--stop-wait": "stop_wait_seconds"}


def build_parser() -> tuple[argparse.ArgumentParser, list[cli.Parameter]]:
    p, params = cli.derived_parser(COMPONENT, doc=__doc__, aliases=ALIASES)
    p.add_argument("--created-after", default="",
                   help="only training jobs created after this ISO time (bounds the scan)")
    p.add_argument("--report", type=cli.output_file, help="also write the Markdown report to this file")
    return p, params


@cli_errors
def main(argv: list[str] | None = None) -> int:
    args, values = cli.parse(build_parser(), argv)
    created_after = None
    if args.created_after:
        try:
            created_after = dt.datetime.fromisoformat(args.created_after)
        except ValueError as exc:
            raise UserError("created_after", f"{args.created_after!r} is not an ISO time.",
                            "write e.g. 2026-11-29T12:00:00+00:00.") from exc
    result = cleanup(
        values["run_id"], values["region"], dry_run=values["dry_run"],
        policy={str(k): str(v) for k, v in values["policy"].items()},
        s3_uris=values["s3_uris"], ecr_repositories=values["ecr_repositories"],
        codebuild_projects=values["codebuild_projects"], created_after=created_after,
        max_objects=values["max_objects"], stop_wait_s=values["stop_wait_seconds"],
        log=lambda line: print(line, file=sys.stderr, flush=True))
    print(result.markdown)
    if args.report:
        with open(args.report, "w", encoding="utf-8") as f:
            f.write(result.markdown)
    return 1 if result.failures and values["fail_on_error"] else 0


if __name__ == "__main__":
    sys.exit(main())
