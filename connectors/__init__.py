"""The `danube` PySpark data source: batch and streaming reads of Danube topics from storage.

`register(spark)` makes `format("danube")` available in a session and installs the listener
that commits subscription cursors after each batch (`connectors.cursor_commit`). The user
manual, with every option, is the docstring of `DanubeDataSource`.
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["DanubeDataSource", "register"]

_COMMITTERS: dict[int, Any] = {}


def register(spark: Any, *, etcd_options: Mapping[str, str] | None = None) -> Any:
    """Register `format("danube")` and the cursor-committing listener in `spark`.

    `etcd_options` (`etcd.user`, `etcd.password`, `etcd.caCert`, ...) are the credentials the
    listener uses for the etcd endpoints named in the streams' offsets. Calling it again on the
    same session registers nothing twice; credentials given then are added to the listener's.
    Returns the listener.
    """
    from connectors.spark_compat import require_supported_spark

    require_supported_spark(spark.version)  # before importing an API an older Spark lacks
    from connectors.cursor_commit import DanubeCursorCommitter
    from connectors.jvm_view import bind_root_packages
    from connectors.source import DanubeDataSource

    bind_root_packages(spark)  # the listener's progress events, and every Java exception, cost less
    _register_source(spark, DanubeDataSource)
    committer = _COMMITTERS.get(id(spark))
    if committer is None:
        committer = DanubeCursorCommitter(etcd_options)
        spark.streams.addListener(committer)
        _COMMITTERS[id(spark)] = committer
    elif etcd_options:
        committer.add_credentials(etcd_options)
    return committer


def _register_source(spark: Any, source: type) -> None:
    """`spark.dataSource.register(source)`; Spark 4.0/4.1 refuse a name their own lookup already
    registered from `pyspark_danube` (the same class), which then serves as it is."""
    try:
        spark.dataSource.register(source)
    except Exception as exc:  # pyspark's AnalysisException; matched by its error condition
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
            raise


def __getattr__(name: str) -> Any:
    """`connectors.DanubeDataSource`, imported on first use: importing `connectors` on a Spark
    without the Python data source API must not fail before `register` can name the version."""
    if name == "DanubeDataSource":
        from connectors.source import DanubeDataSource

        return DanubeDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
