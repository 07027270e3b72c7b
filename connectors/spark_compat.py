"""What the running PySpark offers a Python data source: decided once, at import, by feature.

The connector supports every Spark 4.x (`SUPPORTED_SPARK`). The Python data source API it is
built on arrived in 4.0 and grew since; two differences matter to it:

* **Admission control** (`pyspark.sql.streaming.datasource`, Spark 4.2+): Spark passes
  `latestOffset(start, limit)` a read limit, asks `getDefaultReadLimit()`, and drives
  `Trigger.AvailableNow` through `prepareForTriggerAvailableNow()` batch by batch. Spark 4.0
  and 4.1 have no such module: they call `latestOffset()` with no argument (the stream tracks
  its own start), and run an AvailableNow query as one batch up to the `latestOffset()` of its
  start (SPARK-45178). There a stream must read everything available per trigger, and the
  per-trigger limits cannot be honoured: `connectors.stream` refuses them by name. The read
  limit classes below are then stand-ins with the same names and fields, used only inside
  the stream, so it has one code path.
* **`to_arrow_schema`'s time zone**: `timezone="UTC"` from 4.2, `timestamp_utc=True` (UTC
  by default) before.

Nothing here raises at import: `pyspark_danube` is imported by Spark's data source lookup,
where one failing import hides every Python data source with `DATA_SOURCE_NOT_FOUND`. A Spark
outside the supported range is named at first use instead (`require_supported_spark`).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyspark

from danube_core.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

# The Spark releases the connector is tested on (tests/integration/test_spark_versions.py), as
# (major, minor) bounds: first supported, first not supported.
SUPPORTED_SPARK = ((4, 0), (5, 0))
SPARK_VERSION: str = pyspark.__version__
ADMISSION_CONTROL_SINCE = "4.2"

try:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxBytes,
        ReadMaxRows,
        ReadMinRows,
        SupportsTriggerAvailableNow,
    )

    ADMISSION_CONTROL = True
except ImportError:  # Spark 4.0 and 4.1
    ADMISSION_CONTROL = False

    class ReadLimit:  # type: ignore[no-redef]
        """Stand-in for Spark 4.2's read limits (never sent to Spark)."""

    @dataclass
    class ReadAllAvailable(ReadLimit):  # type: ignore[no-redef]
        pass

    @dataclass
    class ReadMaxRows(ReadLimit):  # type: ignore[no-redef]
        max_rows: int

    @dataclass
    class ReadMaxBytes(ReadLimit):  # type: ignore[no-redef]
        max_bytes: int

    @dataclass
    class ReadMinRows(ReadLimit):  # type: ignore[no-redef]
        min_rows: int
        max_trigger_delay: int = 0

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Spark 4.0/4.1 do not know this mix-in; the stream's method is simply never called."""


def spark_version_tuple(version: str = SPARK_VERSION) -> tuple[int, int]:
    """`(major, minor)` of a Spark version string such as `4.0.5` or `4.1.0.dev1`."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ConfigError(f"cannot read the Spark version {version!r}: expected major.minor[.patch]")
    return int(match.group(1)), int(match.group(2))


def unsupported_spark(version: str = SPARK_VERSION) -> str | None:
    """Why `version` cannot run the connector, or None when it can."""
    (low, high) = SUPPORTED_SPARK
    found = spark_version_tuple(version)
    if low <= found < high:
        return None
    return (f"danube-spark's data source needs Spark {low[0]}.{low[1]} to {high[0] - 1}.x "
            f"(its Python data source API); this is Spark {version}: use a Spark 4 runtime "
            f"(Databricks Runtime 17.3 LTS or later)")


def require_supported_spark(version: str = SPARK_VERSION) -> None:
    """Fail with one line naming the Spark found and the one needed (registration, first use)."""
    reason = unsupported_spark(version)
    if reason is not None:
        raise ConfigError(reason)


def arrow_schema_of(schema: "StructType") -> "pa.Schema":
    """The Arrow schema Spark expects `read()` to yield for `schema`, timestamps in UTC."""
    from pyspark.sql.pandas.types import to_arrow_schema

    if "timezone" in _parameters(to_arrow_schema):
        return to_arrow_schema(schema, timezone="UTC")
    return to_arrow_schema(schema, timestamp_utc=True)  # type: ignore[call-arg]  # Spark 4.0/4.1


def _parameters(function: Any) -> set[str]:
    return set(inspect.signature(function).parameters)
