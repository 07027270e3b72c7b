"""The `danube` PySpark data source: batch and streaming reads of Danube topics from storage.

`register(spark)` makes `format("danube")` available in a session and installs the listener
that commits subscription cursors after each batch (`connectors.cursor_commit`). The user
manual, with every option, is the docstring of `DanubeDataSource`.
"""

from __future__ import annotations

from typing import Any, Mapping

from connectors.source import DanubeDataSource

__all__ = ["DanubeDataSource", "register"]

_COMMITTERS: dict[int, Any] = {}


def register(spark: Any, *, etcd_options: Mapping[str, str] | None = None) -> Any:
    """Register `format("danube")` and the cursor-committing listener in `spark`.

    `etcd_options` (`etcd.user`, `etcd.password`, `etcd.caCert`, ...) are the credentials the
    listener uses for the etcd endpoints named in the streams' offsets. Calling it again on the
    same session registers nothing twice; credentials given then are added to the listener's.
    Returns the listener.
    """
    from connectors.cursor_commit import DanubeCursorCommitter
    from connectors.jvm_view import bind_root_packages

    bind_root_packages(spark)  # the listener's progress events, and every Java exception, cost less
    spark.dataSource.register(DanubeDataSource)
    committer = _COMMITTERS.get(id(spark))
    if committer is None:
        committer = DanubeCursorCommitter(etcd_options)
        spark.streams.addListener(committer)
        _COMMITTERS[id(spark)] = committer
    elif etcd_options:
        committer.add_credentials(etcd_options)
    return committer
