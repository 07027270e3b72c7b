"""`connectors.jvm_view`: the session's py4j view answers its root packages without asking the JVM."""

from __future__ import annotations

import pytest
from py4j.java_gateway import JavaClass, JavaPackage
from pyspark.errors import AnalysisException

from connectors.jvm_view import ROOT_PACKAGES, bind_root_packages

pytestmark = pytest.mark.spark


class CountingClient:
    """The view's gateway client, counting the names it asks the JVM to resolve."""

    def __init__(self, client) -> None:
        self.client, self.resolved = client, []

    def send_command(self, command: str, *args, **kwargs):
        parts = command.split("\n")
        if parts[:2] == ["r", "u"]:  # py4j's reflection command: get unknown member
            self.resolved.append(parts[2])
        return self.client.send_command(command, *args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.client, name)


def test_root_packages_and_type_util_resolve_without_a_jvm_lookup(spark, monkeypatch):
    """The session fixture's `connectors.register(spark)` bound them."""
    view = spark.sparkContext._jvm
    bound = {name: view.__dict__.get(name) for name in (*ROOT_PACKAGES, "py4j")}
    assert all(isinstance(package, JavaPackage) for package in bound.values()), bound
    counting = CountingClient(view._gateway_client)
    for package in (*bound.values(), bound["py4j"].reflection):
        monkeypatch.setattr(package, "_gateway_client", counting)
    monkeypatch.setattr(view, "_gateway_client", counting)

    assert isinstance(view.py4j.reflection.TypeUtil, JavaClass)
    assert counting.resolved == []
    functions = view.org.apache.spark.sql.functions  # below the roots: py4j resolves each level
    assert isinstance(functions, JavaClass)
    assert counting.resolved == ["org.apache", "org.apache.spark", "org.apache.spark.sql",
                                 "org.apache.spark.sql.functions"]


def test_java_exceptions_are_still_converted_with_the_bound_type_util(spark):
    bind_root_packages(spark)  # a second call changes nothing
    with pytest.raises(AnalysisException, match="TABLE_OR_VIEW_NOT_FOUND"):
        spark.sql("SELECT * FROM no_such_table_for_the_view_test").collect()
