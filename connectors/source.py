"""The `danube` PySpark data source: validates options and wires the readers."""

from __future__ import annotations

from typing import MutableMapping

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from connectors.options import parse_options
from connectors.schema import spark_schema


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
    its own, so `format("danube")` works without the call; the call is still what installs
    the listener that keeps cursors current.)

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

    Options (keys are case-insensitive; a bad value fails `load()` with a ValueError naming
    the option, the value and what is accepted):

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
                           `auto` (default) = the `wal_url` each broker registers in etcd;
                           an fsspec URL/path of a shared WAL root, or a template with
                           `{broker_id}`; `none` = sealed objects only.

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
                           is registered if missing; a second live query on it is refused.
      failOnDataLoss       `true` (default): fail on a gap, a missing object, a CRC error
                           or offsets that go backwards, naming topic, offsets and object;
                           `false`: log, count and skip.
      includeSource        `true` adds the column `source`: the object id or `wal`.

    Schema: topic string (base name, without `-part-N`), partition int (N, or null),
    offset long, publish_time timestamp, producer_name string, producer_id decimal(20,0),
    payload binary, attributes map<string,string>, schema_id decimal(20,0),
    schema_version long [, source string]. u64 values are exact.

    Progress and lag: each source's `latestOffset` in query progress is JSON with the newest
    offsets and, under `lag`, per topic the messages, bytes and milliseconds (publish_time)
    the subscription is behind; the same is logged at INFO every batch and stored in the
    subscription's etcd record under `lag`.
    """

    def __init__(self, options: MutableMapping[str, str]) -> None:
        super().__init__(options)
        self.parsed = parse_options(options)

    @classmethod
    def name(cls) -> str:
        return "danube"

    def schema(self) -> StructType:
        return spark_schema(self.parsed.include_source)

    def reader(self, schema: StructType) -> DataSourceReader:
        from connectors.batch import DanubeBatchReader

        return DanubeBatchReader(self.parsed)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from connectors.stream import DanubeStreamReader

        return DanubeStreamReader(self.parsed)
