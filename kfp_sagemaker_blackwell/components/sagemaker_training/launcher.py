"""Launches a training job: validate, check capacity, run, and summarise.

Shared by the KFP component and ``python -m kfp_sagemaker_blackwell.components.sagemaker_training``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kfp_sagemaker_blackwell.catalog import tokens
from kfp_sagemaker_blackwell.catalog.flags import normalise_hyperparameters
from kfp_sagemaker_blackwell.common import aws, resources
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.common.execution_context import (
    DEFAULT_STOP_TIMEOUT_S,
    ExecutionContext,
    check_stop_timeout,
)
from kfp_sagemaker_blackwell.components.sagemaker_training.request.build import build_request
from kfp_sagemaker_blackwell.components.sagemaker_training.request.capacity import (
    instance_choices,
)
from kfp_sagemaker_blackwell.components.sagemaker_training.request.config import (
    TrainingJobConfig,
)
from kfp_sagemaker_blackwell.components.sagemaker_training.request.resolution import (
    ResolvedConfig,
    resolve,
)
from kfp_sagemaker_blackwell.components.sagemaker_training.runner import (
    DEFAULT_MAX_OUTAGE_S,
    DEFAULT_POLL_INTERVAL_S,
    TrainingJobRunner,
)
from kfp_sagemaker_blackwell.planning import pricing

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
    training_seconds: int = 0  # TrainingTimeInSeconds (spot: 1 - billable/training is saved)
    price_source: str = ""  # where the price of estimated_cost_usd comes from
    instance_type: str = ""  # what SageMaker ran (SelectedInstanceType with preferences)
    instance_count: int = 0


def prepare(cfg: TrainingJobConfig, *, region: str | None = None) -> tuple[ResolvedConfig,
                                                                               dict[str, Any]]:
    """Validates and builds the request; no AWS call."""
    resolved = resolve(cfg, region=region)
    check_reachable_data(cfg.hyperparameters)
    return resolved, build_request(resolved)


def check_reachable_data(hyperparameters: Mapping[str, Any] | None) -> None:
    """The token data a ``data-dir`` hyperparameter names, when it is a directory on this
    machine (the local backend runs the trainer here), checked as the trainer checks it at
    start-up (``catalog/tokens.py``), so that damaged data is refused before the job is
    created. A path this machine does not have is the container's (a channel's path on
    SageMaker): not reachable, not checked here; the trainer checks it."""
    path = normalise_hyperparameters(hyperparameters or {}).get("data-dir", "")
    if not path or not os.path.isdir(path):
        return
    try:
        tokens.check(path)
    except tokens.DataError as exc:
        raise UserError("hyperparameters[data-dir]", exc.problem, exc.fix) from None


def dry_run(cfg: TrainingJobConfig, *, say: Callable[[str], None],
            refuse_unknown_price: bool = True) -> dict[str, Any]:
    """Everything a launch checks before its first AWS call, with no AWS call (the
    prices from ``instance_hour_prices`` or the shipped table; a training plan's fee is
    not looked up): the notes and the cost preview said, the request returned. What
    ``--dry-run`` and the pipelines' argument check run; the check passes
    ``refuse_unknown_price=False``: a budget it has no price for is the launch's to check
    (with the Price List API's price, or the plan's fee)."""
    resolved, request = prepare(cfg)
    for note in resolved.notes:
        say(note)
    check_follow_settings(cfg.poll_interval_seconds, cfg.max_outage_seconds,
                          cfg.stop_timeout_seconds)
    book = pricing.PriceBook(resolved.region, cfg.instance_hour_prices, lookup=False)
    cost_preview(resolved, book, say=say, refuse_unknown_price=refuse_unknown_price)
    return request


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
                            "check the ARN and region (aws sagemaker list-training-plans)."
                            ) from None
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
    poll_interval_s: float | None = None,
    max_outage_s: float | None = None,
    stop_timeout_s: float | None = None,
    out: Callable[[str], None] | None = None,
    raise_on_failure: bool = True,
    ctx: ExecutionContext | None = None,
    budget_jobs: int | None = None,
) -> TrainingResult:
    """Runs the job to its end; raises UserError before any AWS call for bad parameters.

    The settings not given here are the configuration's (``instance_hour_prices``,
    ``poll_interval_seconds``, ``max_outage_seconds``, ``stop_timeout_seconds``, one
    job per item of ``budget_items``: ``resolve``'s budget), as the component and the CLI
    pass them.

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
        return _launch(
            cfg, ctx, resources_path=resources_path,
            instance_hour_prices=(cfg.instance_hour_prices if instance_hour_prices is None
                                  else instance_hour_prices),
            poll_interval_s=_given(poll_interval_s, cfg.poll_interval_seconds),
            max_outage_s=_given(max_outage_s, cfg.max_outage_seconds),
            stop_timeout_s=_given(stop_timeout_s, cfg.stop_timeout_seconds),
            out=out or (lambda line: print(line, flush=True)),
            raise_on_failure=raise_on_failure, budget_jobs=budget_jobs)


