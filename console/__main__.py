"""`python -m console --config conf/console.yaml [--allow-actions]`: serve the console.

Exit codes: 0 stopped by a signal, 2 bad configuration.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

from danube_core.errors import ConfigError

logger = logging.getLogger("console")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m console", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="the console's YAML (conf/console.yaml)")
    parser.add_argument("--allow-actions", action="store_true",
                        help="enable admission and drain (a token must be configured: actions.token_file or "
                             "CONSOLE_ACTIONS__TOKEN)")
    parser.add_argument("--host", default=None, help="address to bind (overrides listen.host)")
    parser.add_argument("--port", type=int, default=None, help="port to bind (overrides listen.port)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from console.config import load_console_config
    from console.server import ConsoleServer

    try:
        config = load_console_config(args.config, allow_actions=args.allow_actions)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    config = dataclasses.replace(config, **overrides)
    server = ConsoleServer(config)
    logger.info("console serving on http://%s:%d (actions %s)", config.host, config.port,
                "allowed" if config.actions_enabled else "off")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
