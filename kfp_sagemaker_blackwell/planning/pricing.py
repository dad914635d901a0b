"""Prices with their source, and the one cost function.

**The cost.** ``cost(price, instances, seconds)`` is the only place a cost is computed:
instances x seconds / 3600 x the price per instance-hour. SageMaker reports
``BillableTimeInSeconds`` per instance (botocore's model: "Multiply BillableTimeInSeconds
by the number of instances (InstanceCount) in your training cluster to get the total
compute time SageMaker bills you"); for managed spot it is the time billed, so
``1 - BillableTimeInSeconds / TrainingTimeInSeconds`` is the saving SageMaker reports.
The launcher (finished jobs, the worst case, the memory plan's predicted hours), the
throughput model (cost per billion tokens, cost of N steps) and the memory plan's report
all call it.

**The price**, for one region (``PriceBook``), comes from, in this order:

1. ``instance_hour_prices`` (the user's, e.g. a Savings Plans rate);
2. the AWS Price List API (boto3 ``pricing``, ``GetProducts`` for ``AmazonSageMaker``,
   the region's ``regionCode`` and the ``<REGION>-Train:<instance type>`` usage type,
   the on-demand ``Hrs`` dimension in USD), cached per region for a day under the user's
   cache directory (``$KFP_SAGEMAKER_CACHE_DIR`` or ``$XDG_CACHE_HOME/kfp-sagemaker``);
   ``KFP_SAGEMAKER_PRICE_LIST=off`` skips it;
3. the shipped table (``kfp_sagemaker_blackwell.catalog.hardware``: each instance type's price with its source,
   checked on ``kfp_sagemaker_blackwell.catalog.hardware.PRICES_CHECKED``).

A training plan is paid up front: a job on a plan costs its share of the plan's
``UpfrontFee`` (``plan_price``: the fee per reserved instance-hour, in the plan's
``CurrencyCode``), not an hourly rate. Every ``Price`` carries ``source``, and every
cost shown names it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.common.errors import UserError

# The Price List API has endpoints in these regions only; prices of every region come
# from any of them.
PRICE_LIST_REGIONS = ("us-east-1", "ap-south-1", "eu-central-1")
PRICE_LIST_ENV = "KFP_SAGEMAKER_PRICE_LIST"  # "off": the shipped table only
CACHE_DIR_ENV = "KFP_SAGEMAKER_CACHE_DIR"
CACHE_SECONDS = 86400
SERVICE_CODE = "AmazonSageMaker"

@dataclass(frozen=True)
class Price:
    """A price per instance-hour and where it comes from (shown with every cost)."""

    per_instance_hour: float
    source: str
    currency: str = "USD"


@dataclass(frozen=True)
class Cost:
    amount: float
    currency: str
    instances: int
    seconds: float
    price: Price

    def __str__(self) -> str:
        time = (f"{self.seconds / 3600:,.4g} h" if self.seconds >= 3600
                else f"{self.seconds:,.0f} s")
        rate = money(self.price.per_instance_hour, self.currency)
        return (f"{money(self.amount, self.currency)} ({self.instances} x {time} x {rate}/h; "
                f"{self.price.source})")


def instance_hours(instances: int, seconds: float) -> float:
    """``instances`` running (or billed) ``seconds`` each: instances x seconds / 3600."""
    return instances * float(seconds) / 3600.0


def cost(price: Price, instances: int, seconds: float) -> Cost:
    """The cost of ``instances`` billed for ``seconds`` each (BillableTimeInSeconds is per
    instance): their instance-hours x the price per instance-hour."""
    amount = instance_hours(instances, seconds) * price.per_instance_hour
    return Cost(amount, price.currency, instances, float(seconds), price)


def billed(job: Mapping[str, Any]) -> tuple[str, int, int]:
    """(instance type, instances, seconds per instance) SageMaker bills for a finished job,
    from its DescribeTrainingJob: the type and count it selected from InstancePreferences
    (``ResourceConfig.SelectedInstanceType``/``SelectedInstanceCount``, else the requested
    ones), ``BillableTimeInSeconds`` plus the warm pool's retained time
    (``WarmPoolStatus.ResourceRetainedBillableTimeInSeconds``, billed x InstanceCount too)."""
    rc = job.get("ResourceConfig") or {}
    itype = str(rc.get("SelectedInstanceType") or rc.get("InstanceType") or "")
    count = int(rc.get("SelectedInstanceCount") or rc.get("InstanceCount") or 1)
    retained = int((job.get("WarmPoolStatus") or {}).get("ResourceRetainedBillableTimeInSeconds")
                   or 0)
    return itype, count, int(job.get("BillableTimeInSeconds") or 0) + retained


def money(amount: float, currency: str = "USD") -> str:
    return f"${amount:,.2f}" if currency == "USD" else f"{amount:,.2f} {currency}"


def shipped_row(instance_type: str) -> hardware.ShippedPrice | None:
    """The catalog's shipped price of an instance type (None: the catalog has none)."""
    it = hardware.INSTANCE_TYPES.get(instance_type)
    return it.price if it is not None else None


