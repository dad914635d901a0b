"""What a report is about, said at its top, so that a forwarded report says what was trained.

Two sources, merged: what the pipeline knows and passes to the report step (pipeline name,
run id, instance type and count, region, model preset: ``given``), and what each run's
series metadata says about itself (``kfp_sagemaker_blackwell.common.step_series``: the job name, the
trainer's configuration, world size and GPU). A value the runs share is shown once; values
that differ (the batch sizes of a tuning sweep) are listed. Both reports (the precision
sweep's and batch tuning's) render the same rows, in HTML and in Markdown.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Mapping, Sequence
from typing import Any

from kfp_sagemaker_blackwell.common import markdown as md

# The keys a pipeline may pass (``run_context`` of the report components), in display order.
GIVEN_KEYS = ("pipeline", "run_id", "model_preset", "instance_type", "instance_count", "region")


def _distinct(values: Sequence[Any]) -> list[str]:
    out: list[str] = []
    for v in values:
        if v is None or v == "" or isinstance(v, dict):
            continue
        if isinstance(v, float) and v.is_integer():
            v = int(v)  # a count passed through a pipeline's JSON arrives as 1.0
        text = {True: "on", False: "off"}.get(v, str(v)) if isinstance(v, bool) else str(v)
        if text not in out:
            out.append(text)
    return out


def _model(given: Mapping[str, Any], metas: Sequence[Mapping[str, Any]]) -> str:
    """The preset name (when the pipeline passed it) and the shapes the runs trained."""
    shapes = []
    for meta in metas:
        m = (meta.get("training") or {}).get("model")
        if isinstance(m, dict) and m.get("num_layers"):
            shapes.append(f"{m.get('num_layers')} layers, hidden {m.get('hidden_size')}, "
                          f"{m.get('num_heads')} heads ({m.get('num_kv_heads')} kv), "
                          f"ffn {m.get('ffn_hidden_size')}, vocab {m.get('vocab_size')}")
    parts = _distinct([given.get("model_preset")]) + _distinct(shapes)
    return "; ".join(parts)


def rows(given: Mapping[str, Any] | None, metas: Sequence[Mapping[str, Any]], *,
         now: dt.datetime | None = None) -> list[tuple[str, str]]:
    """(label, value) rows: only what is known (an unknown value is left out, not "n/a")."""
    given = dict(given or {})
    training = [m.get("training") or {} for m in metas]

    def each(key: str) -> str:
        values = [t.get(key) for t in training]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values if v is not None):
            values = sorted(v for v in values if v is not None)  # batch sizes 1, 2, 4, 8
        return ", ".join(_distinct(values))

    world = _distinct([f"{m.get('world_size')} x {m.get('gpu') or 'CPU process'}"
                       for m in metas if m.get("world_size")])
    instance = " x ".join(_distinct([given.get("instance_count")]) + _distinct(
        [given.get("instance_type")])) if given.get("instance_type") else ""
    out = [
        ("pipeline", ", ".join(_distinct([given.get("pipeline")]))),
        ("run id", ", ".join(_distinct([given.get("run_id")]))),
        ("report written", (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%d %H:%M UTC")),
        ("model", _model(given, metas)),
        ("sequence length", each("seq_length")),
        ("batch size per GPU", each("batch_size")),
        ("gradient accumulation", each("grad_accum_steps")),
        ("activation checkpointing", each("activation_checkpointing")),
        ("steps", each("max_steps")),
        ("instances", instance),
        ("ranks", ", ".join(world)),
        ("region", ", ".join(_distinct([given.get("region")]))),
        ("training jobs", ", ".join(_distinct([m.get("run") for m in metas]))),
    ]
    extra = [(str(k), ", ".join(_distinct([v]))) for k, v in sorted(given.items())
             if k not in GIVEN_KEYS]
    return [(k, v) for k, v in out + extra if v]


def to_html(context: list[tuple[str, str]]) -> str:
    """A two-column table (class ``run-context``), every value escaped."""
    e = html.escape
    cells = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in context)
    return f"<table class='run-context' id='run-context'><caption>Run</caption>{cells}</table>"


def to_markdown(context: list[tuple[str, str]]) -> list[str]:
    """One bullet per row, every value escaped (``kfp_sagemaker_blackwell.common.markdown``); a list,
    not a table, so the summary's one table stays its verdicts."""
    return [f"- {md.inline(k)}: {md.inline(v)}" for k, v in context] + [""]
