"""The package edges of docs/architecture.md hold in the code: every import between the project's
packages is one its "may import" table allows, and no project module imports itself back
through others (an import circle).

The table is the documentation a newcomer reads; parsing it here means a new edge is added
there first, in the open, rather than found later as a tangle. Imports are read with `ast`
(nothing is imported), function-level and `TYPE_CHECKING` imports included: both are edges a
reader of the module has to know about. Only for circles are `TYPE_CHECKING` imports left
out, since they never run.
"""

from __future__ import annotations

import ast
import configparser
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
_TICKED = re.compile(r"`([^`]+)`")


def may_import_table() -> dict[str, tuple[str, ...]]:
    """package -> the project packages or modules (dotted) it may import, from `## Packages`.

    A row's third cell names them in backticks (`danube_core`, `speedlayer.announce`); names
    that are not a Python package of the checkout (third-party ones, `native/grpc_front`) are
    the build's business, not this test's."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("\n## Packages\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    packages = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        name = _TICKED.findall(cells[0])[0].rstrip("/")
        if (ROOT / name / "__init__.py").exists():
            packages[name] = tuple(_TICKED.findall(cells[2]))
    return {name: tuple(a for a in allowed if a.split(".")[0] in packages) for name, allowed in packages.items()}


@dataclass(frozen=True)
class Edge:
    source: str  # importing module, dotted
    target: str  # imported project module (or package), dotted
    where: str  # path:line
    type_only: bool  # under `if TYPE_CHECKING:`


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules(packages: list[str]) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[module_name(path)] = path
    return found


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def _imported(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> list[str]:
    """Dotted names one import statement reaches; `from pkg import mod` reaches `pkg.mod`."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([node.module] if node.module else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]


def project_edges(packages: list[str]) -> list[Edge]:
    modules = project_modules(packages)
    edges = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        type_only = _type_checking_lines(tree)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in _imported(module, path.name == "__init__.py", node, modules):
                if name.split(".")[0] not in packages:
                    continue
                parts = name.split(".")  # the module itself, else the nearest package above a name in it
                while len(parts) > 1 and ".".join(parts) not in modules:
                    parts.pop()
                target = ".".join(parts)
                if target != module:
                    edges.append(Edge(module, target, f"{path.relative_to(ROOT)}:{node.lineno}",
                                      node.lineno in type_only))
    return edges


def layering_violations(table: dict[str, tuple[str, ...]], edges: list[Edge]) -> list[str]:
    """One line per import of another package that its row does not name."""
    found = []
    for edge in edges:
        source, target = edge.source.split(".")[0], edge.target.split(".")[0]
        if source == target:
            continue
        allowed = table[source]
        if not any(edge.target == name or edge.target.startswith(name + ".") for name in allowed):
            found.append(f"{edge.where}: {edge.source} imports {edge.target}; "
                         f"`{source}/` may import only {', '.join(allowed) or 'no project package'}")
    return list(dict.fromkeys(found))  # one line per import statement and target


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


TABLE = may_import_table()
EDGES = project_edges(sorted(TABLE))


def test_the_table_names_every_installed_package():
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    installed = {line.strip().rstrip("*") for line in setup["options.packages.find"]["include"].split() if line.strip()}
    assert installed == set(TABLE), "setup.cfg's packages and docs/architecture.md's package table differ"


def test_every_import_between_packages_is_one_the_table_allows():
    assert EDGES, "no imports found: the scan is broken"
    violations = layering_violations(TABLE, EDGES)
    assert not violations, "imports docs/architecture.md does not allow:\n" + "\n".join(violations)


def test_no_module_imports_itself_through_others():
    graph: dict[str, set[str]] = {}
    for edge in EDGES:
        if not edge.type_only:
            graph.setdefault(edge.source, set()).add(edge.target)
    assert not circles(graph), f"import circles: {circles(graph)}"


def test_no_package_imports_itself_through_others():
    graph: dict[str, set[str]] = {}
    for edge in EDGES:
        source, target = edge.source.split(".")[0], edge.target.split(".")[0]
        if source != target:
            graph.setdefault(source, set()).add(target)
    assert not circles(graph), f"packages that import each other: {circles(graph)}"


def test_the_checks_catch_a_forbidden_edge_and_a_circle():
    edge = Edge("connectors.wal_scan", "broker.wal_files", "connectors/wal_scan.py:1", False)
    assert layering_violations({"connectors": ("danube_core",), "broker": ("danube_core",)}, [edge])
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
