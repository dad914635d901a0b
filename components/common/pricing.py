"""Estimated cost of a training job: billable seconds x an instance-hour price.

SageMaker reports ``BillableTimeInSeconds`` per instance (for managed spot only
the time actually billed): botocore's model says "Multiply BillableTimeInSeconds
by the number of instances (InstanceCount) in your training cluster to get the
total compute time SageMaker bills you", so the cost is billable seconds x
instances x the instance-hour price. The worst case, before launch, is
instances x MaxRuntimeInSeconds x the price: SageMaker stops a job at its
maximum run time, so it cannot bill more. The price per
instance-hour comes from a table the user can override or extend (the
component's ``instance_hour_prices`` parameter, the CLI's
``--instance-hour-price``), because prices differ by region, change over time
and are discounted by Savings Plans; a training plan is paid up front for its
whole duration, so for a job on a plan the estimate is the job's share of
instance-hours at the given rate, not an extra charge.

The defaults below are approximate us-east-1 on-demand SageMaker training
rates; they were NOT verified against the AWS price list from the environment
this project is built in (no access to it). Check
https://aws.amazon.com/sagemaker/ai/pricing/ and override them for real budgets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from components.common.errors import UserError

# USD per instance-hour, approximate (see the module docstring).
DEFAULT_INSTANCE_HOUR_PRICES_USD: dict[str, float] = {
    "ml.p6-b200.48xlarge": 113.93,
    "ml.p5.48xlarge": 113.07,
    "ml.p4d.24xlarge": 37.69,
    "ml.p4de.24xlarge": 47.11,
    "ml.g5.48xlarge": 20.36,
    "ml.g5.xlarge": 1.41,
}


def price_table(overrides: Mapping[str, float | int | str] | None = None) -> dict[str, float]:
    table = dict(DEFAULT_INSTANCE_HOUR_PRICES_USD)
    for instance_type, price in (overrides or {}).items():
        try:
            value = float(price)
        except (TypeError, ValueError):
            value = math.nan
        if not value >= 0 or math.isinf(value):
            raise UserError("instance_hour_prices", f"{instance_type}: {price!r} is not a "
                            "price.", "give USD per instance-hour as a non-negative number.")
        table[str(instance_type)] = value
    return table


def estimate_cost_usd(instance_type: str, billable_seconds: int | float,
                      prices: Mapping[str, float], instance_count: int = 1) -> float | None:
    """Cost in USD of a finished job (``billable_seconds``: SageMaker's per-instance
    BillableTimeInSeconds), or None when the table has no price for the instance type."""
    price = prices.get(instance_type)
    if price is None:
        return None
    return round(float(billable_seconds) * instance_count / 3600.0 * price, 4)


def worst_case_cost_usd(instance_type: str, instance_count: int, max_runtime_seconds: int,
                        prices: Mapping[str, float]) -> float | None:
    """The most the job can cost: every instance billed for the whole maximum run time."""
    return estimate_cost_usd(instance_type, max_runtime_seconds, prices, instance_count)


def check_budget(max_cost_usd: float, worst_case: float | None, *, instance_type: str,
                 jobs: int = 1) -> None:
    """Refuses (UserError) a launch whose worst case, times ``jobs`` sharing the budget,
    exceeds ``max_cost_usd``; 0 means no budget."""
    if isinstance(max_cost_usd, bool) or not isinstance(max_cost_usd, (int, float)) or not (
            0 <= max_cost_usd < math.inf):
        raise UserError("max_cost_usd", f"{max_cost_usd!r} is not an amount.",
                        "pass USD as a number >= 0 (0: no limit).")
    if not max_cost_usd:
        return
    if worst_case is None:
        raise UserError("max_cost_usd", f"cannot be checked: no price for {instance_type}.",
                        f"pass instance_hour_prices={{\"{instance_type}\": <USD per hour>}}.")
    total = worst_case * jobs
    if total > max_cost_usd:
        what = (f"{jobs} jobs x ${worst_case:,.2f}" if jobs > 1 else f"${worst_case:,.2f}")
        raise UserError(
            "max_cost_usd", f"the worst case ({what} = ${total:,.2f}: instances x "
            f"max_runtime_seconds x the instance-hour price) exceeds ${max_cost_usd:,.2f}.",
            "lower max_runtime_seconds or instance_count, or raise max_cost_usd.")
