"""Prices as AWS sells them, on the local backend: the Price List API through boto3, its
day-long cache and the fallback to the shipped table, training plans' upfront fees, and
what a spot job saves.

The jobs here do not run the trainer: the backend runs conftest's ``STEP_SCRIPT`` (a few
steps of 50 ms), so every launch takes about a second.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import sys
from typing import Any

import pytest
from conftest import STEP_SCRIPT, local_backend_with_bucket, training_config

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.common import aws
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.components.sagemaker_training import launcher
from kfp_sagemaker_blackwell.components.sagemaker_training.request import TrainingJobConfig
from kfp_sagemaker_blackwell.iam import policy as iam_policy
from kfp_sagemaker_blackwell.local_backend import pricing_api
from kfp_sagemaker_blackwell.local_backend.settings import OfferingTemplate
from kfp_sagemaker_blackwell.planning import pricing

BUCKET = "kfp-sagemaker-prices"
P5, P6 = "ml.p5.48xlarge", "ml.p6-b200.48xlarge"
PLAN_FEE_PER_INSTANCE_HOUR = 90.0


@pytest.fixture(scope="module")
def backend():
    yield from local_backend_with_bucket(
        BUCKET, stop_grace_s=2, log_flush_s=0.1, max_concurrent_jobs=4,
        command=[sys.executable, "-c", STEP_SCRIPT],
        offerings=(OfferingTemplate(P6, max_instance_count=4,
                                    upfront_fee_per_instance_hour=PLAN_FEE_PER_INSTANCE_HOUR),))


@pytest.fixture
def price_list(monkeypatch, tmp_path):
    """The Price List API switched on, with an empty cache of this test's own."""
    monkeypatch.setenv(pricing.PRICE_LIST_ENV, "on")
    monkeypatch.setenv(pricing.CACHE_DIR_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def config(**changes: Any) -> TrainingJobConfig:
    return training_config(BUCKET, "prices", **{"max_steps": 8, "max_runtime_seconds": 3600,
                                                **changes})


def test_the_price_list_api_prices_a_training_instance_through_boto3(backend, price_list):
    with aws.record_calls() as recording:
        price = pricing.PriceBook("us-west-2").price(P5)
    assert price is not None and price.per_instance_hour == 63.296
    today = dt.date.today().isoformat()
    assert price.source == f"AWS Price List API at {backend.endpoint_url}, us-west-2, {today}"
    [call] = recording.calls()
    assert (call.service, call.operation, call.region) == ("pricing", "GetProducts", "us-east-1")
    assert call.params["ServiceCode"] == "AmazonSageMaker"
    assert {(f["Field"], f["Value"]) for f in call.params["Filters"]} == {
        ("regionCode", "us-west-2"), ("usagetype", f"Train:{P5}")}
    # the pod's IAM policy allows it
    assert iam_policy.check_calls(iam_policy.pod_policy(bucket=BUCKET), recording.calls()) == []


def test_get_products_answers_json_strings_in_pages_as_aws_does(backend):
    client = backend.client("pricing", "us-east-1")
    pages = list(client.get_paginator("get_products").paginate(
        ServiceCode="AmazonSageMaker", PaginationConfig={"PageSize": 2}))
    items = [i for page in pages for i in page["PriceList"]]
    assert len(pages) == 3 and len(items) == 5 and all(isinstance(i, str) for i in items)
    assert {json.loads(i)["product"]["attributes"]["regionCode"] for i in items} == {
        "us-west-2", "us-east-1"}
    # a training price is read from the training row only, never from Hosting's
    hosting = [i for i in items if "-Host:" in i]
    assert hosting and pricing.training_price(hosting[0], "us-west-2", P5) is None
    assert client.get_products(ServiceCode="AmazonEC2")["PriceList"] == []
    with pytest.raises(client.exceptions.ClientError):
        client.get_products(ServiceCode="AmazonSageMaker",
                            Filters=[{"Type": "FUZZY", "Field": "regionCode", "Value": "x"}])


def test_prices_are_cached_per_region_for_a_day(backend, price_list):
    pricing.PriceBook("us-west-2").price(P5)
    [path] = list((price_list / "prices").glob("us-west-2@*.json"))
    data = json.loads(path.read_text())
    assert data["date"] == dt.date.today().isoformat() and data["prices"] == {P5: 63.296}
    with aws.record_calls() as recording:
        assert pricing.PriceBook("us-west-2").price(P5).per_instance_hour == 63.296
    assert recording.calls() == []  # from the cache
    data["fetched_at"] -= pricing.CACHE_SECONDS + 1  # a day old
    path.write_text(json.dumps(data))
    with aws.record_calls() as recording:
        pricing.PriceBook("us-west-2").price(P5)
    assert [c.operation for c in recording.calls()] == ["GetProducts"]
    # another region has its own cache
    with aws.record_calls() as recording:
        assert pricing.PriceBook("us-east-1").price(P5).source.endswith(
            f"us-east-1, {dt.date.today().isoformat()}")
    assert len(recording.calls()) == 1


def test_a_type_the_api_has_no_price_for_falls_back_to_the_shipped_table_and_says_so(
        backend, price_list):
    book = pricing.PriceBook("us-west-2")
    price = book.price(P6)  # the fixture, like our evidence, has no ml.p6-b200 SageMaker rate
    assert price == pricing.shipped_price(P6)
    assert price.source.startswith(f"shipped table of {hardware.PRICES_CHECKED}")
    assert book.notes == [f"the AWS Price List API has no on-demand training price for {P6} "
                          "in us-west-2: the shipped table's"]
    # a region the API has nothing for
    assert pricing.PriceBook("eu-west-1").price(P5) == pricing.shipped_price(P5)


def test_an_unreachable_api_falls_back_to_the_shipped_table_and_caches_nothing(
        backend, price_list, monkeypatch):
    # A port bound here and never listened on: connections to it are refused, and no other
    # process (another test worker) can take it before the request (a port closed first could).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", f"http://127.0.0.1:{port}")
        book = pricing.PriceBook("us-west-2")
        assert book.price(P5) == pricing.shipped_price(P5)
    [note] = book.notes
    assert note.startswith("AWS Price List API unavailable (EndpointConnectionError") and \
        note.endswith(f"{P5} priced from the shipped table")
    assert not list(price_list.glob("prices/*"))


def test_a_job_is_costed_at_the_price_list_rate_and_says_so(backend, price_list):
    lines: list[str] = []
    result = launcher.launch(config(instance_type=P5, instance_count=2), poll_interval_s=0.2,
                             out=lines.append)
    assert result.status == "Completed"
    assert result.price_source.startswith("AWS Price List API at ")
    assert result.estimated_cost_usd == pytest.approx(
        2 * result.billable_seconds / 3600 * 63.296, abs=1e-4)
    assert result.worst_case_cost_usd == pytest.approx(2 * 63.296)
    [worst] = [ln for ln in lines if ln.startswith("worst case")]
    assert "(2 x 1 h x $63.30/h; AWS Price List API at " in worst
    [final] = [ln for ln in lines if ln.startswith(f"training job {result.job_name}: Completed")]
    assert f", cost ${result.estimated_cost_usd:,.2f} (2 x " in final and \
        "AWS Price List API" in final


def test_a_job_on_a_training_plan_costs_its_share_of_the_upfront_fee(backend):
    sm = backend.client("sagemaker")
    [offer] = sm.search_training_plan_offerings(
        InstanceType=P6, InstanceCount=2, DurationHours=24,
        TargetResources=["training-job"])["TrainingPlanOfferings"]
    fee = PLAN_FEE_PER_INSTANCE_HOUR * 2 * 24
    assert offer["UpfrontFee"] == f"{fee:.2f}" and offer["CurrencyCode"] == "USD"
    name = f"plan-{os.getpid()}"
    arn = sm.create_training_plan(TrainingPlanName=name,
                                  TrainingPlanOfferingId=offer["TrainingPlanOfferingId"])[
        "TrainingPlanArn"]
    assert sm.describe_training_plan(TrainingPlanName=name)["UpfrontFee"] == f"{fee:.2f}"

    lines: list[str] = []
    result = launcher.launch(config(training_plan_arn=arn), poll_interval_s=0.2,
                             out=lines.append, budget_jobs=3)
    assert result.status == "Completed"
    # 1 instance x 1 h of the plan's 2 x 24 reserved instance-hours: 1/48 of the fee
    assert result.worst_case_cost_usd == pytest.approx(fee / 48)
    assert result.estimated_cost_usd == pytest.approx(
        result.billable_seconds / 3600 * PLAN_FEE_PER_INSTANCE_HOUR, abs=1e-4)
    assert result.price_source == (f"training plan {name}: UpfrontFee ${fee:,.2f} for 2 x 24 h, "
                                   "paid up front")
    [usage] = [ln for ln in lines if ln.startswith(f"training plan {name}: paid up front")]
    assert usage == (f"training plan {name}: paid up front, ${fee:,.2f} for 48 reserved "
                     "instance-hours; this sweep uses at most 3 jobs x 1 x 1 h = 3 "
                     "instance-hours (6% of the plan)")
    # the budget is checked against the plan's share, not an hourly rate
    with pytest.raises(UserError, match=r"3 jobs x \$90.00 = \$270.00; each \$90.00 \(1 x 1 h "
                       rf"x \$90.00/h; training plan {name}"):
        launcher.launch(config(training_plan_arn=arn, max_cost_usd=200.0), out=lambda ln: None,
                        budget_jobs=3)


def test_a_spot_job_reports_the_saving_sagemaker_reports(backend):
    lines: list[str] = []
    cfg = config(use_spot=True, checkpoint_s3_uri=f"s3://{BUCKET}/ckpt/spot",
                 max_wait_seconds=7200, max_steps=50)  # a few seconds: billable < training
    result = launcher.launch(cfg, poll_interval_s=0.2, out=lines.append)
    job = backend.client("sagemaker").describe_training_job(TrainingJobName=result.job_name)
    billable, training = job["BillableTimeInSeconds"], job["TrainingTimeInSeconds"]
    assert billable < training and result.training_seconds == training
    saving = 1 - billable / training  # botocore's formula
    price = pricing.shipped_price(P6).per_instance_hour
    assert result.estimated_cost_usd == pytest.approx(billable / 3600 * price, abs=1e-4)
    assert result.worst_case_cost_usd == pytest.approx(2 * price)  # MaxWaitTimeInSeconds
    [final] = [ln for ln in lines if ln.startswith(f"training job {result.job_name}")]
    assert (f"; spot saving {saving:.0%} as SageMaker reports it (billable {billable} s of "
            f"{training} s training), ${(training - billable) / 3600 * price:,.2f} less than "
            "on-demand") in final, final


def test_the_local_price_list_serves_only_get_products():
    status, payload = pricing_api.handle("DescribeServices", b"{}")
    assert status == 400 and payload["__type"] == "UnknownOperationException"
