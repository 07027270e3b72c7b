"""`MetadataStore` over a real etcd v3 cluster, with every etcd/gRPC error translated here.

An unreachable etcd becomes `MetadataUnavailableError` (retriable; names the endpoints, the
operation and the key), anything else `MetadataError` naming the key. Reads are retried
through `danube_core.retry`; idempotent requests fail over to the next endpoint.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Sequence, TypeVar

import grpc

# Client choice: python-etcd3 0.12 (the original) fails to import with protobuf >= 4, which
# grpcio and pyspark[connect] require. etcd-sdk-python (module `pyetcd`) is its maintained fork
# with the same API, so this is the client used.
import pyetcd
from pyetcd import etcdrpc
from pyetcd.utils import prefix_range_end

from danube_core.errors import (
    ConfigError, DanubeError, MetadataCompactedError, MetadataError, MetadataUnavailableError,
)
from danube_core.etcd_errors import (
    CLIENT_ERRORS, compacted_revision, describe, grpc_code, is_unavailable, key_target,
)
from danube_core.etcd_watch import EtcdWatch
from danube_core.metadata import (
    EventDispatcher, KeyValues, Lease, LostCallback, MetadataStore, RangeRead, WatchCallback,
    WatchHandle, check_limit, check_prefix, check_ttl, check_value,
)
from danube_core.retry import RetryPolicy, call_with_retry

logger = logging.getLogger(__name__)

T = TypeVar("T")

# --- etcd -------------------------------------------------------------------------------------

# gRPC channel options. Reconnect backoff is capped at 1 s (gRPC's default grows to 120 s, so a
# restarted etcd would stay "unavailable" long after it is back) and each channel keeps its own
# subchannels (the shared pool would hand a new client a peer's backoff state). Keepalive pings
# while streams are open detect a dead peer under a watch instead of waiting forever.
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
]
_ENDPOINT_FORMS = "host:port, http://host:port or https://host:port (comma-separated for several)"


def _lease_id(lease: Lease | None) -> int | None:
    return lease.id if lease is not None else None


def _parse_endpoints(endpoints: str | list[str]) -> list[tuple[str, int, bool]]:
    """`(host, port, https)` per endpoint; ConfigError naming a malformed one."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    parsed = []
    for raw in (item.strip() for item in items):
        scheme, sep, rest = raw.partition("://")
        if not sep:
            scheme, rest = "http", raw
        host, _, port = rest.rstrip("/").rpartition(":")
        valid_port = port.isdigit() and 0 < int(port) < 65536
        if scheme not in ("http", "https") or not host or not valid_port:
            raise ConfigError(f"etcd endpoint {raw!r} in {endpoints!r}: expected {_ENDPOINT_FORMS}")
        parsed.append((host, int(port), scheme == "https"))
    if not parsed:
        raise ConfigError(f"etcd endpoints {endpoints!r}: expected at least one of {_ENDPOINT_FORMS}")
    return parsed


