"""Cloud objects (spec §4) through fsspec: one URL + storage options give the filesystem.

Object keys are `storage/topics/{ns}/{topic}/objects/data-<start>-<secs>.dnb1` under the
store's root (spec §4.1: the etcd root prefix is NOT part of object keys). The same code serves
local directories (`/abs`, `./rel`, `file:///abs`), `s3://bucket[/prefix]`, `memory://name` and
any other fsspec protocol that is installed (`gcs://`, `az://`; Danube's `azblob://` is read as
`az://`). Every backend error is translated in one table (`translate_error`) into
`ObjectMissingError` / `ObjectStoreError` with the URL named and the cause chained; reads retry
retriable errors through `danube_core.retry`. An `ObjectStore` pickles as its URL and options
and rebuilds its filesystem lazily, so Spark executors can reopen object URLs themselves.
"""

from __future__ import annotations

import errno
import inspect
import io
import logging
import os
import re
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem
from fsspec.spec import AbstractBufferedFile

from danube_core.object_id_ranges import OBJECT_NAME_PREFIX, start_offset_prefixes
from danube_core.errors import ConfigError, DanubeError, ObjectMissingError, ObjectStoreError
from danube_core.retry import call_with_retry
from danube_core.topics import TopicName

logger = logging.getLogger(__name__)

T = TypeVar("T")

OBJECTS_PATH_TEMPLATE = "storage/topics/{ns}/{topic}/objects"
OBJECT_ID_PATTERN = re.compile(r"^data-(0|[1-9][0-9]*)-(0|[1-9][0-9]*)\.dnb1$")
WRITE_BLOCK_SIZE = 8 * 1024 * 1024  # multipart part size, as the broker's uploader uses (§4.4)
READ_BLOCK_SIZE = 4 * 1024 * 1024  # streaming read-ahead, as the broker's cloud reader uses (§4.6)
_U64_MAX = (1 << 64) - 1
_SCHEME_ALIASES = {"azblob": "az"}


def object_id_for(start_offset: int, unix_secs: int) -> str:
    """`data-<start_offset>-<unix_secs>.dnb1`, both decimal and unpadded (spec §4.2)."""
    for name, value in (("start_offset", start_offset), ("unix_secs", unix_secs)):
        if type(value) is not int or not 0 <= value <= _U64_MAX:
            raise ValueError(f"object id {name}={value!r}: expected an integer in 0..2^64-1")
    return f"data-{start_offset}-{unix_secs}.dnb1"


def parse_object_id(object_id: str) -> tuple[int, int]:
    """`(start_offset, unix_secs)` from an object id; ValueError naming it if malformed."""
    match = OBJECT_ID_PATTERN.match(object_id)
    if match is None:
        raise ValueError(f"object id {object_id!r}: expected data-<start offset>-<unix seconds>.dnb1")
    return int(match.group(1)), int(match.group(2))


def objects_dir(topic: TopicName) -> str:
    """`storage/topics/{ns}/{topic}/objects`, relative to the store's root."""
    return OBJECTS_PATH_TEMPLATE.format(ns=topic.namespace, topic=topic.topic)


def normalize_url(url: str) -> str:
    """A scheme-qualified root URL: bare paths become absolute `file://` URLs.

    Relative paths are resolved against the current directory here, once, so the URL means the
    same directory on an executor whose working directory differs.
    """
    if "://" not in url:
        return "file://" + os.path.abspath(url)
    scheme, rest = url.split("://", 1)
    return f"{_SCHEME_ALIASES.get(scheme, scheme)}://{rest}"


# --- error table ------------------------------------------------------------------------------

_CREDENTIAL_ERRORS = {  # by class name, so this module needs no botocore/azure/google import
    "NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
    "ClientAuthenticationError", "DefaultCredentialsError", "RefreshError",
}
_CONNECTION_ERRORS = {
    "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
    "ResponseStreamingError", "ClientConnectorError", "ServerDisconnectedError", "ClientPayloadError",
    "ClientOSError", "ServiceRequestError", "ServiceResponseError",
}
# s3fs maps 5xx, SlowDown and OperationAborted to OSError(EIO/EREMOTEIO/EBUSY); the others are
# the usual socket-level failures.
_RETRIABLE_ERRNOS = {
    errno.EIO, errno.EBUSY, getattr(errno, "EREMOTEIO", errno.EIO), errno.EAGAIN, errno.ETIMEDOUT,
    errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.EPIPE, errno.ENETUNREACH,
    errno.EHOSTUNREACH,
}


