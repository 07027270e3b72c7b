"""Deleting the objects a failover's recovery uploaded again (the soak's open defect 3, issue 43).

A broker that closed an object and died before putting its descriptor leaves the object in
storage with no descriptor. The next owner recovers the dead broker's WAL
(`topic_storage.recover_previous_wal`) and uploads the same frames again under a descriptor, so
the old object is a byte-for-byte copy nobody can name. Readers must tell such a repeated
upload from an older run's object anyway (a real v0.7.3 broker leaves them too:
`danube_core.repeated_upload`), but each audit would then read it again, and tools would list
it beside the topic's runs; the broker that made the copy knows where to look, so it deletes it.

Deleted are only objects that start in the recovered offsets, that no descriptor references,
whose descriptor key is already held by a descriptor of another object (keys are created,
never overwritten: a broker paused past its lease that wakes up cannot name it any more), and
whose every frame equals the described frame at that offset (`repeats_described`). Anything
else stays, and readers report it. Best effort: a failure is logged, never raised.
"""

from __future__ import annotations

import logging

from danube_core.descriptor_catalog import DescriptorCatalog
from danube_core.errors import DanubeError
from danube_core.keys import StorageKeys
from danube_core.metadata import MetadataStore
from danube_core.objectstore import ObjectStore, parse_object_id
from danube_core.records import ObjectDescriptor
from danube_core.repeated_upload import repeats_described
from danube_core.topics import TopicName

logger = logging.getLogger(__name__)


def delete_repeated_uploads(topic: TopicName, store: ObjectStore, metadata: MetadataStore, keys: StorageKeys,
                            first: int, last: int) -> list[str]:
    """Delete the repeated uploads (module docstring) starting in offsets `[first, last]`, which
    descriptors hold now; the ids deleted."""
    try:
        return _delete(topic, store, DescriptorCatalog(metadata, keys, topic), first, last)
    except DanubeError as exc:
        logger.warning("%s: could not look for repeated uploads of offsets %d..%d: %s; readers "
                       "recognise them", topic, first, last, exc)
        return []


def _delete(topic: TopicName, store: ObjectStore, catalog: DescriptorCatalog, first: int, last: int) -> list[str]:
    covering = catalog.at_or_before(first)
    described: list[ObjectDescriptor] = []
    for descriptor in catalog.iter_from(covering.start_offset if covering is not None else first):
        if descriptor.start_offset > last:
            break
        described.append(descriptor)
    referenced = {d.object_id for d in described}
    by_start = {d.start_offset: d for d in described}
    deleted = []
    for object_id in store.list_objects(topic, first, last):
        start = parse_object_id(object_id)[0]
        holder = by_start.get(start)
        if object_id in referenced or holder is None:
            continue
        path = store.object_path(topic, object_id)
        if not repeats_described(store, path, start, described, lambda i: store.object_path(topic, i)):
            logger.warning("%s: object %s is not referenced by any descriptor and differs from the "
                           "frames of %s: kept", topic, object_id, holder.object_id)
            continue
        logger.warning("%s: deleting object %s: its descriptor was never written and %s holds the same "
                       "frames byte for byte (uploaded again from the dead owner's WAL)",
                       topic, object_id, holder.object_id)
        store.delete(path)
        deleted.append(object_id)
    return deleted
