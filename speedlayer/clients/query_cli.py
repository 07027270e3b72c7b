"""`python -m speedlayer query`: one SQL query through the Data Gateway; prints rows and latency.

    python -m speedlayer query --gateway 127.0.0.1:7800 --tenant acme --dataset orders \\
        "SELECT day, count(*) AS n FROM orders GROUP BY day ORDER BY day"

The token, where the gateway requires one, comes from `--token` or `SPEEDLAYER_TOKEN`. The
latency printed is the client's: from the call to the last row received. Exit code 1 and the
error, one line on stderr, when the query fails; a gateway that accepts no connection within
`--connect-timeout-ms` is named as unreachable (a closed port fails at once). A TLS gateway
is `--gateway grpc+tls://host:port`; `--ca-cert ca.pem` trusts the CA that signed its
certificate (and implies TLS for a bare host:port).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

MAX_PRINTED_ROWS = 1000


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("query", help="run SQL on a dataset through the gateway")
    parser.add_argument("--gateway", required=True, help="host:port of a Data Gateway")
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--dataset", required=True, help="the dataset; the SQL names it as a table")
    parser.add_argument("--epoch", default="", help="a specific epoch (default: the newest READY one)")
    parser.add_argument("--token", default=os.environ.get("SPEEDLAYER_TOKEN"), help="the tenant's token")
    parser.add_argument("--client-id", help="stable id: the gateway keeps a client on the same replica")
    parser.add_argument("--timeout-ms", type=int, default=30_000)
    parser.add_argument("--connect-timeout-ms", type=int, default=2_000,
                        help="give up on a gateway that accepts no connection within this long")
    parser.add_argument("--ca-cert", default=os.environ.get("SPEEDLAYER_CA_CERT"),
                        help="PEM file of the CA that signed a TLS gateway's certificate (or SPEEDLAYER_CA_CERT)")
    parser.add_argument("--max-rows", type=int, default=0, help="fail if the result has more rows")
    parser.add_argument("--committed", action="store_true",
                        help="the committed epoch alone, without the topic's tail (a dataset served with one)")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument("sql")


def run(args: argparse.Namespace) -> int:
    from speedlayer.clients.query_client import QueryClient
    from speedlayer.errors import SpeedLayerError

    try:
        with QueryClient(args.gateway, args.tenant, token=args.token, client_id=args.client_id,
                         timeout_ms=args.timeout_ms, connect_timeout_ms=args.connect_timeout_ms,
                         ca_cert=args.ca_cert) as client:
            started = time.perf_counter()
            table = client.query(args.dataset, args.sql, epoch=args.epoch, max_rows=args.max_rows,
                                 committed_only=args.committed)
            elapsed_ms = (time.perf_counter() - started) * 1000
    except (SpeedLayerError, ValueError) as exc:
        print(f"error: {type(exc).__name__}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    rows = table.slice(0, MAX_PRINTED_ROWS).to_pylist()
    if args.format == "json":
        for row in rows:
            print(json.dumps(row, default=str))
    else:
        print(render_rows(table.column_names, rows))
    metadata = table.schema.metadata or {}
    if b"speedlayer.tail" in metadata:
        print(f"epoch {metadata.get(b'speedlayer.epoch', b'?').decode()}, tail {metadata[b'speedlayer.tail'].decode()}",
              file=sys.stderr)
    more = f" (first {MAX_PRINTED_ROWS} shown)" if table.num_rows > MAX_PRINTED_ROWS else ""
    print(f"{table.num_rows} row(s){more} in {elapsed_ms:.1f} ms", file=sys.stderr if args.format == "json" else sys.stdout)
    return 0


def render_rows(columns: list[str], rows: list[dict]) -> str:
    cells = [[str(c) for c in columns]] + [["NULL" if r[c] is None else str(r[c]) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = [" | ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)