def translate_error(exc: BaseException, url: str, op: str) -> DanubeError:
    """The one mapping from backend errors to ours (raise the result `from exc`).

    missing object -> ObjectMissingError; permissions/credentials -> ObjectStoreError with
    retriable False; connection problems, timeouts, throttling, 5xx -> retriable
    ObjectStoreError; anything else -> non-retriable ObjectStoreError.
    """
    if isinstance(exc, DanubeError):
        return exc
    names = {cls.__name__ for cls in type(exc).__mro__}
    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, FileNotFoundError):
        return ObjectMissingError(f"object {url} does not exist ({op}): {detail}")
    if isinstance(exc, PermissionError) or names & _CREDENTIAL_ERRORS:
        return _permanent(f"{op} of {url} was refused (permissions or credentials): {detail}")
    if (
        isinstance(exc, (ConnectionError, TimeoutError))
        or names & _CONNECTION_ERRORS
        or (isinstance(exc, OSError) and exc.errno in _RETRIABLE_ERRNOS)
    ):
        return ObjectStoreError(f"{op} of {url} failed, worth retrying: {detail}")
    return _permanent(f"{op} of {url} failed: {detail}")


def _permanent(message: str) -> ObjectStoreError:
    """An ObjectStoreError that retrying will not fix (the class default is retriable)."""
    error = ObjectStoreError(message)
    error.retriable = False
    return error


