"""One declaration per parameter: the KFP signatures, the CLIs and the pipelines agree.

A component's signature declares its parameters; its CLI (``python -m
components.<name>``) must offer each one under the parameter's name with dashes
and with no default of its own that differs; the same parameter has the same name
(and so the same flag) in every component, CLI and pipeline.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import re
from pathlib import Path
from typing import Any

import pytest

from kfp_sagemaker_blackwell.common import cli

# CLI module -> (component module, component name). Every module has build_parser().
CLIS = {
    "kfp_sagemaker_blackwell.components.memory_estimate.__main__": ("kfp_sagemaker_blackwell.components.memory_estimate.component", "memory_estimate"),
    "kfp_sagemaker_blackwell.components.build_image.__main__": ("kfp_sagemaker_blackwell.components.build_image.component", "build_image"),
    "kfp_sagemaker_blackwell.components.cleanup.__main__": ("kfp_sagemaker_blackwell.components.cleanup.component", "cleanup"),
    "kfp_sagemaker_blackwell.components.parse_logs.__main__": ("kfp_sagemaker_blackwell.components.parse_logs.component", "parse_logs"),
    "kfp_sagemaker_blackwell.components.compare_convergence.__main__": ("kfp_sagemaker_blackwell.components.compare_convergence.component",
                                                "compare_convergence"),
    "kfp_sagemaker_blackwell.components.sagemaker_training.__main__": ("kfp_sagemaker_blackwell.components.sagemaker_training.component",
                                               "sagemaker_training"),
    "kfp_sagemaker_blackwell.components.plan_training.__main__": ("kfp_sagemaker_blackwell.components.plan_training.component", "plan_training"),
    "kfp_sagemaker_blackwell.components.rank_throughput.__main__": ("kfp_sagemaker_blackwell.components.rank_throughput.component",
                                            "rank_throughput"),
    "kfp_sagemaker_blackwell.components.prerank_candidates.__main__": (
        "kfp_sagemaker_blackwell.components.prerank_candidates.component", "prerank_candidates"),
}
ROOT = Path(__file__).resolve().parent.parent
# What is not yet converted: (test, source) -> why. Strict, so that a marker must go the
# day its test passes.
NOT_YET: dict[tuple[str, str], str] = {}
# Parameters that two declarations still spell two ways: name set -> why. The test fails
# when one is fixed, so that it is struck here.
SPLIT: dict[frozenset[str], str] = {}
PIPELINES = ("kfp_sagemaker_blackwell.pipelines.precision_sweep", "kfp_sagemaker_blackwell.pipelines.batch_tuning", "kfp_sagemaker_blackwell.pipelines.plan_and_train")
# Names that mean the same parameter even though they differ by more than a unit suffix.
SYNONYMS = [{"preset", "model_preset"}, {"pipeline", "pipeline_name"},
            {"poll_interval", "poll_interval_s", "poll_interval_seconds"}]


def _mark(test: str, name: str) -> Any:
    reason = NOT_YET.get((test, name))
    return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=reason)) if reason \
        else name


def _component(cli_module: str) -> Any:
    module, name = CLIS[cli_module]
    return getattr(importlib.import_module(module), name)


def _parser(source: str) -> argparse.ArgumentParser:
    if source == "trainer":
        from kfp_sagemaker_blackwell.catalog.flags import build_parser

        return build_parser()
    if source in PIPELINES:
        from kfp_sagemaker_blackwell.pipelines import _cli

        mod = importlib.import_module(source)
        return _cli.build_parser(name=source.split(".")[-1], doc=mod.__doc__ or "",
                                 build=mod.build_pipeline,
                                 default_parallelism=mod.DEFAULT_PARALLELISM,
                                 local_defaults=mod.LOCAL_DEFAULTS)[0]
    built = importlib.import_module(source).build_parser()
    return built[0] if isinstance(built, tuple) else built


def _visible_options(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """dest -> long options of every documented optional flag (deprecated aliases are hidden)."""
    out: dict[str, list[str]] = {}
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or not action.option_strings or action.dest == "help":
            continue
        out.setdefault(action.dest, []).extend(o for o in action.option_strings
                                               if o.startswith("--"))
    return out


@pytest.mark.parametrize("cli_module", [_mark("defaults", m) for m in CLIS])
def test_every_component_parameter_is_a_cli_flag_with_the_components_default(cli_module):
    component = _component(cli_module)
    parser = _parser(cli_module)
    left_out = set(getattr(importlib.import_module(cli_module), "PIPELINE_ONLY", ()))
    by_dest = {a.dest: a for a in parser._actions if a.help != argparse.SUPPRESS}
    problems = []
    for p in cli.parameters(component):
        if p.name in left_out:
            continue
        action = by_dest.get(p.name)
        if action is None:
            problems.append(f"{p.name}: no {p.flag}")
            continue
        if p.flag not in action.option_strings:
            problems.append(f"{p.name}: spelled {action.option_strings}, not {p.flag}")
        # None: the CLI takes the declaration's default (kfp_sagemaker_blackwell.common.cli.values)
        if action.default is not None and action.default != p.default:
            problems.append(f"{p.name}: CLI default {action.default!r} != {p.default!r}")
    assert not problems, problems


@pytest.mark.parametrize("source", [_mark("flags", s) for s in (*CLIS, *PIPELINES, "trainer")])
def test_a_flag_is_its_parameters_name_with_dashes(source):
    wrong = {dest: options for dest, options in _visible_options(_parser(source)).items()
             if options and options[0] != cli.flag_name(dest)}
    assert not wrong, wrong


def _unit_free(name: str) -> str:
    name = re.sub(r"_(s|sec|secs|seconds)$", "", name)
    for group in SYNONYMS:
        if name in group:
            return min(group)
    return name


def _declared_names() -> set[str]:
    names = set()
    for cli_module in CLIS:
        names |= {p.name for p in cli.parameters(_component(cli_module))}
    for pipeline in PIPELINES:
        names |= {p.name for p in cli.parameters(importlib.import_module(pipeline).PIPELINE)}
    return names


def test_the_components_and_pipelines_spell_each_parameter_one_way():
    groups: dict[str, set[str]] = {}
    for name in _declared_names():
        groups.setdefault(_unit_free(name), set()).add(name)
    assert {frozenset(g) for g in groups.values() if len(g) > 1} == set(SPLIT)


@pytest.mark.parametrize("source", [_mark("spelling", s) for s in (*CLIS, "trainer")])
def test_every_cli_spells_a_parameter_as_the_components_do(source):
    split = set().union(*SPLIT)
    declared = {_unit_free(n): n for n in _declared_names() if n not in split}
    wrong = {dest: declared[_unit_free(dest)] for dest in _visible_options(_parser(source))
             if _unit_free(dest) in declared and dest != declared[_unit_free(dest)]}
    assert not wrong, wrong


# ---- parameter groups: declared once in the catalog, written out in each signature --------

# Each group of catalog/parameters.py and the components and pipelines that declare it.
GROUP_SITES = {
    "MODEL": {"sagemaker_training", "memory_estimate", "plan_training", "precision_sweep",
              "batch_tuning", "plan_and_train"},
    "ENCRYPTION": {"sagemaker_training", "precision_sweep", "batch_tuning"},
    "PIPELINE_RUN": {"precision_sweep", "batch_tuning", "plan_and_train"},
    "CAPACITY": {"precision_sweep", "batch_tuning"},
    "SWEEP_BUDGET": {"precision_sweep", "batch_tuning"},
    "PLAN_LIMITS": {"plan_training", "plan_and_train"},
    "PIPELINE_IMAGE_AND_CLEANUP": {"precision_sweep", "batch_tuning", "plan_and_train"},
}


def _is_kfp(fn: ast.FunctionDef) -> bool:
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if getattr(target, "attr", getattr(target, "id", "")) in ("component", "pipeline"):
            return True
    return False


def _signatures() -> dict[str, ast.FunctionDef]:
    """Every component's and pipeline's function, by name, as its source declares it."""
    paths = sorted((ROOT / "components").glob("*/component.py"))
    paths += [ROOT / "pipelines" / f"{m.rsplit('.', 1)[-1]}.py" for m in PIPELINES]
    return {fn.name: fn for path in paths
            for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(fn, ast.FunctionDef) and _is_kfp(fn)}


def _declared(fn: ast.FunctionDef) -> list[tuple[str, str, Any]]:
    """(name, kind, default) of each value parameter, the default ``REQUIRED`` when there is
    none and an empty container for None (what the group's default means to KFP)."""
    from kfp_sagemaker_blackwell.catalog.parameters import REQUIRED

    args = fn.args.args
    defaults = [REQUIRED] * (len(args) - len(fn.args.defaults)) + fn.args.defaults
    out = []
    for arg, node in zip(args, defaults, strict=True):
        kind = ast.unparse(arg.annotation).removeprefix("Optional[").removesuffix("]")
        if kind not in cli.KINDS:
            continue  # an artifact
        value = node if node is REQUIRED else (
            ast.literal_eval(node) if not isinstance(node, ast.Attribute | ast.Name) else "?")
        out.append((arg.arg, kind, cli.KINDS[kind]() if value is None else value))
    return out


def test_every_signature_writes_its_parameter_groups_as_the_catalog_declares_them():
    """KFP needs each signature literal, so a group (the model, encryption, a pipeline's run,
    ...) is written out in every component and pipeline that takes it, once declared in
    catalog/parameters.py: there, each site writes the whole group as one block in its order
    with its kinds and defaults, and leaves its documentation to the group (the decorators
    put it in). A signature that writes a group's parameters as one block takes the group,
    and is one of its sites."""
    from kfp_sagemaker_blackwell.catalog import parameters

    assert set(GROUP_SITES) == {name for name in dir(parameters)
                                if getattr(parameters, name) in parameters.GROUPS}
    problems = []
    for site, fn in _signatures().items():
        declared = _declared(fn)
        names = [name for name, _, _ in declared]
        documented = set(cli.doc_args(ast.get_docstring(fn) or ""))
        for key, sites in GROUP_SITES.items():
            group = getattr(parameters, key)
            if site not in sites:
                if group.taken_by(names):
                    problems.append(f"{site}: takes {key} without being its site")
                continue
            want = [(p.name, p.kind.__name__, p.default) for p in group.parameters]
            start = names.index(group.names[0]) if group.names[0] in names else -1
            if start < 0 or declared[start:start + len(want)] != want:
                problems.append(f"{site}: {key} is not {want} in one block")
            if documented & set(group.names):
                problems.append(f"{site}: documents {sorted(documented & set(group.names))} "
                                f"itself (the group's help is in catalog/parameters.py)")
    assert not problems, problems


def test_the_groups_help_reaches_the_kfp_description_and_the_command_line():
    from kfp_sagemaker_blackwell.catalog.parameters import MODEL
    from kfp_sagemaker_blackwell.components.memory_estimate.component import memory_estimate
    from kfp_sagemaker_blackwell.pipelines.plan_and_train import PIPELINE

    spec = memory_estimate.component_spec.inputs
    helps = {p.name: p.help for p in cli.parameters(PIPELINE.pipeline_func)}
    for p in MODEL.parameters:
        assert " ".join(spec[p.name].description.split()) == p.help
        assert helps[p.name] == p.help


# ---- the domain's typed values are made from the declaration, checked once ----------------


def test_compare_settings_take_the_components_defaults_and_name_a_bad_parameter():
    from kfp_sagemaker_blackwell.common.errors import UserError
    from kfp_sagemaker_blackwell.components.compare_convergence.compare import Settings
    from kfp_sagemaker_blackwell.components.compare_convergence.component import compare_convergence

    settings = Settings.from_parameters(cli.declared(compare_convergence))
    assert (settings.baseline, settings.loss_tolerance_rel, settings.align_by) == (
        "bf16", 0.01, "step")
    for name, bad in (("align_by", "time"), ("baseline", "fp9"), ("target_gpu", "B900"),
                      ("final_window", 0.0)):
        with pytest.raises(UserError) as err:
            Settings.from_parameters(cli.declared(compare_convergence, **{name: bad}))
        assert err.value.field == name


def test_a_build_request_takes_the_components_defaults_and_names_a_bad_parameter():
    from kfp_sagemaker_blackwell.common.errors import UserError
    from kfp_sagemaker_blackwell.components.build_image.component import build_image
    from kfp_sagemaker_blackwell.components.build_image.launcher import BuildRequest

    request = BuildRequest.from_parameters(cli.declared(build_image, run_id="r"))
    assert (request.repository, request.timeout_minutes, request.builder) == (
        "kfp-sagemaker-blackwell/trainer", 120, "auto")
    for name, bad in (("builder", "podman"), ("timeout_minutes", 3), ("tags", {"k" * 200: "v"}),
                      ("codebuild_compute_type", "BUILD_HUGE"), ("run_id", "run*")):
        with pytest.raises(UserError) as err:
            BuildRequest.from_parameters(cli.declared(build_image, {"run_id": "r", name: bad}))
        assert err.value.field == name


def _literal_copies(paths: list[Path], defaults: dict[str, Any]) -> set[tuple[str, str]]:
    """Module constants (``DEFAULT_X`` or ``X``) and class fields in ``paths`` that are a
    literal equal to ``defaults``' value of that (unit-free) name: a default written twice."""
    found = set()
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        scopes = [tree.body] + [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        for body in scopes:
            for node in body:
                target = (node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1
                          else node.target if isinstance(node, ast.AnnAssign) else None)
                if not isinstance(target, ast.Name) or node.value is None:
                    continue
                name = _unit_free(target.id.lower().removeprefix("default_"))
                if name not in defaults:
                    continue
                try:
                    value = ast.literal_eval(node.value)
                except ValueError:
                    continue  # derived, not a literal
                if type(value) is type(defaults[name]) and value == defaults[name]:
                    found.add((str(path.relative_to(ROOT)), target.id))
    return found


def test_no_component_module_restates_a_parameters_default():
    from kfp_sagemaker_blackwell.components.sagemaker_training.request import OUTSIDE_KFP_DEFAULTS

    # One declaration per parameter (issue 27 item 1): a component's plain modules take
    # the signature's defaults from it (cli.source_parameters, cli.declared), never a copy.
    found = set()
    for folder in sorted((ROOT / "components").iterdir()):
        if not (folder / "component.py").exists():
            continue
        module = f"kfp_sagemaker_blackwell.components.{folder.name}.component"
        declared = {_unit_free(p.name): p.default for p in cli.source_parameters(
            module, folder.name, defaults=OUTSIDE_KFP_DEFAULTS)  # placeholders: not literals
            if not p.required}
        found |= _literal_copies(sorted(set(folder.rglob("*.py")) - {folder / "component.py"}),
                                 declared)
    assert not found, sorted(found)


# component -> (the module of its parameters' type, the type): each derived from the signature
PARAMETER_TYPES = {
    "sagemaker_training": ("sagemaker_training.request.config", "TrainingJobConfig"),
    "build_image": ("build_image.launcher", "BuildRequest"),
    "compare_convergence": ("compare_convergence.records", "Settings"),
}


@pytest.mark.parametrize("name", sorted(PARAMETER_TYPES))
def test_a_component_passes_every_parameter_by_its_name(name):
    """The component hands its parameters to their type by name, not through ``locals()`` or
    a dict: every field of the type, each the parameter of the same name, in the call that
    makes it (so a reader, or a tool, follows each one in)."""
    import dataclasses

    module, type_name = PARAMETER_TYPES[name]
    kind = getattr(importlib.import_module(f"kfp_sagemaker_blackwell.components.{module}"),
                   type_name)
    tree = ast.parse((ROOT / "components" / name / "component.py").read_text(encoding="utf-8"))
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                and getattr(n.func, "id", "") == "locals"]
    (call,) = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
               and getattr(n.func, "id", "") == type_name]
    assert not call.args
    passed = {k.arg: getattr(k.value, "id", None) for k in call.keywords}
    assert passed == {f.name: f.name for f in dataclasses.fields(kind)}


