"""`QueryClient` and `query()`: SQL on a speed layer dataset through the Data Gateway.

    from speedlayer.clients import query
    table = query("127.0.0.1:7800", "acme", "orders", "SELECT day, sum(amount) FROM orders GROUP BY day")
    frame = table.to_pandas()

The SQL names the dataset as a table (`FROM orders`). The answer comes from the newest READY
epoch (or `epoch=`), whole: never half of one. Failures raise the speed layer's errors
(`speedlayer.errors`): `InvalidQueryError` (bad SQL, naming the dataset), `NotFoundError`,
`UnknownTenantError` (a tenant the speed layer has nothing of), `TenantIsolationError`
(another tenant's dataset), `UnauthenticatedError`, `ResultTooLargeError`, `QueryTimeoutError`,
`ReplicaUnavailableError` (retriable: the gateway has no reachable READY replica), and
`GatewayUnreachableError` (retriable: no connection to the gateway itself within
`connect_timeout_ms`; a closed port fails at once), `WrongServerError` (the address answered,
but it is not a gateway's).

A TLS gateway is `grpc+tls://host:port`; a gateway certificate signed by a private CA needs
that CA: `ca_cert=` (a PEM file) or `tls_root_certs=` (PEM text), which also imply TLS for a
bare `host:port`.
"""

from __future__ import annotations

import uuid

import pyarrow as pa
import pyarrow.flight as flight

from speedlayer.errors import GATEWAY_CHECK, GatewayUnreachableError, SpeedLayerError, WrongServerError
from speedlayer.protocol.query import (
    DEADLINE_SLACK_S, QueryRequest, call_options, error_info, from_flight, location,
)

DEFAULT_CONNECT_TIMEOUT_MS = 2_000


def connect(address: str, connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS,
            tls_root_certs: bytes | None = None) -> flight.FlightClient:
    """A Flight client whose connection attempts last at most `connect_timeout_ms` (gRPC's own
    minimum is 20 s, which a host that accepts nothing would make every call wait); with
    `tls_root_certs` (PEM), over TLS trusting those CAs."""
    options = [("grpc.min_reconnect_backoff_ms", connect_timeout_ms),
               ("grpc.initial_reconnect_backoff_ms", connect_timeout_ms)]
    if tls_root_certs is None:
        return flight.connect(location(address), generic_options=options)
    url = address if "://" in address else f"grpc+tls://{address}"
    if not url.startswith("grpc+tls://"):
        raise ValueError(f"gateway {address!r}: a CA certificate is for a TLS gateway (grpc+tls://host:port)")
    return flight.connect(url, tls_root_certs=tls_root_certs, generic_options=options)


def root_certs(ca_cert: str | None, tls_root_certs: bytes | str | None) -> bytes | None:
    """The PEM of the CAs a client trusts: `tls_root_certs` as given, or read from `ca_cert`."""
    if ca_cert and tls_root_certs:
        raise ValueError("ca_cert and tls_root_certs: give one of them")
    if tls_root_certs:
        return tls_root_certs.encode() if isinstance(tls_root_certs, str) else bytes(tls_root_certs)
    if not ca_cert:
        return None
    try:
        with open(ca_cert, "rb") as pem:
            return pem.read()
    except OSError as exc:
        raise ValueError(f"ca_cert {ca_cert!r}: cannot read it ({exc.strerror or exc})") from exc


def read_query(client: flight.FlightClient, request: QueryRequest, options: flight.FlightCallOptions) -> pa.Table:
    """Run one DoGet and read its whole result; Flight failures become speed layer errors."""
    try:
        return client.do_get(flight.Ticket(request.to_ticket()), options=options).read_all()
    except (flight.FlightError, pa.ArrowException) as exc:
        raise from_flight(exc) from exc


def unreached(exc: BaseException) -> bool:
    """A Flight call that failed before any server answered it: UNAVAILABLE without the speed
    layer's error info (every error a gateway sends carries it)."""
    return isinstance(exc, flight.FlightUnavailableError) and error_info(exc) is None


class QueryClient:
    """One connection to a gateway for `tenant`; `client_id` (default: random per client)
    keeps this client on the same replica of each dataset, for warm caches; `ca_cert` (a PEM
    file) or `tls_root_certs` (PEM text) is the CA of a TLS gateway's certificate."""

    def __init__(self, gateway: str, tenant: str, *, token: str | None = None, client_id: str | None = None,
                 timeout_ms: int = 30_000, connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS,
                 ca_cert: str | None = None, tls_root_certs: bytes | str | None = None) -> None:
        if not tenant:
            raise ValueError("tenant: required")
        for name, value in (("timeout_ms", timeout_ms), ("connect_timeout_ms", connect_timeout_ms)):
            if value < 1:
                raise ValueError(f"{name}={value}: expected >= 1")
        self.gateway, self.tenant, self.token = gateway, tenant, token
        self.client_id = client_id or uuid.uuid4().hex
        self.timeout_ms, self.connect_timeout_ms = timeout_ms, connect_timeout_ms
        self._client = connect(gateway, connect_timeout_ms, root_certs(ca_cert, tls_root_certs))

    def query(self, dataset: str, sql: str, *, epoch: str = "", max_rows: int = 0, max_bytes: int = 0,
              timeout_ms: int | None = None, committed_only: bool = False) -> pa.Table:
        """`sql` on `dataset`. A dataset served with its topic's tail answers its epoch plus the
        tail's newer rows (the answer's schema metadata `speedlayer.epoch` and `speedlayer.tail`
        say which); `committed_only=True` asks for the epoch alone."""
        timeout_ms = timeout_ms or self.timeout_ms
        request = QueryRequest(dataset=dataset, sql=sql, epoch=epoch, max_rows=max_rows, max_bytes=max_bytes,
                               timeout_ms=timeout_ms, committed_only=committed_only)
        options = call_options(self.tenant, token=self.token, client_id=self.client_id,
                               timeout_s=timeout_ms / 1000 + DEADLINE_SLACK_S)
        try:
            return self._client.do_get(flight.Ticket(request.to_ticket()), options=options).read_all()
        except (flight.FlightError, pa.ArrowException) as exc:
            if unreached(exc):
                raise GatewayUnreachableError(self.gateway, str(exc), self.connect_timeout_ms) from exc
            if isinstance(exc, NotImplementedError) and error_info(exc) is None:
                said = str(exc).split(". Detail:", 1)[0].split(". gRPC client debug context:", 1)[0]
                raise WrongServerError(self.gateway, "gateway", said, GATEWAY_CHECK) from exc
            raise from_flight(exc) from exc

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "QueryClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def query(gateway: str, tenant: str, dataset: str, sql: str, **kwargs) -> pa.Table:
    """One query on a fresh connection; keyword arguments as `QueryClient` and `QueryClient.query`."""
    client_kwargs = {k: kwargs.pop(k) for k in ("token", "client_id", "connect_timeout_ms", "ca_cert", "tls_root_certs")
                     if k in kwargs}
    with QueryClient(gateway, tenant, **client_kwargs) as client:
        return client.query(dataset, sql, **kwargs)


__all__ = ["QueryClient", "query", "SpeedLayerError"]
