"""Salvage reads: an older run's messages, read whole from the sources that hold them.

When a real broker reuses offsets (`connectors.topic_runs`), the older run's messages stay in
storage (objects no descriptor references, stale descriptors' objects, WAL files) but are no
longer in the topic's offset space, so no ordinary read returns them. The batch option
`salvage` names those sources (as `python -m connectors.topic_inspector runs` lists them);
each is scanned for its runs of consecutive offsets and read whole, every CRC checked, with
the source in the `source` column (the object id, or `<WAL file URL>#<byte>` of the run's
first frame: one `wal.log` can hold two runs with the same offsets), so a table can keep both
runs' messages apart. A WAL file named with `#<byte>` reads only the run starting there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from connectors.read_task import ReadTask
from connectors.topic_runs import wal_run_name
from connectors.wal_scan import scan_file_runs
from danube_core.errors import ConfigError, ObjectMissingError
from danube_core.objectstore import OBJECT_ID_PATTERN
from danube_core.topics import TopicName

if TYPE_CHECKING:
    from connectors.catalog import TopicCatalog


def salvage_tasks(
    catalog: "TopicCatalog", topic: str, names: Sequence[str], *, fail_on_data_loss: bool
) -> list[ReadTask]:
    """One task per run of consecutive offsets in each named object or WAL file."""
    tasks = []
    for name in names:
        is_object = bool(OBJECT_ID_PATTERN.match(name))
        url, _, at = (catalog.objects_url(TopicName.parse(topic)) + name, "", "") if is_object else name.partition("#")
        if at and not at.isdigit():
            raise ConfigError(f"option 'salvage': {name!r}: expected <WAL file URL>#<byte position of a run>")
        options = catalog.storage_options_for(url)
        try:
            runs = scan_file_runs(url, options)
        except ObjectMissingError as exc:
            kind = "object" if is_object else "WAL file"
            raise ConfigError(f"option 'salvage': {kind} {name!r} of topic {topic} does not exist "
                              f"({url})") from exc
        chosen = [r for r in runs if r.stop_offset > r.first_offset and (not at or int(r.positions[0]) == int(at))]
        if at and not chosen:
            raise ConfigError(f"option 'salvage': no run of frames starts at byte {at} of {url}")
        for run in chosen:
            source = name if is_object else wal_run_name(url, int(run.positions[0]))
            tasks.append(ReadTask(
                topic=topic, source=source, url=url, storage_options=options,
                byte_start=int(run.positions[0]), byte_end=int(run.positions[-1]),
                start_offset=run.first_offset, end_offset=run.stop_offset,
                strict=is_object, fail_on_data_loss=fail_on_data_loss,
            ))
    return tasks
