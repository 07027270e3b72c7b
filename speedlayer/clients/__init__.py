"""The speed layer's clients and command-line tools: what people and programs call it with.

    from speedlayer.clients import ManagementClient, delta_request, query, QueryClient

`management_client` (`ManagementClient`, `delta_request`) calls the masters over gRPC;
`query_client` (`QueryClient`, `query`) calls the Data Gateway over Arrow Flight; `admin_cli` and `query_cli`
are `python -m speedlayer admin|query`. Clients import the wire protocols
(`speedlayer.protocol`) and the generated API, never a role (`master/`, `worker/`, `gateway/`).

Names are imported on first use: the management client needs grpc, the query client
pyarrow.flight, and a caller of one should not pay for the other. No submodule is named like
an exported name: importing `speedlayer.clients.query` would have made `query` the module.
"""

from __future__ import annotations

from importlib import import_module

__all__ = ["ManagementClient", "delta_request", "QueryClient", "query"]

_HOMES = {"ManagementClient": "speedlayer.clients.management_client",
          "delta_request": "speedlayer.clients.management_client",
          "QueryClient": "speedlayer.clients.query_client", "query": "speedlayer.clients.query_client"}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'speedlayer.clients' has no attribute {name!r}")
