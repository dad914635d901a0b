"""Two fixes to kfp 2.17's local orchestrator, applied only by this project's local runs.

The compiled pipelines are correct and run on a Kubeflow cluster; kfp.local
mis-runs two patterns they use:

1. ``ParallelFor(task.outputs["name"])`` over a *named* output of a
   multi-output task: the local orchestrator only resolves single-output tasks
   (``...-Output``) and otherwise looks for a pipeline input called
   ``<task>-<output>`` ("Parent pipeline input argument ... not found").
2. A loop body that reads outputs of tasks outside the loop (the image URI,
   the memory plan), or the loop's own list (``budget_items``: the jobs sharing a
   budget): when it builds each iteration, every input of the loop that comes from
   a task output is replaced by the loop item, so ``memory_plan`` arrives as
   ``"bf16"`` and ``budget_items`` as one candidate instead of the list.

``apply()`` patches both in the running process (idempotent), and only on the
kfp versions they were written and tested for (``FIXED_VERSIONS``): on any other
version it raises ``UnsupportedKfpVersion`` naming the version and what to do,
instead of patching internals that may have changed. ``tests/test_pipelines.py``
runs a small pipeline with both patterns, so a change that breaks them fails loudly.
"""

from __future__ import annotations

import inspect
from typing import Any

# kfp releases (major.minor) whose kfp.local these patches were written against and tested with.
FIXED_VERSIONS = ("2.17",)
_APPLIED = False


class UnsupportedKfpVersion(RuntimeError):
    pass


def check_version(version: str | None = None) -> str:
    """The installed kfp version when the fixes apply to it; else UnsupportedKfpVersion."""
    if version is None:
        import kfp

        version = str(kfp.__version__)
    if ".".join(version.split(".")[:2]) not in FIXED_VERSIONS:
        raise UnsupportedKfpVersion(
            f"kfp {version} is installed, but the local-run fixes in "
            f"pipelines/_kfp_local_fixes.py were written for kfp {', '.join(FIXED_VERSIONS)} "
            "(they patch private kfp.local functions). Local runs (--run-local, "
            "kfp_sagemaker_blackwell.pipelines.local.run_pipeline) need one of those versions: pip install "
            f"'kfp=={FIXED_VERSIONS[-1]}.*' (constraints.txt pins the tested one). Compiling "
            "and running on a Kubeflow cluster do not use these fixes and work with kfp>=2.17.")
    return version


def _check_signature(func: Any, expected: list[str]) -> None:
    names = list(inspect.signature(func).parameters)
    if names != expected:
        raise UnsupportedKfpVersion(
            f"kfp.local's {func.__qualname__}{tuple(names)} is not the function the local-run "
            f"fixes were written for ({tuple(expected)}); install kfp=={FIXED_VERSIONS[-1]}.*.")


def apply() -> None:
    global _APPLIED
    if _APPLIED:
        return
    check_version()
    from kfp.local import io
    from kfp.local.orchestrator import task_spec_utils

    _check_signature(io.IOStore.get_parent_input, ["self", "key"])
    _check_signature(task_spec_utils.create_parameter_loop_iteration_task_spec,
                     ["original_task_spec", "loop_item", "loop_task_name"])

    original_get = io.IOStore.get_parent_input

    def get_parent_input(self: Any, key: str) -> Any:
        try:
            return original_get(self, key)
        except ValueError:
            name = key.removeprefix("pipelinechannel--")
            for i in range(len(name) - 1, 0, -1):  # "<task-name>-<output_name>"
                if name[i] == "-":
                    try:
                        return self.get_task_output(name[:i], name[i + 1:])
                    except ValueError:
                        continue
            raise

    original_iteration = task_spec_utils.create_parameter_loop_iteration_task_spec

    def create_parameter_loop_iteration_task_spec(
        original_task_spec: Any, loop_item: Any, loop_task_name: str
    ) -> Any:
        spec = original_iteration(original_task_spec, loop_item, loop_task_name)
        for name, value in original_task_spec.inputs.parameters.items():
            # every upstream output keeps its real value, the loop's own list too (a body
            # input that is the loop-wide list gets the list, as on a cluster: the item
            # reaches the body through the iterator's item input, set above)
            if value.HasField("task_output_parameter"):
                spec.inputs.parameters[name].CopyFrom(value)
        return spec

    io.IOStore.get_parent_input = get_parent_input  # type: ignore[method-assign]
    task_spec_utils.create_parameter_loop_iteration_task_spec = (
        create_parameter_loop_iteration_task_spec
    )
    _APPLIED = True
