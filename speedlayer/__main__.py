"""`python -m speedlayer master|worker|gateway|admin|query ...`: run the speed layer, administer, query.

    python -m speedlayer master --config conf/speedlayer.yaml [--id m1] [--port 7701]
    python -m speedlayer worker --tenant acme --id w1 --masters 127.0.0.1:7701,127.0.0.1:7702
    python -m speedlayer gateway --config conf/speedlayer.yaml [--port 7800]
    python -m speedlayer admin --masters 127.0.0.1:7701 admit --tenant acme --dataset orders --delta /data/orders
    python -m speedlayer query --gateway 127.0.0.1:7800 --tenant acme --dataset orders "SELECT count(*) FROM orders"

Masters, workers and gateways run until SIGINT/SIGTERM. Exit codes: 0 after a clean stop, 1 for
a refused admin request or a failed query, 2 for a bad configuration.

This module only dispatches: each subcommand's flags and process wiring are its own module's
(`master.process`, `worker.process`, `gateway.process`, `clients.admin_cli`, `clients.query_cli`),
each with `add_parser(subparsers)` and `run(args) -> exit code`. Workers and gateways start only
on a DuckDB whose parse tree the speed layer reads (`protocol.parse_tree_format`): another
DuckDB is refused as a bad configuration, naming its version and the range supported.
"""

from __future__ import annotations

import argparse
import sys
from types import ModuleType

from danube_core.errors import ConfigError, DanubeError

from speedlayer.clients import admin_cli, query_cli
from speedlayer.gateway import process as gateway_process
from speedlayer.master import process as master_process
from speedlayer.protocol.parse_tree_format import check_installed_duckdb
from speedlayer.worker import process as worker_process

SUBCOMMANDS: dict[str, ModuleType] = {
    "master": master_process, "worker": worker_process, "gateway": gateway_process,
    "admin": admin_cli, "query": query_cli,
}
# The subcommands that guard and rewrite SQL through DuckDB's parse tree.
READS_PARSE_TREES = ("worker", "gateway")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m speedlayer", description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command in READS_PARSE_TREES:
            check_installed_duckdb()
        return SUBCOMMANDS[args.command].run(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except DanubeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
