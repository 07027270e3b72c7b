"""The gRPC status a Flight SQL client receives for a speed layer error, with its message and
no Python traceback.

pyarrow's Flight server gives a handler's exception the gRPC code of its Arrow status
(`pa.ArrowInvalid` INVALID_ARGUMENT, `pa.ArrowKeyError` NOT_FOUND, `pa.ArrowNotImplementedError`
UNIMPLEMENTED) and appends, as the status's "Detail", the exception formatted with
`traceback.format_exception`: file paths and source lines of the gateway reached every client.
Its `FlightError` classes carry no traceback but have none of those codes. The classes here are
those Arrow errors whose formatting fails on purpose when pyarrow formats them (`__notes__`
raises when `traceback` is called from native code, with no Python caller: pyarrow building the
status), so pyarrow falls back to naming the exception's type: the client reads "<message>.
Detail: Python exception: InvalidArgument" (checked with the ADBC driver in
tests/speedlayer/test_flight_sql.py). Formatted from Python (a log, a test report), they format
as any exception.

RESOURCE_EXHAUSTED (a result over its row or byte limit) cannot be sent: Arrow's Flight
transport sends OutOfMemory as UNKNOWN, which a client cannot tell from a failure of the
server. It goes as INVALID_ARGUMENT with the limit in its message: the same query fails again
until it asks for less.
"""

from __future__ import annotations

import sys
import traceback
from types import FrameType

import pyarrow as pa

from speedlayer.errors import SpeedLayerError
from speedlayer.protocol.query import to_flight


class _SentWithoutTraceback(Exception):
    @property
    def __notes__(self) -> list[str]:
        caller: FrameType | None = sys._getframe(1)
        while caller is not None and caller.f_code.co_filename == traceback.__file__:
            caller = caller.f_back
        if caller is None:  # pyarrow's Flight server building the status: name the type, not the frames
            raise LookupError("a status for a Flight client: its type names it, not a traceback")
        raise AttributeError("__notes__")  # none: as for any exception without notes

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""  # KeyError's repr() quotes would reach the client


class InvalidArgument(_SentWithoutTraceback, pa.ArrowInvalid):
    """INVALID_ARGUMENT: the statement's or the request's own fault; the same request fails again."""


class NotFound(_SentWithoutTraceback, pa.ArrowKeyError):
    """NOT_FOUND: a handle or dataset that does not exist (any more)."""


class Unimplemented(_SentWithoutTraceback, pa.ArrowNotImplementedError):
    """UNIMPLEMENTED: a command or action the speed layer does not serve (writes, transactions)."""


_BY_STATUS: dict[str, type[Exception]] = {
    "INVALID_ARGUMENT": InvalidArgument,
    "RESOURCE_EXHAUSTED": InvalidArgument,
    "NOT_FOUND": NotFound,
    "UNIMPLEMENTED": Unimplemented,
}


def flight_sql_error(error: SpeedLayerError) -> Exception:
    """The exception that gives a Flight SQL client the standard status for `error`: the classes
    above, else Flight's own (UNAUTHENTICATED, PERMISSION_DENIED, UNAVAILABLE, DEADLINE_EXCEEDED,
    CANCELLED), whose detail is the status name and the error's JSON (`to_flight`)."""
    cls = _BY_STATUS.get(error.status_name)
    return cls(str(error)) if cls is not None else to_flight(error)
