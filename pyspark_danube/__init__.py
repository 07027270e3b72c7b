"""Lets Spark find the `danube` data source without a registration call.

Spark 4.2 looks up Python data sources once per driver JVM, the first time a Python data source
is used: a Python worker (`pyspark.sql.worker.lookup_data_sources`) runs
`pkgutil.iter_modules()` over its `sys.path`, imports every top-level module whose name starts
with `pyspark_`, and registers its `DefaultSource` (a `DataSource` subclass) under
`DefaultSource.name()`. So `format("danube")` works as soon as this package is importable by
Spark's Python workers: installed with `pip install danube-spark` (or an editable install in
`compat` mode, `pip install -e . --config-settings editable_mode=compat`, since the default
editable mode uses an import hook that `iter_modules` does not see), or on `PYTHONPATH`.
Without `connectors.register(spark)` a stream commits its subscription cursors itself, one
trigger after each batch (see `connectors.cursor_commit`); the listener the call installs
commits them as soon as each batch's progress is posted.
"""

from connectors.source import DanubeDataSource as DefaultSource

__all__ = ["DefaultSource"]
