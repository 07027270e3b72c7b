"""The package edges of docs/architecture.md hold in the code: every import between the project's
packages is one its "may import" table allows, and no project module imports itself back
through others (an import circle).

The table is the documentation a newcomer reads; parsing it here means a new edge is added
there first, in the open, rather than found later as a tangle. Imports are read with `ast`
(nothing is imported), function-level and `TYPE_CHECKING` imports included: both are edges a
reader of the module has to know about. Only for circles are `TYPE_CHECKING` imports left
out, since they never run.

Inside the speed layer the same holds between its parts (the "Speed layer parts" table), and
one rule holds whatever the table says: the roles (`master`, `worker`, `gateway`) and
`clients` are imported by `speedlayer.__main__` only, the roles only through their `process`
modules, so they never import one another and what they share imports none of them.

And one more holds whatever the table says: no product package imports `devstack`, the
development stack. A product that imports what starts it for the demo and the tests ends up
running development code in production (a broker once brought up an empty etcd of its own
because `devstack`'s launcher was one import away).
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


SPEEDLAYER_ROLES = ("speedlayer.master", "speedlayer.worker", "speedlayer.gateway")
SPEEDLAYER_ENTRY = "speedlayer.__main__"


def speedlayer_parts() -> dict[str, tuple[str, ...]]:
    """part -> the speed layer parts or modules (dotted) it may import, from `### Speed layer parts`."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("\n### Speed layer parts\n", 1)[1].split("\n| module |", 1)[0]
    parts = {}
    for row in (line for line in section.splitlines() if line.startswith("| `speedlayer")):
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        parts[_TICKED.findall(cells[0])[0]] = tuple(_TICKED.findall(cells[2]))
    return parts


def part_of(module: str, parts: dict[str, tuple[str, ...]]) -> str | None:
    """The part a speed layer module belongs to: the longest part name it is or is under (the
    package itself, `speedlayer`, holds only its `__init__`)."""
    owners = [p for p in parts if module == p or (p != "speedlayer" and module.startswith(p + "."))]
    return max(owners, key=len) if owners else None


def speedlayer_part_violations(parts: dict[str, tuple[str, ...]], edges: list[Edge]) -> list[str]:
    """One line per import between speed layer parts that the importer's row does not name."""
    found = []
    for edge in edges:
        if not (edge.source.startswith("speedlayer") and edge.target.startswith("speedlayer")):
            continue
        source, target = part_of(edge.source, parts), part_of(edge.target, parts)
        if source is None or target is None:
            found.append(f"{edge.where}: {edge.source if source is None else edge.target} is in no row of "
                         "docs/architecture.md's speed layer parts")
        elif source != target and not any(edge.target == name or edge.target.startswith(name + ".")
                                           for name in parts[source]):
            found.append(f"{edge.where}: {edge.source} imports {edge.target}; `{source}` may import only "
                         f"{', '.join(parts[source]) or 'no other part'}")
    return list(dict.fromkeys(found))


def one_way_violations(parts: dict[str, tuple[str, ...]], edges: list[Edge]) -> list[str]:
    """Imports breaking the speed layer's one direction: a role or a client imported from
    anywhere but `__main__`, a role other than through its `process` module, or a `process`
    module imported by anything but `__main__`."""
    found = []
    for edge in edges:
        if not (edge.source.startswith("speedlayer") and edge.target.startswith("speedlayer")):
            continue
        source, target = part_of(edge.source, parts), part_of(edge.target, parts)
        if source == target and not edge.target.endswith(".process"):
            continue
        if target in SPEEDLAYER_ROLES and (source != SPEEDLAYER_ENTRY or not edge.target.endswith(".process")):
            found.append(f"{edge.where}: {edge.source} imports the role module {edge.target} "
                         f"(only {SPEEDLAYER_ENTRY} imports a role, through its `process` module)")
        elif target == "speedlayer.clients" and source != SPEEDLAYER_ENTRY:
            found.append(f"{edge.where}: {edge.source} imports the client module {edge.target} "
                         f"(only {SPEEDLAYER_ENTRY} imports `speedlayer.clients`)")
    return found


DEVELOPMENT_PACKAGE = "devstack"


