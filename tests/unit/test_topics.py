"""Topic names (spec §6.1, §7)."""

from __future__ import annotations

import pytest

from danube_core.errors import InvalidTopicNameError
from danube_core.topics import TopicName


def test_parse_broker_name() -> None:
    t = TopicName.parse("/default/orders")
    assert (t.namespace, t.topic) == ("default", "orders")
    assert t.broker_name == "/default/orders" == str(t)
    assert t.storage_path == "default/orders"
    assert t.partition is None and t.base_name == "/default/orders"


def test_partition_names() -> None:
    part = TopicName.partition_name("/default/orders", 2)
    assert part == TopicName("default", "orders-part-2")
    assert part.partition == 2 and part.base_name == "/default/orders"
    assert TopicName.partition_name(TopicName.parse("/ns/a-part-1"), 0).broker_name == "/ns/a-part-1-part-0"
    with pytest.raises(InvalidTopicNameError):
        TopicName.partition_name("/ns/base", -1)


@pytest.mark.parametrize("topic,partition", [("x-part-10", 10), ("x-part-0", 0), ("x-part-01", None),
                                             ("x-part-", None), ("-part-3", None), ("xpart-3", None)])
def test_partition_suffix(topic: str, partition: int | None) -> None:
    assert TopicName("ns", topic).partition == partition


def test_unicode_alphanumerics_allowed() -> None:
    t = TopicName.parse("/café_1/заказы-２")
    assert t.storage_path == "café_1/заказы-２"


def test_from_storage_path() -> None:
    assert TopicName.from_storage_path("default/orders") == TopicName("default", "orders")


@pytest.mark.parametrize(
    "name",
    ["default/orders", "/default", "/default/orders/x", "/default/", "//orders", "/a b/c",
     "/a/b.c", "/a/b/", "", "/", "/a/b\n", "/a/b*"],
)
def test_invalid_topic_names(name: str) -> None:
    with pytest.raises(InvalidTopicNameError, match=r"expected the form /\{namespace\}/\{topic\}"):
        TopicName.parse(name)


def test_invalid_parts_in_constructor() -> None:
    with pytest.raises(InvalidTopicNameError, match="/a/b c"):
        TopicName("a", "b c")


def test_is_hashable_and_value_equal() -> None:
    assert {TopicName.parse("/a/b"), TopicName("a", "b")} == {TopicName("a", "b")}
