"""The query protocol shared by the client, the Data Gateway and the workers (Arrow Flight).

A query is one Flight `DoGet`. The ticket is compact JSON (`QueryRequest`): the dataset, the
SQL, optionally the epoch (default: the newest READY one), result limits and a deadline. The
tenant travels in call headers, not in the ticket, so that authentication stays out of the
request body:

    x-speedlayer-tenant: acme            (required)
    authorization: Bearer <token>        (required when the gateway has a token for the tenant)
    x-speedlayer-client: <client id>     (optional; the gateway prefers the same replica per id)

A statement's `$1`, `$2`, ... are bound to the values in `parameters` (one row of Arrow IPC,
`query_parameters`), never written into its text; a worker that predates them refuses the
statement for its unbound parameters.

The gateway gives each query it forwards a `query_id`; when its own caller cancels or passes its
deadline, it sends the worker `CANCEL_ACTION` with that id, and the worker interrupts the query.

A dataset served with its topic's tail (`speedlayer.tail_spec`) answers its epoch plus the
tail's rows above the epoch's offsets, and says so in the answer schema's metadata
(`speedlayer.epoch`, `speedlayer.tail`); `committed_only` asks for the epoch alone.

A statement may also read other datasets of the tenant (a join): `joined` names each with
the epoch it is pinned to, and the worker binds every one (the gateway's Flight SQL sends it
only to a worker holding all those epochs READY; a worker that predates it ignores it, and its
SQL guard then refuses the statement for reading a table that is not its dataset).

Errors cross Flight as `FlightError`s whose `extra_info` is JSON naming the speed layer error
class (`{"error": "ResultTooLargeError", "message": ...}`), so that the client raises the same
`SpeedLayerError` subclass with the server's message, not Flight's decorated text.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

from speedlayer import errors
from speedlayer.errors import InvalidRequestError, SpeedLayerError

TENANT_HEADER = "x-speedlayer-tenant"
# A worker's Flight action stopping the tenant's running queries whose ticket had the query id
# in the action's body (the gateway sends it when its own caller has gone).
CANCEL_ACTION = "speedlayer.cancel-query"
CLIENT_HEADER = "x-speedlayer-client"
AUTH_HEADER = "authorization"
HEADERS_MIDDLEWARE = "speedlayer-headers"


@dataclass(frozen=True)
class QueryRequest:
    """One query. 0 for a limit or the timeout means "the server's default"."""

    dataset: str
    sql: str
    epoch: str = ""
    max_rows: int = 0
    max_bytes: int = 0
    timeout_ms: int = 0
    joined: tuple[tuple[str, str], ...] = ()  # ((dataset, epoch), ...): other datasets the SQL reads
    parameters: str = ""  # the values of the SQL's $1, $2, ... (`query_parameters.pack_parameters`)
    query_id: str = ""  # set by the gateway: what CANCEL_ACTION names to stop the query
    # A dataset with a tail answers its epoch + the tail's rows above it; True: the epoch alone.
    committed_only: bool = False

    def to_ticket(self) -> bytes:
        body = {k: v for k, v in asdict(self).items() if v and k != "joined"}
        if self.joined:
            body["joined"] = dict(self.joined)
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_ticket(cls, raw: bytes) -> "QueryRequest":
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise InvalidRequestError(f"query ticket is not JSON: {raw[:60]!r}") from exc
        if not isinstance(value, dict):
            raise InvalidRequestError("query ticket: expected a JSON object")
        for name in ("dataset", "sql"):
            if not isinstance(value.get(name), str) or not value[name].strip():
                raise InvalidRequestError(f"query ticket: {name!r} is required (a non-empty string)")
        for name in ("max_rows", "max_bytes", "timeout_ms"):
            item = value.get(name, 0)
            if not isinstance(item, int) or isinstance(item, bool) or item < 0:
                raise InvalidRequestError(f"query ticket: {name}={item!r}: expected an integer >= 0")
        for name in ("epoch", "parameters", "query_id"):
            if not isinstance(value.get(name, ""), str):
                raise InvalidRequestError(f"query ticket: {name!r} must be a string")
        if not isinstance(value.get("committed_only", False), bool):
            raise InvalidRequestError("query ticket: 'committed_only' must be true or false")
        joined = value.pop("joined", {})
        if not isinstance(joined, dict) or not all(isinstance(k, str) and k and isinstance(v, str) and v
                                                   for k, v in joined.items()):
            raise InvalidRequestError("query ticket: 'joined' must map dataset -> epoch (non-empty strings)")
        names = cls.__dataclass_fields__.keys()
        return cls(**{k: v for k, v in value.items() if k in names}, joined=tuple(sorted(joined.items())))


@dataclass(frozen=True)
class QueryLimits:
    """A server's defaults and caps: a request may ask for less, never for more."""

    max_rows: int = 1_000_000
    max_bytes: int = 256 * 1024 * 1024
    timeout_ms: int = 30_000

    def effective(self, request: QueryRequest) -> "QueryLimits":
        def pick(asked: int, cap: int) -> int:
            return min(asked, cap) if asked else cap

        return QueryLimits(pick(request.max_rows, self.max_rows), pick(request.max_bytes, self.max_bytes),
                           pick(request.timeout_ms, self.timeout_ms))