def _given(value: Any, configured: Any) -> Any:
    return configured if value is None else value


def _launch(cfg: TrainingJobConfig, ctx: ExecutionContext, *, resources_path: str | None,
            instance_hour_prices: Mapping[str, Any] | None, poll_interval_s: float,
            max_outage_s: float, stop_timeout_s: float, out: Callable[[str], None],
            raise_on_failure: bool, budget_jobs: int | None) -> TrainingResult:
    check_follow_settings(poll_interval_s, max_outage_s, stop_timeout_s)
    if resources_path:
        resources.check_writable(resources_path, "aws_resources")
    resolved, request = prepare(cfg)
    say = out
    # validated before any AWS call; the lookups it makes (GetProducts) only read
    book = pricing.PriceBook(resolved.region, instance_hour_prices)
    for note in resolved.notes:
        say(note)
    endpoint = {"endpoint_url": cfg.endpoint_url} if cfg.endpoint_url else {}
    sagemaker = aws.client("sagemaker", resolved.region, **endpoint)
    plan: dict[str, Any] | None = None
    if cfg.training_plan_arn:
        plan = check_training_plan(sagemaker, resolved)
        say(f"training plan {plan.get('TrainingPlanName')}: {plan.get('Status')}, "
            f"{plan.get('AvailableInstanceCount', '?')} of {plan.get('TotalInstanceCount', '?')} "
            "instance(s) available")
    worst = cost_preview(resolved, book, plan=plan, budget_jobs=budget_jobs, say=say)
    ctx.check("before CreateTrainingJob: nothing was created")
    # Following the job: the runner rides out outages itself, looking at the termination
    # flag between attempts (aws.FOLLOW_CLIENT: no botocore retries, short timeouts);
    # stopping it: timeouts within the stop budget.
    follow = aws.client("sagemaker", resolved.region, **endpoint, **aws.FOLLOW_CLIENT)
    logs = aws.client("logs", resolved.region, **endpoint, **aws.FOLLOW_CLIENT)
    stopper = aws.client("sagemaker", resolved.region, **endpoint,
                         **aws.bounded_client_config(stop_timeout_s))
    runner = TrainingJobRunner(sagemaker, logs, resolved.region, poll_interval_s=poll_interval_s,
                               max_outage_s=max_outage_s, stop_timeout_s=stop_timeout_s,
                               out=say, ctx=ctx, follow=follow, stopper=stopper)
    job = runner.run(request, run_id=cfg.run_id, resources_path=resources_path)
    billable = int(job.get("BillableTimeInSeconds") or 0)
    selected, instances, billed_s = pricing.billed(job)
    price = job_price(resolved, book, plan, selected or cfg.instance_type)
    cost = pricing.cost(price, instances, billed_s) if price else None
    result = TrainingResult(
        job_name=job["TrainingJobName"],
        job_arn=job["TrainingJobArn"],
        status=job["TrainingJobStatus"],
        secondary_status=job.get("SecondaryStatus", ""),
        model_s3_uri=(job.get("ModelArtifacts") or {}).get("S3ModelArtifacts", ""),
        billable_seconds=billable,
        estimated_cost_usd=-1.0 if cost is None else round(cost.amount, 4),
        worst_case_cost_usd=-1.0 if worst is None else round(worst.amount, 4),
        failure_reason=job.get("FailureReason", ""),
        created=runner.created,
        training_seconds=int(job.get("TrainingTimeInSeconds") or 0),
        price_source=price.source if price else "",
        instance_type=selected or cfg.instance_type,
        instance_count=instances,
    )
    say(cost_report(resolved, job, cost, book))
    if raise_on_failure:
        runner.check(job)
    return result


