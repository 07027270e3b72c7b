"""`python -m speedlayer worker`: a worker process (control agent + Flight query service).

    python -m speedlayer worker --tenant acme --id w1 --masters 127.0.0.1:7701,127.0.0.1:7702
    python -m speedlayer worker --config conf/speedlayer.yaml [--tenant acme --id w1]

The configuration is `speedlayer.config.WorkerConfig`: the file's `worker:` section, its
`SPEEDLAYER_WORKER__...` environment overrides, then these flags. The Flight service starts
first: the agent registers the address it bound (port 0: any free port), and both share the
DuckDB the loader fills and the epochs `ServedDatasets` publishes.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from danube_core.errors import ConfigError

from speedlayer.shutdown import stop_on_signals

MIB = 1024 * 1024


def add_parser(sub: argparse._SubParsersAction) -> None:
    worker = sub.add_parser("worker", help="run a worker")
    worker.add_argument("--config", help="YAML config (conf/speedlayer.yaml, section worker)")
    worker.add_argument("--tenant", help="the worker's tenant (required here or as worker.tenant)")
    worker.add_argument("--id", help="worker id (default: <hostname>-<pid>)")
    worker.add_argument("--masters",
                        help="host:port of the masters (comma-separated; required here or as worker.masters)")
    worker.add_argument("--listen", help="host:port of the worker's Flight query service "
                                         "(default 127.0.0.1:0; port 0: any free port)")
    worker.add_argument("--address",
                        help="address the gateway reaches the Flight service at (default: the listen address)")
    worker.add_argument("--max-result-rows", type=int, help="cap on a query's result rows (default 1000000)")
    worker.add_argument("--max-result-mb", type=int, help="cap on a query's result size (default 256)")
    worker.add_argument("--query-timeout-ms", type=int, help="cap on a query's deadline (default 30000)")
    worker.add_argument("--memory-mb", type=int, help="DuckDB memory limit and reported capacity (default 2048)")
    worker.add_argument("--threads", type=int, help="DuckDB threads (default 2)")
    worker.add_argument("--cpu-cores", type=int, help="reported CPU cores (default: this host's)")
    worker.add_argument("--storage-options",
                        help='JSON: fsspec options per protocol, e.g. {"s3": {"key": "...", "client_kwargs": {...}}}')
    worker.add_argument("--metrics-port", type=int)
    worker.add_argument("--log-level", default="INFO")


def flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The flags as `worker:` keys (None: not given, the file or the default stands)."""
    storage_options = None
    if args.storage_options is not None:
        try:
            storage_options = json.loads(args.storage_options)
        except ValueError as exc:
            raise ConfigError(f"--storage-options {args.storage_options!r}: not JSON: {exc}") from exc

    def mib(value: int | None) -> int | None:
        return None if value is None else value * MIB

    return {"tenant": args.tenant, "id": args.id, "masters": args.masters, "listen": args.listen,
            "address": args.address, "memory_bytes": mib(args.memory_mb), "cpu_cores": args.cpu_cores,
            "threads": args.threads, "storage_options": storage_options,
            "max_result_rows": args.max_result_rows, "max_result_bytes": mib(args.max_result_mb),
            "query_timeout_ms": args.query_timeout_ms, "metrics_port": args.metrics_port}


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM or a finished DRAIN; 0 after a clean stop."""
    from dataclasses import replace

    from speedlayer.config import load_worker_config
    from speedlayer.observability.logs import configure_logging
    from speedlayer.observability.metrics import serve_metrics
    from speedlayer.protocol.query import QueryLimits
    from speedlayer.worker.agent import WorkerAgent
    from speedlayer.worker.flight_server import WorkerFlightServer
    from speedlayer.worker.loader import EpochLoader
    from speedlayer.worker.serving import ServedDatasets
    from speedlayer.worker.tails import WorkerTails

    config = load_worker_config(args.config, flag_overrides(args))
    configure_logging(args.log_level, role="worker", tenant_id=config.tenant, worker_id=config.worker_id)
    serve_metrics(config.metrics_port)
    loader = EpochLoader(memory_limit_bytes=config.memory_bytes, threads=config.threads,
                         storage_options=config.storage_options)
    served = ServedDatasets(drop_table=loader.drop)
    tails = WorkerTails(cursor=loader.cursor)  # datasets served with their topic's tail (speedlayer.worker.tails)
    limits = QueryLimits(max_rows=config.max_result_rows, max_bytes=config.max_result_bytes,
                         timeout_ms=config.query_timeout_ms)
    server = WorkerFlightServer(f"grpc://{config.listen}", tenant=config.tenant, served=served,
                                cursor=loader.cursor, limits=limits, tails=tails)
    # Registered with the master (RegisterEvent.address -> /workers/{tenant}/{id}) for the gateway.
    agent = WorkerAgent(replace(config, address=config.advertised_address(server.port)), loader=loader, served=served,
                        tails=tails)
    stop_on_signals(agent.stop)
    try:
        agent.run()
    finally:
        tails.stop()
        server.shutdown()
    return 0
