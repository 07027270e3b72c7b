"""Runs one pipeline: the `danube` stream -> `DeltaBatchWriter` under the configured trigger.

`python -m pipelines run <file>`, `./spark-submit.sh run <file>`, the demo, the notebooks and
the tests all go through `PipelineRunner`, so every entry point runs the same code. Everything
that can be checked before the query starts is (the YAML, the source options; before the
Spark session starts, etcd, storage and the registry subject, `pipelines.preflight`; then the
expectation suite and the checkpoint against the Delta tables), so a mistake fails in seconds
with its key named. With a `metrics:` section the runner serves the pipeline's Prometheus
endpoint (`pipelines.metrics_endpoint`) from its construction until `stop()`, whoever runs it.

A pipeline whose checkpoint was deleted, moved or replaced while its tables hold batches written
under the old one does not start: `CheckpointMismatchError` names the table, the txnAppId, the
checkpoint and what to do (see `pipelines.batch_trail`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming import StreamingQuery

import connectors
from connectors import options as opt
from connectors.subscription_lock import release_after_stop
from danube_core.errors import ConfigError, DanubeError, SubscriptionBusyError, error_type_in
from danube_core.metadata import MetadataStore
from pipelines.batch_hooks import NO_HOOKS, BatchHooks
from pipelines.batch_trail import check_checkpoint, pipeline_tables, read_trail
from pipelines.checkpoint_state import read_state
from pipelines.config import AVAILABLE_NOW, PipelineConfig, SourceConfig
from pipelines.decode import Decoder
from pipelines.delta_sink import DeltaBatchWriter
from pipelines.expectations import QualityGate
from pipelines.metrics import PipelineMetrics
from pipelines.preflight import check_services
from pipelines.session import running_spark_version
from pipelines.subject_schemas import SubjectSchemas

if TYPE_CHECKING:
    from pipelines.metrics_endpoint import MetricsEndpoint

logger = logging.getLogger(__name__)

# A driver that died holds the subscription lock until its etcd lease expires (connectors'
# LOCK_TTL_S = 10 s); a restarted pipeline retries for up to this long before giving up.
LOCK_WAIT_S = 30.0
STOP_POLL_S = 0.5  # how often `run` looks for a stop request while the query runs


def reader_options(source: SourceConfig) -> dict[str, str]:
    """The `danube` source options for a pipeline source (lineage column always on)."""
    options = {
        opt.ETCD_ENDPOINTS: source.etcd_endpoints,
        opt.STORAGE_URL: source.storage_url,
        opt.SUBSCRIPTION: source.subscription,
        opt.FAIL_ON_DATA_LOSS: str(source.fail_on_data_loss).lower(),
        opt.INCLUDE_SOURCE: "true",
    }
    optional = {
        opt.TOPIC: ",".join(source.topics) or None,
        opt.TOPIC_PATTERN: source.topic_pattern,
        opt.NAMESPACE: source.namespace,
        opt.STORAGE_OPTIONS: json.dumps(dict(source.storage_options)) if source.storage_options else None,
        opt.ROOT_PREFIX: source.root_prefix,
        opt.WAL_ROOT: source.wal_root,
        opt.STARTING_OFFSETS: source.starting_offsets,
        opt.MAX_MESSAGES_PER_TRIGGER: _text(source.max_messages_per_trigger),
        opt.MAX_BYTES_PER_TRIGGER: source.max_bytes_per_trigger,
    }
    options.update({k: v for k, v in optional.items() if v is not None})
    options.update(source.options)
    return options


def lost_offsets_option(config: PipelineConfig) -> dict[str, str]:
    """With failOnDataLoss=false, executors record the offsets they skip under the checkpoint
    (`connectors.loss_records`), so query progress counts them; only for a checkpoint fsspec
    can reach too (a local path, `file://`, `s3://`, `dbfs:/` through its `/dbfs` mount, ...;
    not e.g. `abfss://` without adlfs)."""
    if config.source.fail_on_data_loss:
        return {}
    from urllib.parse import urlsplit

    from fsspec.registry import known_implementations

    checkpoint = config.checkpoint.rstrip("/")
    scheme = urlsplit(checkpoint).scheme
    if scheme == "dbfs":  # fsspec's dbfs needs a workspace token; clusters mount DBFS at /dbfs
        checkpoint, scheme = "/dbfs/" + checkpoint[len("dbfs:"):].lstrip("/"), ""
    if scheme and scheme not in known_implementations:
        logger.info("pipeline %s: executor-side data loss is logged, not counted in query progress "
                    "(fsspec cannot reach the checkpoint %s)", config.name, config.checkpoint)
        return {}
    return {opt.LOST_OFFSETS_LOCATION: f"{checkpoint}/danube-lost-offsets"}


# Query progress carries these per batch under `observedMetrics[OBSERVED_INPUT]`. Spark only
# reports metrics observed in the streaming plan, i.e. before foreachBatch; how the rows split
# between target and quarantine is decided inside the batch (decode, expectations), so those
# counts are in the Delta commits' userMetadata (`counts`), the log and `PipelineMetrics`.
OBSERVED_INPUT = "danube_input"


def observe_input(stream: DataFrame) -> DataFrame:
    """`stream` with per-batch input counts observed (`rows_in`, `payload_bytes_in`)."""
    return stream.observe(
        OBSERVED_INPUT,
        F.count(F.lit(1)).alias("rows_in"),
        F.coalesce(F.sum(F.length("payload")), F.lit(0)).cast("long").alias("payload_bytes_in"),
    )


def check_trigger_limits(config: PipelineConfig, spark_version: str) -> None:
    """Spark 4.0 and 4.1 cannot limit a Python stream's batches (`connectors.spark_compat`):
    a pipeline file's per-batch caps are refused there, by key, before the session starts."""
    from connectors.spark_compat import ADMISSION_CONTROL_SINCE, spark_version_tuple

    if spark_version_tuple(spark_version) >= spark_version_tuple(ADMISSION_CONTROL_SINCE):
        return
    caps = {"max_messages_per_trigger": config.source.max_messages_per_trigger,
            "max_bytes_per_trigger": config.source.max_bytes_per_trigger}
    for key, value in caps.items():
        if value is not None:
            raise ConfigError(
                f"{config.file}: source.{key} needs Spark {ADMISSION_CONTROL_SINCE} or later, which lets a "
                f"Python stream limit its batches; this is Spark {spark_version}, where every batch reads "
                f"all available messages: remove the key, or run on Spark {ADMISSION_CONTROL_SINCE}+")