def job_price(resolved: ResolvedConfig, book: pricing.PriceBook,
              plan: Mapping[str, Any] | None, instance_type: str = "") -> pricing.Price | None:
    """What one instance-hour of this job costs: its plan's share of the upfront fee, or
    the on-demand price of ``instance_type`` (default: the first choice; a spot job's
    BillableTimeInSeconds is already discounted)."""
    if plan is not None:
        return pricing.plan_price(plan)
    return book.price(instance_type or resolved.config.instance_type)


def cost_report(resolved: ResolvedConfig, job: Mapping[str, Any], cost: pricing.Cost | None,
                book: pricing.PriceBook) -> str:
    """The finished job's line: billable time, cost with its price's source, spot saving."""
    c = resolved.config
    billable = int(job.get("BillableTimeInSeconds") or 0)
    selected, instances, _ = pricing.billed(job)
    line = (f"training job {job['TrainingJobName']}: {job['TrainingJobStatus']}"
            f"{f' on {instances} x {selected} (selected from the preferences)' if c.fallback_instances else ''}"
            f"; billable {billable} s per instance")
    pool = job.get("WarmPoolStatus") or {}
    retained = pool.get("ResourceRetainedBillableTimeInSeconds")
    if retained is not None:
        line += f" + {int(retained)} s retained in the warm pool ({pool.get('Status')})"
    line += f", cost {cost}" if cost is not None else f" ({book.missing(selected)})"
    if c.keep_alive_seconds and retained is None:
        line += (f"; warm pool {pool.get('Status', 'pending')}: up to {c.keep_alive_seconds} s x "
                 f"{instances} instance(s) more are billed while it is retained (SageMaker "
                 "reports it in WarmPoolStatus.ResourceRetainedBillableTimeInSeconds)")
    training = int(job.get("TrainingTimeInSeconds") or 0)
    if c.use_spot and training:
        # botocore's model: the saving is (1 - BillableTimeInSeconds / TrainingTimeInSeconds)
        line += (f"; spot saving {1 - billable / training:.0%} as SageMaker reports it "
                 f"(billable {billable} s of {training} s training)")
        if cost is not None:
            on_demand = pricing.cost(cost.price, c.instance_count, training)
            line += f", {pricing.money(on_demand.amount - cost.amount)} less than on-demand"
    return line


def cost_preview(resolved: ResolvedConfig, book: pricing.PriceBook, *,
                 plan: Mapping[str, Any] | None = None, budget_jobs: int | None = None,
                 say: Callable[[str], None],
                 refuse_unknown_price: bool = True) -> pricing.Cost | None:
    """Prints the worst case (and the plan's predicted cost, when it has one) and refuses a
    launch over ``max_cost_usd`` (``budget_jobs``: jobs of a sweep sharing that budget,
    default the resolved budget's, one per item of ``budget_items``);
    returns the worst case, None without a price. ``plan``: the DescribeTrainingPlan of a
    job on a training plan (None in a dry run: its fee is then not known)."""
    c = resolved.config
    budget = resolved.budget
    budget_jobs = budget.jobs if budget_jobs is None else budget_jobs
    if isinstance(budget_jobs, bool) or not isinstance(budget_jobs, int) or budget_jobs < 1:
        raise UserError("budget_jobs", f"{budget_jobs!r}: must be an integer >= 1.")
    if c.training_plan_arn and plan is None:
        say("worst case: the training plan's share of its UpfrontFee, looked up at launch "
            "(DescribeTrainingPlan; not in a dry run)")
        budget.check_worst_case(None, instance_type=c.instance_type,
                                missing="a dry run does not look up the training plan's fee",
                                refuse_unknown=refuse_unknown_price)
        return None
    price = job_price(resolved, book, plan)
    worst, missing = worst_case(resolved, book, plan, say)
    if plan is not None:
        say(plan_usage(plan, resolved, budget_jobs))
    predicted = _predicted(resolved, price)
    if predicted:
        say(predicted)
    budget.check_worst_case(worst, instance_type=missing or c.instance_type, jobs=budget_jobs,
                            missing=book.missing(missing or c.instance_type),
                            refuse_unknown=refuse_unknown_price)
    return worst


