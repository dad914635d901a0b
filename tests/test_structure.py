"""The shape of the house: no import cycles, no function body over 80 lines, the catalog
on the ground floor (it imports nothing of the project and only the standard library; every
package may import it), and the trainer image holding every package the trainer imports.

Read from the source with ``ast`` (nothing is imported), so a lazy import inside a
function and an import under ``if TYPE_CHECKING:`` count like any other: a cycle
hidden that way is still a cycle for the reader.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("catalog", "components", "pipelines", "trainer")
MAX_FUNCTION_LINES = 80
# KFP definitions: their body is their docstring (the component's documentation).
KFP_DECORATORS = {"component", "pipeline", "container_component"}
# Functions still over the limit: (file, function) -> the issue that splits them. The test
# fails when one of them is split (strike it here) as much as when a new one appears.
# Component packages (components/<name>/, all but common/) share contracts through
# components/common/ only. Imports still made from one into another: (importer, imported)
# -> why. Strict like STILL_LONG: an entry goes the day its import does.
CROSS_COMPONENT: dict[tuple[str, str], str] = {
    ("sagemaker_training", "memory_estimate"): "the launcher's memory pre-flight "
    "(request.preflight) runs memory_estimate's planner before every launch",
    ("plan_training", "memory_estimate"): "the training planner asks memory_estimate's "
    "planner and estimator what fits (largest_batch, batch_cap, the peak) for every "
    "configuration it searches: the same fit decision as the memory plan, not a copy",
}
STILL_LONG: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in modules:
                    found.add(target)
                elif base in modules:
                    found.add(base)
    found.discard(name)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    out.append(sorted(group))
    return out


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_components_pipelines_trainer():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _top_level_imports(path: Path) -> set[str]:
    """The top-level names of every module ``path`` imports (absolute imports)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_the_catalog_imports_nothing_of_the_project():
    graph = _graph()
    catalog = {name for name in graph if name.split(".")[0] == "catalog"}
    assert len(catalog) > 5
    assert {(a, b) for a in catalog for b in graph[a] if b not in catalog} == set()


def test_the_catalog_is_torch_free_standard_library_only():
    for path in (ROOT / "catalog").rglob("*.py"):
        outside = _top_level_imports(path) - set(sys.stdlib_module_names) - {"catalog"}
        assert not outside, (path.name, outside)


def _reached(graph: dict[str, set[str]], roots: set[str]) -> set[str]:
    seen, todo = set(roots), list(roots)
    while todo:
        for child in graph[todo.pop()] - seen:
            seen.add(child)
            todo.append(child)
    return seen


def test_the_trainer_image_has_every_package_the_trainer_imports():
    """images/trainer/Dockerfile COPYs into /opt/ml/code, and the local backend links into a
    job's code dir (components/local/container.py's CODE_PACKAGES), every project package
    the trainer reaches: the trainer and the catalog, nothing of components/ or pipelines/."""
    graph = _graph()
    reached = _reached(graph, {n for n in graph if n.split(".")[0] == "trainer"})
    needed = {n.split(".")[0] for n in reached}
    assert needed == {"trainer", "catalog"}
    dockerfile = (ROOT / "images" / "trainer" / "Dockerfile").read_text(encoding="utf-8")
    copied = set(re.findall(r"(?m)^COPY (\w+)/? /opt/ml/code/\1/?$", dockerfile))
    assert copied == needed
    tree = ast.parse((ROOT / "components" / "local" / "container.py").read_text("utf-8"))
    staged = next(ast.literal_eval(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Assign)
                  and any(getattr(t, "id", "") == "CODE_PACKAGES" for t in node.targets))
    assert set(staged) == needed


def test_the_components_image_installs_every_package():
    """images/components/Dockerfile pip-installs the checkout: each package must be in it."""
    dockerfile = (ROOT / "images" / "components" / "Dockerfile").read_text(encoding="utf-8")
    assert set(re.findall(r"(?m)^COPY (\w+) \./\1$", dockerfile)) >= set(PACKAGES)


def _component_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) component packages: components.<a>... importing components.<b>..."""
    def package(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 and parts[0] == "components" else ""

    return {(package(a), package(b)) for a, targets in graph.items() for b in targets
            if package(a) and package(b) and package(a) != package(b)
            and package(b) != "common"}


def test_component_packages_depend_on_common_not_on_each_other():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _component_imports(graph) == set(CROSS_COMPONENT)


def test_the_component_rule_sees_a_lazy_import_between_components():
    graph = {"components.a.x": {"components.common.y", "components.b.z"},
             "components.common.y": set(), "components.b.z": {"components.common.y"}}
    assert _component_imports(graph) == {("a", "b")}
    graph["components.common.y"] = {"components.b.z"}  # common/ importing a component
    assert ("common", "b") in _component_imports(graph)


def _is_kfp_definition(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in fn.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in KFP_DECORATORS:
            return True
    return False


def _body_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of ``fn`` without its docstring and without KFP definitions nested in it."""
    lines = set(range(fn.lineno, (fn.end_lineno or fn.lineno) + 1))
    first = fn.body[0] if fn.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
            and isinstance(first.value.value, str):
        lines -= set(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    for node in ast.walk(fn):
        if node is not fn and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) \
                and _is_kfp_definition(node):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            lines -= set(range(start, (node.end_lineno or node.lineno) + 1))
    return len(lines)


def _long_functions() -> dict[tuple[str, str], int]:
    out = {}
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) \
                    and not _is_kfp_definition(node):
                n = _body_lines(node)
                if n > MAX_FUNCTION_LINES:
                    out[(str(path.relative_to(ROOT)), node.name)] = n
    return out


def test_no_function_body_over_80_lines_outside_kfp_definitions():
    long = _long_functions()
    assert set(long) == set(STILL_LONG), {k: v for k, v in long.items() if k not in STILL_LONG}
