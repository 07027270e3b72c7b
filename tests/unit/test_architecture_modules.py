"""Every product module has a row in docs/architecture.md: the map a newcomer reads is complete.

Product packages are those of the architecture's package table that are Python packages,
`devstack` (the development stack) excepted. Each has a `## \\`<package>/\\` modules` table
whose first column names its modules by path within the package (`gateway/routing.py`); a
name ending in `/` covers everything under that folder (`gateway/flight_sql/`), and a name
may be a glob (`api/v1/*.proto`). Which modules need a row, decided here:

* every `.py` file, `__main__.py` included (the entry point a user types);
* an `__init__.py` only when it holds code: one with just its docstring is the package's
  description (the package table and the `speedlayer` parts table say what the package is);
  one that defines or re-exports names (`connectors.register`, `pyspark_danube.DefaultSource`)
  is a module a reader must know of;
* generated protobuf stubs (`*_pb2.py`, `*_pb2_grpc.py`) are covered by the row of the
  `.proto` they come from.

And the reverse: a row that names a path must name one that exists, so a module renamed or
removed does not leave its old row behind.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
NOT_PRODUCT = {"devstack"}
_TICKED = re.compile(r"`([^`]+)`")
_PATH = re.compile(r"[\w/*-]+(\.(py|proto|c)|/)")
_MODULES_HEADING = re.compile(r"^`(?P<package>\w+)/?` modules")


def sections() -> dict[str, str]:
    """`## ` heading -> its text, for every second-level section of the architecture."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    return {part.split("\n", 1)[0]: part for part in text.split("\n## ")[1:]}


def product_packages() -> list[str]:
    section = sections()["Packages"]
    names = [_TICKED.findall(line)[0].rstrip("/") for line in section.splitlines() if line.startswith("| `")]
    return [n for n in names if (ROOT / n / "__init__.py").exists() and n not in NOT_PRODUCT]


def module_rows() -> dict[str, list[str]]:
    """package -> the names in the first column of its modules table(s)."""
    rows: dict[str, list[str]] = {}
    for heading, text in sections().items():
        match = _MODULES_HEADING.match(heading)
        if match is None:
            continue
        names = rows.setdefault(match.group("package"), [])
        for line in text.splitlines():
            if line.startswith("| `"):
                first_cell = line.strip().strip("|").split("|")[0]
                names.extend(_TICKED.findall(first_cell))
    return rows


def holds_code(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue
        return True
    return False


def modules_needing_a_row(package: str) -> list[str]:
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if "__pycache__" in path.parts or path.stem.endswith(("_pb2", "_pb2_grpc")):
            continue
        if path.name == "__init__.py" and not holds_code(path):
            continue
        found.append(path.relative_to(ROOT / package).as_posix())
    return found


def covered(module: str, names: list[str]) -> bool:
    return any(module == name or (name.endswith("/") and module.startswith(name)) or fnmatch.fnmatch(module, name)
               for name in names)


def test_every_product_module_has_a_row_in_the_architecture():
    rows = module_rows()
    missing = [f"{package}/{module}" for package in product_packages()
               for module in modules_needing_a_row(package) if not covered(module, rows.get(package, []))]
    assert not missing, ("product modules in no row of docs/architecture.md's module tables (add a row: "
                         "what it holds, in a line):\n" + "\n".join(missing))


def test_every_product_package_has_a_modules_table():
    rows = module_rows()
    assert {"danube_core", "connectors", "broker", "pipelines", "speedlayer", "console",
            "pyspark_danube"} <= set(product_packages())
    assert not [p for p in product_packages() if not rows.get(p)], "a product package without a modules table"


def test_every_row_names_a_path_that_exists():
    stale = []
    for package, names in module_rows().items():
        for name in names:
            if not _PATH.fullmatch(name):
                continue  # not a path: a part (`speedlayer.master`) or a name beside the module
            if name.startswith("_pb2"):
                continue  # "`x.proto` + `_pb2*`": the stubs generated beside the .proto
            if not list((ROOT / package).glob(name.rstrip("/"))):
                stale.append(f"{package}/{name}")
    assert not stale, "docs/architecture.md names modules that do not exist:\n" + "\n".join(stale)


def test_a_missing_module_is_found():
    """The check itself: a module no row names is reported, a folder row covers what is under it."""
    assert not covered("connectors_new.py", ["connectors.py", "gateway/"])
    assert covered("gateway/flight_sql/service.py", ["gateway/flight_sql/"])
    assert covered("api/v1/master.proto", ["api/v1/*.proto"])
