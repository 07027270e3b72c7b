"""`python -m pipelines run <file.yaml>` runs a pipeline (the demo is `python -m devstack demo`).

`python -m pipelines tail` is a speed-layer worker's tail process (`pipelines.tail_server`): it
answers the worker over its stdin and stdout and is not meant to be run by hand.

`run` blocks until an availableNow pipeline has read everything, or until SIGINT/SIGTERM stops a
processingTime pipeline (the batch in flight is replayed on the next start: exactly once).
Before Spark starts, the pipeline file, etcd, storage and the registry subject are checked
(`pipelines.preflight`): a mistake there is one line on stderr naming the key to fix, with the
traceback only under `--log-level DEBUG`. With a `metrics:` section the pipeline's Prometheus
endpoint serves while it runs (`PipelineRunner` owns it, so every entry point serves it). The
session is stopped before the process exits.
Exit codes: 0 done, 1 the query failed, 2 bad configuration (file, options, registry subject),
3 etcd or storage unreachable or refusing access.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import TYPE_CHECKING

from danube_core.errors import ConfigError, MetadataError, ObjectStoreError
from pipelines.batch_hooks import NO_HOOKS, BatchHooks

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger("pipelines")


def main(argv: list[str] | None = None, *, hooks: BatchHooks = NO_HOOKS) -> int:
    """The command; `hooks` act at the steps of each batch (the fault battery's entry point,
    `devstack/faults/pipeline.py`, passes its own; nothing happens by default)."""
    parser = argparse.ArgumentParser(prog="python -m pipelines", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the pipeline declared in a YAML file")
    run.add_argument("config", help="conf/pipelines/<name>.yaml")
    commands.add_parser("tail", help="a speed-layer worker's tail process (stdin/stdout; started by the worker)")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    if args.command == "tail":
        from pipelines.tail_server import main as tail_main

        return tail_main()
    try:
        return _run(args.config, hooks)
    except ConfigError as exc:
        return _refused(exc, 2)
    except (MetadataError, ObjectStoreError) as exc:  # raised here only before the query starts
        return _refused(exc, 3)


def configure_logging(level: str) -> None:
    """Timestamped log lines at `level` for a pipeline's process (and the demo's, `devstack`);
    py4j and great-expectations only from WARNING, their INFO lines bury the pipeline's own."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("py4j", "great_expectations"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _refused(exc: Exception, code: int) -> int:
    """One line on stderr naming what to fix (the traceback too at DEBUG); `code` back."""
    logger.debug("traceback", exc_info=exc)
    print(f"error: {exc}", file=sys.stderr)
    return code


def _run(path: str, hooks: BatchHooks) -> int:
    from pipelines.config import load_config
    from pipelines.runner import PipelineRunner

    config = load_config(path)
    runner = PipelineRunner(config, hooks=hooks)  # it serves the `metrics:` endpoint until stopped

    def stop(signum: int, _frame: object) -> None:
        logger.info("signal %d: stopping pipeline %s", signum, config.name)
        runner.request_stop()  # not runner.stop(): no Spark call from inside a blocked Spark call

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        metrics = runner.run()
    except Exception as exc:  # a StreamingQueryException carries the batch's own error
        logger.error("pipeline %s failed: %s", config.name, exc)
        return 1
    finally:
        runner.stop()
        _stop_session(runner.spark)
    logger.info("pipeline %s finished: %s", config.name, metrics.totals())
    return 0


def _stop_session(spark: SparkSession) -> None:
    """Stop the session while this process still answers Py4J callbacks.

    Stopping it delivers the listener events still queued (the last batch's progress, the
    query's termination) to the Python listeners (connectors' `DanubeCursorCommitter`). Left
    to the JVM's shutdown hook, which runs after Python has exited, each of them fails with
    "ERROR StreamingQueryListenerBus: Listener PythonStreamingQueryListenerWrapper threw an
    exception ... Py4JException".
    """
    try:
        spark.stop()
    except Exception as exc:  # a JVM that already died: nothing left to stop
        logger.warning("could not stop the Spark session: %s", exc)


if __name__ == "__main__":
    sys.exit(main())
