"""Binds the JVM packages PySpark looks up on every Java exception into the session's py4j view.

Why: py4j resolves a name on the gateway's view (`jvm.py4j`, `jvm.org`) by trying it as a class,
bare and then in each package PySpark imports into the view (about ten tries), and each try is
a class lookup that fails only after searching every jar on Spark's class path (about 270).
PySpark converts every Java exception it meets, testing its type about ten times through
`jvm.py4j.reflection.TypeUtil`, and py4j ends each iteration over a Java map with an exception.
A Python `StreamingQueryListener` gets every progress event as Java maps (durations, event
time, each source's metrics), so each event cost about a hundred failed jar searches per map
and per listener; the cursor-committing listener (`connectors.cursor_commit`) is one on every
session `register` sees, and a pipeline adds its own. Profiled in the test suite's session, those
searches were about a sixth of its JVM's samples.

A top-level package stays a package and py4j's `TypeUtil` is py4j's own class, so binding them
changes no answer; names below the roots are still resolved by py4j (a class added later, say
with `spark.jars`, is found as before). Spark Connect sessions have no py4j view: nothing to do.
"""

from __future__ import annotations

from typing import Any

# Top-level packages of the names PySpark and the project resolve through the view.
ROOT_PACKAGES = ("org", "java", "scala", "io", "com")
TYPE_UTIL = "py4j.reflection.TypeUtil"


def bind_root_packages(spark: Any) -> None:
    """Bind `ROOT_PACKAGES` and `py4j.reflection.TypeUtil` on `spark`'s py4j view, once."""
    from py4j.java_gateway import JavaClass, JavaPackage

    context = getattr(spark, "sparkContext", None) if hasattr(spark, "_jsparkSession") else None
    view = getattr(context, "_jvm", None)
    if view is None or isinstance(view.__dict__.get("py4j"), JavaPackage):
        return
    client, view_id = view._gateway_client, view._id
    for root in ROOT_PACKAGES:
        setattr(view, root, JavaPackage(root, client, view_id))
    py4j = JavaPackage("py4j", client, view_id)
    py4j.reflection = JavaPackage("py4j.reflection", client, view_id)
    py4j.reflection.TypeUtil = JavaClass(TYPE_UTIL, client)
    view.py4j = py4j
