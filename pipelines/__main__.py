"""`python -m pipelines run <file.yaml>` runs a pipeline; `python -m pipelines demo` runs the demo.

`run` blocks until an availableNow pipeline has read everything, or until SIGINT/SIGTERM stops a
processingTime pipeline (the batch in flight is replayed on the next start: exactly once).
Exit codes: 0 done, 1 the query failed, 2 bad configuration.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from danube_core.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the pipeline declared in a YAML file")
    run.add_argument("config", help="conf/pipelines/<name>.yaml")
    demo = commands.add_parser("demo", help="the one-command demo on the embedded defaults")
    demo.add_argument("--data-dir", default=None, help="where to keep etcd, WAL, objects, Delta (default: a temp dir)")
    demo.add_argument("--messages", type=int, default=200, help="how many messages to produce")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("py4j", "great_expectations"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        if args.command == "run":
            return _run(args.config)
        from pipelines.demo import run_demo

        return run_demo(data_dir=args.data_dir, messages=args.messages)
    except ConfigError as exc:
        logging.getLogger("pipelines").error("%s", exc)
        return 2


def _run(path: str) -> int:
    from pipelines.config import load_config
    from pipelines.runner import PipelineRunner

    config = load_config(path)
    runner = PipelineRunner(config)

    def stop(signum: int, _frame: object) -> None:
        logging.getLogger("pipelines").info("signal %d: stopping pipeline %s", signum, config.name)
        runner.request_stop()  # not runner.stop(): no Spark call from inside a blocked Spark call

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        metrics = runner.run()
    except Exception as exc:  # a StreamingQueryException carries the batch's own error
        logging.getLogger("pipelines").error("pipeline %s failed: %s", config.name, exc)
        return 1
    finally:
        runner.stop()
    logging.getLogger("pipelines").info("pipeline %s finished: %s", config.name, metrics.totals())
    return 0


if __name__ == "__main__":
    sys.exit(main())
