"""Topic metadata in etcd (spec §5.3, §6.1, §6.2, §6.7, §7): create, find, unload, delete.

These are the cluster-scope operations, done by whichever broker (or the admin CLI) is asked:
they only write keys, and the leader and the owning broker react through their watches.

Deliberate differences from v0.7.3, keeping every key and value as the spec says:
* Partitions of `/ns/base` are matched as `base-part-<K>` exactly, ordered by K; Danube's plain
  prefix match would also return `/ns/baseball`.
* Delete removes the namespace index entry *before* the assignment, so the owner can tell a
  delete from an unload by the index (see `broker.cluster`) even if the leader already
  consumed the unload marker (§6.8's race).
* `owner` reads one assignment key per broker (found with one limit-1 range read per broker
  under `/cluster/brokers/`); Danube's `get_broker_for_topic` scans every assignment key of the
  cluster on every lookup.
"""

from __future__ import annotations

import logging
import re

from danube_core.keys import (
    BROKERS_PREFIX,
    StorageKeys,
    assignment_key,
    broker_assignments_prefix,
    delivery_key,
    namespace_topic_key,
    parse_assignment_key,
    producer_key,
    producers_prefix,
    register_key,
    schema_subject_key,
    subscription_key,
    subscriptions_prefix,
    parse_subscription_key,
    topic_policy_key,
    topic_root_key,
    topic_schema_key,
    unassigned_key,
)
from danube_core.metadata import MetadataStore, prefix_end
from danube_core.records import (
    NULL_JSON,
    BrokerRegistration,
    ProducerRecord,
    SubscriptionRecord,
    UnassignedMarker,
    dump_delivery,
    dump_json,
    parse_cursor,
    parse_delivery,
)
from danube_core.topics import TopicName

from broker.client_errors import AlreadyExistsError, ConflictError, InvalidRequestError, NotFoundError
from broker.namespaces import Namespaces, present

logger = logging.getLogger(__name__)

MAX_PARTITIONS = 4096
PARTITIONS_LISTED = 8  # an error message names at most this many partitions


def _listed(topics: list[TopicName]) -> str:
    """`a, b, c` (the first few of many, then how many more)."""
    shown = ", ".join(str(topic) for topic in topics[:PARTITIONS_LISTED])
    more = len(topics) - PARTITIONS_LISTED
    return f"{shown}, ... and {more} more" if more > 0 else shown


def broker_ids(metadata: MetadataStore) -> list[int]:
    """Ids of the brokers with keys under `/cluster/brokers/{id}/`, in key order: every broker
    that joined (its state key outlives it), so a dead one whose assignments the leader has not
    moved yet is there too. One limit-1 range read per broker, skipping each broker's keys: the
    cost follows the brokers, not the topics they hold."""
    ids: list[int] = []
    start, end = BROKERS_PREFIX, prefix_end(BROKERS_PREFIX)
    while rows := metadata.get_range(start, end, limit=1):
        key = rows[0][0]
        name, slash, _ = key[len(BROKERS_PREFIX):].partition("/")
        if name.isascii() and name.isdigit():
            ids.append(int(name))
        # Every key from here to the end of `{name}/` is this broker's.
        start = prefix_end(f"{BROKERS_PREFIX}{name}/") if slash else key + "\0"
    return ids


