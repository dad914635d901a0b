"""The shape of the house: which package may import which (the catalog on the ground floor),
no import cycles, no function body over 80 lines, no class over 300, ``components/`` holding
only components, and the images holding every package their code imports.

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
NS = "kfp_sagemaker_blackwell"
# The repository's top-level packages, each ``kfp_sagemaker_blackwell.<name>`` once imported.
PACKAGES = ("catalog", "common", "planning", "iam", "trainer", "local_backend", "components",
            "pipelines")
# Who may import whom, from the ground floor up (besides itself): the catalog imports nothing of
# the project; the trainer only the catalog (its image holds nothing else); the components the
# catalog, the plumbing, the domain models and the IAM checks, never each other; only the
# pipelines compose components and the local backend.
LAYERS: dict[str, set[str]] = {
    "catalog": set(),
    "common": {"catalog"},
    "planning": {"catalog", "common"},
    "iam": {"catalog", "common"},
    "trainer": {"catalog"},
    "local_backend": {"catalog", "common"},
    "components": {"catalog", "common", "planning", "iam"},
    "pipelines": {"catalog", "common", "planning", "iam", "components", "local_backend"},
}
# Imports across layers the table does not allow: (importer, imported) -> why. Strict: an entry
# goes the day its import does.
LAYER_EXCEPTIONS: dict[tuple[str, str], str] = {
    ("components", "trainer"): "memory_estimate's cross-check (crosscheck.py, run only with "
    "--crosscheck on a machine with torch) measures the trainer's own model under FSDP's memory "
    "tracker: the estimate checked against the code it estimates, not a copy of it",
}
MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 300
# KFP definitions: their body is their docstring (the component's documentation).
KFP_DECORATORS = {"component", "pipeline", "container_component"}
# Functions still over the limit: (file, function) -> the issue that splits them. The test
# fails when one of them is split (strike it here) as much as when a new one appears.
STILL_LONG: dict[tuple[str, str], str] = {}
# Component packages (components/<name>/) share contracts through common/ and planning/ only.
# Imports still made from one into another: (importer, imported) -> why. Strict like STILL_LONG.
CROSS_COMPONENT: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = [NS, *path.relative_to(ROOT).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _package(module: str) -> str:
    """The top-level folder a module lives in (``kfp_sagemaker_blackwell.common.aws``: common)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == NS else ""


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


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_no_import_cycle():
    assert _cycles(_graph()) == []


def _layer_breaks(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(_package(a), _package(b)) for a, targets in graph.items() for b in targets
            if _package(a) != _package(b) and _package(b) not in LAYERS.get(_package(a), set())}


def test_every_package_imports_only_the_layers_below_it():
    assert _layer_breaks(_graph()) == set(LAYER_EXCEPTIONS)


def test_the_layer_rule_sees_an_upward_import():
    graph = {f"{NS}.catalog.gpus": {f"{NS}.common.aws"}, f"{NS}.common.aws": set()}
    assert _layer_breaks(graph) == {("catalog", "common")}


def test_the_catalog_imports_nothing_of_the_project():
    graph = _graph()
    catalog = {name for name in graph if _package(name) == "catalog"}
    assert len(catalog) > 5
    assert {(a, b) for a in catalog for b in graph[a] if b not in catalog} == set()


def _absolute_imports(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute imports)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
    return found


def test_the_catalog_is_torch_free_standard_library_only():
    for path in (ROOT / "catalog").rglob("*.py"):
        outside = {m for m in _absolute_imports(path) if m.split(".")[0] not in
                   sys.stdlib_module_names and not m.startswith(f"{NS}.catalog")}
        assert not outside, (path.name, outside)


def _reached(graph: dict[str, set[str]], roots: set[str]) -> set[str]:
    seen, todo = set(roots), list(roots)
    while todo:
        for child in graph[todo.pop()] - seen:
            seen.add(child)
            todo.append(child)
    return seen


