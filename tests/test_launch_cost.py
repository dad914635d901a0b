"""Cost of a training job: per-instance billing, the worst case before launch, budgets,
the shipped price table and its sources (the Price List API: tests/test_prices.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kfp_sagemaker_blackwell.catalog import hardware
from kfp_sagemaker_blackwell.common import aws
from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.components.sagemaker_training import __main__ as cli
from kfp_sagemaker_blackwell.components.sagemaker_training import launcher
from kfp_sagemaker_blackwell.components.sagemaker_training.request import TrainingJobConfig
from kfp_sagemaker_blackwell.planning import pricing
from kfp_sagemaker_blackwell.planning.memory_plan import MemoryPlan, PrecisionPlan

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/kfp-sagemaker-trainer:test"
ROLE = "arn:aws:iam::123456789012:role/SageMakerTraining"
P6 = "ml.p6-b200.48xlarge"
PRICE = hardware.INSTANCE_TYPES[P6].price.usd_per_hour


def book(**overrides) -> pricing.PriceBook:
    return pricing.PriceBook("us-west-2", overrides, lookup=False)


def cfg(**changes) -> TrainingJobConfig:
    base = TrainingJobConfig(image_uri=IMAGE, role_arn=ROLE, output_s3_uri="s3://my-bucket/out",
                             run_id="cost", task="train", model_preset="tiny", batch_size=2,
                             seq_length=32, max_steps=10)
    return replace(base, **changes)


def test_billable_time_is_per_instance_so_two_instances_cost_twice_as_much():
    price = book().price(P6)
    one = pricing.cost(price, 1, 3600)
    two = pricing.cost(price, 2, 3600)
    assert one.amount == pytest.approx(PRICE) and two.amount == pytest.approx(2 * PRICE)
    assert book().price("ml.unknown") is None


def test_worst_case_is_instances_times_max_runtime_times_price_and_names_its_source():
    lines: list[str] = []
    resolved, _ = launcher.prepare(cfg(instance_count=2, max_runtime_seconds=7200))
    worst = launcher.cost_preview(resolved, book(), say=lines.append)
    assert worst is not None and worst.amount == pytest.approx(2 * 2 * PRICE)
    [line] = [ln for ln in lines if ln.startswith("worst case")]
    assert f"(max_runtime_seconds): ${2 * 2 * PRICE:,.2f} (2 x 2 h x ${PRICE:,.2f}/h; " \
        f"shipped table of {hardware.PRICES_CHECKED} (derived: 1.15 x EC2" in line, line
    assert line.endswith("verify)")


def test_spot_worst_case_is_max_wait_time_at_the_on_demand_rate():
    lines: list[str] = []
    resolved, _ = launcher.prepare(cfg(use_spot=True, checkpoint_s3_uri="s3://my-bucket/ckpt",
                                       max_runtime_seconds=3600, max_wait_seconds=3 * 3600))
    worst = launcher.cost_preview(resolved, book(), say=lines.append)
    # SageMaker ends a spot job at MaxWaitTimeInSeconds, not at MaxRuntimeInSeconds
    assert worst is not None and worst.amount == pytest.approx(3 * PRICE)
    assert any("max_wait_seconds, billed at most the on-demand rate" in ln for ln in lines)


def test_shipped_table_has_the_june_2025_rates_and_every_row_a_source():
    shipped = {name: it.price for name, it in hardware.INSTANCE_TYPES.items() if it.price}
    assert shipped["ml.p5.48xlarge"].usd_per_hour == 63.296
    assert shipped["ml.p4d.24xlarge"].usd_per_hour == 25.25
    # SageMaker = 1.15 x EC2 for every pair checked; rows derived so say it
    assert PRICE == pytest.approx(1.15 * 113.9328) and PRICE == pytest.approx(131.02, abs=0.01)
    for itype in ("ml.p6-b200.48xlarge", "ml.p5en.48xlarge", "ml.p6-b300.48xlarge"):
        assert shipped[itype].source.startswith("derived: 1.15 x EC2"), itype
    assert shipped["ml.p5e.48xlarge"].usd_per_hour is None  # training plans only
    for itype, row in shipped.items():
        assert row.source, itype
        if row.usd_per_hour is not None:
            source = book().price(itype).source
            assert source.startswith(f"shipped table of {hardware.PRICES_CHECKED} (") \
                and source.endswith(": verify"), source


def test_the_users_price_wins_and_says_it_is_the_users():
    price = book(**{P6: 99.5}).price(P6)
    assert price == pricing.Price(99.5, "instance_hour_prices (yours)")


@pytest.mark.parametrize(("budget", "jobs", "refused"), [
    (100.0, 1, True), (3 * PRICE, 1, False), (3 * PRICE, 2, True), (0.0, 4, False)])
def test_max_cost_usd_refuses_a_worst_case_over_it_before_any_aws_call(budget, jobs, refused):
    c = cfg(max_runtime_seconds=7200, max_cost_usd=budget)  # worst case 2 x PRICE per job
    with aws.record_calls() as recording:
        if refused:
            with pytest.raises(UserError) as err:
                launcher.launch(c, out=lambda line: None, budget_jobs=jobs)
            assert err.value.field == "max_cost_usd" and f"{budget:,.2f}" in str(err.value)
        else:
            resolved, _ = launcher.prepare(c)
            launcher.cost_preview(resolved, book(), budget_jobs=jobs, say=lambda line: None)
    assert recording.calls() == []


def test_a_budget_without_a_price_is_refused_saying_why_there_is_none():
    c = cfg(instance_type="ml.p5e.48xlarge", precision="bf16", max_cost_usd=10.0)
    resolved, _ = launcher.prepare(c)
    with pytest.raises(UserError, match="no price for ml.p5e.48xlarge .no on-demand price: "
                       "sold through training plans only") as err:
        launcher.cost_preview(resolved, book(), say=lambda line: None)
    assert 'instance_hour_prices={"ml.p5e.48xlarge"' in str(err.value)


def test_the_plans_predicted_time_and_cost_are_shown_labelled_predicted(capsys):
    from kfp_sagemaker_blackwell.catalog import spec

    entry = PrecisionPlan(precision="bf16", supported=True, fits=True, batch_size=2,
                          activation_checkpointing=False, peak_bytes=2**30, step_seconds=0.5,
                          throughput_source="throughput model")
    plan = MemoryPlan(instance_type=P6, gpu="B200", gpu_memory_bytes=192 * 2**30, world_size=8,
                      seq_length=32, model=spec.PRESETS["tiny"].to_dict(),
                      precisions={"bf16": entry}).to_json()
    code = cli.main(["--run-id", "cost", "--image-uri", IMAGE, "--role-arn", ROLE,
                     "--output-s3-uri", "s3://my-bucket/out", "--model-preset", "tiny", "--batch-size", "2",
                     "--seq-length", "32", "--max-steps", "7200", "--memory-plan", plan,
                     "--dry-run"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"predicted: 7200 steps x 0.5 s = 1.00 h, ${PRICE:,.2f} (1 x 1 h x ${PRICE:,.2f}/h; " \
        f"shipped table of {hardware.PRICES_CHECKED}" in err, err
    assert "predicted, not measured" in err and "worst case (max_runtime_seconds): $" in err


def test_the_sweeps_pass_their_items_so_the_budget_covers_every_job():
    from kfp_sagemaker_blackwell.pipelines import batch_tuning, precision_sweep

    for module, items in ((precision_sweep, "runnable_precisions"),
                          (batch_tuning, "trials")):
        spec = module.PIPELINE.pipeline_spec
        train = [t for comp in spec.components.values() for name, t in comp.dag.tasks.items()
                 if name.startswith("sagemaker-training")]
        assert len(train) == 1
        params = train[0].inputs.parameters
        assert params["max_cost_usd"].component_input_parameter == "pipelinechannel--max_cost_usd"
        assert items in params["budget_items"].component_input_parameter


def test_both_pipelines_pass_instance_hour_prices_to_the_plan_and_every_training_job():
    from kfp_sagemaker_blackwell.pipelines import batch_tuning, precision_sweep

    for module in (precision_sweep, batch_tuning):
        spec = module.PIPELINE.pipeline_spec
        assert "instance_hour_prices" in spec.root.input_definitions.parameters
        tasks = {name: t for comp in list(spec.components.values()) + [spec.root]
                 for name, t in comp.dag.tasks.items()}
        for prefix in ("memory-estimate", "sagemaker-training"):
            [task] = [t for name, t in tasks.items() if name.startswith(prefix)]
            assert task.inputs.parameters["instance_hour_prices"].component_input_parameter \
                in ("instance_hour_prices", "pipelinechannel--instance_hour_prices"), prefix


def test_the_memory_plan_prices_with_the_users_rate_and_names_it():
    from kfp_sagemaker_blackwell.components.memory_estimate.__main__ import with_defaults
    from kfp_sagemaker_blackwell.components.memory_estimate.launcher import run_component

    plan = MemoryPlan.from_json(run_component(**with_defaults(dict(
        model_preset="1b", seq_length=1024, batch_size=2, precisions=["bf16"],
        instance_hour_prices={P6: 50.0}))).plan)
    entry = plan.precisions["bf16"]
    assert entry.price_source == "instance_hour_prices (yours)"
    per_billion = 50.0 / 3600 * 1e9 / (entry.tokens_per_s_per_gpu * 8)
    assert entry.cost_usd_per_billion_tokens == pytest.approx(per_billion, rel=1e-3)


def test_a_cost_reads_as_its_formula_and_its_source():
    price = pricing.Price(63.296, "AWS Price List API, us-west-2, 2026-12-01")
    assert str(pricing.cost(price, 2, 90)) == ("$3.16 (2 x 90 s x $63.30/h; AWS Price List API, "
                                               "us-west-2, 2026-12-01)")
    assert str(pricing.cost(price, 1, 5400)).startswith("$94.94 (1 x 1.5 h x $63.30/h; ")
    eur = pricing.cost(pricing.Price(10.0, "training plan p", "EUR"), 1, 3600)
    assert str(eur).startswith("10.00 EUR (1 x 1 h x 10.00 EUR/h; ")


@pytest.mark.parametrize("amount", [-5, -0.01, float("inf"), float("nan"), True])
def test_resolve_refuses_a_budget_that_is_not_an_amount_naming_max_cost_usd(amount):
    from kfp_sagemaker_blackwell.catalog.errors import FieldError
    from kfp_sagemaker_blackwell.components.sagemaker_training.request import resolve

    with pytest.raises(FieldError) as err:
        resolve(cfg(max_cost_usd=amount), region="us-west-2")
    assert isinstance(err.value, UserError) and err.value.field == "max_cost_usd"
    assert "is not an amount" in err.value.problem and "0: no limit" in err.value.fix


def test_resolve_parses_the_budget_once_for_the_jobs_that_share_it():
    from kfp_sagemaker_blackwell.components.sagemaker_training.request import Budget, resolve

    resolved = resolve(cfg(max_cost_usd=12, budget_items=["bf16", "fp8", "mxfp8"]),
                       region="us-west-2")
    assert resolved.budget == Budget(12.0, 3)
    assert resolve(cfg(), region="us-west-2").budget == Budget(0.0, 1)


@pytest.mark.parametrize("amount", [-1, float("nan"), float("inf"), True, "10"])
def test_the_planner_refuses_a_budget_as_the_training_job_does(amount):
    """One Budget (planning/pricing.py) parses max_cost_usd for sagemaker_training and
    plan_training: the same refusal, in the same words."""
    from kfp_sagemaker_blackwell.common import cli as common_cli
    from kfp_sagemaker_blackwell.components.plan_training import launcher as plan_run
    from kfp_sagemaker_blackwell.components.plan_training.component import plan_training

    with pytest.raises(UserError) as launched:
        pricing.Budget.parse(amount, None)
    with pytest.raises(UserError) as planned:
        plan_run.run_component(verdicts="", probe_series=(), **common_cli.declared(
            plan_training, {"training_tokens": 10**9, "max_cost_usd": amount}))
    assert str(planned.value) == str(launched.value)


def test_instance_hours_are_what_a_cost_and_a_plans_share_are_made_of():
    price = pricing.Price(40.0, "test")
    assert pricing.instance_hours(2, 5400) == 3.0
    assert pricing.cost(price, 2, 5400).amount == 40.0 * pricing.instance_hours(2, 5400)
    assert not pricing.Budget(0.0).over(1e9) and pricing.Budget(100.0, 2).over(50.01)
    assert not pricing.Budget(100.0, 2).over(50.0)
