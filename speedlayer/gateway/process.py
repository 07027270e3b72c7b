"""`python -m speedlayer gateway`: a Data Gateway process (routing table + Flight service).

    python -m speedlayer gateway --config conf/speedlayer.yaml [--port 7800]

Flags override the file's `gateway:` section and its `SPEEDLAYER_GATEWAY__...` environment
overrides (`speedlayer.config.load_gateway_config`). The gateway's etcd store is built in
`metadata_store`, the one place it is made.
"""

from __future__ import annotations

import argparse
import logging
import threading
from typing import TYPE_CHECKING

from speedlayer.shutdown import stop_on_signals

if TYPE_CHECKING:
    from danube_core.metadata import MetadataStore

    from speedlayer.config import GatewayConfig

logger = logging.getLogger("speedlayer.gateway")


def add_parser(sub: argparse._SubParsersAction) -> None:
    gateway = sub.add_parser("gateway", help="run a Data Gateway (Arrow Flight and Flight SQL)")
    gateway.add_argument("--config", help="YAML config (conf/speedlayer.yaml, section gateway)")
    gateway.add_argument("--host", help="listen host (overrides gateway.host)")
    gateway.add_argument("--port", type=int, help="Flight port (overrides gateway.port; 0: any free port)")
    gateway.add_argument("--metrics-port", type=int, help="Prometheus port (overrides gateway.metrics_port)")
    gateway.add_argument("--log-level", default="INFO")


def metadata_store(config: GatewayConfig) -> MetadataStore:
    """The etcd the gateway's routing table watches (assignments and workers), reached with the
    `etcd:` section's TLS files, user and password (`danube_core.etcd_settings`)."""
    return config.etcd.connect()


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; 0 after a clean stop."""
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
    store = metadata_store(config)
    routing = RoutingTable(store, SpeedLayerKeys(config.key_root)).start()
    server = GatewayFlightServer(config, routing)
    done = threading.Event()
    stop_on_signals(done.set)
    logger.info("gateway serving on %s:%d (%s; native protocol and Arrow Flight SQL)", config.host, server.port,
                "TLS" if config.tls else "no TLS")
    print(f"gateway listening on {config.host}:{server.port}", flush=True)  # the operator's (and scripts') line
    try:
        while not done.wait(1.0):
            pass
    finally:
        server.shutdown()
        routing.close()
        store.close()
    return 0
