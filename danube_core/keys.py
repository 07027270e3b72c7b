"""Every etcd key path (spec §5), in one place.

Broker-side keys (`/cluster`, `/namespaces`, `/topics`, `/schemas`) use the broker topic
name `/{ns}/{topic}`; storage keys use `<root_prefix>/storage/topics/{ns}/{topic}/...` with the
root pasted in exactly as configured (§5.2: a trailing `/` in the root gives `//`, as in the
broker). Functions taking a topic accept a `TopicName` or a broker name string.
"""

from __future__ import annotations

from danube_core.errors import MetadataError
from danube_core.topics import TopicName

DEFAULT_ROOT_PREFIX = "/danube-data"
OFFSET_KEY_WIDTH = 20
CUR_KEY_NAME = "cur"

TopicLike = TopicName | str


def _topic(t: TopicLike) -> TopicName:
    return t if isinstance(t, TopicName) else TopicName.parse(t)


def padded_offset(n: int) -> str:
    """Offset as 20 zero-padded digits, so etcd's byte order is numeric order."""
    return "%020d" % n


def parse_object_key(key: str) -> int | None:
    """Start offset from a descriptor key (`.../objects/<20 digits>`); None for `.../objects/cur`."""
    name = key.rsplit("/", 1)[-1]
    if name == CUR_KEY_NAME:
        return None
    if len(name) != OFFSET_KEY_WIDTH or not name.isascii() or not name.isdigit():
        raise MetadataError(
            f"etcd key {key!r} is not an object descriptor key "
            f"(expected .../objects/<{OFFSET_KEY_WIDTH} digits> or .../objects/cur)"
        )
    return int(name)


class StorageKeys:
    """Storage keys under a configured root prefix (`wal_cloud.uploader.root_prefix`)."""

    def __init__(self, root_prefix: str = DEFAULT_ROOT_PREFIX) -> None:
        self.root_prefix = root_prefix

    def topics_prefix(self) -> str:
        """`<root>/storage/topics/`: the storage keys of every topic."""
        return f"{self.root_prefix}/storage/topics/"

    def topic_prefix(self, t: TopicLike) -> str:
        """`<root>/storage/topics/ns/t/`: everything a reliable topic stores (deleted on topic delete)."""
        return f"{self.root_prefix}/storage/topics/{_topic(t).storage_path}/"

    def objects_prefix(self, t: TopicLike) -> str:
        """Holds the descriptors and the `cur` pointer."""
        return self.topic_prefix(t) + "objects/"

    def object_key(self, t: TopicLike, start_offset: int) -> str:
        return self.objects_prefix(t) + padded_offset(start_offset)

    def cur_key(self, t: TopicLike) -> str:
        return self.objects_prefix(t) + CUR_KEY_NAME

    def state_key(self, t: TopicLike) -> str:
        """The sealed-state marker written on unload (§5.2, §6.2)."""
        return self.topic_prefix(t) + "state"


# ---- topic keys (/topics{T}/...) ------------------------------------------------------------

TOPICS_PREFIX = "/topics/"


def topic_root_key(t: TopicLike) -> str:
    """`/topics/ns/t`: only the system events topic has a value here (§5.3)."""
    return f"/topics{_topic(t).broker_name}"


def topic_keys_prefix(t: TopicLike) -> str:
    """Every key of one topic below its root."""
    return topic_root_key(t) + "/"


def delivery_key(t: TopicLike) -> str:
    return topic_root_key(t) + "/delivery"


def schema_subject_key(t: TopicLike) -> str:
    return topic_root_key(t) + "/schema_subject"


def schema_config_key(t: TopicLike) -> str:
    return topic_root_key(t) + "/schema_config"


def topic_schema_key(t: TopicLike) -> str:
    """`/topics{T}/schema`, removed by DeleteTopic (§6.7)."""
    return topic_root_key(t) + "/schema"


def topic_policy_key(t: TopicLike) -> str:
    return topic_root_key(t) + "/policy"


def producers_prefix(t: TopicLike) -> str:
    return topic_root_key(t) + "/producers/"


def producer_key(t: TopicLike, producer_id: int) -> str:
    return producers_prefix(t) + str(producer_id)


def subscriptions_prefix(t: TopicLike) -> str:
    """Lists subscription records *and* their cursors (`<sub>/cursor`)."""
    return topic_root_key(t) + "/subscriptions/"


def subscription_key(t: TopicLike, subscription: str) -> str:
    return subscriptions_prefix(t) + subscription


def cursor_key(t: TopicLike, subscription: str) -> str:
    return subscription_key(t, subscription) + "/cursor"


def parse_subscription_key(t: TopicLike, key: str) -> tuple[str, bool]:
    """`(subscription, is_cursor)` for a key under `subscriptions_prefix(t)`."""
    prefix = subscriptions_prefix(t)
    if not key.startswith(prefix) or len(key) == len(prefix):
        raise MetadataError(f"etcd key {key!r} is not under {prefix!r}")
    rest = key[len(prefix):]
    if rest.endswith("/cursor"):
        return rest[: -len("/cursor")], True
    return rest, False


