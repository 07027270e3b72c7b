"""Fakes shared by the Flight SQL unit tests (`test_flight_sql_statement_units`,
`test_flight_sql_session_units`): a gateway configuration, a server call context carrying request
headers, and a descriptor for a Flight SQL command."""

from __future__ import annotations

import pyarrow.flight as flight

from speedlayer.config import GatewayConfig
from speedlayer.gateway.flight_sql.messages import pack
from speedlayer.protocol.query import HEADERS_MIDDLEWARE


def gateway_config(**kwargs) -> GatewayConfig:
    """A gateway configuration for tenant `acme` (token `s3cret`); `kwargs` set other fields."""
    from danube_core.etcd_settings import EtcdSettings

    return GatewayConfig(host="127.0.0.1", port=0, etcd=EtcdSettings("127.0.0.1:2379"),
                         tokens={"acme": "s3cret"}, **kwargs)


class _Middleware:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers


class CallContext:
    """A Flight server call context from 127.0.0.1 whose headers middleware holds `headers`."""

    def __init__(self, headers: dict[str, str]) -> None:
        self._headers = _Middleware(headers)

    def get_middleware(self, name: str) -> _Middleware | None:
        return self._headers if name == HEADERS_MIDDLEWARE else None

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"


def command_descriptor(message) -> flight.FlightDescriptor:
    """The descriptor a client sends for the Flight SQL command `message`."""
    return flight.FlightDescriptor.for_command(pack(message))
