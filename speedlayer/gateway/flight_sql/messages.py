"""Flight SQL commands on the wire: a `google.protobuf.Any` in a descriptor's command, a
ticket or an action's body, named by its type URL.

A command is recognised by its type URL alone: those the gateway serves are unpacked into the
generated messages (`speedlayer.api.flight_sql_pb2`); those it refuses (updates, ingestion,
transactions, Substrait plans, XDBC type info) are named so the refusal says what was asked.
Anything that is not a packed Any of Flight SQL's package is a malformed command.
"""

from __future__ import annotations

from google.protobuf import any_pb2
from google.protobuf.message import DecodeError, Message

from speedlayer.api import flight_sql_pb2 as sql_pb2
from speedlayer.errors import InvalidRequestError
from speedlayer.errors import ReadOnlyError as ReadOnlyError  # re-exported: raised for Flight SQL's writes
from speedlayer.errors import UnsupportedCommandError as UnsupportedCommandError

TYPE_PREFIX = "type.googleapis.com/arrow.flight.protocol.sql."

SERVED: dict[str, type[Message]] = {cls.DESCRIPTOR.name: cls for cls in (
    sql_pb2.CommandGetSqlInfo, sql_pb2.CommandGetCatalogs, sql_pb2.CommandGetDbSchemas, sql_pb2.CommandGetTables,
    sql_pb2.CommandGetTableTypes, sql_pb2.CommandGetPrimaryKeys, sql_pb2.CommandGetExportedKeys,
    sql_pb2.CommandGetImportedKeys, sql_pb2.CommandGetCrossReference, sql_pb2.CommandStatementQuery, sql_pb2.TicketStatementQuery,
    sql_pb2.CommandPreparedStatementQuery, sql_pb2.ActionCreatePreparedStatementRequest,
    sql_pb2.ActionClosePreparedStatementRequest)}

# Flight SQL commands and actions that write or keep transactions: the speed layer is read-only.
READ_ONLY_REFUSED = frozenset({
    "CommandStatementUpdate", "CommandPreparedStatementUpdate", "CommandStatementIngest",
    "CommandStatementSubstraitPlan", "ActionCreatePreparedSubstraitPlanRequest",
    "ActionBeginTransactionRequest", "ActionEndTransactionRequest", "ActionBeginSavepointRequest",
    "ActionEndSavepointRequest",
})

# Action types (Flight's `Action.type`) of Flight SQL and the message their body holds.
ACTION_CREATE_PREPARED = "CreatePreparedStatement"
ACTION_CLOSE_PREPARED = "ClosePreparedStatement"
READ_ONLY_ACTIONS = frozenset({"BeginTransaction", "EndTransaction", "BeginSavepoint", "EndSavepoint",
                               "CreatePreparedSubstraitPlan"})


def unpack(raw: bytes, where: str) -> Message:
    """The served Flight SQL message `raw` (a serialized Any) holds; InvalidRequestError if it is
    not a Flight SQL command, ReadOnlyError for writes and transactions, an unsupported-command
    error for the rest."""
    packed = any_pb2.Any()
    try:
        packed.ParseFromString(raw)
    except DecodeError as exc:
        raise InvalidRequestError(f"{where}: not a Flight SQL command (a packed protobuf Any): {exc}") from exc
    if not packed.type_url.startswith(TYPE_PREFIX):
        raise InvalidRequestError(f"{where}: not a Flight SQL command (type URL {packed.type_url[:100]!r})")
    name = packed.type_url[len(TYPE_PREFIX):]
    if name in READ_ONLY_REFUSED:
        raise ReadOnlyError(f"{where}: {name} is refused: the speed layer is read-only "
                            f"(no updates, ingestion or transactions)")
    cls = SERVED.get(name)
    if cls is None:
        raise UnsupportedCommandError(f"{where}: Flight SQL command {name} is not supported by this server")
    message = cls()
    try:
        message.ParseFromString(packed.value)
    except DecodeError as exc:
        raise InvalidRequestError(f"{where}: malformed {name}: {exc}") from exc
    return message


def unpack_as(raw: bytes, cls: type[Message], where: str) -> Message:
    """`raw` unpacked, which must be a `cls` (an action's body, a ticket)."""
    message = unpack(raw, where)
    if not isinstance(message, cls):
        raise InvalidRequestError(f"{where}: expected {cls.DESCRIPTOR.name}, got {message.DESCRIPTOR.name}")
    return message


def pack(message: Message) -> bytes:
    """`message` as a serialized Any with Flight SQL's type URL."""
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed.SerializeToString()
