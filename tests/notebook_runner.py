"""Runs a Databricks source-format notebook (`notebooks/*.py`) cell by cell, as Databricks would.

The source format is a Python file whose first line is `# Databricks notebook source` and
whose cells are separated by `# COMMAND ----------` lines; a cell made only of `# MAGIC` lines
is markdown (or another magic such as `%pip`) and is skipped here. Every code cell runs in
order in one namespace that holds what Databricks provides to a notebook:

* `spark`: the test session (already `connectors.register`ed by the fixture);
* `dbutils`: a stand-in whose `widgets.get` returns the default a notebook declared with
  `dbutils.widgets.text/dropdown/combobox`, unless the test overrides it;
* `display`: collects what the notebook shows. A DataFrame is collected at once (it is lazy,
  and the notebook may go on to change the data it reads), so `shown` holds plain rows;
* the notebook's folder on `sys.path`, so it imports the files beside it
  (`notebook_widgets.py`) as it does in a Databricks workspace.

A notebook that raises fails with `NotebookCellError` naming the file and the cell number.
Charts use matplotlib's non-interactive Agg backend, chosen before any cell imports pyplot.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

NOTEBOOK_HEADER = "# Databricks notebook source"
CELL_SEPARATOR = "# COMMAND ----------"
MAGIC_PREFIX = "# MAGIC"


@dataclass(frozen=True)
class Cell:
    """One cell: `number` counts from 1 as Databricks shows it; `magic` cells are not run."""

    number: int
    source: str
    magic: bool


class NotebookFormatError(ValueError):
    """The file is not in Databricks' source format."""


class NotebookCellError(AssertionError):
    """A cell raised; the message names the notebook, the cell and its first line."""


def parse_notebook(text: str, name: str = "<notebook>") -> list[Cell]:
    """Split a source-format notebook into cells; NotebookFormatError if the header is missing."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != NOTEBOOK_HEADER:
        raise NotebookFormatError(f"{name}: first line must be {NOTEBOOK_HEADER!r}, got {lines[:1]!r}")
    chunks: list[list[str]] = [[]]
    for line in lines[1:]:
        if line.strip() == CELL_SEPARATOR:
            chunks.append([])
        else:
            chunks[-1].append(line)
    cells = []
    for chunk in chunks:
        source = "\n".join(chunk).strip("\n")
        if not source.strip():
            continue
        code = [line for line in source.splitlines() if line.strip()]
        magic = all(line.lstrip().startswith(MAGIC_PREFIX) for line in code)
        cells.append(Cell(len(cells) + 1, source + "\n", magic))
    return cells


class Widgets:
    """`dbutils.widgets`: declared defaults, overridden by the test's values."""

    def __init__(self, overrides: Mapping[str, str]) -> None:
        self._overrides = {k: str(v) for k, v in overrides.items()}
        self.defaults: dict[str, str] = {}

    def text(self, name: str, defaultValue: str = "", label: str | None = None) -> None:
        self.defaults[name] = defaultValue

    def dropdown(self, name: str, defaultValue: str, choices: list[str], label: str | None = None) -> None:
        if defaultValue not in choices:
            raise ValueError(f"widget {name!r}: default {defaultValue!r} is not one of {choices}")
        self.defaults[name] = defaultValue

    combobox = dropdown

    def get(self, name: str) -> str:
        """The test value, else the default; KeyError (as Databricks raises) if never declared."""
        if name not in self.defaults:
            raise KeyError(f"widget {name!r} was read before the notebook declared it")
        return self._overrides.get(name, self.defaults[name])

    def getArgument(self, name: str, default: str | None = None) -> str | None:
        return self.get(name) if name in self.defaults else default

    def remove(self, name: str) -> None:
        self.defaults.pop(name, None)

    def removeAll(self) -> None:
        self.defaults.clear()

    def unused_overrides(self) -> list[str]:
        """Test values for widgets the notebook never declared (a typo in the test)."""
        return sorted(set(self._overrides) - set(self.defaults))


@dataclass
class DbutilsStandIn:
    widgets: Widgets


@dataclass
class Shown:
    """One `display(...)` call: rows for a DataFrame (Spark or pandas), else the object."""

    kind: str  # "dataframe" | "pandas" | "figure" | "other"
    value: Any
    columns: list[str] = field(default_factory=list)


class Display:
    """Collects what a notebook displays, in order."""

    def __init__(self) -> None:
        self.shown: list[Shown] = []

    def __call__(self, obj: Any, *args: Any, **kwargs: Any) -> None:
        self.shown.append(_capture(obj))

    def frames(self) -> list[Shown]:
        return [s for s in self.shown if s.kind in ("dataframe", "pandas")]

    def figures(self) -> list[Shown]:
        return [s for s in self.shown if s.kind == "figure"]


def _capture(obj: Any) -> Shown:
    from pyspark.sql import DataFrame

    if isinstance(obj, DataFrame):
        return Shown("dataframe", [row.asDict(recursive=True) for row in obj.collect()], obj.columns)
    try:
        import pandas as pd

        if isinstance(obj, pd.DataFrame):
            return Shown("pandas", obj.to_dict("records"), [str(c) for c in obj.columns])
    except ImportError:
        pass
    if type(obj).__name__ == "Figure" and type(obj).__module__.startswith("matplotlib"):
        return Shown("figure", obj)
    return Shown("other", obj)


@dataclass
class NotebookRun:
    """The outcome of one run: the namespace the cells left behind and what they displayed."""

    path: Path
    namespace: dict[str, Any]
    display: Display
    widgets: Widgets
    cell_seconds: dict[int, float]  # wall time of each code cell, by cell number


def run_notebook(path: str | Path, spark: Any, widgets: Mapping[str, str] | None = None) -> NotebookRun:
    """Execute every code cell of the notebook at `path` in order, in one namespace."""
    path = Path(path)
    os.environ["MPLBACKEND"] = "Agg"
    _use_agg()
    cells = parse_notebook(path.read_text(encoding="utf-8"), str(path))
    if str(path.parent.resolve()) not in sys.path:
        sys.path.insert(0, str(path.parent.resolve()))
    stand_in = Widgets(widgets or {})
    display = Display()
    namespace: dict[str, Any] = {
        "__name__": "__main__",
        "__file__": str(path),
        "spark": spark,
        "dbutils": DbutilsStandIn(stand_in),
        "display": display,
    }
    timings: dict[int, float] = {}
    for cell in cells:
        if cell.magic:
            continue
        first = next((line for line in cell.source.splitlines() if line.strip()), "")
        code = compile(cell.source, f"{path.name} [cell {cell.number}]", "exec")
        started = time.monotonic()
        try:
            exec(code, namespace)
        except Exception as exc:
            raise NotebookCellError(
                f"{path.name}: cell {cell.number} ({first.strip()[:80]!r}) raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        timings[cell.number] = time.monotonic() - started
    _close_figures()
    unused = stand_in.unused_overrides()
    if unused:
        raise NotebookCellError(f"{path.name}: the test set widgets the notebook never declares: {unused}")
    return NotebookRun(path, namespace, display, stand_in, timings)


def _use_agg() -> None:
    try:
        import matplotlib
    except ImportError:
        return  # a notebook that draws fails in its own cell, naming the missing module
    matplotlib.use("Agg", force=True)


def _close_figures() -> None:
    """Free the figures (displayed ones stay referenced by `Shown` for the assertions)."""
    import sys

    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close("all")