def _read_file(path: str | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise ConfigError(f"etcd {what} file {path!r} cannot be read: {exc}") from exc


# etcd caps a response at 4 MiB by default (a topic's 100,000 descriptors are ~30 MB), so large
# ranges are read in pages; later pages are pinned to the first page's revision, so the whole
# read is one consistent snapshot. Pages ask for no sort order: etcd returns a range in key order
# anyway, and any explicit sort makes it read every remaining key of the range before applying
# the limit (each page of a 100,000-key range then cost ~7x more, the whole read O(n²)).
PAGE_KEYS = 1000


def _paged_range(client: Any, start: bytes, end: bytes, limit: int | None,
                 keys_only: bool, revision: int | None = None) -> RangeRead:
    found: KeyValues = []
    while limit is None or len(found) < limit:
        page = PAGE_KEYS if limit is None else min(PAGE_KEYS, limit - len(found))
        response = client.get_range_response(start, end, limit=page, revision=revision,
                                             keys_only=keys_only)
        revision = revision or response.header.revision
        found.extend((kv.key.decode(), b"" if keys_only else kv.value) for kv in response.kvs)
        if not response.more or not response.kvs:
            break
        start = response.kvs[-1].key + b"\0"
    assert revision is not None  # the loop ran at least once
    return RangeRead(found, revision)


class _EtcdLease(Lease):
    def __init__(self, store: "EtcdMetadataStore", lease_id: int, ttl_s: int) -> None:
        super().__init__(lease_id, ttl_s)
        self._store = store

    def refresh(self) -> None:
        target = f"lease {self.id:x}"
        replies = self._store._read("lease refresh", target, lambda c: list(c.refresh_lease(self.id)))
        if not replies or replies[0].TTL <= 0:  # etcd answers TTL 0 for an unknown/expired lease
            raise self._expired()

    def revoke(self) -> None:
        def revoke(client: Any) -> None:
            try:
                client.revoke_lease(self.id)
            except grpc.RpcError as exc:
                if grpc_code(exc) != grpc.StatusCode.NOT_FOUND:
                    raise

        self._store._call("lease revoke", f"lease {self.id:x}", revoke)


class EtcdMetadataStore(MetadataStore):
    """The metadata store on a real etcd v3 cluster.

    `endpoints`: "host:port", "http(s)://host:port", or several (comma-separated string or
    list). Requests go to one endpoint; when it is unreachable the store moves to the next
    (idempotent requests are re-sent there at once). `user`/`password` enable etcd auth
    (the token is renewed when etcd reports it expired); `ca_cert` (with optional
    `cert_key`+`cert_cert` for client auth) or an https endpoint enables TLS. `timeout_s`
    bounds every RPC. Construction checks that an endpoint answers and fails fast with
    MetadataUnavailableError naming all endpoints otherwise.
    """

    def __init__(
        self,
        endpoints: str | list[str],
        *,
        user: str | None = None,
        password: str | None = None,
        ca_cert: str | None = None,
        cert_key: str | None = None,
        cert_cert: str | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        if (user is None) != (password is None):
            raise ConfigError("etcd user and password must be given together (got only one)")
        if (cert_key is None) != (cert_cert is None):
            raise ConfigError("etcd cert_key and cert_cert must be given together (got only one)")
        if not timeout_s > 0:
            raise ConfigError(f"etcd timeout_s={timeout_s!r}: expected a number of seconds > 0")
        self._targets = _parse_endpoints(endpoints)
        self._labels = [f"{host}:{port}" for host, port, _ in self._targets]
        secure = ca_cert is not None or cert_cert is not None or any(t[2] for t in self._targets)
        self._credentials = (
            grpc.ssl_channel_credentials(
                _read_file(ca_cert, "CA certificate"), _read_file(cert_key, "client key"),
                _read_file(cert_cert, "client certificate"),
            )
            if secure else None
        )
        self._user, self._password, self._timeout_s = user, password, timeout_s
        self._read_retry = RetryPolicy(
            max_attempts=4, initial_backoff_s=0.1, max_backoff_s=1.0, deadline_s=2 * timeout_s
        )
        self._lock = threading.Lock()
        self._clients: list[Any | None] = [None] * len(self._targets)
        self._current = 0
        self._watches: set[EtcdWatch] = set()
        self._dispatcher = EventDispatcher("etcd-metadata-watch")
        self.closed = False
        self._connect()

    def __repr__(self) -> str:
        return f"EtcdMetadataStore({','.join(self._labels)})"

    def _new_client(self, index: int) -> Any:
        host, port, _ = self._targets[index]
        # time_retry=0: pyetcd would otherwise refuse a once-failed endpoint for 300 s; the
        # failover between endpoints is done by this class, one pyetcd client per endpoint.
        endpoint = pyetcd.Endpoint(host, port, secure=self._credentials is not None,
                                   creds=self._credentials, time_retry=0.0, opts=_CHANNEL_OPTIONS)
        client = pyetcd.MultiEndpointEtcd3Client(
            endpoints=[endpoint], timeout=self._timeout_s, user=self._user, password=self._password
        )
        # With auth, pyetcd sends the token twice on every call: as call metadata and through a
        # Python credentials plugin. The metadata is enough for etcd, and the plugin can freeze
        # the process: gRPC releases a plugin on one of its own threads, which takes the GIL,
        # while `close()` holds the GIL waiting for those threads (grpc/grpc#42247); seen as a
        # test worker hung in `Channel.close` with a gRPC thread waiting for the GIL.
        client.call_credentials = None
        return client

    def _client(self, index: int) -> Any:
        with self._lock:
            if self._clients[index] is None:
                self._clients[index] = self._new_client(index)
            return self._clients[index]

    def _drop_client(self, index: int) -> None:
        with self._lock:
            client, self._clients[index] = self._clients[index], None
        if client is not None:
            client.close()

    def _connect(self) -> None:
        """Find a live endpoint now, so a wrong or dead etcd fails at startup, within timeout_s each."""
        last: BaseException | None = None
        for index, label in enumerate(self._labels):
            try:
                client = self._client(index)
                client.maintenancestub.Status(
                    etcdrpc.StatusRequest(), self._timeout_s,
                    metadata=client.metadata,
                )
            except CLIENT_ERRORS as exc:
                self._drop_client(index)
                if not is_unavailable(exc):
                    raise MetadataError(
                        f"etcd at {label} rejected the connection check: {describe(exc)}"
                    ) from exc
                last = exc
                continue
            self._current = index
            return
        raise MetadataUnavailableError(
            f"etcd unreachable at {', '.join(self._labels)} during connect "
            f"(timeout {self._timeout_s}s per endpoint): {describe(last)}"
        ) from last

    def _call(self, op: str, target: str, fn: Callable[[Any], T], *, failover: bool = True) -> T:
        """Run `fn(client)` on the current endpoint, translating every client error.

        On unavailability the next endpoint becomes current; with `failover` (idempotent
        requests) `fn` is re-sent there, each endpoint tried once.
        """
        if self.closed:
            raise MetadataError(f"etcd {op} of {target}: the store is closed")
        tried: list[str] = []
        last: BaseException | None = None
        renewed_token = False
        while len(tried) < len(self._labels):
            index = self._current
            try:
                return fn(self._client(index))
            except CLIENT_ERRORS as exc:
                token_expired = grpc_code(exc) == grpc.StatusCode.UNAUTHENTICATED
                if self._user and token_expired and not renewed_token:
                    self._drop_client(index)  # auth token expired: a new client authenticates again
                    renewed_token = True
                    continue
                if not is_unavailable(exc):
                    raise MetadataError(
                        f"etcd {op} of {target} failed at {self._labels[index]}: {describe(exc)}"
                    ) from exc
                tried.append(self._labels[index])
                last = exc
                self._fail_over(index)
                if not failover:
                    break
        raise MetadataUnavailableError(
            f"etcd unreachable at {', '.join(tried)} during {op} of {target}: {describe(last)}"
        ) from last

    def _fail_over(self, index: int) -> None:
        with self._lock:
            if self._current == index and len(self._labels) > 1:
                self._current = (index + 1) % len(self._labels)
                logger.warning("etcd endpoint %s unavailable, switching to %s",
                               self._labels[index], self._labels[self._current])

    def _read(self, op: str, target: str, fn: Callable[[Any], T]) -> T:
        return call_with_retry(
            lambda: self._call(op, target, fn), what=f"etcd {op} of {target}", policy=self._read_retry
        )

    def get(self, key: str) -> bytes | None:
        return self._read("get", key_target(key), lambda c: c.get(key)[0])

    def put(self, key: str, value: bytes, lease: Lease | None = None) -> int:
        check_value(key, value)
        response = self._call("put", key_target(key), lambda c: c.put(key, value, lease=_lease_id(lease)))
        return response.header.revision

    def delete(self, key: str) -> bool:
        return self._call("delete", key_target(key), lambda c: c.delete(key))

    def delete_prefix(self, prefix: str) -> int:
        check_prefix(prefix)
        return self._call("delete_prefix", key_target(prefix), lambda c: c.delete_prefix(prefix).deleted)

    def get_prefix(self, prefix: str, keys_only: bool = False) -> KeyValues:
        check_prefix(prefix)

        start = prefix.encode()
        end = prefix_range_end(start)
        return self._read("get_prefix", key_target(prefix),
                          lambda client: _paged_range(client, start, end, None, keys_only)).kvs

    def get_range(self, start_key: str, end_key: str, limit: int | None = None) -> KeyValues:
        check_limit(limit)

        start, end = start_key.encode(), end_key.encode()
        return self._read("get_range", f"key range [{start_key!r}, {end_key!r})",
                          lambda client: _paged_range(client, start, end, limit, False)).kvs

    def range_at(self, start_key: str, end_key: str, revision: int | None = None) -> RangeRead:
        start, end = start_key.encode(), end_key.encode()
        target = f"key range [{start_key!r}, {end_key!r}) at revision {revision or 'now'}"
        try:
            return self._read("range_at", target,
                              lambda client: _paged_range(client, start, end, None, False, revision))
        except MetadataError as exc:
            compacted = compacted_revision(exc.__cause__) if exc.__cause__ is not None else None
            if compacted is None:
                raise
            raise MetadataCompactedError(f"etcd range_at of {target}: compacted", compacted) from exc

    def current_revision(self) -> int:
        header = self._read("revision", "the key space",
                            lambda c: c.get_response(b"\0", count_only=True).header)
        return header.revision

    def compact(self, revision: int) -> None:
        self._call("compact", f"revision {revision}", lambda c: c.compact(revision, physical=True))

    def put_if_absent(self, key: str, value: bytes, lease: Lease | None = None) -> bool:
        check_value(key, value)

        def txn(client: Any) -> bool:
            ops = client.transactions
            put = ops.put(key, value, lease=_lease_id(lease))
            created, _ = client.transaction(compare=[ops.create(key) == 0], success=[put], failure=[])
            return created

        # Not re-sent on failover: a lost reply would turn our own success into False.
        return self._call("put_if_absent", key_target(key), txn, failover=False)

    def compare_and_put_revision(self, key: str, expected: bytes | None, value: bytes) -> int | None:
        check_value(key, value)

        def txn(client: Any) -> int | None:
            ops = client.transactions
            condition = ops.create(key) == 0 if expected is None else ops.value(key) == expected
            put = ops.put(key, value)
            swapped, responses = client.transaction(compare=[condition], success=[put], failure=[])
            return responses[0].response_put.header.revision if swapped else None

        return self._call("compare_and_put", key_target(key), txn, failover=False)

    def compare_and_put_with(self, key: str, expected: bytes | None, value: bytes,
                             also: Sequence[tuple[str, bytes]]) -> bool:
        for checked, checked_value in ((key, value), *also):
            check_value(checked, checked_value)

        def txn(client: Any) -> bool:
            ops = client.transactions
            condition = ops.create(key) == 0 if expected is None else ops.value(key) == expected
            puts = [ops.put(written, written_value) for written, written_value in ((key, value), *also)]
            swapped, _ = client.transaction(compare=[condition], success=puts, failure=[])
            return swapped

        return self._call("compare_and_put", key_target(key), txn, failover=False)

    def guarded_put(self, key: str, expected: bytes | None, value: bytes, *, guard: tuple[str, bytes | None],
                    lease: Lease | None = None) -> int | None:
        check_value(key, value)
        guard_key, guard_value = guard

        def txn(client: Any) -> int | None:
            ops = client.transactions
            condition = ops.create(key) == 0 if expected is None else ops.value(key) == expected
            put = ops.put(key, value, lease=_lease_id(lease))
            held = ops.create(guard_key) == 0 if guard_value is None else ops.value(guard_key) == guard_value
            swapped, responses = client.transaction(compare=[condition, held], success=[put], failure=[])
            return responses[0].response_put.header.revision if swapped else None

        return self._call("guarded_put", key_target(key), txn, failover=False)

    def grant_lease(self, ttl_s: int) -> Lease:
        check_ttl(ttl_s)
        # Not re-sent on failover: after a lost reply that would grant a second lease.
        target = f"a {ttl_s}s lease"
        granted = self._call("grant_lease", target, lambda c: c.lease(ttl_s), failover=False)
        return _EtcdLease(self, granted.id, granted.ttl)  # etcd raises a TTL below its minimum

    def _lease_handle(self, lease_id: int, ttl_s: int) -> Lease:
        return _EtcdLease(self, lease_id, ttl_s)

    def refresh_leases(self, leases: list[Lease]) -> list[Lease]:
        """One LeaseKeepAlive stream carrying a request per lease (etcd answers each in order,
        TTL 0 for a lease it no longer knows)."""
        if not leases:
            return []
        requests = [etcdrpc.LeaseKeepAliveRequest(ID=lease.id) for lease in leases]

        def refresh(client: Any) -> list[Any]:
            return list(client.leasestub.LeaseKeepAlive(iter(requests), client.timeout,
                                                        metadata=client.metadata))

        replies = self._read("lease refresh", f"{len(leases)} leases", refresh)
        expired = {reply.ID for reply in replies if reply.TTL <= 0}
        return [lease for lease in leases if lease.id in expired]

    def watch_prefix(
        self, prefix: str, callback: WatchCallback, *, start_revision: int | None = None,
        on_lost: LostCallback | None = None,
    ) -> WatchHandle:
        check_prefix(prefix)
        handle = WatchHandle(prefix, callback, lambda: watch.cancel())
        watch = EtcdWatch(self, handle, on_lost)
        with self._lock:
            self._watches.add(watch)
        try:
            watch.start(start_revision)
        except DanubeError:
            handle.cancel()
            raise
        return handle

    def _forget_watch(self, watch: EtcdWatch) -> None:
        with self._lock:
            self._watches.discard(watch)

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            watches = list(self._watches)
        for watch in watches:
            watch.handle.cancel()
        for index in range(len(self._clients)):
            self._drop_client(index)
        self._dispatcher.close()