def development_imports(edges: list[Edge]) -> list[str]:
    """One line per import of `devstack` from a product package (any package but itself)."""
    found = [f"{edge.where}: {edge.source} imports {edge.target}; product code never imports "
             f"the development stack (`{DEVELOPMENT_PACKAGE}/`): move what it needs into the product"
             for edge in edges
             if edge.target.split(".")[0] == DEVELOPMENT_PACKAGE and edge.source.split(".")[0] != DEVELOPMENT_PACKAGE]
    return list(dict.fromkeys(found))


TABLE = may_import_table()
EDGES = project_edges(sorted(TABLE))
SPEEDLAYER_PARTS = speedlayer_parts()


def test_the_table_names_every_installed_package():
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    installed = {line.strip().rstrip("*") for line in setup["options.packages.find"]["include"].split() if line.strip()}
    assert installed == set(TABLE), "setup.cfg's packages and docs/architecture.md's package table differ"


def test_every_import_between_packages_is_one_the_table_allows():
    assert EDGES, "no imports found: the scan is broken"
    violations = layering_violations(TABLE, EDGES)
    assert not violations, "imports docs/architecture.md does not allow:\n" + "\n".join(violations)


def test_no_product_package_imports_the_development_stack():
    violations = development_imports(EDGES)
    assert not violations, "product code importing devstack:\n" + "\n".join(violations)
    allowed = {package: [n for n in names if n.split(".")[0] == DEVELOPMENT_PACKAGE]
               for package, names in TABLE.items() if package != DEVELOPMENT_PACKAGE}
    assert not any(allowed.values()), f"docs/architecture.md lets product packages import devstack: {allowed}"


def test_the_development_check_catches_a_product_import_of_devstack():
    lazy = Edge("broker.server", "devstack.embedded_etcd", "broker/server.py:200", False)
    stack = Edge("devstack.demo", "devstack.broker_stack", "devstack/demo.py:1", False)
    assert len(development_imports([lazy, stack])) == 1


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


def test_every_speed_layer_module_is_in_a_part_and_imports_only_what_its_row_allows():
    modules = [m for m in project_modules(["speedlayer"]) if not m.startswith("speedlayer.api.v1.")]
    assert not [m for m in modules if part_of(m, SPEEDLAYER_PARTS) is None], \
        "speed layer modules in no row of docs/architecture.md's speed layer parts"
    violations = speedlayer_part_violations(SPEEDLAYER_PARTS, EDGES)
    assert not violations, "speed layer imports docs/architecture.md does not allow:\n" + "\n".join(violations)


def test_speed_layer_roles_and_clients_are_imported_by_the_entry_point_only():
    violations = one_way_violations(SPEEDLAYER_PARTS, EDGES)
    assert not violations, "the speed layer's one direction is broken:\n" + "\n".join(violations)
    for role in (*SPEEDLAYER_ROLES, "speedlayer.clients"):  # nor may the table say otherwise
        allowed = [p for p, names in SPEEDLAYER_PARTS.items()
                   if p != role and any(n == role or n.startswith(role + ".") for n in names)]
        assert allowed in ([], [SPEEDLAYER_ENTRY]), f"docs/architecture.md lets {allowed} import {role}"


def test_the_speed_layer_checks_catch_a_role_importing_another():
    parts = {"speedlayer.__main__": ("speedlayer.master.process",), "speedlayer.master": ("speedlayer.protocol",),
             "speedlayer.worker": ("speedlayer.protocol",), "speedlayer.protocol": ()}
    sideways = Edge("speedlayer.master.server", "speedlayer.worker.agent", "speedlayer/master/server.py:1", False)
    backwards = Edge("speedlayer.protocol.master_rpc", "speedlayer.master.leader_gate", "p.py:1", False)
    wiring = Edge("speedlayer.master.server", "speedlayer.master.process", "speedlayer/master/server.py:2", False)
    entry = Edge("speedlayer.__main__", "speedlayer.master.process", "speedlayer/__main__.py:1", False)
    assert len(speedlayer_part_violations(parts, [sideways, backwards, entry])) == 2
    assert len(one_way_violations(parts, [sideways, backwards, wiring, entry])) == 3