# ---- namespace keys -------------------------------------------------------------------------

NAMESPACES_PREFIX = "/namespaces/"


def namespace_policy_key(ns: str) -> str:
    """Its existence is what makes the namespace exist (§5.4)."""
    return f"{NAMESPACES_PREFIX}{ns}/policy"


def namespace_topics_prefix(ns: str) -> str:
    return f"{NAMESPACES_PREFIX}{ns}/topics/"


def namespace_topic_key(t: TopicLike) -> str:
    """`/namespaces/ns/topics/ns/t` = null: the only record of a topic (and partition) list."""
    topic = _topic(t)
    return namespace_topics_prefix(topic.namespace) + topic.storage_path


def topic_from_namespace_index_key(key: str) -> TopicName:
    """Inverse of `namespace_topic_key`."""
    parts = key.split("/")
    # "", "namespaces", ns, "topics", ns, topic
    if len(parts) != 6 or parts[:2] != ["", "namespaces"] or parts[3] != "topics":
        raise MetadataError(
            f"etcd key {key!r} is not a namespace topic index key "
            "(expected /namespaces/{ns}/topics/{ns}/{topic})"
        )
    return TopicName(parts[4], parts[5])


# ---- cluster keys ---------------------------------------------------------------------------

CLUSTER_PREFIX = "/cluster/"
REGISTER_PREFIX = "/cluster/register/"
BROKERS_PREFIX = "/cluster/brokers/"
UNASSIGNED_PREFIX = "/cluster/unassigned/"
LOAD_PREFIX = "/cluster/load/"
LEADER_KEY = "/cluster/leader"
REBALANCING_HISTORY_PREFIX = "/cluster/rebalancing_history/"


def cluster_name_key(name: str) -> str:
    return CLUSTER_PREFIX + name


def register_key(broker_id: int) -> str:
    """Held by the broker's lease (TTL 32 s)."""
    return f"{REGISTER_PREFIX}{broker_id}"


def broker_assignments_prefix(broker_id: int) -> str:
    """Watched by the owning broker; also holds its `state` key."""
    return f"{BROKERS_PREFIX}{broker_id}/"


def broker_state_key(broker_id: int) -> str:
    return broker_assignments_prefix(broker_id) + "state"


def assignment_key(broker_id: int, t: TopicLike) -> str:
    return broker_assignments_prefix(broker_id) + _topic(t).storage_path


def parse_assignment_key(key: str) -> tuple[int, TopicName] | None:
    """`(broker_id, topic)` for `/cluster/brokers/{id}/{ns}/{topic}`.

    None for any other key under BROKERS_PREFIX (notably `/cluster/brokers/{id}/state`), so a
    watcher of a broker's prefix can skip non-assignments.
    """
    if not key.startswith(BROKERS_PREFIX):
        return None
    parts = key[len(BROKERS_PREFIX):].split("/")
    if len(parts) != 3 or not parts[0].isdigit():
        return None
    return int(parts[0]), TopicName(parts[1], parts[2])


def unassigned_key(t: TopicLike) -> str:
    return UNASSIGNED_PREFIX + _topic(t).storage_path


def topic_from_unassigned_key(key: str) -> TopicName:
    if not key.startswith(UNASSIGNED_PREFIX):
        raise MetadataError(f"etcd key {key!r} is not under {UNASSIGNED_PREFIX!r}")
    return TopicName.from_storage_path(key[len(UNASSIGNED_PREFIX):])


def load_key(broker_id: int) -> str:
    return f"{LOAD_PREFIX}{broker_id}"


def rebalancing_history_key(unix_secs: int) -> str:
    return f"{REBALANCING_HISTORY_PREFIX}{unix_secs}"


# ---- schema registry keys -------------------------------------------------------------------

SCHEMAS_PREFIX = "/schemas/"
NEXT_SCHEMA_ID_KEY = "/schemas/_global/next_schema_id"
SCHEMA_INDEX_PREFIX = "/schemas/_index/by_id/"


def schema_index_key(schema_id: int) -> str:
    return f"{SCHEMA_INDEX_PREFIX}{schema_id}"


def schema_metadata_key(subject: str) -> str:
    return f"{SCHEMAS_PREFIX}{subject}/metadata"


def schema_versions_prefix(subject: str) -> str:
    return f"{SCHEMAS_PREFIX}{subject}/versions/"


def schema_version_key(subject: str, version: int) -> str:
    return f"{schema_versions_prefix(subject)}{version}"


def schema_compatibility_key(subject: str) -> str:
    return f"{SCHEMAS_PREFIX}{subject}/compatibility"


# ---- connector keys (ours; the broker knows nothing of them) --------------------------------

def subscription_lock_key(root_prefix: str, subscription: str) -> str:
    """`<root>/connectors/subscriptions/{sub}/lock`: leased by the one live query that commits
    cursors under `sub`, so a second query on the same subscription is refused."""
    return f"{root_prefix}/connectors/subscriptions/{subscription}/lock"