# ---- errors across Flight --------------------------------------------------------------------

_FLIGHT_CLASS = {
    "UNAUTHENTICATED": flight.FlightUnauthenticatedError,
    "PERMISSION_DENIED": flight.FlightUnauthorizedError,
    "UNAVAILABLE": flight.FlightUnavailableError,
    "DEADLINE_EXCEEDED": flight.FlightTimedOutError,
    "CANCELLED": flight.FlightCancelledError,
}


def to_flight(error: SpeedLayerError) -> flight.FlightError:
    """The Flight exception to raise for `error` (its class name and message in extra_info)."""
    cls = _FLIGHT_CLASS.get(error.status_name, flight.FlightServerError)
    info = json.dumps({"error": type(error).__name__, "status": error.status_name, "message": str(error)})
    return cls(str(error), extra_info=info.encode())


def from_flight(exc: Exception) -> SpeedLayerError:
    """The speed layer error a Flight call failed with (transport failures: ReplicaUnavailable)."""
    info = error_info(exc)
    if info:
        cls = getattr(errors, str(info.get("error", "")), None)
        if isinstance(cls, type) and issubclass(cls, SpeedLayerError) and _built_from_message(cls):
            return cls(str(info.get("message", "")))
    text = str(exc).split(". Detail:", 1)[0]
    if isinstance(exc, flight.FlightUnavailableError):
        return errors.ReplicaUnavailableError(text)
    if isinstance(exc, flight.FlightTimedOutError):
        return errors.QueryTimeoutError(text)
    if isinstance(exc, flight.FlightCancelledError):
        return errors.QueryCancelledError(text)
    if isinstance(exc, flight.FlightUnauthorizedError):
        return errors.TenantIsolationError(text)
    if isinstance(exc, flight.FlightUnauthenticatedError):
        return errors.UnauthenticatedError(text)
    return SpeedLayerError(text)


def _built_from_message(cls: type[SpeedLayerError]) -> bool:
    """Whether `cls(message)` makes the error (not NotLeaderError, nor the client-side ones)."""
    return not any("__init__" in vars(k) for k in cls.__mro__ if issubclass(k, SpeedLayerError))


def error_info(exc: BaseException) -> dict[str, Any] | None:
    """The speed layer error a Flight exception carries (its `extra_info`), None for Flight's own."""
    raw = getattr(exc, "extra_info", None)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# ---- call headers and deadlines on the calling side (the client, the gateway to a worker) -----

# The call's gRPC deadline is the query's plus this, so the server's clearer timeout arrives first.
DEADLINE_SLACK_S = 2.0


def location(address: str) -> str:
    """A Flight location from `host:port` (or an explicit grpc:// URL)."""
    return address if "://" in address else f"grpc://{address}"


def call_options(tenant: str, *, token: str | None = None, client_id: str | None = None,
                 timeout_s: float | None = None) -> flight.FlightCallOptions:
    """The call headers of a query for `tenant` (and its token and client id), with a deadline."""
    headers = [(TENANT_HEADER.encode(), tenant.encode())]
    if token:
        headers.append((AUTH_HEADER.encode(), f"Bearer {token}".encode()))
    if client_id:
        headers.append((CLIENT_HEADER.encode(), client_id.encode()))
    return flight.FlightCallOptions(headers=headers, timeout=timeout_s)


# ---- call headers on the server side ---------------------------------------------------------


class _Headers(flight.ServerMiddleware):
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers


class HeadersMiddlewareFactory(flight.ServerMiddlewareFactory):
    """Keeps each call's headers (lower-cased names, first value) for `call_headers`."""

    def start_call(self, info: flight.CallInfo, headers: dict[str, list]) -> _Headers:
        return _Headers({k.lower(): (v[0].decode() if isinstance(v[0], bytes) else v[0])
                         for k, v in headers.items() if v})


def call_headers(context: flight.ServerCallContext) -> dict[str, str]:
    middleware = context.get_middleware(HEADERS_MIDDLEWARE)
    return middleware.headers if middleware is not None else {}


def batch_bytes(batch: pa.RecordBatch) -> int:
    """Bytes a batch holds (its buffers), what `max_bytes` counts."""
    return batch.nbytes
