"""A precision name is checked once per boundary in one process (issue 27 item 2).

``parse_precision`` is the one check (a lookup in ``precisions._BY_NAME``); the trainer's
``--precision`` flag is checked by argparse's choices and converted by ``as_precision``.
Each test counts the lookups by the function that made them, over one whole CLI run.
"""

from __future__ import annotations

import collections
import copy
import json
import pickle
import sys
from typing import Any

import pytest

from kfp_sagemaker_blackwell.catalog import hardware, precisions

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/kfp-sagemaker-trainer:test"
ROLE = "arn:aws:iam::123456789012:role/SageMakerTraining"


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()

    class Counting(dict):  # type: ignore[type-arg]
        def get(self, key: Any, default: Any = None) -> Any:
            counts[sys._getframe(1).f_code.co_name] += 1
            return dict.get(self, key, default)

    monkeypatch.setattr(precisions, "_BY_NAME", Counting(precisions._BY_NAME))
    return counts


def test_parse_returns_the_catalog_facts_and_trusts_a_parsed_value(checks):
    fp8 = precisions.parse_precision("fp8")
    assert (fp8, fp8.name, fp8.recipe, fp8.low, fp8.compute_dtype, fp8.min_cc, fp8.risk) == (
        "fp8", "fp8", "DelayedScaling", True, "bf16", (8, 9), 1)
    assert precisions.parse_precision("bf16").recipe == ""
    assert precisions.parse_precision(fp8) is fp8 and checks["parse_precision"] == 2
    with pytest.raises(ValueError, match=r"^baseline='fp9': unknown; did you mean"):
        precisions.parse_precision("fp9", "baseline")
    with pytest.raises(AttributeError):
        fp8.risk = 0  # type: ignore[misc]
    # a str wherever a name goes (JSON, copies, other processes), still the parsed value
    assert json.dumps({fp8: fp8}) == '{"fp8": "fp8"}'
    assert pickle.loads(pickle.dumps(fp8)) is fp8 and copy.deepcopy(fp8) is fp8
    b200, sm120 = hardware.gpu("B200"), (12, 0)
    assert b200.supports(precisions.parse_precision("mxfp8"))
    assert not precisions.parse_precision("mxfp8").supported_on(sm120)
    checks.clear()
    assert b200.supported_precisions() == list(precisions.PRECISIONS) and not checks


def test_the_training_component_checks_its_precision_once(checks, capsys):
    from kfp_sagemaker_blackwell.components.sagemaker_training.__main__ import main

    assert main(["--dry-run", "--run-id", "r1", "--task", "train", "--pipeline", "p",
                 "--image-uri", IMAGE, "--role-arn", ROLE, "--region", "us-west-2",
                 "--output-s3-uri", "s3://kfp-sagemaker-test/out", "--precision", "mxfp8",
                 "--model-preset", "tiny", "--batch-size", "4", "--seq-length", "32",
                 "--max-steps", "12", "--fallback-instances",
                 '[{"InstanceType": "ml.p6-b200.48xlarge", "InstanceCount": 2}]']) == 0
    # resolve's parse; the trainer's own parser, replayed on the hyperparameters, converts
    # (its argparse choices check the flag) and TrainConfig.validate trusts the result
    assert checks == {"parse_precision": 1, "as_precision": 1}


def test_a_plan_search_checks_each_listed_precision_once(checks, capsys):
    from kfp_sagemaker_blackwell.components.plan_training.__main__ import main
    from kfp_sagemaker_blackwell.planning import published

    # The report's Blackwell check (published.check(): the published figures against the model)
    # parses its own 9 constants once per process and keeps the result: made before the count,
    # as any earlier plan in this process made it, so the count does not depend on which tests
    # ran before this one in its worker (it failed when it ran first).
    published.check()
    checks.clear()
    assert main(["--model-preset", "8b", "--training-tokens", "100000000000",
                 "--seq-length", "8192", "--capacity-modes", "on-demand",
                 "--precisions", "bf16,fp8"]) == 0
    assert checks == {"parse_precision": 2}  # not once per candidate (96 before)


def test_a_memory_estimate_checks_each_precision_once(checks, capsys):
    from kfp_sagemaker_blackwell.components.memory_estimate.__main__ import main

    assert main(["--model-preset", "8b", "--seq-length", "4096",
                 "--precisions", "bf16,fp8,mxfp8"]) == 0
    assert checks == {"parse_precision": 3}


def test_the_sweeps_argument_check_passes_its_parsed_precisions_on(checks, tmp_path, capsys):
    from kfp_sagemaker_blackwell.pipelines import precision_sweep

    assert precision_sweep.main(["--compile", "--output", str(tmp_path / "s.yaml"),
                                 "--precisions", "bf16,fp8"]) == 0
    # the memory plan and the two training checks it runs trust them
    assert checks == {"parse_precision": 2, "as_precision": 2}


def test_the_trainer_config_trusts_its_flags_parse(checks):
    from kfp_sagemaker_blackwell.catalog import flags

    cfg = flags.check_hyperparameters({"precision": "fp8", "model-preset": "tiny"})
    assert cfg.precision == "fp8" and isinstance(cfg.precision, precisions.Precision)
    assert checks == {"as_precision": 1}
    checks.clear()
    flags.make("tiny", precision="fp8")  # in-process: validate is the boundary
    assert checks == {"parse_precision": 1}


def test_a_comparison_checks_its_baseline_once_and_trusts_the_series_names(checks):
    from kfp_sagemaker_blackwell.catalog.spec import PRESETS
    from kfp_sagemaker_blackwell.common import cli
    from kfp_sagemaker_blackwell.common.step_series import Series
    from kfp_sagemaker_blackwell.components.compare_convergence.compare import Settings, compare
    from kfp_sagemaker_blackwell.components.compare_convergence.component import (
        compare_convergence,
    )

    training = {"model": PRESETS["small"].to_dict(), "batch_size": 8, "seq_length": 64}
    steps = list(range(1, 101))
    series = [Series({"precision": p, "seed": 1, "status": "completed", "training": training},
                     {"step": steps, "loss": [5.0 - s / 50 for s in steps],
                      "tokens_per_s": [1000.0] * len(steps)}, f"{p}.csv")
              for p in ("bf16", "fp8", "fp9")]
    cmp = compare(series, Settings.from_parameters(cli.declared(compare_convergence)))
    # the fp8 speed-up is predicted by the throughput model (its setups trust the names)
    assert cmp.results["fp8"].speedup_source.startswith("predicted on B200")
    assert cmp.results["fp9"].speedup_source == "unknown: fp9 is not a known precision"
    assert checks == {"parse_precision": 1, "as_precision": 3}
