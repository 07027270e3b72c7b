"""What a broker's lookup cache holds: cluster-wide only what Danube's lookup protocol needs.

The broker reads its metadata through a `LocalCache` (Danube's, seeds 000/001) behind a
`CachedMetadataStore` (`BrokerServer.lookups`). Danube's protocol lets a client ask *any*
broker about *any* topic: TopicLookup answers Connect, or Redirect to the owner's URL;
TopicPartitions lists a partitioned topic's partitions; a producer's topic is created (auto-
create) only after checking that neither it nor partitions of it exist. So every broker keeps,
for the whole cluster:

* `/cluster/`: registrations (the URLs a Redirect names), assignments
  `/cluster/brokers/{id}/{ns}/{topic}` (who owns a topic), broker states and unassigned
  markers, which the leader's placement and failover read too;
* `/namespaces/`: namespace policies and the topic index `/namespaces/{ns}/topics/{ns}/{topic}`
  (does a topic, or a partition of it, exist).

That is two keys per topic of the cluster (its assignment and its index entry): the part of a
broker's memory that grows with the cluster (`bench/bench_broker_lookups.py` measures it).
Everything else a broker reads about a topic lives under `/topics/{ns}/{topic}/` (delivery,
policy, schema subject, producers, subscriptions and their cursors) and is cached only for the
topics this broker serves: `ServedTopicKeys.serve` covers a topic's keys when the broker loads
it, `release` drops them when the topic leaves. Reads of another topic's keys (the leader
checking an unloading topic's delivery, a failover) go to etcd through `CachedMetadataStore`.

The cache's one watch is on `/` (the spans' common prefix), so it still receives every write
in etcd, other topics' storage keys included, and drops those it does not hold: CPU per write
of the cluster, not memory.
"""

from __future__ import annotations

import logging
import threading

from danube_core.keys import CLUSTER_PREFIX, NAMESPACES_PREFIX, topic_keys_prefix
from danube_core.local_cache import LocalCache
from danube_core.metadata import MetadataStore, prefix_end
from danube_core.topics import TopicName

logger = logging.getLogger(__name__)

# What every broker needs about every topic (see the module docstring).
CLUSTER_WIDE_PREFIXES = (CLUSTER_PREFIX, NAMESPACES_PREFIX)
# Watched from the start, so spans of served topics under `/topics/` can be added later.
WATCH_PREFIX = "/"


def open_lookup_cache(store: MetadataStore, name: str) -> LocalCache:
    """The broker's lookup cache, loaded and watching: the cluster-wide prefixes, no topic keys
    yet. MetadataError if etcd cannot be read."""
    return LocalCache(store, CLUSTER_WIDE_PREFIXES, name=name, watch_prefix=WATCH_PREFIX).start()


class ServedTopicKeys:
    """The `/topics/{ns}/{topic}/` keys of the topics this broker serves, held in its lookup
    cache from `serve` (the topic loads) to `release` (it leaves). Thread-safe; both calls are
    idempotent."""

    def __init__(self, cache: LocalCache) -> None:
        self._cache = cache
        self._lock = threading.Lock()  # one cover or uncover at a time, so `_served` matches the spans
        self._served: set[TopicName] = set()

    def serve(self, topic: TopicName) -> None:
        """Hold `topic`'s keys from now on (one range read of them). MetadataError if etcd cannot
        be read; the topic's reads then go to etcd until it is served again."""
        prefix = topic_keys_prefix(topic)
        with self._lock:
            if topic in self._served:
                return
            self._cache.cover(prefix, prefix_end(prefix))
            self._served.add(topic)

    def release(self, topic: TopicName) -> None:
        """Drop `topic`'s keys (later reads of them go to etcd)."""
        prefix = topic_keys_prefix(topic)
        with self._lock:
            if topic not in self._served:
                return
            dropped = self._cache.uncover(prefix, prefix_end(prefix))
            self._served.discard(topic)
        logger.debug("lookup cache dropped %d key(s) of %s", dropped, topic)

    def topics(self) -> list[TopicName]:
        """The topics whose keys are held, sorted by name."""
        with self._lock:
            return sorted(self._served, key=str)
