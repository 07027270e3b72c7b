"""`python -m speedlayer master|worker|gateway|admin|query ...`: run the speed layer, administer, query.

    python -m speedlayer master --config conf/speedlayer.yaml [--id m1] [--port 7701]
    python -m speedlayer worker --tenant acme --id w1 --masters 127.0.0.1:7701,127.0.0.1:7702
    python -m speedlayer gateway --config conf/speedlayer.yaml [--port 7800]
    python -m speedlayer admin --masters 127.0.0.1:7701 admit --tenant acme --dataset orders --delta /data/orders
    python -m speedlayer query --gateway 127.0.0.1:7800 --tenant acme --dataset orders "SELECT count(*) FROM orders"

Masters, workers and gateways run until SIGINT/SIGTERM. Exit codes: 0 after a clean stop, 1 for
a refused admin request or a failed query, 2 for a bad configuration.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import threading

from danube_core.errors import ConfigError, DanubeError

from speedlayer import admin, query_cli


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m speedlayer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    master = sub.add_parser("master", help="run a master")
    master.add_argument("--config", help="YAML config (conf/speedlayer.yaml)")
    master.add_argument("--id", help="master id (overrides master.id)")
    master.add_argument("--port", type=int, help="gRPC port (overrides master.port)")
    master.add_argument("--metrics-port", type=int, help="Prometheus port (overrides master.metrics_port)")
    master.add_argument("--log-level", default="INFO")
    worker = sub.add_parser("worker", help="run a worker")
    worker.add_argument("--tenant", required=True)
    worker.add_argument("--id", default=f"{socket.gethostname()}-{os.getpid()}", help="worker id")
    worker.add_argument("--masters", required=True, help="host:port of the masters (comma-separated)")
    worker.add_argument("--listen", default="127.0.0.1:0",
                        help="host:port of the worker's Flight query service (port 0: any free port)")
    worker.add_argument("--address", default="",
                        help="address the gateway reaches the Flight service at (default: the listen address)")
    worker.add_argument("--max-result-rows", type=int, default=1_000_000, help="cap on a query's result rows")
    worker.add_argument("--max-result-mb", type=int, default=256, help="cap on a query's result size")
    worker.add_argument("--query-timeout-ms", type=int, default=30_000, help="cap on a query's deadline")
    worker.add_argument("--memory-mb", type=int, default=2048, help="DuckDB memory limit and reported capacity")
    worker.add_argument("--threads", type=int, default=2, help="DuckDB threads")
    worker.add_argument("--cpu-cores", type=int, default=os.cpu_count() or 1)
    worker.add_argument("--storage-options", default="{}",
                        help='JSON: fsspec options per protocol, e.g. {"s3": {"key": "...", "client_kwargs": {...}}}')
    worker.add_argument("--metrics-port", type=int)
    worker.add_argument("--log-level", default="INFO")
    gateway = sub.add_parser("gateway", help="run a Data Gateway (Arrow Flight)")
    gateway.add_argument("--config", help="YAML config (conf/speedlayer.yaml, section gateway)")
    gateway.add_argument("--host", help="listen host (overrides gateway.host)")
    gateway.add_argument("--port", type=int, help="Flight port (overrides gateway.port; 0: any free port)")
    gateway.add_argument("--metrics-port", type=int, help="Prometheus port (overrides gateway.metrics_port)")
    gateway.add_argument("--log-level", default="INFO")
    admin.add_parser(sub)
    query_cli.add_parser(sub)
    return parser


def _until_signal(stop) -> None:
    done = threading.Event()

    def handler(signum, frame):
        done.set()
        stop()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)


def _master(args: argparse.Namespace) -> int:
    from speedlayer.config import load_master_config
    from speedlayer.master.server import MasterServer
    from speedlayer.observability.logs import configure_logging

    config = load_master_config(args.config, {"id": args.id, "port": args.port, "metrics_port": args.metrics_port})
    configure_logging(args.log_level, role="master", master_id=config.master_id)
    server = MasterServer(config)
    _until_signal(server.stop)
    server.start()
    server.wait()
    return 0


def _worker(args: argparse.Namespace) -> int:
    from speedlayer.keys import valid_id
    from speedlayer.observability.logs import configure_logging
    from speedlayer.observability.metrics import serve_metrics
    from speedlayer.worker.agent import WorkerAgent, WorkerConfig

    for name, value in (("--tenant", args.tenant), ("--id", args.id)):
        if not valid_id(value):
            raise ConfigError(f"{name} {value!r}: expected 1-128 of letters, digits, '_', '.', '-'")
    try:
        storage_options = json.loads(args.storage_options)
    except ValueError as exc:
        raise ConfigError(f"--storage-options {args.storage_options!r}: not JSON: {exc}") from exc
    configure_logging(args.log_level, role="worker", tenant_id=args.tenant, worker_id=args.id)
    serve_metrics(args.metrics_port)
    agent = WorkerAgent(WorkerConfig(
        tenant=args.tenant, worker_id=args.id, masters=args.masters.split(","),
        memory_bytes=args.memory_mb * 1024 * 1024, cpu_cores=args.cpu_cores, threads=args.threads,
        storage_options=storage_options))
    server = _query_server(args, agent)
    host = args.listen.rpartition(":")[0]
    # Registered with the master (RegisterEvent.address -> /workers/{tenant}/{id}) for the gateway.
    agent.config = dataclasses.replace(agent.config, address=args.address or f"{host}:{server.port}")
    _until_signal(agent.stop)
    try:
        agent.run()
    finally:
        server.shutdown()
    return 0


def _query_server(args: argparse.Namespace, agent):
    from speedlayer.query.protocol import QueryLimits
    from speedlayer.worker.flight_server import WorkerFlightServer

    for name, value in (("--max-result-rows", args.max_result_rows), ("--max-result-mb", args.max_result_mb),
                        ("--query-timeout-ms", args.query_timeout_ms)):
        if value < 1:
            raise ConfigError(f"{name} {value}: expected an integer >= 1")
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--listen {args.listen!r}: expected host:port")
    limits = QueryLimits(max_rows=args.max_result_rows, max_bytes=args.max_result_mb * 1024 * 1024,
                         timeout_ms=args.query_timeout_ms)
    return WorkerFlightServer(f"grpc://{args.listen}", tenant=args.tenant, served=agent.served,
                              cursor=agent.loader.cursor, limits=limits)


def _gateway(args: argparse.Namespace) -> int:
    from danube_core.metadata_etcd import EtcdMetadataStore
    from speedlayer.config import load_gateway_config
    from speedlayer.gateway.routing import RoutingTable
    from speedlayer.gateway.server import GatewayFlightServer
    from speedlayer.keys import SpeedLayerKeys
    from speedlayer.observability.logs import configure_logging
    from speedlayer.observability.metrics import serve_metrics

    config = load_gateway_config(args.config, {"host": args.host, "port": args.port,
                                               "metrics_port": args.metrics_port})
    configure_logging(args.log_level, role="gateway")
    serve_metrics(config.metrics_port)
    store = EtcdMetadataStore(config.etcd_endpoints)
    routing = RoutingTable(store, SpeedLayerKeys(config.key_root)).start()
    server = GatewayFlightServer(config, routing)
    done = threading.Event()
    _until_signal(done.set)
    logging.getLogger("speedlayer.gateway").info("gateway serving on %s:%d", config.host, server.port)
    print(f"gateway listening on {config.host}:{server.port}", flush=True)
    try:
        while not done.wait(1.0):
            pass
    finally:
        server.shutdown()
        routing.close()
        store.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "master":
            return _master(args)
        if args.command == "worker":
            return _worker(args)
        if args.command == "gateway":
            return _gateway(args)
        if args.command == "query":
            return query_cli.run(args)
        return admin.run(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except DanubeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
