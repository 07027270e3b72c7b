"""Loaded by every Python process of the executors in the Spark cluster test (this directory is on
their PYTHONPATH, after the shipped code): refuses what executors must never need.

* the etcd client (`pyetcd`): executors get partitions that carry everything they read
  (object URLs, byte ranges, WAL URLs); planning and cursors stay on the driver;
* the project's packages from anywhere but the shipped archive (`danube_spark/` in the
  executor's directory), e.g. from the checkout the test runs in.

A refused import raises ImportError naming this guard, so the task fails with the reason.
Only executors are guarded (the worker sets SPARK_EXECUTOR_DIRS for them): Python processes
the driver starts (e.g. to create a data source instance) run from the driver's checkout.
Each shipped package an executor imports is noted in `executor_guard.log` in its working
directory, for the test to see that the guard ran.
"""

import importlib.abc
import importlib.machinery
import os
import sys

SHIPPED = ("danube_core", "connectors", "pipelines", "pyspark_danube")
SHIPPED_DIR = "/danube_spark/"
NO_ETCD = ("pyetcd", "etcd3")


class ExecutorGuard(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        top = name.partition(".")[0]
        if top in NO_ETCD:
            raise ImportError(f"executor_guard: an executor imported {name}: executors must never need etcd")
        if name in SHIPPED:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            origin = spec.origin if spec is not None else None
            if origin is None or SHIPPED_DIR not in origin:
                raise ImportError(f"executor_guard: {name} on an executor comes from {origin}, "
                                  f"not the shipped archive ({SHIPPED_DIR})")
            with open("executor_guard.log", "a", encoding="utf-8") as log:
                log.write(f"{name} {origin}\n")
            return spec
        return None


if os.environ.get("SPARK_EXECUTOR_DIRS"):
    sys.meta_path.insert(0, ExecutorGuard())
