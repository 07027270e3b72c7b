"""`python -m connectors runs|tail`: what a topic's storage holds that reads would not return.

* `runs`: every object and WAL run of a topic, sorted into the current run and older runs
  whose offsets a real broker reused (`connectors.topic_runs`), one JSON line each, then the
  `salvage` option value that reads the older runs' messages with their provenance.
* `tail`: the messages a WAL this reader cannot reach holds (the owner, from which offset,
  and what etcd proves exists), as JSON.

Both take the `danube` data source's own options as `--option key=value` (plus shortcuts for
the common ones), so what they show is what `spark.read.format("danube")` with the same
options would read; etcd, though, is reached through the flags every tool shares (`--etcd`,
and for a secured etcd the `--etcd-*` flags of `danube_core.etcd_cli`: TLS files, user, the
password from $DANUBE_ETCD_PASSWORD or `--etcd-password-file`), not `etcd.*` options, so no
password is ever on the command line. Exit codes: 0 done, 1 etcd or storage refused or
unreachable, 2 bad arguments or options.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from danube_core.errors import ConfigError, DanubeError
from danube_core.etcd_cli import add_etcd_flags, etcd_settings_from_args

EXIT_OK = 0
EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m connectors", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("runs", "tail"))
    add_etcd_flags(parser, required=True)
    parser.add_argument("--storage-url", required=True, help="storage root URL (option storage.url)")
    parser.add_argument("--topic", required=True, help="one topic, e.g. /default/orders")
    parser.add_argument("--wal-root", help="option walRoot (auto, none, URL, template or JSON map)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="any other danube data source option, e.g. rootPrefix=/danube-data "
                             "(not etcd.*: the --etcd flags give those)")
    return parser


def _options(args: argparse.Namespace) -> dict[str, str]:
    options = {"storage.url": args.storage_url, "topic": args.topic}
    if args.wal_root:
        options["walRoot"] = args.wal_root
    for pair in args.option:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--option {pair!r}: expected KEY=VALUE")
        options[key] = value
    return options


def main(argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    from connectors.topic_inspector import TopicInspector, rows

    out, err = out or sys.stdout, err or sys.stderr
    args = _parser().parse_args(argv)
    try:
        with TopicInspector.from_options(_options(args), etcd=etcd_settings_from_args(args)) as inspector:
            topic = inspector.topics()[0]
            if args.command == "tail":
                out.write(json.dumps({"topic": topic, "unreadTail": inspector.unread_tail(topic)}) + "\n")
                return EXIT_OK
            found = rows(inspector.runs(topic))
            for row in found:
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
            older = [r["source"] for r in found if r["run"] == "older" and r["kind"] != "sealed-state"]
            if older:
                out.write(json.dumps({"salvage": ",".join(dict.fromkeys(older))}) + "\n")
    except (ConfigError, ValueError) as exc:
        err.write(f"{exc}\n")
        return EXIT_USAGE
    except DanubeError as exc:
        err.write(f"{type(exc).__name__}: {exc}\n")
        return 1
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
