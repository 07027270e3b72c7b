"""etcd key layout (spec §5)."""

from __future__ import annotations

import pytest

from danube_core import keys
from danube_core.errors import MetadataError
from danube_core.keys import StorageKeys, padded_offset
from danube_core.topics import TopicName

ORDERS = TopicName.parse("/default/orders")


def test_padded_offset() -> None:
    assert padded_offset(1204) == "00000000000000001204"
    assert padded_offset(2**64 - 1) == "18446744073709551615"
    assert padded_offset(9) < padded_offset(10) < "cur"


def test_storage_keys_default_root() -> None:
    sk = StorageKeys()
    assert sk.topic_prefix(ORDERS) == "/danube-data/storage/topics/default/orders/"
    assert sk.objects_prefix(ORDERS) == "/danube-data/storage/topics/default/orders/objects/"
    assert sk.object_key(ORDERS, 1204) == "/danube-data/storage/topics/default/orders/objects/00000000000000001204"
    assert sk.cur_key(ORDERS) == "/danube-data/storage/topics/default/orders/objects/cur"
    assert sk.state_key("/default/orders") == "/danube-data/storage/topics/default/orders/state"


def test_storage_root_pasted_as_configured() -> None:
    assert StorageKeys("/danube").state_key(ORDERS) == "/danube/storage/topics/default/orders/state"
    assert StorageKeys("/x/").cur_key(ORDERS) == "/x//storage/topics/default/orders/objects/cur"


def test_parse_object_key() -> None:
    sk = StorageKeys()
    assert keys.parse_object_key(sk.object_key(ORDERS, 2**64 - 1)) == 2**64 - 1
    assert keys.parse_object_key(sk.cur_key(ORDERS)) is None
    with pytest.raises(MetadataError, match="objects/12"):
        keys.parse_object_key("/danube-data/storage/topics/a/b/objects/12")


def test_topic_keys() -> None:
    assert keys.topic_root_key(ORDERS) == "/topics/default/orders"
    assert keys.delivery_key(ORDERS) == "/topics/default/orders/delivery"
    assert keys.schema_subject_key(ORDERS) == "/topics/default/orders/schema_subject"
    assert keys.schema_config_key(ORDERS) == "/topics/default/orders/schema_config"
    assert keys.topic_schema_key(ORDERS) == "/topics/default/orders/schema"
    assert keys.topic_policy_key("/default/orders") == "/topics/default/orders/policy"
    assert keys.producer_key(ORDERS, 2**64 - 1) == "/topics/default/orders/producers/18446744073709551615"
    assert keys.producers_prefix(ORDERS) == "/topics/default/orders/producers/"
    assert keys.subscription_key(ORDERS, "s1") == "/topics/default/orders/subscriptions/s1"
    assert keys.cursor_key(ORDERS, "s1") == "/topics/default/orders/subscriptions/s1/cursor"
    assert keys.subscriptions_prefix(ORDERS) == "/topics/default/orders/subscriptions/"


def test_parse_subscription_key() -> None:
    assert keys.parse_subscription_key(ORDERS, keys.cursor_key(ORDERS, "s1")) == ("s1", True)
    assert keys.parse_subscription_key(ORDERS, keys.subscription_key(ORDERS, "s1")) == ("s1", False)
    with pytest.raises(MetadataError):
        keys.parse_subscription_key(ORDERS, "/topics/other/t/subscriptions/s1")


def test_namespace_keys() -> None:
    part = TopicName.parse("/default/orders-part-0")
    assert keys.namespace_policy_key("default") == "/namespaces/default/policy"
    assert keys.namespace_topics_prefix("default") == "/namespaces/default/topics/"
    key = keys.namespace_topic_key(part)
    assert key == "/namespaces/default/topics/default/orders-part-0"
    assert keys.topic_from_namespace_index_key(key) == part
    with pytest.raises(MetadataError, match="/namespaces/default/policy"):
        keys.topic_from_namespace_index_key("/namespaces/default/policy")


def test_cluster_keys() -> None:
    bid = 9876543210123456789
    assert keys.cluster_name_key("MY_CLUSTER") == "/cluster/MY_CLUSTER"
    assert keys.register_key(bid) == f"/cluster/register/{bid}"
    assert keys.register_key(bid).startswith(keys.REGISTER_PREFIX)
    assert keys.broker_state_key(bid) == f"/cluster/brokers/{bid}/state"
    assert keys.assignment_key(bid, ORDERS) == f"/cluster/brokers/{bid}/default/orders"
    assert keys.broker_assignments_prefix(bid) == f"/cluster/brokers/{bid}/"
    assert keys.assignment_key(bid, ORDERS).startswith(keys.BROKERS_PREFIX)
    assert keys.unassigned_key(ORDERS) == "/cluster/unassigned/default/orders"
    assert keys.unassigned_key(ORDERS).startswith(keys.UNASSIGNED_PREFIX)
    assert keys.load_key(bid) == f"/cluster/load/{bid}"
    assert keys.LEADER_KEY == "/cluster/leader"
    assert keys.rebalancing_history_key(1700000000) == "/cluster/rebalancing_history/1700000000"


def test_parse_cluster_keys() -> None:
    bid = 2**64 - 1
    assert keys.parse_assignment_key(keys.assignment_key(bid, ORDERS)) == (bid, ORDERS)
    assert keys.parse_assignment_key(keys.broker_state_key(bid)) is None
    assert keys.parse_assignment_key("/cluster/register/1") is None
    assert keys.topic_from_unassigned_key(keys.unassigned_key(ORDERS)) == ORDERS
    with pytest.raises(MetadataError):
        keys.topic_from_unassigned_key("/cluster/brokers/1/default/orders")


def test_schema_keys() -> None:
    assert keys.NEXT_SCHEMA_ID_KEY == "/schemas/_global/next_schema_id"
    assert keys.schema_index_key(5) == "/schemas/_index/by_id/5"
    assert keys.schema_metadata_key("orders") == "/schemas/orders/metadata"
    assert keys.schema_version_key("orders", 3) == "/schemas/orders/versions/3"
    assert keys.schema_versions_prefix("orders") == "/schemas/orders/versions/"
    assert keys.schema_compatibility_key("orders") == "/schemas/orders/compatibility"
