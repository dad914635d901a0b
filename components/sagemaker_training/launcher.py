"""Launches a training job: validate, check capacity, run, and summarise.

Shared by the KFP component and ``python -m components.sagemaker_training``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from components.common import aws, pricing, resources
from components.common.errors import UserError
from components.common.execution_context import (
    DEFAULT_STOP_TIMEOUT_S,
    ExecutionContext,
    check_stop_timeout,
)
from components.sagemaker_training.request import (
    ResolvedConfig,
    TrainingJobConfig,
    build_request,
    resolve,
)
from components.sagemaker_training.runner import (
    DEFAULT_MAX_OUTAGE_S,
    DEFAULT_POLL_INTERVAL_S,
    TrainingJobRunner,
)

USABLE_PLAN_STATUSES = ("Active", "Scheduled")


@dataclass(frozen=True)
class TrainingResult:
    job_name: str
    job_arn: str
    status: str
    secondary_status: str
    model_s3_uri: str
    billable_seconds: int
    estimated_cost_usd: float  # -1.0 when the price table has no price for the instance
    worst_case_cost_usd: float  # instances x max runtime x price; -1.0 without a price
    failure_reason: str
    created: bool  # False when the job already existed (a retried or restarted component)


def prepare(cfg: TrainingJobConfig, *, region: str | None = None) -> tuple[ResolvedConfig,
                                                                               dict[str, Any]]:
    """Validates and builds the request; no AWS call."""
    resolved = resolve(cfg, region=region)
    return resolved, build_request(resolved)


def check_training_plan(sagemaker: Any, resolved: ResolvedConfig) -> dict[str, Any]:
    """Confirms the plan is Active or Scheduled and reserves this instance type and count."""
    c = resolved.config
    try:
        plan = sagemaker.describe_training_plan(TrainingPlanName=resolved.training_plan_name)
    except Exception as exc:
        if aws.error_code(exc) in ("ResourceNotFound", "ResourceNotFoundException",
                                   "ValidationException"):
            raise UserError("training_plan_arn", f"{c.training_plan_arn} was not found in "
                            f"{resolved.region} ({exc}).",
                            "check the ARN and region (aws sagemaker list-training-plans).") \
                from None
        raise
    status = plan.get("Status", "")
    if status not in USABLE_PLAN_STATUSES:
        raise UserError("training_plan_arn", f"{plan.get('TrainingPlanName')} is {status}; "
                        "jobs can only run on an Active or Scheduled plan.",
                        "use another plan (or on-demand / spot capacity).")
    reserved: dict[str, int] = {}
    for rc in plan.get("ReservedCapacitySummaries") or []:
        reserved[rc["InstanceType"]] = reserved.get(rc["InstanceType"], 0) + int(
            rc.get("TotalInstanceCount", 0))
    count = reserved.get(c.instance_type, 0)
    if count == 0:
        raise UserError("training_plan_arn", f"{plan.get('TrainingPlanName')} reserves "
                        f"{', '.join(reserved) or 'no instances'}, not {c.instance_type}.",
                        "use the plan's instance type or another plan.")
    if c.instance_count > count:
        raise UserError("instance_count", f"{c.instance_count} exceeds the "
                        f"{count} {c.instance_type} instance(s) of training plan "
                        f"{plan.get('TrainingPlanName')}.", f"use at most {count}.")
    return dict(plan)


def check_follow_settings(poll_interval_s: float, max_outage_s: float,
                          stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> None:
    check_stop_timeout(stop_timeout_s)
    for fld, value, default in (("poll_interval_seconds", poll_interval_s, DEFAULT_POLL_INTERVAL_S),
                                ("max_outage_seconds", max_outage_s, DEFAULT_MAX_OUTAGE_S)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                0 < value < float("inf")):
            raise UserError(fld, f"{value!r}: must be a number of seconds > 0.",
                            f"pass e.g. {fld}={default:g}.")


def launch(
    cfg: TrainingJobConfig,
    *,
    resources_path: str | None = None,
    instance_hour_prices: Mapping[str, Any] | None = None,
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
    max_outage_s: float = DEFAULT_MAX_OUTAGE_S,
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
    out: Callable[[str], None] | None = None,
    raise_on_failure: bool = True,
    ctx: ExecutionContext | None = None,
    budget_jobs: int = 1,
) -> TrainingResult:
    """Runs the job to its end; raises UserError before any AWS call for bad parameters.

    SIGTERM and SIGINT are handled from the first line on (an ``ExecutionContext``,
    or ``ctx`` when the caller holds one): the job is stopped and ``Terminated``
    raised. ``max_outage_s``: how long an unreachable SageMaker endpoint is ridden
    out while following the job before ``AwsUnreachable``; ``stop_timeout_s``: how
    long the stop on termination (or after an unexpected error once the job exists)
    may take, whatever ``max_outage_s``. ``resources_path`` is checked for
    writability before any AWS call.
    """
    with contextlib.ExitStack() as stack:
        ctx = ctx or stack.enter_context(ExecutionContext("sagemaker_training"))
        return _launch(cfg, ctx, resources_path=resources_path,
                       instance_hour_prices=instance_hour_prices,
                       poll_interval_s=poll_interval_s, max_outage_s=max_outage_s,
                       stop_timeout_s=stop_timeout_s, out=out or (lambda line: print(line, flush=True)),
                       raise_on_failure=raise_on_failure, budget_jobs=budget_jobs)


def _launch(cfg: TrainingJobConfig, ctx: ExecutionContext, *, resources_path: str | None,
            instance_hour_prices: Mapping[str, Any] | None, poll_interval_s: float,
            max_outage_s: float, stop_timeout_s: float, out: Callable[[str], None],
            raise_on_failure: bool, budget_jobs: int) -> TrainingResult:
    check_follow_settings(poll_interval_s, max_outage_s, stop_timeout_s)
    if resources_path:
        resources.check_writable(resources_path, "aws_resources")
    resolved, request = prepare(cfg)
    prices = pricing.price_table(instance_hour_prices)  # validated before any AWS call too
    say = out
    for note in resolved.notes:
        say(note)
    worst = cost_preview(resolved, prices, budget_jobs=budget_jobs, say=say)
    ctx.check("before any AWS call: nothing was created")
    sagemaker = aws.client("sagemaker", resolved.region)
    # Following the job: the runner rides out outages itself (aws.FOLLOW_CLIENT);
    # stopping it: timeouts within the stop budget.
    follow = aws.client("sagemaker", resolved.region, **aws.FOLLOW_CLIENT)
    logs = aws.client("logs", resolved.region, **aws.FOLLOW_CLIENT)
    stopper = aws.client("sagemaker", resolved.region,
                         **aws.bounded_client_config(stop_timeout_s))
    if cfg.training_plan_arn:
        plan = check_training_plan(sagemaker, resolved)
        say(f"training plan {plan.get('TrainingPlanName')}: {plan.get('Status')}, "
            f"{plan.get('AvailableInstanceCount', '?')} of {plan.get('TotalInstanceCount', '?')} "
            "instance(s) available")
    runner = TrainingJobRunner(sagemaker, logs, resolved.region, poll_interval_s=poll_interval_s,
                               max_outage_s=max_outage_s, stop_timeout_s=stop_timeout_s,
                               out=say, ctx=ctx, follow=follow, stopper=stopper)
    job = runner.run(request, run_id=cfg.run_id, resources_path=resources_path)
    billable = int(job.get("BillableTimeInSeconds") or 0)
    cost = pricing.estimate_cost_usd(cfg.instance_type, billable, prices, cfg.instance_count)
    result = TrainingResult(
        job_name=job["TrainingJobName"],
        job_arn=job["TrainingJobArn"],
        status=job["TrainingJobStatus"],
        secondary_status=job.get("SecondaryStatus", ""),
        model_s3_uri=(job.get("ModelArtifacts") or {}).get("S3ModelArtifacts", ""),
        billable_seconds=billable,
        estimated_cost_usd=-1.0 if cost is None else cost,
        worst_case_cost_usd=-1.0 if worst is None else worst,
        failure_reason=job.get("FailureReason", ""),
        created=runner.created,
    )
    say(f"training job {result.job_name}: {result.status}; billable {billable} s per instance"
        + (f", estimated ${cost:,.2f}" if cost is not None
           else f" (no price for {cfg.instance_type}: pass instance_hour_prices)"))
    if raise_on_failure:
        runner.check(job)
    return result


def cost_preview(resolved: ResolvedConfig, prices: Mapping[str, float], *, budget_jobs: int = 1,
                 say: Callable[[str], None]) -> float | None:
    """Prints the worst case (and the plan's predicted cost, when it has one) and refuses a
    launch over ``max_cost_usd`` (``budget_jobs``: jobs of a sweep sharing that budget);
    returns the worst case, None without a price. No AWS call."""
    c = resolved.config
    if isinstance(budget_jobs, bool) or not isinstance(budget_jobs, int) or budget_jobs < 1:
        raise UserError("budget_jobs", f"{budget_jobs!r}: must be an integer >= 1.")
    worst = pricing.worst_case_cost_usd(c.instance_type, c.instance_count,
                                        c.max_runtime_seconds, prices)
    hours = c.max_runtime_seconds / 3600
    if worst is None:
        say(f"worst case: {c.instance_count} x {c.instance_type} x {hours:g} h (no price for "
            f"{c.instance_type}: pass instance_hour_prices)")
    else:
        say(f"worst case: {c.instance_count} x {c.instance_type} x {hours:g} h "
            f"(max_runtime_seconds) x ${prices[c.instance_type]:,.2f}/h = ${worst:,.2f} "
            "(price table: approximate on-demand, see components/common/pricing.py)")
    predicted = _predicted(resolved, prices)
    if predicted:
        say(predicted)
    pricing.check_budget(c.max_cost_usd, worst, instance_type=c.instance_type, jobs=budget_jobs)
    return worst


def _predicted(resolved: ResolvedConfig, prices: Mapping[str, float]) -> str:
    """The memory plan's throughput prediction as hours and USD for this job, or ""."""
    c = resolved.config
    if not c.memory_plan.strip():
        return ""
    from components.common.memory_plan import MemoryPlan

    entry = MemoryPlan.from_json(c.memory_plan).precisions.get(c.precision)
    step_s = getattr(entry, "step_seconds", None)
    if not step_s:
        return ""
    hours = c.max_steps * float(step_s) / 3600
    price = prices.get(c.instance_type)
    cost = f", ${hours * c.instance_count * price:,.2f}" if price is not None else ""
    source = getattr(entry, "throughput_source", "") or "the memory plan's throughput model"
    return (f"predicted: {c.max_steps} steps x {float(step_s):.3g} s = {hours:.2f} h{cost} "
            f"({source}; predicted, not measured)")


def request_json(request: dict[str, Any]) -> str:
    return json.dumps(request, indent=2, sort_keys=True)