def _text(value: int | None) -> str | None:
    return None if value is None else str(value)


class PipelineRunner:
    """Starts, runs and stops one pipeline's streaming query."""

    def __init__(self, config: PipelineConfig, spark: SparkSession | None = None, *,
                 hooks: BatchHooks = NO_HOOKS) -> None:
        self.config = config
        self.hooks = hooks  # passed to the sink: the fault battery's (`pipelines.batch_hooks`)
        self.options = {**lost_offsets_option(config), **reader_options(config.source)}
        try:
            parsed = opt.parse_options(self.options)
        except ConfigError as exc:
            raise ConfigError(f"{config.file}: source: {exc}") from exc
        check_trigger_limits(config, spark.version if spark is not None else running_spark_version())
        # Before the session, which takes tens of seconds to start: a wrong etcd endpoint,
        # storage URL or subject fails in about a second, naming the key to fix; so does a
        # metrics port in use (`metrics.port`), bound here for whoever runs the pipeline.
        check_services(config, self.options)
        self.metrics = PipelineMetrics()
        self.endpoint: MetricsEndpoint | None = _metrics_endpoint(config)
        if self.endpoint is not None:
            self.endpoint.follow(self.metrics)
        try:
            self._start(config, spark, parsed)
        except BaseException:
            if self.endpoint is not None:
                self.endpoint.close()
            raise

    def _start(self, config: PipelineConfig, spark: SparkSession | None, parsed: opt.DanubeOptions) -> None:
        """The session, the quality gate, etcd and the decoder: what `__init__` sets up after
        the checks and the metrics endpoint (which it closes if this fails)."""
        # The session comes before the quality gate: great-expectations' Spark datasource would
        # otherwise create a plain one (without the Delta and Avro packages) that every later
        # getOrCreate reuses.
        self.spark = spark or _session(config)
        credentials = {k: v for k, v in self.options.items() if k.lower().startswith("etcd.") and k != opt.ETCD_ENDPOINTS}
        if credentials:  # the cursor-committing listener needs the source's etcd credentials/TLS
            connectors.register(self.spark, etcd_options=credentials)
        self.gate = QualityGate(config.expectations) if config.expectations is not None else None
        self.metadata: MetadataStore = parsed.etcd.connect()
        schemas = SubjectSchemas(self.metadata, config.decode.subject) if config.decode.subject else None
        self.decoder = Decoder(config.decode, schemas)
        self.query: StreamingQuery | None = None
        self._writer: DeltaBatchWriter | None = None
        self._closed = False
        self._stop_requested = threading.Event()

    def check_checkpoint(self) -> None:
        """Refuse to start when a table holds batches of this pipeline its checkpoint does not
        know (deleted, replaced or restored from an old copy): `CheckpointMismatchError`."""
        checkpoint = read_state(self.spark, self.config.checkpoint)
        trails = [read_trail(self.spark, table, self.config.name) for table in pipeline_tables(self.config)]
        check_checkpoint(self.config.name, checkpoint, [t for t in trails if t is not None])

    def start(self) -> StreamingQuery:
        """Start the query and return at once (processingTime pipelines keep running).

        The checkpoint is checked against the tables first (`check_checkpoint`); the sink
        checks again before every batch it writes."""
        self.check_checkpoint()
        writer = DeltaBatchWriter(self.config, self.decoder, self.gate, self.options, self.metadata, self.metrics,
                                  hooks=self.hooks)
        self._writer = writer
        stream = observe_input(self.spark.readStream.format("danube").options(**self.options).load())
        builder = (
            stream.writeStream.queryName(self.config.name)
            .foreachBatch(writer)
            .option("checkpointLocation", self.config.checkpoint)
        )
        trigger = self.config.trigger
        if trigger.mode == AVAILABLE_NOW:
            builder = builder.trigger(availableNow=True)
        else:
            builder = builder.trigger(processingTime=f"{trigger.interval_ms} milliseconds")
        self.query = builder.start()
        logger.info("pipeline %s started (query %s, trigger %s)", self.config.name, self.query.id, trigger.mode)
        return self.query

    def request_stop(self) -> None:
        """Make `run` stop the query and return. Safe in a signal handler: it calls no Spark
        method (a handler runs inside the main thread's blocking Py4J call, whose connection a
        second call from the handler would corrupt, failing the stop)."""
        self._stop_requested.set()

    def run(self, lock_wait_s: float = LOCK_WAIT_S) -> PipelineMetrics:
        """Start and block until the query ends (availableNow) or is stopped; re-raise its failure.

        The subscription lock is taken when the query first plans, so a predecessor that died
        still holding it fails the new query at once; it is restarted until the lock expires.
        `request_stop()` ends the wait: the query is stopped here, on the calling thread.
        """
        deadline = time.monotonic() + lock_wait_s
        while True:
            query = self.query or self.start()
            try:
                # The ignore: pyspark takes a float timeout (it sends int(timeout * 1000) ms) but
                # annotates it as int.
                while not query.awaitTermination(STOP_POLL_S):  # type: ignore[arg-type]
                    if self._stop_requested.is_set():
                        self.stop()
                        return self.metrics
                return self.metrics
            except StreamingQueryException as exc:
                if not _worth_restarting(str(exc)) or time.monotonic() >= deadline:
                    raise
                logger.info("pipeline %s: %s; restarting the query", self.config.name,
                            "subscription still locked by a previous run" if _subscription_busy(str(exc))
                            else "the source's Python process did not start in time")
                self.query = None
                time.sleep(1.0)

    def stop(self) -> None:
        """Stop the query (the current batch finishes or is replayed next time), release its
        subscription lock (`release_after_stop`), close etcd and the metrics endpoint."""
        if self.query is not None and self.query.isActive:
            self.query.stop()
        if self._closed:
            return
        self._closed = True
        lock = self._writer.lock if self._writer is not None else None
        try:
            if lock is not None:
                try:
                    release_after_stop(self.metadata, lock)
                except DanubeError as exc:  # the lease then expires on its own
                    logger.warning("pipeline %s: could not release subscription lock %s: %s",
                                   self.config.name, lock.key, exc)
        finally:
            self.metadata.close()
            if self.endpoint is not None:
                self.endpoint.close()


def _subscription_busy(error: str) -> bool:
    cause = error_type_in(error)
    return cause is not None and issubclass(cause, SubscriptionBusyError)


def _worth_restarting(error: str) -> bool:
    """A query failure a restart of the query (same JVM) can cure: the subscription still
    locked by a predecessor (decided by the error's type), or Spark's source process not
    connecting back within Spark's fixed 10 s (`PythonWorkerFactory.createSimpleWorker`;
    Python's start-up alone exceeds it on an overloaded machine). The latter is a JVM error
    with no class of ours, so its text is all there is to match."""
    return _subscription_busy(error) or "Python worker failed to connect back" in error


def _metrics_endpoint(config: PipelineConfig) -> MetricsEndpoint | None:
    """The Prometheus endpoint of the file's `metrics:` section, following nothing yet (None
    without one); ConfigError naming `metrics.port` if it cannot be bound."""
    if config.metrics is None:
        return None
    from pipelines.metrics_endpoint import MetricsEndpoint

    return MetricsEndpoint(config)


def _session(config: PipelineConfig) -> SparkSession:
    from pipelines.session import build_session

    return build_session(f"danube-pipeline-{config.name}", conf=dict(config.spark_conf))

