"""Option errors reach the user first and plainly, as a Spark user expects from Kafka's source.

PySpark runs a Python data source's driver-side code in worker processes and sends the
formatted Python traceback to the JVM as the error message, so a bad option would read
`[PYTHON_DATA_SOURCE_ERROR] ... Traceback (most recent call last): ...` with our message on
the last line. Two things in PySpark 4.2 make this worse, and this module counters both:

* `python_streaming_source_runner.main` calls `reader.stop()` in a `finally` around
  `streamReader()`: if `streamReader()` raises, `reader` is unbound and the user sees
  PySpark's `UnboundLocalError`, ours only in the chained traceback. `streamReader()` therefore
  never raises: it returns a `FailedStreamReader` that raises the error on Spark's first call.
* A configuration error needs no traceback. PySpark's worker prints the exception alone when
  `SPARK_HIDE_TRACEBACK` is set (what `spark.sql.execution.pyspark.udf.hideTraceback.enabled`
  sets) and reads it when it formats the error; every PySpark worker exits right after it
  reports an error, so setting it in that process affects this one error only. It is only set
  when the caller is one of PySpark's planner workers, never in a user's own process.
"""

from __future__ import annotations

import functools
import os
import sys
from types import FrameType
from typing import Any, Callable, Iterator, NoReturn, TypeVar, cast

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from connectors.spark_compat import ReadLimit, SupportsTriggerAvailableNow
from danube_core.errors import ConfigError

# Modules of the PySpark processes that run a data source's code and report its errors to the
# JVM: the planner workers (create_data_source, plan_data_source_read, ...), the streaming
# runner and the executors' task worker.
_SPARK_WORKER_MODULES = ("pyspark.sql.worker.", "pyspark.sql.streaming.python_streaming_source_runner",
                         "pyspark.worker")

_Method = TypeVar("_Method", bound=Callable[..., Any])


def in_spark_worker() -> bool:
    """True when called (at any depth) from a PySpark worker that reports errors to the JVM."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        spec = frame.f_globals.get("__spec__")
        name = spec.name if spec is not None else frame.f_globals.get("__name__", "")
        if name.startswith(_SPARK_WORKER_MODULES):
            return True
        frame = frame.f_back
    return False


def report_plainly(error: BaseException) -> None:
    """Make PySpark's worker report a `ConfigError` as its message alone, without a traceback.

    Other errors keep their traceback: they are bugs or outages, and the frames help.
    """
    if isinstance(error, ConfigError) and in_spark_worker():
        os.environ["SPARK_HIDE_TRACEBACK"] = "1"


def plain_config_errors(method: _Method) -> _Method:
    """Decorate a method Spark calls so the `ConfigError`s it raises are reported plainly.

    `functools.wraps` keeps the signature visible: PySpark inspects `latestOffset`'s
    parameters to decide whether the source supports admission control.
    """

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except ConfigError as error:
            report_plainly(error)
            raise

    return cast(_Method, wrapper)


def plain_iteration(items: Iterator[Any]) -> Iterator[Any]:
    """`items`, reporting a `ConfigError` raised while iterating plainly (executors' `read()`:
    a `file://` WAL root that is not on a shared volume is a setting to fix)."""
    try:
        yield from items
    except ConfigError as error:
        report_plainly(error)
        raise


class FailedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Stands in for a stream reader that could not be made: every call Spark makes raises
    the original error, so it is what the query fails with (see the module docstring).

    It offers what `DanubeStreamReader` offers (admission control, Trigger.AvailableNow), so
    Spark's capability checks pass and its first real call is the one that reports the error.
    """

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def _raise(self) -> NoReturn:
        report_plainly(self.error)
        raise self.error

    def initialOffset(self) -> dict:
        self._raise()

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        self._raise()

    def getDefaultReadLimit(self) -> ReadLimit:
        self._raise()

    def prepareForTriggerAvailableNow(self) -> None:
        self._raise()

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        self._raise()

    def commit(self, end: dict) -> None:
        self._raise()

    def read(self, partition: InputPartition) -> Iterator:
        self._raise()

    def stop(self) -> None:
        """Nothing was opened."""