def test_the_trainer_image_has_every_package_the_trainer_imports():
    """images/trainer/Dockerfile COPYs into /opt/ml/code/kfp_sagemaker_blackwell, and the local
    backend links into a job's code dir (local_backend/container.py's CODE_PACKAGES), every
    project package the trainer reaches: the trainer and the catalog, nothing else."""
    graph = _graph()
    reached = _reached(graph, {n for n in graph if _package(n) == "trainer"})
    needed = {_package(n) for n in reached}
    assert needed == {"trainer", "catalog"}
    dockerfile = (ROOT / "images" / "trainer" / "Dockerfile").read_text(encoding="utf-8")
    copied = set(re.findall(rf"(?m)^COPY {NS}/(\w+)/? /opt/ml/code/{NS}/\1/?$", dockerfile))
    assert copied == needed
    assert re.search(rf"(?m)^COPY {NS}/__init__.py /opt/ml/code/{NS}/__init__.py$", dockerfile)
    tree = ast.parse((ROOT / "local_backend" / "container.py").read_text("utf-8"))
    staged = next(ast.literal_eval(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Assign)
                  and any(getattr(t, "id", "") == "CODE_PACKAGES" for t in node.targets))
    assert set(staged) == needed


def test_the_components_image_installs_every_package():
    """images/components/Dockerfile pip-installs the checkout: the package's folder (which holds
    every package; the root's folders are links into it) must be in it."""
    dockerfile = (ROOT / "images" / "components" / "Dockerfile").read_text(encoding="utf-8")
    assert NS in set(re.findall(r"(?m)^COPY (\w+) \./\1$", dockerfile))
    assert {p.name for p in (ROOT / NS).iterdir() if (p / "__init__.py").is_file()} == set(PACKAGES)


# A component folder's files by role (DESIGN.md): its KFP definition, its command line, and
# its launcher, the work both call; its other modules are named after what they hold.
COMPONENT_ROLES = ("component.py", "__main__.py", "launcher.py")


def _component_folders() -> list[Path]:
    return sorted(p for p in (ROOT / "components").iterdir() if p.is_dir()
                  and not p.name.startswith((".", "_")))


def test_components_holds_only_components():
    """Each folder of components/ is one component: its KFP definition, its command line and
    its launcher, each under its role's name."""
    missing = {folder.name: [role for role in COMPONENT_ROLES if not (folder / role).is_file()]
               for folder in _component_folders()}
    assert {name: roles for name, roles in missing.items() if roles} == {}


def test_a_component_and_its_command_line_call_the_work_through_the_launcher():
    """The KFP definition and the command line both import their component's launcher (the
    work is done once, there: not in the definition, whose body is embedded in the YAML)."""
    graph = _graph()
    not_calling = []
    for folder in _component_folders():
        package = f"{NS}.components.{folder.name}"
        for entry in (f"{package}.component", f"{package}.__main__"):
            if f"{package}.launcher" not in graph[entry]:
                not_calling.append(entry)
    assert not_calling == []


def _component_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) component packages: components.<a>... importing components.<b>..."""
    def package(module: str) -> str:
        parts = module.split(".")
        return parts[2] if len(parts) > 2 and parts[:2] == [NS, "components"] else ""

    return {(package(a), package(b)) for a, targets in graph.items() for b in targets
            if package(a) and package(b) and package(a) != package(b)}


def test_components_do_not_import_each_other():
    assert _component_imports(_graph()) == set(CROSS_COMPONENT)


def test_the_component_rule_sees_a_lazy_import_between_components():
    graph = {f"{NS}.components.a.x": {f"{NS}.common.y", f"{NS}.components.b.z"},
             f"{NS}.common.y": set(), f"{NS}.components.b.z": {f"{NS}.common.y"}}
    assert _component_imports(graph) == {("a", "b")}


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


def test_no_class_over_300_lines():
    long = {}
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_CLASS_LINES:
                    long[(str(path.relative_to(ROOT)), node.name)] = n
    assert long == {}


def test_nothing_imports_a_folder_by_its_bare_name():
    """A bare ``import components`` works in a checkout (the root is on sys.path) and nowhere
    else: installed, the package claims one name, ``kfp_sagemaker_blackwell``."""
    bare = []
    for folder in (*PACKAGES, "tests", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom)
                         and not node.level else [])
                bare += [f"{path.relative_to(ROOT)}: {n}" for n in names
                         if n.split(".")[0] in PACKAGES]
    assert bare == []
