"""Two fixes to kfp 2.17's local orchestrator, applied only by this project's local runs.

The compiled pipelines are correct and run on a Kubeflow cluster; kfp.local
mis-runs two patterns they use:

1. ``ParallelFor(task.outputs["name"])`` over a *named* output of a
   multi-output task: the local orchestrator only resolves single-output tasks
   (``...-Output``) and otherwise looks for a pipeline input called
   ``<task>-<output>`` ("Parent pipeline input argument ... not found").
2. A loop body that reads outputs of tasks outside the loop (the image URI,
   the memory plan): when it builds each iteration, every input of the loop
   that comes from a task output is replaced by the loop item, so
   ``memory_plan`` arrives as ``"bf16"``.

``apply()`` patches both in the running process (idempotent);
``tests/test_pipelines.py`` runs a small pipeline with both patterns so that a
kfp upgrade that changes these internals fails loudly instead of silently.
"""

from __future__ import annotations

from typing import Any

_APPLIED = False


def apply() -> None:
    global _APPLIED
    if _APPLIED:
        return
    from kfp.local import io
    from kfp.local.orchestrator import task_spec_utils

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
        items = ""
        if original_task_spec.WhichOneof("iterator") == "parameter_iterator":
            items = original_task_spec.parameter_iterator.items.input_parameter
        for name, value in original_task_spec.inputs.parameters.items():
            if value.HasField("task_output_parameter") and name != items:
                spec.inputs.parameters[name].CopyFrom(value)  # keep the real upstream output
        return spec

    io.IOStore.get_parent_input = get_parent_input  # type: ignore[method-assign]
    task_spec_utils.create_parameter_loop_iteration_task_spec = (
        create_parameter_loop_iteration_task_spec
    )
    _APPLIED = True