def shipped_price(instance_type: str) -> Price | None:
    row = shipped_row(instance_type)
    if row is None or row.usd_per_hour is None:
        return None
    return Price(row.usd_per_hour,
                 f"shipped table of {hardware.PRICES_CHECKED} ({row.source}): verify")


def check_overrides(overrides: Mapping[str, Any] | None) -> dict[str, float]:
    """``instance_hour_prices`` as floats; a UserError for anything that is not a price."""
    out: dict[str, float] = {}
    for instance_type, price in (overrides or {}).items():
        try:
            value = float(price)
        except (TypeError, ValueError):
            value = math.nan
        if not value >= 0 or math.isinf(value):
            raise UserError("instance_hour_prices", f"{instance_type}: {price!r} is not a "
                            "price.", "give USD per instance-hour as a non-negative number.")
        out[str(instance_type)] = value
    return out


class PriceBook:
    """The price of each instance type in one region, with its source (see the module
    docstring for the order). ``notes`` says why a lookup fell back to the table.
    ``lookup=False`` (or no region): no AWS call, the user's prices and the table only."""

    def __init__(self, region: str = "", overrides: Mapping[str, Any] | None = None, *,
                 lookup: bool | None = None) -> None:
        self.region = region
        self.overrides = check_overrides(overrides)
        self.lookup = bool(region) and (price_list_enabled() if lookup is None else lookup)
        self.notes: list[str] = []
        self._memo: dict[str, Price | None] = {}

    def price(self, instance_type: str) -> Price | None:
        if instance_type not in self._memo:
            self._memo[instance_type] = self._resolve(instance_type)
        return self._memo[instance_type]

    def _resolve(self, instance_type: str) -> Price | None:
        if instance_type in self.overrides:
            return Price(self.overrides[instance_type], "instance_hour_prices (yours)")
        if self.lookup:
            try:
                found = cached_lookup(self.region, instance_type)
            except PriceListUnavailable as exc:
                self.notes.append(f"AWS Price List API unavailable ({exc}): "
                                  f"{instance_type} priced from the shipped table")
            else:
                if found is not None:
                    return found
                self.notes.append(f"the AWS Price List API has no on-demand training price for "
                                  f"{instance_type} in {self.region}: the shipped table's")
        return shipped_price(instance_type)

    def missing(self, instance_type: str) -> str:
        """Why there is no price, and what to do (for messages)."""
        row = shipped_row(instance_type)
        why = f"{row.source}" if row else "not in the AWS Price List API nor the shipped table"
        return (f"no price for {instance_type} ({why}): pass instance_hour_prices="
                f"{{\"{instance_type}\": <USD per hour>}}")


def price_list_enabled() -> bool:
    return os.environ.get(PRICE_LIST_ENV, "on").strip().lower() not in ("off", "0", "false")


# ---- the AWS Price List API, cached per region for a day ----

class PriceListUnavailable(Exception):
    """The API could not be reached or refused the call (the reason is the message)."""


def _endpoint() -> str:
    return os.environ.get("AWS_ENDPOINT_URL_PRICING") or os.environ.get("AWS_ENDPOINT_URL") or ""


def cache_path(region: str) -> Path:
    root = os.environ.get(CACHE_DIR_ENV) or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kfp-sagemaker")
    endpoint = _endpoint()
    # a stand-in endpoint (the local backend) never shares the cache of real AWS
    tag = "@" + hashlib.sha256(endpoint.encode()).hexdigest()[:10] if endpoint else ""
    return Path(root) / "prices" / f"{region}{tag}.json"


def _read_cache(path: Path, now: float) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or not (
            0 <= now - float(data.get("fetched_at", -1e18)) < CACHE_SECONDS):
        return {}
    return data


def cached_lookup(region: str, instance_type: str,
                  fetch: Callable[[str, str], float | None] | None = None) -> Price | None:
    """The Price List API's on-demand training price, from the day-old cache or the API;
    None when the API has none. Raises PriceListUnavailable when it cannot be asked."""
    path = cache_path(region)
    now = time.time()
    data = _read_cache(path, now)
    prices: dict[str, Any] = dict(data.get("prices") or {})
    if instance_type not in prices:
        prices[instance_type] = (fetch or get_products_price)(region, instance_type)
        if not data:
            data = {"fetched_at": now, "date": dt.date.fromtimestamp(now).isoformat()}
        data.update(region=region, endpoint=_endpoint(), prices=prices)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only home: no cache, the price is still right
    usd = prices[instance_type]
    if usd is None:
        return None
    where = f" at {data['endpoint']}" if data.get("endpoint") else ""
    return Price(float(usd), f"AWS Price List API{where}, {region}, {data['date']}")


