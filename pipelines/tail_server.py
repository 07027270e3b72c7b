"""`python -m pipelines tail`: a speed-layer worker's tail process, answering over its stdin/stdout.

The worker serving a dataset's tail starts this process and asks it, one request at a time
(`speedlayer.protocol.tail_wire`), for the pipeline's topics, their earliest and latest offsets,
and ranges read and split as the pipeline splits them (`pipelines.tail_feed.TailFeed`). The
first request opens the feed from the pipeline file's text; the process exits when its stdin
closes, so a worker that stops the tail or dies takes its tail process with it.

Its stdout carries nothing but answers: the descriptor is kept for them and fd 1 pointed at
stderr before Spark starts, so nothing the JVM or a library prints can corrupt a frame. Every
failure is an answer naming its class (a `DataLossError` stays one: the worker reports the loss).

A master admitting a dataset with a tail (it may not import this package) starts one and sends
a single `check`: the pipeline file parsed, then `pipelines.preflight`'s checks (etcd, storage,
the registry subject) and its named topics' existence; the answer is the pipeline's name and
the namespaces it reads.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import IO, Any

import yaml

from pipelines.config import PipelineConfig, parse_config
from speedlayer.protocol.tail_wire import read_request, write_answer, write_failure

logger = logging.getLogger(__name__)

FILE_LABEL = "tail.pipeline_config"  # how errors name the pipeline file (the admission's field)


def serve(inp: IO[bytes], out: IO[bytes]) -> int:
    """Answer requests until `inp` ends."""
    feed: Any = None
    try:
        while (request := read_request(inp)) is not None:
            try:
                feed = _answer(request, feed, out)
            except Exception as exc:  # every failure goes back to the worker, named
                logger.warning("tail request %s failed: %s", request.get("op"), exc, exc_info=logger.isEnabledFor(10))
                write_failure(out, type(exc).__name__, str(exc))
    finally:
        if feed is not None:
            feed.close()
    return 0


def _answer(request: dict, feed: Any, out: IO[bytes]) -> Any:
    op = request["op"]
    if op == "open":
        from pipelines.tail_feed import TailFeed

        feed = TailFeed(pipeline_config(request["pipeline_config"]))
        write_answer(out, {"pipeline": feed.config.name})
        return feed
    if op == "check":
        config = pipeline_config(request["pipeline_config"])
        check(config)
        write_answer(out, {"name": config.name, "namespaces": topic_namespaces(config)})
        return feed
    if feed is None:
        raise ValueError(f"tail request {op!r} before 'open'")
    if op == "topics":
        write_answer(out, feed.topics())
    elif op == "earliest":
        write_answer(out, feed.earliest(request["topics"]))
    elif op == "latest":
        above = request.get("above")
        write_answer(out, feed.latest(request["topics"], above, float(request.get("wait_ms", 0)) / 1000))
    elif op == "read":
        batch = feed.read(request["start"], request["end"])
        write_answer(out, {"first": dict(batch.first), "ends": dict(batch.ends), "read": batch.read,
                           "quarantined": batch.quarantined}, batch.rows if batch.rows.num_columns else None)
    else:
        raise ValueError(f"unknown tail request {op!r}")
    return feed


def pipeline_config(text: str) -> PipelineConfig:
    return parse_config(yaml.safe_load(text), FILE_LABEL)


def topic_namespaces(config: PipelineConfig) -> list[str]:
    """The namespaces a pipeline's `source` reads (a pattern's fixed `/namespace/` prefix)."""
    from danube_core.topics import TopicName

    source = config.source
    if source.topics:
        return sorted({TopicName.parse(t).namespace for t in source.topics})
    if source.namespace:
        return [source.namespace]
    pattern = (source.topic_pattern or "").lstrip("/")
    return [pattern.split("/", 1)[0]]


def check(config: PipelineConfig) -> None:
    """What a pipeline with a tail needs: etcd, storage, the registry subject, its named topics."""
    from connectors import options as opt
    from connectors.batch import new_catalog
    from danube_core.errors import ConfigError
    from pipelines.preflight import ETCD_CHECK_TIMEOUT_MS, check_storage, check_subject, connect_etcd
    from pipelines.runner import reader_options

    options = opt.parse_options(reader_options(config.source))
    with connect_etcd(config, options.etcd, min(options.etcd.timeout_ms, ETCD_CHECK_TIMEOUT_MS)) as metadata:
        check_storage(config, options.storage_url, options.storage_options)
        check_subject(config, metadata)
        if options.topics is not None:
            present = new_catalog(options, metadata).indexed(list(options.topics))
            missing = [t for t in options.topics if t not in present]
            if missing:
                raise ConfigError(f"{FILE_LABEL}: source.topics: {missing} do not exist in etcd "
                                  f"{config.source.etcd_endpoints}")


def main() -> int:
    """Keep the real stdout for answers, point fd 1 at stderr, serve."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return serve(sys.stdin.buffer, answers)