class TopicRegistry:
    """Topic records over a metadata store.

    Any broker answers any client about any topic (TopicLookup, TopicPartitions, the checks
    before a create), so `exists`, `partitions`, `owner` and `registration` need the cluster's
    namespace index, assignments and registrations: the broker's lookup cache holds those for
    the whole cluster, and the `/topics` keys only of the topics it serves (`broker.lookup_cache`).
    The other topics' keys this class reads (`delivery`, `subscriptions`) then come from etcd.
    """

    def __init__(self, metadata: MetadataStore, namespaces: Namespaces | None = None) -> None:
        self.metadata = metadata
        self.namespaces = namespaces or Namespaces(metadata)

    # ---- existence and lookup ---------------------------------------------------------------

    def exists(self, topic: TopicName) -> bool:
        return self.namespaces.has_topic(topic)

    def delivery(self, topic: TopicName) -> str | None:
        key = delivery_key(topic)
        raw = self.metadata.get(key)
        return None if raw is None else parse_delivery(raw, key)

    def partitions(self, name: TopicName) -> list[TopicName]:
        """What TopicPartitions answers: `[name]` if it is a topic, else its `-part-K` topics."""
        if self.exists(name):
            return [name]
        pattern = re.compile(re.escape(name.topic) + r"-part-(0|[1-9][0-9]*)$")
        found = []
        for topic in self.namespaces.topics(name.namespace):
            match = pattern.match(topic.topic)
            if match:
                found.append((int(match.group(1)), topic))
        return [topic for _, topic in sorted(found, key=lambda pair: pair[0])]

    def inspection_targets(self, name: TopicName, storage_keys: StorageKeys) -> list[TopicName]:
        """The topics an inspection of `name` (admin `topics storage`, tools `objects`) covers:
        what `partitions` answers (the topic, or a partitioned base's partitions), else `name`
        alone if storage keys remain under it (a deleted topic's, one written by hand).
        NotFoundError naming where it looked otherwise: printing `null`s for a name that is
        nothing would read as an empty topic."""
        self.metadata.sync_reads()
        found = self.partitions(name)
        if found:
            return found
        prefix = storage_keys.topic_prefix(name)
        if self.metadata.get_prefix(prefix, keys_only=True):
            return [name]
        raise NotFoundError(f"topic {name} does not exist: no {namespace_topic_key(name)}, no partitions "
                            f"{name}-part-N and no storage keys under {prefix}")

    def owner(self, topic: TopicName) -> int | None:
        """Broker id holding `/cluster/brokers/{id}/{ns}/{topic}`, if any (the first in key order,
        should two). A dead broker counts until the leader moves its assignments: a lookup then
        waits for the new owner instead of answering "does not exist". O(brokers) reads."""
        for broker_id in broker_ids(self.metadata):
            if self.metadata.get(assignment_key(broker_id, topic)) is not None:
                return broker_id
        return None

    def owners(self, topics: list[TopicName]) -> dict[TopicName, int | None]:
        """`owner` of each of many topics (a listing): one range read of each broker's
        assignments instead of a point read per broker and topic."""
        wanted = set(topics)
        found: dict[TopicName, int | None] = {}
        for broker_id in broker_ids(self.metadata):
            for key, _ in self.metadata.get_prefix(broker_assignments_prefix(broker_id), keys_only=True):
                parsed = parse_assignment_key(key)
                if parsed is not None and parsed[1] in wanted:
                    found.setdefault(parsed[1], broker_id)
        return {topic: found.get(topic) for topic in topics}

    def registration(self, broker_id: int) -> BrokerRegistration | None:
        key = register_key(broker_id)
        raw = self.metadata.get(key) if present(self.metadata, key) else None
        return None if raw is None else BrokerRegistration.from_json(raw, key)

    # ---- create -----------------------------------------------------------------------------

    def create(self, topic: TopicName, delivery: str, schema_subject: str | None = None) -> None:
        """Write a new topic's keys in Danube's order; the leader then assigns it (§6.1)."""
        self.metadata.sync_reads()  # the existence checks below must not miss a recent create
        self.namespaces.require(topic.namespace)
        if self.exists(topic):
            raise AlreadyExistsError(f"topic {topic} already exists ({namespace_topic_key(topic)})")
        self._check_partition_conflict(topic)
        self.metadata.put(unassigned_key(topic), NULL_JSON)
        self.metadata.put(namespace_topic_key(topic), NULL_JSON)
        self.metadata.put(delivery_key(topic), dump_delivery(delivery))
        if schema_subject:
            self.metadata.put(schema_subject_key(topic), dump_json(schema_subject))
        logger.info("topic %s created (%s), waiting for assignment", topic, delivery)

    def create_partitioned(self, base: TopicName, partitions: int, delivery: str) -> list[TopicName]:
        """Create `/ns/base-part-0` ... `-part-{N-1}` (§7); no key records the parent."""
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidRequestError(f"partitions={partitions} for {base}: expected 1..{MAX_PARTITIONS}")
        if base.partition is not None:
            raise InvalidRequestError(f"partitioned topic base name {base} must not end in -part-N")
        names = [TopicName.partition_name(base, k) for k in range(partitions)]
        for name in names:
            self.create(name, delivery)
        return names

    def _check_partition_conflict(self, topic: TopicName) -> None:
        """ConflictError (not AlreadyExistsError: `topic` itself does not exist, and the broker
        takes AlreadyExistsError for a concurrent create) when `topic` clashes with a
        partitioned topic; the message is what a producer's user reads, so it says what to do."""
        if topic.partition is not None:
            base = TopicName.parse(topic.base_name)
            if self.exists(base):
                raise ConflictError(
                    f"cannot create partition {topic}: {base} is a non-partitioned topic; create the producer "
                    f"without partitions, or delete {base} first"
                )
            return
        partitions = self.partitions(topic)
        if partitions:
            raise ConflictError(
                f"cannot create topic {topic}: it is partitioned into {len(partitions)} partitions "
                f"({_listed(partitions)}); create the producer with the partition count (danube-client: "
                f"with_partitions({len(partitions)})) or publish to one partition, e.g. {partitions[0]}; "
                "to make it a non-partitioned topic, delete the partitioned topic first"
            )

    # ---- producers and subscriptions --------------------------------------------------------

    def put_producer(self, record: ProducerRecord) -> None:
        topic = TopicName.parse(record.topic_name)
        self.metadata.put(producer_key(topic, record.producer_id), record.to_json())

    def producer_exists(self, topic: TopicName, producer_id: int) -> bool:
        return present(self.metadata, producer_key(topic, producer_id))

    def delete_producers(self, topic: TopicName) -> None:
        self.metadata.delete_prefix(producers_prefix(topic))

    def delete_subscriptions(self, topic: TopicName) -> None:
        """Every subscription record (and cursor) of `topic`: a non-reliable unload (§5.3)."""
        self.metadata.delete_prefix(subscriptions_prefix(topic))

    def put_subscription(self, topic: TopicName, record: SubscriptionRecord) -> None:
        self.metadata.put(subscription_key(topic, record.subscription_name), record.to_json())

    def subscriptions(self, topic: TopicName) -> dict[str, dict]:
        """`{name: {"record": SubscriptionRecord | None, "cursor": int | None}}` from etcd."""
        found: dict[str, dict] = {}
        for key, raw in self.metadata.get_prefix(subscriptions_prefix(topic)):
            name, is_cursor = parse_subscription_key(topic, key)
            entry = found.setdefault(name, {"record": None, "cursor": None})
            if is_cursor:
                entry["cursor"] = parse_cursor(raw, key)
            else:
                entry["record"] = SubscriptionRecord.from_json(raw, key)
        return found

    # ---- unload and delete ------------------------------------------------------------------

    def unload(self, topic: TopicName) -> int:
        """Admin UnloadTopic (§6.2 step 1): marker `{"from_broker","reason":"unload"}`, then
        delete the assignment; the owner seals and the leader reassigns. Returns the owner."""
        self.metadata.sync_reads()  # acts on the owner: read it as etcd has it now
        owner = self._require_owner(topic)
        marker = UnassignedMarker(from_broker=owner, reason="unload")
        self.metadata.put(unassigned_key(topic), marker.to_json())
        self.metadata.delete(assignment_key(owner, topic))
        logger.info("topic %s unload requested from broker %d", topic, owner)
        return owner

    def delete(self, topic: TopicName) -> list[TopicName]:
        """Admin DeleteTopic (§6.7) on a base name; a partitioned base deletes every partition."""
        if topic.partition is not None:
            raise InvalidRequestError(
                f"cannot delete the single partition {topic}; delete its base topic {topic.base_name}"
            )
        self.metadata.sync_reads()  # acts on owners and keys: read them as etcd has them now
        targets = self.partitions(topic)
        if not targets:
            raise NotFoundError(f"topic {topic} does not exist ({namespace_topic_key(topic)} is missing)")
        for target in targets:
            self._delete_one(target)
        return targets

    def _delete_one(self, topic: TopicName) -> None:
        owner = self.owner(topic)
        self.metadata.delete(namespace_topic_key(topic))
        self.metadata.delete(unassigned_key(topic))
        if owner is not None:
            self.metadata.delete(assignment_key(owner, topic))
        for prefix in (producers_prefix(topic), subscriptions_prefix(topic)):
            self.metadata.delete_prefix(prefix)
        for key in (delivery_key(topic), topic_policy_key(topic), topic_schema_key(topic), topic_root_key(topic)):
            self.metadata.delete(key)
        logger.info("topic %s deleted (owner %s)", topic, owner)

    def _require_owner(self, topic: TopicName) -> int:
        owner = self.owner(topic)
        if owner is None:
            if not self.exists(topic):
                raise NotFoundError(f"topic {topic} does not exist ({namespace_topic_key(topic)} is missing)")
            raise NotFoundError(f"topic {topic} is not assigned to any broker right now")
        return owner

    def list(self, namespace: str) -> list[TopicName]:
        """Every topic (and partition) of a namespace."""
        self.namespaces.require(namespace)
        return self.namespaces.topics(namespace)

