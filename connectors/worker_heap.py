"""Keep the Python worker's long-lived objects out of the garbage collector's full passes.

A reused PySpark worker (`spark.python.worker.reuse`, the default) runs `gc.collect()` after
every task. Once a `danube` read has run in it, the worker holds some 100,000 tracked objects:
pyspark, pyarrow, numpy, fsspec and this package's modules, none of them ever garbage. A full
collection walks them all, 60-200 ms of CPU after each task on a loaded 2-core machine, more
than reading a micro-batch of a few thousand messages took. So after the first read in a worker
the heap is collected once and what survives is frozen (`gc.freeze()`): later collections
only walk objects created since. Frozen objects are still freed when their reference count
drops; only a reference cycle among them would stay, and they are module-level state that
lives as long as the worker anyway.
"""

from __future__ import annotations

import gc

_frozen = False


def freeze_long_lived() -> None:
    """Once per process: collect, then freeze every object that survived (module doc)."""
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.collect()
    gc.freeze()