def _guard(op: str, url: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except Exception as exc:  # the I/O boundary: every backend error is translated here
        raise translate_error(exc, url, op) from exc


# --- reading and writing ----------------------------------------------------------------------


class ObjectWriter:
    """Bytes written so far to one object. After the `with` block: `size` and `etag` are final.

    `etag` is the backend's ETag (S3 gives one, with its quotes), else None.
    """

    def __init__(self, url: str, handle: Any) -> None:
        self.url = url
        self.size = 0
        self.etag: str | None = None
        self._handle = handle

    def write(self, data: bytes | bytearray | memoryview) -> int:
        written = _guard("write", self.url, lambda: self._handle.write(data))
        self.size += len(data)
        return written if written is not None else len(data)


class ObjectReader:
    """Sequential reads over one object from a start byte, holding at most one block in memory.

    Each block is one ranged read (retried on its own), so a long scan survives a dropped
    connection and no backend file handle stays open between calls.
    """

    def __init__(
        self, store: "ObjectStore", path_or_url: str, start: int, size: int, block_size: int
    ) -> None:
        self.url = path_or_url
        self.size = size
        self._store = store
        self._position = min(start, size)
        self._block_size = block_size
        self._buffer = b""

    def tell(self) -> int:
        return self._position - len(self._buffer)

    def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes (all the rest if negative); b"" at the end of the object."""
        while (size < 0 or len(self._buffer) < size) and self._position < self.size:
            want = self._block_size if size < 0 else max(self._block_size, size - len(self._buffer))
            end = min(self.size, self._position + want)
            block = self._store.read_range(self.url, self._position, end)
            if len(block) != end - self._position:
                raise _permanent(
                    f"object {self.url} shrank while being read: expected bytes "
                    f"[{self._position}, {end}) of {self.size}, got {len(block)}"
                )
            self._position = end
            self._buffer += block
        taken = len(self._buffer) if size < 0 else min(size, len(self._buffer))
        out, self._buffer = self._buffer[:taken], self._buffer[taken:]
        return out

    def close(self) -> None:
        self._buffer = b""
        self._position = self.size

    def __enter__(self) -> "ObjectReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _FsState:
    fs: Any
    root: str


class ObjectStore:
    """Objects under one root URL, e.g. `s3://bucket/prefix` or `/var/danube/cloud-storage`.

    `storage_options` go to fsspec unchanged (for s3fs: key, secret, client_kwargs with
    endpoint_url/region_name, ...). Paths returned by `object_path` are within the filesystem;
    `object_url` gives a full URL that `ObjectStore.from_url(url, options)` reopens anywhere.
    """

    def __init__(self, url: str, storage_options: dict | None = None) -> None:
        self.url = normalize_url(url)
        self.storage_options = dict(storage_options or {})
        self._state: _FsState | None = None
        self._open_fs()  # fail fast on an unknown scheme or a missing fsspec backend

    @classmethod
    def from_url(cls, url: str, storage_options: dict | None = None) -> "ObjectStore":
        """The store executors use: built from what a partition carries (URL + options)."""
        return cls(url, storage_options)

    def __getstate__(self) -> dict:
        return {"url": self.url, "storage_options": self.storage_options}

    def __setstate__(self, state: dict) -> None:
        self.url = state["url"]
        self.storage_options = state["storage_options"]
        self._state = None  # the filesystem is rebuilt on first use in the new process

    def __repr__(self) -> str:
        return f"ObjectStore({self.url!r})"

    def _open_fs(self) -> _FsState:
        if self._state is None:
            try:
                fs, root = url_to_fs(self.url, **self.storage_options)
            except (ValueError, ImportError, TypeError) as exc:
                raise ConfigError(
                    f"object store URL {self.url!r}: {exc} (expected /abs/dir, ./rel/dir, "
                    "file:///abs/dir, s3://bucket[/prefix], memory://name or another installed "
                    "fsspec protocol)"
                ) from exc
            self._state = _FsState(fs, root.rstrip("/"))
        return self._state

    @property
    def fs(self) -> Any:
        return self._open_fs().fs

    def object_path(self, topic: TopicName, object_id: str) -> str:
        parse_object_id(object_id)
        return self._join(objects_dir(topic), object_id)

    def object_url(self, topic: TopicName, object_id: str) -> str:
        return self.fs.unstrip_protocol(self.object_path(topic, object_id))

    def _join(self, *parts: str) -> str:
        root = self._open_fs().root
        return "/".join([root, *parts]) if root else "/".join(parts)

    def _resolve(self, path_or_url: str) -> tuple[str, str]:
        """`(path within the fs, URL for messages)`; a URL must use this store's protocol."""
        fs = self.fs
        if "://" in path_or_url:
            protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
            scheme = normalize_url(path_or_url).split("://", 1)[0]
            if scheme not in protocols:
                raise ValueError(
                    f"object URL {path_or_url!r} is not on this store "
                    f"({self.url}, protocols {protocols})"
                )
            return fs._strip_protocol(path_or_url), path_or_url
        return path_or_url, fs.unstrip_protocol(path_or_url)

    def _read(self, op: str, path_or_url: str, fn: Callable[[Any, str], T]) -> T:
        path, url = self._resolve(path_or_url)
        return call_with_retry(lambda: _guard(op, url, lambda: fn(self.fs, path)), what=f"{op} of {url}")

    def read_range(self, path_or_url: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of an object (fewer if the object ends before `end`)."""
        if not 0 <= start <= end:
            raise ValueError(
                f"read_range of {path_or_url}: expected 0 <= start <= end, got start={start} end={end}"
            )
        if start == end:
            return b""
        def ranged(fs: Any, path: str) -> bytes:
            return fs.cat_file(path, start=start, end=end)

        return self._read("read_range", path_or_url, ranged)

    def open_reader(
        self, path_or_url: str, start: int = 0, block_size: int = READ_BLOCK_SIZE
    ) -> ObjectReader:
        """Stream an object from byte `start`, fetching `block_size` bytes (4 MiB) at a time.

        The size is read once here, so a missing object fails now with ObjectMissingError and
        reads never ask past the end (S3 refuses such ranges).
        """
        if start < 0 or block_size < 1:
            raise ValueError(f"open_reader of {path_or_url}: expected start >= 0 and block_size >= 1")
        return ObjectReader(self, path_or_url, start, self.size(path_or_url), block_size)

    def size(self, path_or_url: str) -> int:
        def size_of(fs: Any, path: str) -> int:
            fs.invalidate_cache(path)  # listings are cached; another process may have written
            return fs.size(path)

        return self._read("size", path_or_url, size_of)

    def exists(self, path_or_url: str) -> bool:
        def check(fs: Any, path: str) -> bool:
            fs.invalidate_cache(path)
            return fs.exists(path)

        return self._read("exists", path_or_url, check)

    def delete(self, path_or_url: str) -> None:
        """Remove an object; an object that is already gone is not an error (retention may race)."""
        def remove(fs: Any, path: str) -> None:
            try:
                fs.rm_file(path)
            except FileNotFoundError:
                logger.debug("delete of %s: already gone", path)

        self._read("delete", path_or_url, remove)

    def list_objects(self, topic: TopicName, first_start: int = 0, last_start: int | None = None) -> list[str]:
        """Object ids under the topic's objects dir starting in `[first_start, last_start]` (no
        upper bound if None), by start offset; other names are ignored.

        A bounded range on a store that lists by name prefix (S3, GCS: its `find` takes
        `prefix`) lists only the prefixes of `object_id_ranges`, so its cost follows the range,
        not the topic's history; other stores list the directory and filter it."""
        prefixes = None if last_start is None else start_offset_prefixes(first_start, last_start)

        def in_range(name: str) -> bool:
            if not OBJECT_ID_PATTERN.match(name):
                return False
            start = parse_object_id(name)[0]
            return start >= first_start and (last_start is None or start <= last_start)

        def ids(fs: Any, path: str) -> list[str]:
            fs.invalidate_cache(path)
            try:
                if prefixes is not None and "prefix" in inspect.signature(fs.find).parameters:
                    entries = [e for p in prefixes
                               for e in fs.find(path, maxdepth=1, prefix=OBJECT_NAME_PREFIX + p)]
                else:
                    entries = fs.ls(path, detail=False)
            except FileNotFoundError:
                return []
            names = {entry.rstrip("/").rsplit("/", 1)[-1] for entry in entries}
            return sorted(filter(in_range, names), key=parse_object_id)

        return self._read("list", self._join(objects_dir(topic)), ids)

    @contextmanager
    def open_writer(self, topic: TopicName, object_id: str) -> Iterator[ObjectWriter]:
        """Write one object; it appears under its final name only if the block succeeds.

        Local files go to a hidden temp name in the same directory and are renamed into place
        (atomic), so a crash never leaves a partial object under the real name. Memory objects
        are stored in one step at the end. Other backends write with autocommit off: S3 runs a
        multipart upload completed only on success and aborted otherwise. Exceptions raised
        in the block propagate unchanged.
        """
        path = self.object_path(topic, object_id)
        url = self.fs.unstrip_protocol(path)
        if isinstance(self.fs, LocalFileSystem):
            staging = self._local_writer
        elif isinstance(self.fs, MemoryFileSystem):
            staging = self._memory_writer
        else:
            staging = self._staged_writer
        with staging(path, url) as writer:
            yield writer
        logger.debug("wrote %s (%d bytes, etag %s)", url, writer.size, writer.etag)

    @contextmanager
    def _local_writer(self, path: str, url: str) -> Iterator[ObjectWriter]:
        directory, name = path.rsplit("/", 1)
        temp = f"{directory}/.{name}.{uuid.uuid4().hex}.tmp"
        _guard("create directory", url, lambda: self.fs.makedirs(directory, exist_ok=True))
        handle = _guard("open", url, lambda: open(temp, "wb"))
        writer = ObjectWriter(url, handle)
        try:
            yield writer
            _guard("close", url, handle.close)
            _guard("rename", url, lambda: os.replace(temp, path))
        finally:
            handle.close()
            if os.path.exists(temp):
                os.remove(temp)

    @contextmanager
    def _memory_writer(self, path: str, url: str) -> Iterator[ObjectWriter]:
        # fsspec's memory files are visible from the moment they are opened, so the bytes are
        # collected first and stored in one step.
        buffer = io.BytesIO()
        writer = ObjectWriter(url, buffer)
        yield writer
        _guard("write", url, lambda: self.fs.pipe_file(path, buffer.getvalue()))

    @contextmanager
    def _staged_writer(self, path: str, url: str) -> Iterator[ObjectWriter]:
        fs = self.fs
        handle = _guard(
            "open", url, lambda: fs.open(path, "wb", block_size=WRITE_BLOCK_SIZE, autocommit=False)
        )
        writer = ObjectWriter(url, handle)
        try:
            yield writer
            _guard("close", url, handle.close)
            _guard("commit", url, handle.commit)
        except BaseException:
            _discard(handle, url)
            raise
        writer.etag = self._etag(path, url)

    def _etag(self, path: str, url: str) -> str | None:
        try:
            self.fs.invalidate_cache(path)
            info = self.fs.info(path)
        except Exception as exc:  # the object is written; a failed lookup only loses the etag
            logger.warning("object %s written but its etag could not be read: %s", url, exc)
            return None
        etag = info.get("ETag", info.get("etag"))
        return str(etag) if etag is not None else None


def _discard(handle: Any, url: str) -> None:
    """Drop an unfinished upload (S3: abort the multipart) and make sure close() cannot commit it."""
    try:
        handle.discard()
    except Exception as exc:  # best effort: an unfinished multipart is invisible and expires
        logger.warning("discarding the unfinished upload of %s failed: %s", url, exc)
    if isinstance(handle, AbstractBufferedFile):
        handle.closed = True
