"""What the component and its command line both do: memory_estimate's candidates corrected by
the probe, those that still fit ranked, the best ``trial_count`` chosen (planning/prerank.py)."""

from __future__ import annotations

from typing import Any

from kfp_sagemaker_blackwell.planning.memory_plan import MemoryPlan
from kfp_sagemaker_blackwell.planning.prerank import PreRank, prerank
from kfp_sagemaker_blackwell.planning.probe import parse_probes


def prerank_candidates(memory_plan: str, batch_candidates: list[Any], probe: str,
                       trial_count: int) -> PreRank:
    """The pre-ranking of the plan's (JSON) candidates by the probe (JSON, "" = none); a
    plan, candidates or probe that cannot be read is a UserError naming the parameter."""
    return prerank(MemoryPlan.from_json(memory_plan), batch_candidates,
                   parse_probes(probe, field="probe"), trial_count)
