"""Which topics a query reads: names, a pattern or a namespace, resolved through the namespace index.

The namespace index (`/namespaces/<ns>/topics/...`, spec §5.4) lists every topic and partition
the cluster knows. `TopicResolver` reads only that, through a `MetadataStore` (or a cache of
one), and returns topics in a stable order (namespace, base name, partition).
"""

from __future__ import annotations

import logging
import re
from typing import Iterable

from danube_core import keys
from danube_core.metadata import MetadataStore
from danube_core.topics import TopicName

logger = logging.getLogger(__name__)


class TopicResolver:
    """The topics a query names, looked up in the namespace index."""

    def __init__(self, metadata: MetadataStore) -> None:
        self._metadata = metadata

    def resolve(
        self, topics: list[str] | None = None, pattern: str | None = None, namespace: str | None = None
    ) -> list[TopicName]:
        """Topics to read: explicit names, a regex (full match on `/ns/topic` or its base name),
        or a whole namespace. A partitioned base name expands to its `-part-N` partitions
        (exact match on the base, unlike the broker's prefix match, §7). An explicit name that
        is not (yet) in the namespace index is kept, so it is read once it exists."""
        chosen = (topics is not None) + (pattern is not None) + (namespace is not None and pattern is None)
        if chosen != 1:
            raise ValueError("give exactly one of topics, pattern or namespace (pattern may be "
                             f"combined with namespace); got topics={topics!r} pattern={pattern!r} "
                             f"namespace={namespace!r}")
        if topics is not None:
            return sorted({p for name in topics for p in self._expand(TopicName.parse(name))}, key=_order)
        known = self._indexed(namespace)
        if pattern is None:
            return sorted(known, key=_order)
        regex = re.compile(pattern)
        matching = (t for t in known if regex.fullmatch(str(t)) or regex.fullmatch(t.base_name))
        return sorted(matching, key=_order)

    def indexed(self, topics: Iterable[TopicName]) -> set[str]:
        """Those of `topics` the namespace index lists now (a deleted topic's entry is gone)."""
        return {str(t) for t in topics if self._metadata.get(keys.namespace_topic_key(t)) is not None}

    def namespace_topics(self, namespace: str) -> list[TopicName]:
        """Every topic and partition the namespace index lists, in a stable order."""
        return sorted(self._indexed(namespace), key=_order)

    def _indexed(self, namespace: str | None, prefix: str | None = None) -> list[TopicName]:
        """Topics in the namespace index: one namespace's, every namespace's, or those whose
        index key starts with `prefix`."""
        if prefix is None:
            prefix = keys.namespace_topics_prefix(namespace) if namespace else keys.NAMESPACES_PREFIX
        found = []
        for key, _ in self._metadata.get_prefix(prefix, keys_only=True):
            if "/topics/" in key:
                found.append(keys.topic_from_namespace_index_key(key))
        return found

    def _expand(self, topic: TopicName) -> list[TopicName]:
        # Only the index keys starting with the topic's own: itself and its `-part-N` partitions.
        known = self._indexed(topic.namespace, keys.namespace_topic_key(topic))
        if topic in known:
            return [topic]
        parts = [t for t in known if t.partition is not None and t.base_name == topic.broker_name]
        if not parts:
            logger.debug("topic %s is not in the namespace index (yet); reading it as it appears", topic)
            return [topic]
        return parts


def _order(topic: TopicName) -> tuple:
    partition = topic.partition if topic.partition is not None else -1
    return (topic.namespace, topic.base_name, partition, topic.topic)