def price_list_filters(region: str, instance_type: str) -> list[dict[str, str]]:
    return [{"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
            {"Type": "CONTAINS", "Field": "usagetype", "Value": f"Train:{instance_type}"}]


def get_products_price(region: str, instance_type: str) -> float | None:
    """One GetProducts query (paginated) for the on-demand SageMaker training rate."""
    from botocore.exceptions import BotoCoreError, ClientError

    from kfp_sagemaker_blackwell.common import aws

    client = aws.client("pricing", PRICE_LIST_REGIONS[0], max_attempts=2, connect_timeout=5,
                        read_timeout=20)
    try:
        pages = client.get_paginator("get_products").paginate(
            ServiceCode=SERVICE_CODE, FormatVersion="aws_v1",
            Filters=price_list_filters(region, instance_type))
        items = [item for page in pages for item in page.get("PriceList", [])]
    except (BotoCoreError, ClientError) as exc:
        raise PriceListUnavailable(f"{type(exc).__name__}: {exc}") from None
    found = sorted({p for item in items
                    if (p := training_price(item, region, instance_type)) is not None})
    return found[-1] if found else None  # several SKUs: the highest, never an underestimate


def training_price(item: str | dict[str, Any], region: str, instance_type: str) -> float | None:
    """The on-demand USD per hour of one GetProducts PriceList item (a JSON string) when
    it is SageMaker training of ``instance_type`` in ``region``, else None."""
    product = json.loads(item) if isinstance(item, str) else item
    attrs = (product.get("product") or {}).get("attributes") or {}
    usage = str(attrs.get("usagetype", ""))
    kind, _, itype = usage.partition(":")
    if (itype != instance_type or kind.rsplit("-", 1)[-1] != "Train"
            or attrs.get("regionCode") != region):
        return None
    for term in ((product.get("terms") or {}).get("OnDemand") or {}).values():
        for dim in (term.get("priceDimensions") or {}).values():
            usd = (dim.get("pricePerUnit") or {}).get("USD")
            if dim.get("unit") == "Hrs" and usd is not None:
                return float(usd)
    return None


# ---- training plans: paid up front ----

def plan_price(plan: Mapping[str, Any]) -> Price:
    """A training plan's fee per reserved instance-hour (DescribeTrainingPlan's
    ``UpfrontFee`` / (``TotalInstanceCount`` x its duration)), so that ``cost`` gives a
    job's share of the plan."""
    fee = float(plan.get("UpfrontFee") or 0)
    currency = str(plan.get("CurrencyCode") or "USD")
    hours = plan_hours(plan)
    instances = int(plan.get("TotalInstanceCount") or 0)
    per = fee / (instances * hours) if instances and hours else 0.0
    return Price(per, f"training plan {plan.get('TrainingPlanName')}: UpfrontFee "
                 f"{money(fee, currency)} for {instances} x {hours:g} h, paid up front",
                 currency)


def plan_hours(plan: Mapping[str, Any]) -> float:
    return float(plan.get("DurationHours") or 0) + float(plan.get("DurationMinutes") or 0) / 60


@dataclass(frozen=True)
class Budget:
    """``max_cost_usd`` parsed (its one check as an amount) and checked (its one comparison):
    the USD limit (0: none) for the worst cases of ``jobs`` jobs together (a training job's
    ``budget_items``: the items of the ParallelFor it is one of)."""

    limit_usd: float = 0.0
    jobs: int = 1

    @classmethod
    def parse(cls, max_cost_usd: Any, budget_items: Any = None) -> Budget:
        if isinstance(max_cost_usd, bool) or not isinstance(max_cost_usd, int | float) or not (
                0 <= max_cost_usd < math.inf):
            raise UserError("max_cost_usd", f"{max_cost_usd!r} is not an amount.",
                            "pass USD as a number >= 0 (0: no limit).")
        # The loop's own list on a cluster, and locally too (kfp.local 2.17 handed the loop
        # item instead: fixed in pipelines/_kfp_local_fixes.py). Anything else would count
        # one job where the loop runs several: refused, not guessed.
        if budget_items is not None and not isinstance(budget_items, list):
            raise UserError("budget_items", f"{budget_items!r:.80} is not a list (the items of "
                            "the ParallelFor this job is one of).",
                            "pass the loop's list itself (budget_items=<the ParallelFor's "
                            "items>), not its item.")
        return Budget(float(max_cost_usd), len(budget_items or []) or 1)

    def over(self, amount: float, jobs: int | None = None) -> bool:
        """Whether one job's worst case ``amount`` (USD), times the jobs sharing the budget,
        exceeds the limit (never without one)."""
        return bool(self.limit_usd) and amount * (jobs or self.jobs) > self.limit_usd

    def check_worst_case(self, worst: Cost | None, *, instance_type: str, jobs: int | None = None,
                         missing: str = "", refuse_unknown: bool = True) -> None:
        """Refuses (UserError naming max_cost_usd) a worst case (None without a price) that,
        times the jobs sharing the budget, exceeds the limit; a budget with no price to check
        it against too, unless ``refuse_unknown`` is False (a check that does not look up the
        prices the launch will)."""
        if not self.limit_usd or (worst is None and not refuse_unknown):
            return
        jobs = jobs or self.jobs
        if worst is None:
            raise UserError("max_cost_usd", f"cannot be checked: "
                            f"{missing or f'no price for {instance_type}'}.",
                            f"pass instance_hour_prices={{\"{instance_type}\": <USD per hour>}}.")
        if worst.currency != "USD":
            raise UserError("max_cost_usd", f"cannot be checked: the price is in {worst.currency} "
                            f"({worst.price.source}).", "set max_cost_usd=0 and budget the plan "
                            "in its currency.")
        if self.over(worst.amount, jobs):
            total = worst.amount * jobs
            what = (f"{jobs} jobs x ${worst.amount:,.2f} = ${total:,.2f}; each {worst}"
                    if jobs > 1 else str(worst))
            raise UserError(
                "max_cost_usd", f"the worst case ({what}) exceeds ${self.limit_usd:,.2f}.",
                "lower max_runtime_seconds (max_wait_seconds for spot) or instance_count, or "
                "raise max_cost_usd.")


# ---- managed spot: the expected cost ------------------------------------------------------
# SageMaker publishes no spot rate for training: it bills spot time at a discount and reports
# the saving after the job, 1 - BillableTimeInSeconds / TrainingTimeInSeconds (its API
# reference). AWS quotes "up to 90%" for managed spot training (docs.aws.amazon.com/sagemaker/
# latest/dg/model-managed-spot-training.html); multi-GPU instances are in short supply and
# discounted less, so the planner expects half of that ceiling, a stated assumption, not a quote.
SPOT_EXPECTED_SAVING = 0.45
# Interruptions: the EC2 Spot Instance Advisor groups instance types by the share interrupted
# in a month; large GPU types are in its highest band, ">20%". Taken as 20% per instance per
# month (730 h): each instance of a job is interrupted 0.2 / 730 times per hour of run.
SPOT_INTERRUPTIONS_PER_INSTANCE_MONTH = 0.20
HOURS_PER_MONTH = 730.0
SPOT_SOURCE = (f"expected: {SPOT_EXPECTED_SAVING:.0%} off the on-demand rate (assumed: AWS quotes "
               "up to 90% for managed spot training; SageMaker reports the real saving after "
               "the job as 1 - BillableTimeInSeconds / TrainingTimeInSeconds), plus "
               f"{SPOT_INTERRUPTIONS_PER_INSTANCE_MONTH:.0%} interruptions per instance-month "
               "(EC2 Spot Instance Advisor's highest band, >20%), each costing a restart and "
               "one checkpoint interval of lost steps")


@dataclass(frozen=True)
class SpotEstimate:
    """What a spot run is expected to cost: its interruptions' overhead in seconds (each a
    restart plus one checkpoint interval), the expected billed seconds, and the cost."""

    interruptions: float
    overhead_seconds: float
    seconds: float
    cost: Cost
    source: str = SPOT_SOURCE


def spot_expected(price: Price, instances: int, seconds: float, *, restart_seconds: float,
                  checkpoint_interval_seconds: float) -> SpotEstimate:
    """The expected cost of a spot run of ``seconds`` (its on-demand time) on ``instances``:
    (seconds + the interruptions' overhead) x the on-demand rate x (1 - the saving)."""
    interruptions = (instance_hours(instances, seconds) * SPOT_INTERRUPTIONS_PER_INSTANCE_MONTH
                     / HOURS_PER_MONTH)
    overhead = interruptions * (restart_seconds + checkpoint_interval_seconds)
    discounted = Price(price.per_instance_hour * (1 - SPOT_EXPECTED_SAVING),
                       f"{price.source}; spot {SPOT_SOURCE}", price.currency)
    return SpotEstimate(interruptions, overhead, seconds + overhead,
                        cost(discounted, instances, seconds + overhead))