def worst_case(resolved: ResolvedConfig, book: pricing.PriceBook,
               plan: Mapping[str, Any] | None, say: Callable[[str], None]
               ) -> tuple[pricing.Cost | None, str]:
    """The worst case over every instance type SageMaker may select (InstancePreferences),
    each for its count x (MaxRuntime, or MaxWait for spot, + the warm pool's keep-alive, which
    is billed as retained time); prints one line per type. Returns (the largest, None when
    a type has no price; the first type without a price, or "")."""
    c = resolved.config
    # SageMaker ends a job at MaxRuntimeInSeconds; a spot job at MaxWaitTimeInSeconds
    # (waiting for capacity + running), and bills at most the on-demand rate meanwhile.
    # Time Pending (MaxPendingTimeInSeconds) is not billed.
    seconds, limit = ((c.max_wait_seconds, "max_wait_seconds") if c.use_spot
                      else (c.max_runtime_seconds, "max_runtime_seconds"))
    if c.keep_alive_seconds:
        seconds, limit = seconds + c.keep_alive_seconds, f"{limit} + keep_alive_seconds"
    choices = instance_choices(c)
    costs: list[pricing.Cost] = []
    missing, lines = "", []
    for i, (itype, count) in enumerate(choices):
        price = job_price(resolved, book, plan, itype)
        which = "" if len(choices) == 1 else f" if SageMaker selects preference {i + 1}"
        if price is None:
            missing = missing or itype
            lines.append(f"worst case{which}: {count} x {itype} x {seconds / 3600:g} h ({limit}); "
                f"{book.missing(itype)}")
            continue
        cost = pricing.cost(price, count, seconds)
        costs.append(cost)
        spot = ", billed at most the on-demand rate" if c.use_spot else ""
        lines.append(f"worst case{which} ({limit}{spot}): {cost}")
    for line in [f"price: {note}" for note in book.notes] + lines:
        say(line)
    if missing or not costs:
        return None, missing
    worst = max(costs, key=lambda k: k.amount)
    if len(choices) > 1:
        say(f"worst case over the {len(choices)} preferences: {worst}")
    return worst, ""


def plan_usage(plan: Mapping[str, Any], resolved: ResolvedConfig, jobs: int) -> str:
    """What the plan costs and how much of its reserved instance-hours the sweep may use."""
    c = resolved.config
    fee = pricing.money(float(plan.get("UpfrontFee") or 0), str(plan.get("CurrencyCode") or "USD"))
    reserved = int(plan.get("TotalInstanceCount") or 0) * pricing.plan_hours(plan)
    used = jobs * pricing.instance_hours(c.instance_count, c.max_runtime_seconds)
    share = f"{used / reserved:.0%}" if reserved else "n/a"
    sweep = f"{jobs} jobs x " if jobs > 1 else ""
    text = (f"training plan {plan.get('TrainingPlanName')}: paid up front, {fee} for "
            f"{reserved:,.4g} reserved instance-hours; this {'sweep' if jobs > 1 else 'job'} "
            f"uses at most {sweep}{c.instance_count} x {c.max_runtime_seconds / 3600:g} h = "
            f"{used:,.4g} instance-hours ({share} of the plan)")
    if reserved and used > reserved:
        text += "; more than the plan reserves: jobs beyond it wait for the plan's capacity"
    return text


def _predicted(resolved: ResolvedConfig, price: pricing.Price | None) -> str:
    """The memory plan's throughput prediction as hours and cost for this job, or ""."""
    c = resolved.config
    if not c.memory_plan.strip():
        return ""
    from kfp_sagemaker_blackwell.planning.memory_plan import MemoryPlan

    entry = MemoryPlan.from_json(c.memory_plan).precisions.get(c.precision)
    step_s = getattr(entry, "step_seconds", None)
    if not step_s:
        return ""
    seconds = c.max_steps * float(step_s)
    cost = f", {pricing.cost(price, c.instance_count, seconds)}" if price is not None else ""
    source = getattr(entry, "throughput_source", "") or "the memory plan's throughput model"
    return (f"predicted: {c.max_steps} steps x {float(step_s):.3g} s = {seconds / 3600:.2f} h"
            f"{cost} ({source}; predicted, not measured)")


def request_json(request: dict[str, Any]) -> str:
    return json.dumps(request, indent=2, sort_keys=True)
