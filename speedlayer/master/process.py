"""`python -m speedlayer master`: a master process from its flags and `conf/speedlayer.yaml`.

    python -m speedlayer master --config conf/speedlayer.yaml [--id m1] [--port 7701]

Flags override the file's `master:` section and its `SPEEDLAYER_MASTER__...` environment
overrides (`speedlayer.config.load_master_config`). The master's etcd store is built in
`MasterServer` (`speedlayer.master.server`). Heavy imports wait for `run`, so that the other
subcommands do not pay for them.
"""

from __future__ import annotations

import argparse

from speedlayer.master.admission_hooks import NO_HOOKS, AdmissionHooks
from speedlayer.shutdown import stop_on_signals


def add_parser(sub: argparse._SubParsersAction) -> None:
    master = sub.add_parser("master", help="run a master")
    master.add_argument("--config", help="YAML config (conf/speedlayer.yaml)")
    master.add_argument("--id", help="master id (overrides master.id)")
    master.add_argument("--port", type=int, help="gRPC port (overrides master.port)")
    master.add_argument("--metrics-port", type=int, help="Prometheus port (overrides master.metrics_port)")
    master.add_argument("--log-level", default="INFO")


def run(args: argparse.Namespace, hooks: AdmissionHooks = NO_HOOKS) -> int:
    """Serve until SIGINT/SIGTERM; 0 after a clean stop (a bad configuration raises ConfigError).

    `hooks` act at the named steps of the leader's admissions: nothing from `python -m
    speedlayer`; the failover tests start masters through `python -m devstack.faults.master`,
    which passes its own."""
    from speedlayer.config import load_master_config
    from speedlayer.master.server import MasterServer
    from speedlayer.observability.logs import configure_logging

    config = load_master_config(args.config, {"id": args.id, "port": args.port, "metrics_port": args.metrics_port})
    configure_logging(args.log_level, role="master", master_id=config.master_id)
    server = MasterServer(config, hooks=hooks)
    stop_on_signals(server.stop)
    server.start()
    server.wait()
    return 0
