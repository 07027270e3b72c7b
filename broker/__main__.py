"""Start a broker: `python -m broker --config conf/broker.yaml`.

Runs until SIGINT/SIGTERM, then hands its topics over and leaves the cluster. Exit codes:
0 after a clean stop, 1 when etcd cannot be reached (the message names the `meta_store` keys
to check; the broker never starts an etcd unless `meta_store.embedded` asks for one), 2 for a bad configuration (the message names the file and the key).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from danube_core.errors import ConfigError, MetadataUnavailableError

from broker.config import load_config
from broker.server import BrokerServer

logger = logging.getLogger("broker")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m broker", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="broker YAML config (Danube's danube_broker.yml keys)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


async def _run(server: BrokerServer) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(server.stop()))
    try:
        await server.start()
    except BaseException:
        await server.stop()
        raise
    await server.wait()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
        asyncio.run(_run(BrokerServer(config)))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except MetadataUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
