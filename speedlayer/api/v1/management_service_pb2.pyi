from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AdmitDatasetRequest(_message.Message):
    __slots__ = ("tenant_id", "dataset_id", "partitions_to_load", "source", "request_id", "replication", "tail")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_TO_LOAD_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    dataset_id: str
    partitions_to_load: _containers.RepeatedCompositeFieldContainer[PartitionSpec]
    source: DataSourceIdentifier
    request_id: str
    replication: int
    tail: TailOptions
    def __init__(self, tenant_id: _Optional[str] = ..., dataset_id: _Optional[str] = ..., partitions_to_load: _Optional[_Iterable[_Union[PartitionSpec, _Mapping]]] = ..., source: _Optional[_Union[DataSourceIdentifier, _Mapping]] = ..., request_id: _Optional[str] = ..., replication: _Optional[int] = ..., tail: _Optional[_Union[TailOptions, _Mapping]] = ...) -> None: ...

class TailOptions(_message.Message):
    __slots__ = ("pipeline_config", "limit_rows", "limit_bytes")
    PIPELINE_CONFIG_FIELD_NUMBER: _ClassVar[int]
    LIMIT_ROWS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    pipeline_config: str
    limit_rows: int
    limit_bytes: int
    def __init__(self, pipeline_config: _Optional[str] = ..., limit_rows: _Optional[int] = ..., limit_bytes: _Optional[int] = ...) -> None: ...

class AdmitDatasetResponse(_message.Message):
    __slots__ = ("epoch_id", "message", "status", "request_id")
    EPOCH_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    epoch_id: str
    message: str
    status: str
    request_id: str
    def __init__(self, epoch_id: _Optional[str] = ..., message: _Optional[str] = ..., status: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class PartitionSpec(_message.Message):
    __slots__ = ("values",)
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.ScalarMap[str, str]
    def __init__(self, values: _Optional[_Mapping[str, str]] = ...) -> None: ...

class DataSourceIdentifier(_message.Message):
    __slots__ = ("iceberg_table", "olap_table", "delta_table")
    ICEBERG_TABLE_FIELD_NUMBER: _ClassVar[int]
    OLAP_TABLE_FIELD_NUMBER: _ClassVar[int]
    DELTA_TABLE_FIELD_NUMBER: _ClassVar[int]
    iceberg_table: IcebergTable
    olap_table: OlapTable
    delta_table: DeltaTable
    def __init__(self, iceberg_table: _Optional[_Union[IcebergTable, _Mapping]] = ..., olap_table: _Optional[_Union[OlapTable, _Mapping]] = ..., delta_table: _Optional[_Union[DeltaTable, _Mapping]] = ...) -> None: ...

class IcebergTable(_message.Message):
    __slots__ = ("catalog", "database", "table")
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    DATABASE_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    catalog: str
    database: str
    table: str
    def __init__(self, catalog: _Optional[str] = ..., database: _Optional[str] = ..., table: _Optional[str] = ...) -> None: ...

class OlapTable(_message.Message):
    __slots__ = ("instance", "database", "table")
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    DATABASE_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    instance: str
    database: str
    table: str
    def __init__(self, instance: _Optional[str] = ..., database: _Optional[str] = ..., table: _Optional[str] = ...) -> None: ...

class DeltaTable(_message.Message):
    __slots__ = ("table_uri", "version", "pin_version")
    TABLE_URI_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PIN_VERSION_FIELD_NUMBER: _ClassVar[int]
    table_uri: str
    version: int
    pin_version: bool
    def __init__(self, table_uri: _Optional[str] = ..., version: _Optional[int] = ..., pin_version: _Optional[bool] = ...) -> None: ...

class DatasetStatusRequest(_message.Message):
    __slots__ = ("tenant_id", "dataset_id", "epoch_id")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_ID_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    dataset_id: str
    epoch_id: str
    def __init__(self, tenant_id: _Optional[str] = ..., dataset_id: _Optional[str] = ..., epoch_id: _Optional[str] = ...) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("worker_id", "state", "rows", "bytes", "seconds", "error", "leaving")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    state: str
    rows: int
    bytes: int
    seconds: float
    error: str
    leaving: bool
    def __init__(self, worker_id: _Optional[str] = ..., state: _Optional[str] = ..., rows: _Optional[int] = ..., bytes: _Optional[int] = ..., seconds: _Optional[float] = ..., error: _Optional[str] = ..., leaving: _Optional[bool] = ...) -> None: ...

class EpochStatus(_message.Message):
    __slots__ = ("epoch_id", "status", "message", "version", "total_rows", "estimated_memory_bytes", "replication", "replicas", "file_count", "kind", "base_epoch_id")
    EPOCH_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ROWS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    FILE_COUNT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BASE_EPOCH_ID_FIELD_NUMBER: _ClassVar[int]
    epoch_id: str
    status: str
    message: str
    version: int
    total_rows: int
    estimated_memory_bytes: int
    replication: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    file_count: int
    kind: str
    base_epoch_id: str
    def __init__(self, epoch_id: _Optional[str] = ..., status: _Optional[str] = ..., message: _Optional[str] = ..., version: _Optional[int] = ..., total_rows: _Optional[int] = ..., estimated_memory_bytes: _Optional[int] = ..., replication: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ..., file_count: _Optional[int] = ..., kind: _Optional[str] = ..., base_epoch_id: _Optional[str] = ...) -> None: ...

class DatasetStatusResponse(_message.Message):
    __slots__ = ("epochs",)
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    epochs: _containers.RepeatedCompositeFieldContainer[EpochStatus]
    def __init__(self, epochs: _Optional[_Iterable[_Union[EpochStatus, _Mapping]]] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ("tenant_id",)
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    def __init__(self, tenant_id: _Optional[str] = ...) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("tenant_id", "worker_id", "address", "memory_bytes", "cpu_cores", "memory_used_bytes", "epochs", "draining")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_CORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    worker_id: str
    address: str
    memory_bytes: int
    cpu_cores: int
    memory_used_bytes: int
    epochs: _containers.RepeatedScalarFieldContainer[str]
    draining: bool
    def __init__(self, tenant_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., address: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., cpu_cores: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., epochs: _Optional[_Iterable[str]] = ..., draining: _Optional[bool] = ...) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ...) -> None: ...

class DrainWorkerRequest(_message.Message):
    __slots__ = ("tenant_id", "worker_id")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    worker_id: str
    def __init__(self, tenant_id: _Optional[str] = ..., worker_id: _Optional[str] = ...) -> None: ...

class DrainWorkerResponse(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class SetTenantQuotaRequest(_message.Message):
    __slots__ = ("tenant_id", "memory_quota_bytes", "read_only", "source_roots")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_QUOTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ROOTS_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    memory_quota_bytes: int
    read_only: bool
    source_roots: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tenant_id: _Optional[str] = ..., memory_quota_bytes: _Optional[int] = ..., read_only: _Optional[bool] = ..., source_roots: _Optional[_Iterable[str]] = ...) -> None: ...

class TenantQuotaResponse(_message.Message):
    __slots__ = ("tenant_id", "memory_quota_bytes", "memory_used_bytes", "source_roots")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_QUOTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ROOTS_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    memory_quota_bytes: int
    memory_used_bytes: int
    source_roots: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tenant_id: _Optional[str] = ..., memory_quota_bytes: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., source_roots: _Optional[_Iterable[str]] = ...) -> None: ...
