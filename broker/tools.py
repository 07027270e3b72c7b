"""Inspection CLI for WAL files, checkpoints, cloud objects and a topic's storage keys.

    python -m broker.tools dump <path-or-url> [--storage-option k=v ...] [--chunk-bytes N]
    python -m broker.tools objects --etcd HOST:PORT [--etcd-* ...] --topic /ns/t [--root-prefix /danube-data]

`dump` prints one JSON object per frame of a WAL file or a `.dnb1` object (both are frames
back to back, spec §1, §4.3), local or any fsspec URL (`s3://bucket/key`), read in bounded
chunks. `offset` is the frame header's offset, `topic_offset` the one inside the payload
(they are equal in everything the broker writes, §2.6); `payload_b64` is standard base64.
A file named `wal.ckpt` or `uploader.ckpt` is a bincode checkpoint, not frames (§3.4, §3.5):
`dump` prints it as one JSON object tagged `"checkpoint": "wal"` or `"uploader"`.
Storage options are `key=value`; a dotted key nests (`client_kwargs.endpoint_url=http://...`)
and a value that parses as JSON is taken as JSON (quote strings that look like numbers).

`objects` prints one JSON line per object descriptor, then the `cur` pointer and the sealed
state (null when absent), each tagged with `kind` and its etcd `key`. A partitioned topic's
base name (`/ns/t` of `/ns/t-part-0..N-1`) lists each partition in turn. A secured etcd takes
the `--etcd-*` flags of `danube_core.etcd_cli` (TLS files, user; the password from
$DANUBE_ETCD_PASSWORD or `--etcd-password-file`).

Exit codes: 0 fine; 1 corrupt data (CRC mismatch, torn or undecodable frame, invalid etcd
value: stderr names the file or key, the frame offset and byte position); 2 bad arguments;
3 the file or etcd cannot be read, or the topic does not exist (no topic, partitions or
storage keys of that name).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import logging
import posixpath
import re
import sys
from typing import TYPE_CHECKING, Any, TextIO

import fsspec

from danube_core.checkpoints import (
    UPLOADER_CHECKPOINT_NAME,
    WAL_CHECKPOINT_NAME,
    UploaderCheckpoint,
    WalCheckpoint,
)
from danube_core.errors import (
    CheckpointError,
    CorruptFrameError,
    DanubeError,
    MetadataError,
    PayloadDecodeError,
)
from danube_core.etcd_cli import add_etcd_flags, etcd_settings_from_args
from danube_core.frames import STOP_CRC, STOP_END
from danube_core.keys import DEFAULT_ROOT_PREFIX, StorageKeys
from danube_core.message import StreamMessage, decode_message
from danube_core.topics import TopicName
from danube_core.wal_files import DEFAULT_CHUNK_BYTES, FrameFileScanner

if TYPE_CHECKING:
    from danube_core.etcd_settings import EtcdSettings
    from danube_core.metadata import MetadataStore

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_CORRUPT = 1
EXIT_USAGE = 2
EXIT_UNREADABLE = 3

# Checkpoints sit next to the WAL files, so `dump` on a topic directory's files meets them too.
CHECKPOINT_KINDS = {WAL_CHECKPOINT_NAME: ("wal", WalCheckpoint),
                    UPLOADER_CHECKPOINT_NAME: ("uploader", UploaderCheckpoint)}


def message_record(offset: int, msg: StreamMessage) -> dict[str, Any]:
    """The JSON object `dump` prints for the frame at `offset` holding `msg`."""
    mid = msg.msg_id
    return {
        "offset": offset,
        "request_id": msg.request_id,
        "producer_id": mid.producer_id,
        "topic_name": mid.topic_name,
        "broker_addr": mid.broker_addr,
        "topic_offset": mid.topic_offset,
        "payload_b64": base64.b64encode(msg.payload).decode("ascii"),
        "publish_time": msg.publish_time,
        "producer_name": msg.producer_name,
        "subscription_name": msg.subscription_name,
        "attributes": msg.attributes,
        "schema_id": msg.schema_id,
        "schema_version": msg.schema_version,
    }


def parse_storage_options(pairs: list[str]) -> dict[str, Any]:
    """`["a.b=1", "key=x"]` -> `{"a": {"b": 1}, "key": "x"}`; ValueError names a bad pair."""
    options: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"--storage-option {pair!r}: expected key=value")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        *parents, leaf = name.split(".")
        node = options
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"--storage-option {pair!r}: {part!r} is already a plain value")
        node[leaf] = value
    return options


def dump(target: str, storage_options: dict[str, Any], chunk_bytes: int, out: TextIO, err: TextIO) -> int:
    """Print every frame of `target` as JSON lines; returns the exit code."""
    try:
        fs, path = fsspec.core.url_to_fs(target, **storage_options)
    except (OSError, ValueError) as exc:
        err.write(f"cannot open {target}: {exc}\n")
        return EXIT_UNREADABLE
    try:
        fh = fs.open(path, "rb")
    except (OSError, ValueError) as exc:
        err.write(f"cannot open {target}: {exc}{_partition_hint(fs, path, target)}\n")
        return EXIT_UNREADABLE
    try:
        with fh:
            checkpoint = CHECKPOINT_KINDS.get(posixpath.basename(path))
            if checkpoint is not None:
                return _dump_checkpoint(fh.read(), target, *checkpoint, out, err)
            return _dump_frames(fh, target, chunk_bytes, out, err)
    except OSError as exc:
        err.write(f"cannot read {target}: {exc}\n")
        return EXIT_UNREADABLE


def _partition_hint(fs: Any, path: str, target: str) -> str:
    """For `<wal root>/<ns>/<topic>/<file>` where `<topic>` is a partitioned topic's base name:
    where its WAL is, the same file of each partition (a partition is a topic of its own)."""
    topic_dir, name = posixpath.split(path)
    topic = posixpath.basename(topic_dir)
    try:
        found = fs.glob(f"{topic_dir}-part-*/{name}")
    except (OSError, ValueError):
        return ""
    numbers = sorted(int(m.group(1)) for f in found if (m := re.search(r"-part-(\d+)/[^/]*$", f)))
    suffix = f"{topic}/{name}"
    if not numbers or not target.endswith(suffix):
        return ""
    shown = ", ".join(f"{target[:-len(suffix)]}{topic}-part-{n}/{name}" for n in numbers[:3])
    more = f" ... ({len(numbers)} partitions)" if len(numbers) > 3 else ""
    return f"; {topic!r} is a partitioned topic, its WAL is per partition: {shown}{more}"


def _dump_checkpoint(
    data: bytes, target: str, kind: str, cls: type[WalCheckpoint] | type[UploaderCheckpoint],
    out: TextIO, err: TextIO,
) -> int:
    """Print a decoded checkpoint; without this, its bytes would be read as a torn frame."""
    try:
        checkpoint = cls.decode(data, target)
    except CheckpointError as exc:
        err.write(f"{exc}\n")
        return EXIT_CORRUPT
    record = {"checkpoint": kind, **dataclasses.asdict(checkpoint)}
    out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return EXIT_OK


def _dump_frames(fh: Any, target: str, chunk_bytes: int, out: TextIO, err: TextIO) -> int:
    scanner = FrameFileScanner(fh, chunk_bytes=chunk_bytes)
    for offset, frame_pos, payload in scanner:
        try:
            msg = decode_message(payload)
        except PayloadDecodeError as exc:
            err.write(f"{CorruptFrameError(target, offset, frame_pos, f'undecodable payload: {exc}')}\n")
            return EXIT_CORRUPT
        out.write(json.dumps(message_record(offset, msg), ensure_ascii=False) + "\n")
    if scanner.stop_reason == STOP_END:
        return EXIT_OK
    reason = "CRC mismatch" if scanner.stop_reason == STOP_CRC else "torn frame at end of file"
    assert scanner.stop_pos is not None  # a scan that stopped says where
    err.write(f"{CorruptFrameError(target, scanner.stop_offset, scanner.stop_pos, reason)}\n")
    return EXIT_CORRUPT


def list_objects(etcd: EtcdSettings, topic: TopicName, root_prefix: str, out: TextIO, err: TextIO) -> int:
    """Print the topic's descriptors, `cur` and sealed state (each partition's in turn, for a
    partitioned base name); returns the exit code. NotFoundError for a name that is no topic."""
    from broker.topics_registry import TopicRegistry

    keys = StorageKeys(root_prefix)
    status = EXIT_OK
    with etcd.connect() as store:
        for target in TopicRegistry(store).inspection_targets(topic, keys):
            status = max(status, _list_topic_objects(store, keys, target, out, err))
    return status


def _list_topic_objects(store: MetadataStore, keys: StorageKeys, topic: TopicName, out: TextIO, err: TextIO) -> int:
    from danube_core.records import CurPointer, ObjectDescriptor, SealedState

    cur_key, state_key = keys.cur_key(topic), keys.state_key(topic)
    status = EXIT_OK
    for key, raw in store.get_prefix(keys.objects_prefix(topic)):
        if key == cur_key:
            continue
        try:
            descriptor = ObjectDescriptor.from_json(raw, key)
        except MetadataError as exc:
            err.write(f"{exc}\n")
            status = EXIT_CORRUPT
            continue
        _emit(out, "descriptor", key, descriptor.to_value())
    for kind, key, record in (("cur", cur_key, CurPointer), ("state", state_key, SealedState)):
        value = store.get(key)
        try:
            _emit(out, kind, key, None if value is None else record.from_json(value, key).to_value())
        except MetadataError as exc:
            err.write(f"{exc}\n")
            status = EXIT_CORRUPT
    return status


def _emit(out: TextIO, kind: str, key: str, value: Any) -> None:
    out.write(json.dumps({"kind": kind, "key": key, kind: value}, ensure_ascii=False) + "\n")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m broker.tools", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    dump_cmd = commands.add_parser("dump", help="print the messages of a WAL file or .dnb1 object")
    dump_cmd.add_argument("target", help="local path or fsspec URL (s3://bucket/key, file://...)")
    dump_cmd.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE")
    dump_cmd.add_argument("--chunk-bytes", type=int, default=DEFAULT_CHUNK_BYTES,
                          help="read size (default %(default)s)")
    objects_cmd = commands.add_parser("objects", help="list a topic's descriptors, cur and sealed state")
    add_etcd_flags(objects_cmd, required=True)
    objects_cmd.add_argument("--topic", required=True, metavar="/NS/TOPIC")
    objects_cmd.add_argument("--root-prefix", default=DEFAULT_ROOT_PREFIX)
    return parser


def main(argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the CLI; returns the exit code instead of exiting."""
    out, err = out or sys.stdout, err or sys.stderr
    logging.basicConfig(level=logging.WARNING, stream=err)
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed the usage error
        return int(exc.code or 0)
    try:
        if args.command == "dump":
            if args.chunk_bytes <= 0:
                raise ValueError(f"--chunk-bytes {args.chunk_bytes}: expected a positive integer")
            options = parse_storage_options(args.storage_option)
            return dump(args.target, options, args.chunk_bytes, out, err)
        return list_objects(etcd_settings_from_args(args), TopicName.parse(args.topic), args.root_prefix, out, err)
    except ValueError as exc:  # includes InvalidTopicNameError and ConfigError
        err.write(f"{exc}\n")
        return EXIT_USAGE
    except DanubeError as exc:
        err.write(f"{exc}\n")
        return EXIT_UNREADABLE


if __name__ == "__main__":
    sys.exit(main())
