"""KFP definition of cleanup (the work is in ``launcher``).

Policy per resource kind (``{"kind": "action"}``), defaults first:
training_jobs stop|keep, codebuild_builds stop|keep, build_contexts delete|keep,
artifacts keep|delete (model artifacts, outputs, objects other steps tagged),
checkpoints keep|delete (only prefixes unique to a job), logs keep|delete,
images keep|delete (images the run pushed; content-addressed images are reused
by later runs), repositories delete|keep (only one the run created, once
empty), codebuild_projects keep|delete and iam_roles keep|delete (only if the
run created them). Stopping a job does not cancel a training plan.

A dry run lists exactly what a real run would do. A resource that fails is
reported and the rest continue; running cleanup twice is harmless.
"""

from typing import NamedTuple

from kfp.dsl import Markdown, Output

from kfp_sagemaker_blackwell.common.component import component


@component(aws=True, retries=2)  # idempotent
def cleanup(
    run_id: str,
    report: Output[Markdown],
    region: str = "",
    dry_run: bool = False,
    policy: dict = {},  # noqa: B006 (KFP default)
    s3_uris: list = [],  # noqa: B006 (KFP default)
    ecr_repositories: list = [],  # noqa: B006 (KFP default)
    codebuild_projects: list = [],  # noqa: B006 (KFP default)
    max_objects: int = 10000,
    stop_wait_seconds: float = 900.0,
    fail_on_error: bool = True,
) -> NamedTuple(  # type: ignore[valid-type]
    "Outputs", [("stopped", int), ("deleted", int), ("kept", int), ("failed", int)]
):
    """Stops and deletes what one pipeline run created, found by the run's tag only.

    Meant for the pipeline's exit handler (it runs even when a step failed) and,
    as ``python -m kfp_sagemaker_blackwell.components.cleanup --run-id ...``, for runs whose exit handler
    did not run (a Terminate can prevent it). Only resources tagged
    ``kfp-sagemaker:run-id=<run_id>`` (and what hangs off them: a job's output and
    checkpoint prefixes, its log streams) are touched; untagged resources and other
    runs' never are. An empty, wildcard or malformed run id is refused before
    anything is listed. Shared log groups (/aws/sagemaker/TrainingJobs) are never
    deleted, only the run's streams in them.

    Args:
        run_id: The run to clean up (``dsl.PIPELINE_JOB_ID_PLACEHOLDER`` in an exit handler).
        region: AWS region (default: the pod's AWS_REGION).
        dry_run: Only report what would be done.
        policy: Overrides of the per-kind policy, e.g. ``{"logs": "delete"}``.
        s3_uris: S3 prefixes to search for objects tagged with the run (the
            pipeline's bucket/prefix: build contexts, tagged outputs).
        ecr_repositories: Repositories to search for the run's images besides those
            tagged by any run of this project.
        codebuild_projects: CodeBuild projects to search for the run's builds
            besides those tagged by any run.
        max_objects: Objects whose tags are read per S3 prefix (bounds the scan).
        stop_wait_seconds: How long to wait for stopped jobs before deleting
            their files (SageMaker uploads while Stopping).
        fail_on_error: Fail the step (after doing everything else) when an action
            failed, so that the run shows it.

    Returns:
        report: Markdown: what was stopped, deleted, kept and left alone, and failures.
        stopped: Resources stopped (would be, in a dry run).
        deleted: Resources deleted (would be, in a dry run).
        kept: Resources kept by policy.
        failed: Actions that failed.
    """
    from collections import namedtuple

    from kfp_sagemaker_blackwell.common.execution_context import TERMINATED_EXIT_CODE, Terminated
    from kfp_sagemaker_blackwell.components.cleanup.launcher import cleanup as run_cleanup

    try:
        result = run_cleanup(
            run_id, region, dry_run=dry_run,
            policy={str(k): str(v) for k, v in (policy or {}).items()},
            s3_uris=[str(u) for u in s3_uris or []],
            ecr_repositories=[str(r) for r in ecr_repositories or []],
            codebuild_projects=[str(p) for p in codebuild_projects or []],
            max_objects=max_objects, stop_wait_s=stop_wait_seconds,
        )
    except Terminated as exc:  # the message says, per job and build, whether its stop was accepted
        print(f"error: {exc}", flush=True)
        raise SystemExit(TERMINATED_EXIT_CODE) from None
    with open(report.path, "w", encoding="utf-8") as f:
        f.write(result.markdown)
    print(result.markdown)
    if result.failures and fail_on_error:
        raise RuntimeError(f"cleanup: {len(result.failures)} action(s) failed (the rest was "
                           "done); see the report above")
    Outputs = namedtuple("Outputs", ["stopped", "deleted", "kept", "failed"])
    return Outputs(result.count("stop"), result.count("delete"),
                   sum(1 for o in result.outcomes if o.status == "kept"), len(result.failures))
