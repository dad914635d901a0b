"""What the KFP component does, as a plain function (tested without KFP).

``params`` are the component's parameters by name: its signature
(``components/memory_estimate/component.py``) is their one declaration, whose
defaults the CLI fills in (``kfp_sagemaker_blackwell.components.memory_estimate.__main__.with_defaults``). Component semantics:
0 / -1 / "" model values keep the preset's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kfp_sagemaker_blackwell.common.errors import UserError
from kfp_sagemaker_blackwell.components.memory_estimate import report
from kfp_sagemaker_blackwell.planning import planner
from kfp_sagemaker_blackwell.planning.probe import Comparison, Probe, compare
from kfp_sagemaker_blackwell.planning.training_setup import TrainingSetup

# The component's parameters that the planner's Request carries itself; every other one
# named as a TrainingSetup field shapes the training step (``Request.training``).
REQUEST_PARAMETERS = ("batch_size", "seq_length", "world_size", "activation_checkpointing")


def training_parameters(params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters that are TrainingSetup fields (backend, optimizer, dropout...): a
    training knob the component declares under its TrainingSetup name needs no list."""
    return {k: v for k, v in params.items()
            if k in TrainingSetup.__dataclass_fields__ and k not in REQUEST_PARAMETERS}

@dataclass(frozen=True)
class ComponentOutputs:
    plan: str
    runnable_precisions: list[str]
    all_runnable: bool
    batch_candidates: list[dict[str, Any]]
    markdown: str
    metrics: dict[str, float]


def request(
    params: Mapping[str, Any],
    *,
    model: Mapping[str, Any] | None = None,
    training: Mapping[str, Any] | None = None,
) -> planner.Request:
    """The planner's request for the component's parameters.

    ``model`` / ``training``: further ModelSpec fields (None keeps the preset's) and
    training knobs that the CLI offers beyond the component's parameters.
    """
    return planner.Request(
        model=planner.model_from_parameters(params, **(model or {})),
        seq_length=params["seq_length"],
        hardware=planner.resolve_hardware(
            gpu=params["gpu"], instance_type=params["instance_type"],
            world_size=params["world_size"], instance_count=params["instance_count"],
        ),
        precisions=planner.parse_precisions(params["precisions"]),
        batch_sizes=(params["batch_size"],),
        activation_checkpointing=planner.parse_checkpointing(params["activation_checkpointing"]),
        headroom=params["headroom"],
        training={**training_parameters(params), **(training or {})},
        instance_hour_prices=dict(params["instance_hour_prices"] or {}) or None,
    )


def check_runnable(result: planner.PlanResult, params: Mapping[str, Any]) -> None:
    """``require_all_runnable``: a UserError naming every precision that cannot run."""
    bad = [e for e in result.plan.precisions.values() if not e.runnable]
    if params["require_all_runnable"] and bad:
        raise UserError(
            "precisions",
            "cannot all run: "
            + " ".join(f"{e.precision}: {e.reason or 'not runnable'}" for e in bad),
            "drop those precisions, or set require_all_runnable=False to skip them.",
        )


def parse_probe(params: Mapping[str, Any]) -> Probe | None:
    """The ``probe`` parameter (JSON text; "" = none), read once."""
    text = params["probe"] or ""
    return Probe.from_json(text, field="probe") if text.strip() else None


def compare_probe(result: planner.PlanResult, probe: Probe | None) -> Comparison | None:
    """The probe beside the plan's entry for its precision: a UserError naming ``probe``
    unless it ran this estimate's configuration (precision, micro-batch, checkpointing)
    on its GPU type."""
    if probe is None:
        return None
    plan, hw = result.plan, result.request.hardware
    entry = plan.precisions.get(probe.precision)
    if entry is None or not entry.runnable:
        why = "is not planned here" if entry is None else "does not run or fit here"
        raise UserError("probe", f"probed {probe.precision}, which {why} (planned: "
                        f"{', '.join(plan.precisions)}; runnable: "
                        f"{', '.join(plan.runnable_precisions()) or 'none'}).",
                        "probe a runnable precision of this estimate, or add it to precisions.")
    want = (entry.batch_size, entry.activation_checkpointing)
    if (probe.batch_size, probe.activation_checkpointing) != want or \
            probe.gpu_name() != hw.gpu.name:
        raise UserError(
            "probe", f"ran {probe.precision} batch {probe.batch_size}, checkpointing "
            f"{_on(probe.activation_checkpointing)} on {probe.gpu_name()}; this estimate's "
            f"{probe.precision} is batch {want[0]}, checkpointing {_on(want[1])} on "
            f"{hw.gpu.name}.", f"probe that configuration, or set batch_size={probe.batch_size} "
            f"and activation_checkpointing={_on(probe.activation_checkpointing)} (a probe on "
            "another GPU type says nothing about this one).")
    setup = result.request.setup(probe.precision, entry.batch_size,
                                 entry.activation_checkpointing)
    return compare(probe, setup, hw.gpu, instance_type=hw.instance_type,
                   predicted=entry.tokens_per_s_per_gpu)


def _on(x: bool) -> str:
    return "on" if x else "off"


def run_component(**params: Any) -> ComponentOutputs:
    """The component's outputs for its parameters, every one by name (the CLI's
    ``with_defaults`` fills in the signature's defaults)."""
    probe = parse_probe(params)
    result = planner.plan(request(params))
    planner.check_single_precision_supported(result)
    check_runnable(result, params)
    probed = compare_probe(result, probe)
    runnable = result.plan.runnable_precisions()
    return ComponentOutputs(
        plan=result.plan.to_json(),
        runnable_precisions=runnable,
        all_runnable=len(runnable) == len(result.plan.precisions),
        batch_candidates=planner.batch_candidates(result, params["max_candidate_batch_size"]),
        markdown=report.markdown(result, probed),
        metrics=report.metrics(result, probed),
    )