def test_the_planning_models_take_the_trainers_defaults_from_its_flag_table():
    # TrainingSetup's defaults describe the in-repo trainer: where one is a trainer flag
    # (precision, activation checkpointing, accumulation, loss kernel...), it is the flag
    # table's default (catalog/flags.py), not a second literal.
    from kfp_sagemaker_blackwell.catalog.flags import flag_default, flag_fields

    aliases = {"grad_accum_steps": "gradient_accumulation_steps"}
    trainer = {_unit_free(aliases.get(f.name, f.name)): flag_default(f) for f in flag_fields()}
    assert not _literal_copies(sorted((ROOT / "planning").glob("*.py")), trainer)


def test_the_kfp_literals_of_the_planners_headroom_are_the_planners():
    """KFP runs a component's source text, where the planner's names do not exist, so
    memory_estimate and plan_training write the headroom's default as a literal; it is
    the planner's (what the training component's memory pre-flight plans with)."""
    from kfp_sagemaker_blackwell.planning.planner import DEFAULT_HEADROOM

    for name in ("memory_estimate", "plan_training"):
        declared = cli.source_defaults(f"kfp_sagemaker_blackwell.components.{name}.component", name)
        assert declared["headroom"] == DEFAULT_HEADROOM, name


def test_the_runtime_margins_default_is_each_rows_band_and_no_copy_of_the_constant():
    """plan_training's runtime_margin defaults to 0: each row's error band's margin
    (planning/uncertainty.py, which derives the measured source's from the throughput
    model's RUNTIME_MARGIN), so a refit of the model changes the constants alone: no
    literal copy of RUNTIME_MARGIN anywhere in the package, the pipeline's default the same."""
    from kfp_sagemaker_blackwell.pipelines.plan_and_train import PIPELINE
    from kfp_sagemaker_blackwell.planning import throughput, uncertainty

    declared = cli.source_defaults("kfp_sagemaker_blackwell.components.plan_training.component",
                                   "plan_training")
    assert declared["runtime_margin"] == 0
    assert PIPELINE.component_spec.inputs["runtime_margin"].default == 0
    assert uncertainty.bands()[uncertainty.MEASURED].runtime_margin == throughput.RUNTIME_MARGIN
    copies = [p for p in (ROOT / "kfp_sagemaker_blackwell").rglob("*.py")
              if str(throughput.RUNTIME_MARGIN) in p.read_text(encoding="utf-8")]
    assert copies == []


def test_every_cli_builds_its_parser_without_importing_kfp():
    # A command line reads its component's signature from source (cli.parameters of a
    # "module:function" reference): importing component.py imports kfp, 0.4 s of every start.
    import subprocess
    import sys

    code = ("import importlib, sys\n"
            f"for m in {sorted(CLIS)!r}:\n"
            "    importlib.import_module(m).build_parser()\n"
            "print(sorted(k for k in sys.modules if k == 'kfp' or k.startswith('kfp.')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout[-2000:]
