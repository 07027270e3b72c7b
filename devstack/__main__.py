"""`python -m devstack demo` runs the one-command demo (`./demo.sh`) on the embedded defaults.

Exit codes as `python -m pipelines run`: 0 done, 2 bad configuration, 3 etcd or storage
unreachable or refusing access (one line on stderr, the traceback only at `--log-level DEBUG`).
"""

from __future__ import annotations

import argparse
import logging
import sys

from danube_core.errors import ConfigError, MetadataError, ObjectStoreError
from pipelines.__main__ import configure_logging

logger = logging.getLogger("devstack")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="the one-command demo on the embedded defaults")
    demo.add_argument("--data-dir", default=None, help="where to keep etcd, WAL, objects, Delta (default: a temp dir)")
    demo.add_argument("--messages", type=int, default=200, help="how many messages to produce")
    demo.add_argument("--no-console", action="store_true",
                      help="stop at once at the end instead of serving the console (as under CI)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    from devstack.demo import run_demo

    try:
        return run_demo(data_dir=args.data_dir, messages=args.messages, console=not args.no_console)
    except (ConfigError, MetadataError, ObjectStoreError) as exc:
        logger.debug("traceback", exc_info=exc)
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 3


if __name__ == "__main__":
    sys.exit(main())
