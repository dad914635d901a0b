"""Estimated cost of a training job: billable seconds x an instance-hour price.

SageMaker reports ``BillableTimeInSeconds`` (already multiplied by the instance
count, and for managed spot only the time actually billed). The price per
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
                      prices: Mapping[str, float]) -> float | None:
    """Cost in USD, or None when the table has no price for the instance type."""
    price = prices.get(instance_type)
    if price is None:
        return None
    return round(float(billable_seconds) / 3600.0 * price, 4)
