"""Topic names (spec §6.1, §7): validation, broker name vs storage path, partitions.

The broker names a topic `/{namespace}/{topic}` (leading slash: gRPC, etcd `/topics...` keys,
`msg_id.topic_name`); storage uses `{namespace}/{topic}` (WAL dirs, bucket keys, storage etcd
keys). A partitioned topic `/ns/base` is N independent topics `/ns/base-part-K`, K from 0,
unpadded; nothing records the partition count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from danube_core.errors import InvalidTopicNameError

_PARTITION_SUFFIX = re.compile(r"^(?P<base>.+)-part-(?P<k>0|[1-9][0-9]*)$")
_EXPECTED = (
    "expected the form /{namespace}/{topic}, each part made only of Unicode letters, "
    "digits, '_' and '-'"
)


def _valid_part(part: str) -> bool:
    # Mirrors Rust's char::is_alphanumeric (Unicode alphabetic or numeric) plus '_' and '-'.
    return bool(part) and all(ch.isalnum() or ch in "_-" for ch in part)


@dataclass(frozen=True)
class TopicName:
    """A validated topic: `namespace` and short `topic` (which may carry a `-part-K` suffix)."""

    namespace: str
    topic: str

    def __post_init__(self) -> None:
        if not (_valid_part(self.namespace) and _valid_part(self.topic)):
            raise InvalidTopicNameError(
                f"invalid topic name /{self.namespace}/{self.topic}: {_EXPECTED}"
            )

    @classmethod
    def parse(cls, name: str) -> "TopicName":
        """Parse a broker topic name such as `/default/orders`."""
        parts = name.split("/")
        if len(parts) != 3 or parts[0] != "" or not (_valid_part(parts[1]) and _valid_part(parts[2])):
            raise InvalidTopicNameError(f"invalid topic name {name!r}: {_EXPECTED}")
        return cls(parts[1], parts[2])

    @classmethod
    def from_storage_path(cls, path: str) -> "TopicName":
        """Parse a storage topic path such as `default/orders` (no leading slash)."""
        return cls.parse("/" + path)

    @classmethod
    def partition_name(cls, base: "TopicName | str", k: int) -> "TopicName":
        """Partition `k` (0-based) of partitioned topic `base`: `/ns/base-part-k`."""
        base_topic = base if isinstance(base, TopicName) else cls.parse(base)
        if k < 0:
            raise InvalidTopicNameError(f"partition index {k} of {base_topic} must be >= 0")
        return cls(base_topic.namespace, f"{base_topic.topic}-part-{k}")

    @property
    def broker_name(self) -> str:
        """`/ns/topic`: the name in gRPC, `/topics` keys and `msg_id.topic_name`."""
        return f"/{self.namespace}/{self.topic}"

    @property
    def storage_path(self) -> str:
        """`ns/topic`: the path under WAL roots, bucket prefixes and storage etcd keys."""
        return f"{self.namespace}/{self.topic}"

    @property
    def partition(self) -> int | None:
        """K for a `-part-K` topic, else None."""
        match = _PARTITION_SUFFIX.match(self.topic)
        return int(match.group("k")) if match else None

    @property
    def base_name(self) -> str:
        """Broker name without any `-part-K` suffix (the partitioned topic's name)."""
        match = _PARTITION_SUFFIX.match(self.topic)
        topic = match.group("base") if match else self.topic
        return f"/{self.namespace}/{topic}"

    def __str__(self) -> str:
        return self.broker_name
