"""A trivial PySpark data source that passes Arrow IPC files through unchanged: the API's ceiling.

`bench/bench_connector.py` compares the `danube` source with this one on the same rows: both
yield the same Arrow record batches from `read()`, but this one only memory-maps a file that
already holds them (zero-copy, no decoding, no planning lookups), so whatever it costs is the
cost of the Python data source API itself (Python workers, Arrow serialisation to the JVM).

    spark.dataSource.register(PassthroughDataSource)
    df = spark.read.format("passthrough").option("path", "/dir/of/arrow/files").load()

Option `path`: a directory of Arrow IPC files (`*.arrow`); each file is one partition, read
batch by batch. The Spark schema is the first file's Arrow schema.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

if TYPE_CHECKING:
    import pyarrow as pa

PATH_OPTION = "path"


def _files(options: dict) -> list[str]:
    if PATH_OPTION not in options:
        raise ValueError(f"passthrough source: option {PATH_OPTION!r} (a directory of .arrow files) is required")
    files = sorted(str(p) for p in Path(options[PATH_OPTION]).glob("*.arrow"))
    if not files:
        raise ValueError(f"passthrough source: no *.arrow files in {PATH_OPTION}={options[PATH_OPTION]!r}")
    return files


class PassthroughPartition(InputPartition):
    """One Arrow IPC file."""

    def __init__(self, index: int, path: str) -> None:
        super().__init__(index)
        self.path = path


class PassthroughReader(DataSourceReader):
    """Yields each file's record batches as they are stored."""

    def __init__(self, files: list[str]) -> None:
        self.files = files

    def partitions(self) -> list[InputPartition]:
        return [PassthroughPartition(i, path) for i, path in enumerate(self.files)]

    def read(self, partition: InputPartition) -> Iterator["pa.RecordBatch"]:
        import pyarrow as pa

        assert isinstance(partition, PassthroughPartition)
        with pa.memory_map(partition.path) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)


class PassthroughDataSource(DataSource):
    """`format("passthrough")`: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "passthrough"

    def schema(self) -> StructType:
        import pyarrow as pa
        from pyspark.sql.pandas.types import from_arrow_schema

        with pa.memory_map(_files(self.options)[0]) as source:
            return from_arrow_schema(pa.ipc.open_file(source).schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        return PassthroughReader(_files(self.options))
