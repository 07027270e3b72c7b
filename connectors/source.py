"""The `danube` PySpark data source: validates options and wires the readers."""

from __future__ import annotations

from dataclasses import replace
from typing import MutableMapping

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from connectors.options import DanubeOptions, parse_options
from connectors.plain_errors import FailedStreamReader, plain_config_errors, report_plainly
from danube_core.errors import ConfigError
from connectors.schema import projected_columns, spark_schema


class DanubeDataSource(DataSource):
    """Read Danube topics straight from Danube storage, in batch or as a stream.

    Messages are read from the sealed `.dnb1` objects in cloud storage (found through the
    object descriptors in etcd) and the newest ones from the brokers' WAL files, in one offset
    space. Partitions of a partitioned topic (`/ns/t-part-N`) are read as separate topics.
    A stream commits its subscription cursor to etcd once Spark has committed each batch.

    Setup::

        import connectors
        connectors.register(spark)   # format("danube") + the cursor-committing listener

    (`pip install danube-spark` also installs `pyspark_danube`, which Spark 4.2 discovers on
    its own, so `format("danube")` works without the call. Cursors are then committed by the
    stream itself when Spark plans the trigger after each batch; the listener the call
    installs commits them as soon as each batch's progress is posted.)

    Batch example::

        df = (spark.read.format("danube")
              .option("etcd.endpoints", "etcd-0:2379,etcd-1:2379")
              .option("storage.url", "s3://danube-bucket")
              .option("storage.client_kwargs.endpoint_url", "http://minio:9000")
              .option("topic", "/default/orders")
              .option("startingOffsets", "earliest")
              .load())

    Streaming example::

        q = (spark.readStream.format("danube")
             .option("etcd.endpoints", "etcd-0:2379")
             .option("storage.url", "s3://danube-bucket")
             .option("topicPattern", "/default/orders.*")
             .option("subscription", "orders-to-delta")
             .option("maxMessagesPerTrigger", "100000")
             .load()
             .writeStream.format("delta").option("checkpointLocation", "/chk/orders")
             .trigger(availableNow=True).start("/tables/orders"))

    Options (keys are case-insensitive; a bad value fails `load()` with a ValueError
    (`danube_core.errors.ConfigError`) naming the option, the value and what is accepted, as
    the first line after Spark's `[PYTHON_DATA_SOURCE_ERROR]` prefix). Coming from Spark's Kafka source:
    `maxOffsetsPerTrigger` / `minOffsetsPerTrigger` are accepted as they are, offsets JSON
    may be Kafka's nested `{"/ns/topic": {"0": 12, "1": -2}}` (partition N is `-part-N`), and
    a Kafka option with no equivalent (`subscribe`, `includeHeaders`, `minPartitions`, ...)
    fails naming the danube option to use instead:

    Where
      etcd.endpoints       required. `host:port`, `http(s)://host:port`, comma-separated.
      etcd.user, etcd.password    etcd authentication (both or neither).
      etcd.caCert          CA certificate file: enables TLS.
      etcd.certKey, etcd.certCert client key and certificate files (both or neither).
      etcd.timeoutMs       per-request etcd timeout, default 5000.
      rootPrefix           the brokers' `wal_cloud.uploader.root_prefix`, default
                           `/danube-data`, used exactly as written.
      storage.url          required. fsspec URL of the storage root the brokers upload to:
                           `s3://bucket[/prefix]`, `gcs://...`, `az://...`, `file:///dir`.
      storage.<key>        fsspec storage options. Dots nest: `storage.client_kwargs.
                           endpoint_url` -> {"client_kwargs": {"endpoint_url": ...}}. Values
                           are strings, `true`/`false` become booleans.
      storage.options      a JSON object of storage options, for values of other types or
                           names with capitals (Spark lower-cases option keys); the dotted
                           keys are laid over it.
      walRoot              where the newest (not yet uploaded) messages are read from:
                           `auto` (default) = the `wal_url` each of our brokers registers
                           in etcd; an fsspec URL/path of a shared WAL root; a template with
                           `{broker_id}`; a JSON map `{"<broker id>": "<WAL root URL>"}`;
                           `none` = sealed objects only. Real Danube brokers register no
                           `wal_url`: with `auto` their not-yet-uploaded tail is not read,
                           and the query says so (one warning per topic naming the broker,
                           and `unreadTail` in query progress). Point it at their WAL root
                           (`wal_cloud.wal.dir`) through a shared volume, or run the
                           read-only HTTP server beside each broker
                           (`python -m broker.wal_http --dir <wal dir> --listen 0.0.0.0:7700`,
                           fsspec reads it with ranged requests) and map broker ids to
                           `http://<host>:7700/`. The WAL URL must be reachable from the
                           driver and every executor.

    What (exactly one of)
      topic                a topic or a comma-separated list; a partitioned topic's base
                           name reads all its partitions.
      topicPattern         a regular expression matched against whole topic names
                           (`/ns/topic`, or the base name of a partition).
      namespace            every topic of the namespace.
      Topics and partitions created while a stream runs are picked up between batches and
      read from their earliest offset.

    From / to
      startingOffsets      `earliest` | `latest` | `cursor` (resume at the subscription's
                           cursor + 1; topics without a cursor start at latest) | JSON
                           `{"/ns/topic": offset}` (-2 = earliest, -1 = latest; a base name
                           covers all partitions; every topic read must be covered).
                           Default: `latest` for streams, `earliest` for batches.
      startingTimestamp    milliseconds since the epoch: start at the first message
                           published at or after it (excludes startingOffsets).
      endingOffsets        batch only: `latest` (default) | JSON `{"/ns/topic": offset}`,
                           end-exclusive (-1 = latest).
      endingTimestamp      batch only: end before the first message published at or after it.
      A restarted stream resumes from its checkpoint, not from these options.

    How much (streams; `maxPartitionBytes` also for batches)
      maxMessagesPerTrigger  at most this many messages per micro-batch.
      maxBytesPerTrigger     at most this many frame bytes per micro-batch (e.g. `64m`);
                             exact, from descriptor indexes and WAL frame headers.
      minMessagesPerTrigger  defer a micro-batch until this many messages are available ...
      maxTriggerDelay        ... or this long has passed since the last one (default `15m`;
                             e.g. `500ms`, `30s`, `2h`). Ignored with Trigger.AvailableNow.
      maxPartitionBytes      split large objects into tasks of about this many bytes at
                             offset-index entries (default `128m`).
      Trigger.AvailableNow reads what exists when the run starts, in batches bounded as above.

    Cursors and behaviour
      subscription         required for streams: the Danube subscription whose cursor
                           (`/topics/{ns}/{topic}/subscriptions/{sub}/cursor`, the last
                           offset the sink has written) the query commits. The subscription
                           is registered if missing; a second live query on it is refused,
                           and a query whose lock lease is lost stops without moving cursors.
                           Spark does not tell a Python source at `load()` whether it is a
                           stream, so a stream without it fails as it starts: the query
                           terminates with the ConfigError (`awaitTermination()` raises it).
      failOnDataLoss       `true` (default): fail on a gap, a missing object, a CRC error,
                           offsets that go backwards, or offsets a broker reused, naming
                           topic, offsets and object, before anything is returned or
                           committed; `false`: log, count and skip (counts in query
                           progress under `skippedOffsets`).
      lostOffsetsLocation  streams with failOnDataLoss=false: an fsspec URL (a directory on
                           storage both the driver and every executor reach, e.g. under the
                           checkpoint) where executors record the offsets they skip, so
                           those count in `skippedOffsets` too (at the next trigger). Without
                           it only losses the driver finds while planning are counted there;
                           executors' are logged. `storage.*` options apply when it has the
                           storage URL's scheme.
      failOnMissingTopic   `false` (default): a `topic` that does not exist (yet) is named in
                           a WARNING with the topics its namespace has, listed under
                           `missingTopics` in query progress, gets no subscription record,
                           and is read once it is created; `true`: the read fails instead.
      includeSource        `true` adds the column `source`: the object id or `wal`.
      salvage              batch only, with one `topic`: read these sources whole instead
                           of the topic's offset space: comma-separated object ids
                           (`data-0-1795442995.dnb1`) and WAL files (`<URL>` for every run
                           in it, `<URL>#<byte>` for one run), as `python -m connectors runs`
                           lists them. Adds the `source` column (provenance).

    Offset reuse (real Danube brokers): a broker restarted without a seal, or the new owner
    of a topic whose move raced its seal, starts again at offset 0 and overwrites
    descriptors, so one offset names two messages. Reads return the current run only, never
    a mix of two runs at one offset; the older run's messages at reused offsets are data
    loss (see failOnDataLoss) and stay in storage. `python -m connectors runs --etcd ...
    --storage-url ... --topic ...` lists every run (object, WAL file, offsets, publish
    times, whether a descriptor references it) and the `salvage` value that lands the
    older runs in a table with their provenance.

    Schema: topic string (base name, without `-part-N`), partition int (N, or null),
    offset long, publish_time timestamp, producer_name string, producer_id decimal(20,0),
    payload binary, attributes map<string,string>, schema_id decimal(20,0),
    schema_version long [, source string]. u64 values are exact. A query that needs some of
    them names those in a schema, e.g. `.schema("payload binary, offset bigint")`: only they
    are decoded and sent to the JVM, in its order (a `select` after `load()` does not save
    that: Spark gives a Python source no projection). A column the source has not, or
    another type, fails `load()` naming it.

    Progress and lag: each source's `latestOffset` in query progress is JSON with the newest
    offsets and, under `lag`, per topic the messages, bytes and milliseconds (publish_time)
    the subscription is behind; the same is logged at INFO every batch and stored in the
    subscription's etcd record under `lag`. `skippedOffsets` counts per topic what
    failOnDataLoss=false skipped so far; `unreadTail` names, per topic, the broker whose WAL
    cannot be read, the first unread offset, and the highest offset etcd proves exists
    (`atLeastThrough`, from subscription cursors; null when unknown). `missingTopics` lists
    the named topics that do not exist (yet).
    """

    def __init__(self, options: MutableMapping[str, str]) -> None:
        super().__init__(options)
        try:
            self.parsed = parse_options(options)
        except ConfigError as error:
            report_plainly(error)  # `load()` fails with our message first, not a traceback
            raise

    @classmethod
    def name(cls) -> str:
        return "danube"

    def schema(self) -> StructType:
        return spark_schema(self.parsed.include_source)

    def _projected(self, schema: StructType | None) -> DanubeOptions:
        """The options with the columns `schema` names (a user's `.schema(...)`, or ours; None,
        from a caller other than Spark: all of them)."""
        if schema is None:
            return self.parsed
        return replace(self.parsed, columns=projected_columns(schema, self.parsed.include_source))

    @plain_config_errors
    def reader(self, schema: StructType) -> DataSourceReader:
        from connectors.batch import DanubeBatchReader

        return DanubeBatchReader(self._projected(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from connectors.stream import DanubeStreamReader

        try:
            return DanubeStreamReader(self._projected(schema))
        except Exception as error:  # PySpark would hide it behind an UnboundLocalError
            return FailedStreamReader(error)
