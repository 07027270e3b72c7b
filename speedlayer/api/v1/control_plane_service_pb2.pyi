from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EventStreamMessage(_message.Message):
    __slots__ = ("event_id", "tenant_id", "worker_id", "register_event", "heartbeat_event", "data_pull_status_update", "registration_ack", "data_assignment", "heartbeat_ack", "data_unassignment")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    REGISTER_EVENT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_EVENT_FIELD_NUMBER: _ClassVar[int]
    DATA_PULL_STATUS_UPDATE_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_ACK_FIELD_NUMBER: _ClassVar[int]
    DATA_ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_ACK_FIELD_NUMBER: _ClassVar[int]
    DATA_UNASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    tenant_id: str
    worker_id: str
    register_event: RegisterEvent
    heartbeat_event: HeartbeatEvent
    data_pull_status_update: DataPullStatusUpdateEvent
    registration_ack: RegistrationAckEvent
    data_assignment: DataAssignmentEvent
    heartbeat_ack: HeartbeatAckEvent
    data_unassignment: DataUnassignmentEvent
    def __init__(self, event_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., register_event: _Optional[_Union[RegisterEvent, _Mapping]] = ..., heartbeat_event: _Optional[_Union[HeartbeatEvent, _Mapping]] = ..., data_pull_status_update: _Optional[_Union[DataPullStatusUpdateEvent, _Mapping]] = ..., registration_ack: _Optional[_Union[RegistrationAckEvent, _Mapping]] = ..., data_assignment: _Optional[_Union[DataAssignmentEvent, _Mapping]] = ..., heartbeat_ack: _Optional[_Union[HeartbeatAckEvent, _Mapping]] = ..., data_unassignment: _Optional[_Union[DataUnassignmentEvent, _Mapping]] = ...) -> None: ...

class RegisterEvent(_message.Message):
    __slots__ = ("address", "capacity", "held_epochs", "metrics_address")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    HELD_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    address: str
    capacity: WorkerCapacity
    held_epochs: _containers.RepeatedCompositeFieldContainer[HeldEpoch]
    metrics_address: str
    def __init__(self, address: _Optional[str] = ..., capacity: _Optional[_Union[WorkerCapacity, _Mapping]] = ..., held_epochs: _Optional[_Iterable[_Union[HeldEpoch, _Mapping]]] = ..., metrics_address: _Optional[str] = ...) -> None: ...

class HeldEpoch(_message.Message):
    __slots__ = ("dataset_id", "epoch_id", "status", "rows", "bytes")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    epoch_id: str
    status: DataPullStatusUpdateEvent.Status
    rows: int
    bytes: int
    def __init__(self, dataset_id: _Optional[str] = ..., epoch_id: _Optional[str] = ..., status: _Optional[_Union[DataPullStatusUpdateEvent.Status, str]] = ..., rows: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class HeartbeatEvent(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: ResourceStatus
    def __init__(self, status: _Optional[_Union[ResourceStatus, _Mapping]] = ...) -> None: ...

class DataPullStatusUpdateEvent(_message.Message):
    __slots__ = ("dataset_id", "epoch_id", "status", "error_message", "rows", "bytes", "seconds", "memory_bytes")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN: _ClassVar[DataPullStatusUpdateEvent.Status]
        IN_PROGRESS: _ClassVar[DataPullStatusUpdateEvent.Status]
        COMPLETED: _ClassVar[DataPullStatusUpdateEvent.Status]
        FAILED: _ClassVar[DataPullStatusUpdateEvent.Status]
    UNKNOWN: DataPullStatusUpdateEvent.Status
    IN_PROGRESS: DataPullStatusUpdateEvent.Status
    COMPLETED: DataPullStatusUpdateEvent.Status
    FAILED: DataPullStatusUpdateEvent.Status
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    epoch_id: str
    status: DataPullStatusUpdateEvent.Status
    error_message: str
    rows: int
    bytes: int
    seconds: float
    memory_bytes: int
    def __init__(self, dataset_id: _Optional[str] = ..., epoch_id: _Optional[str] = ..., status: _Optional[_Union[DataPullStatusUpdateEvent.Status, str]] = ..., error_message: _Optional[str] = ..., rows: _Optional[int] = ..., bytes: _Optional[int] = ..., seconds: _Optional[float] = ..., memory_bytes: _Optional[int] = ...) -> None: ...

class RegistrationAckEvent(_message.Message):
    __slots__ = ("heartbeat_interval_seconds", "master_id", "lease_ttl_seconds")
    HEARTBEAT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MASTER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_seconds: int
    master_id: str
    lease_ttl_seconds: int
    def __init__(self, heartbeat_interval_seconds: _Optional[int] = ..., master_id: _Optional[str] = ..., lease_ttl_seconds: _Optional[int] = ...) -> None: ...

class DataAssignmentEvent(_message.Message):
    __slots__ = ("dataset_id", "epoch_id", "load_plan")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_ID_FIELD_NUMBER: _ClassVar[int]
    LOAD_PLAN_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    epoch_id: str
    load_plan: LoadPlan
    def __init__(self, dataset_id: _Optional[str] = ..., epoch_id: _Optional[str] = ..., load_plan: _Optional[_Union[LoadPlan, _Mapping]] = ...) -> None: ...

class DataUnassignmentEvent(_message.Message):
    __slots__ = ("dataset_id", "epoch_id", "reason")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    epoch_id: str
    reason: str
    def __init__(self, dataset_id: _Optional[str] = ..., epoch_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class HeartbeatAckEvent(_message.Message):
    __slots__ = ("requested_action",)
    class Action(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        NONE: _ClassVar[HeartbeatAckEvent.Action]
        DRAIN: _ClassVar[HeartbeatAckEvent.Action]
    NONE: HeartbeatAckEvent.Action
    DRAIN: HeartbeatAckEvent.Action
    REQUESTED_ACTION_FIELD_NUMBER: _ClassVar[int]
    requested_action: HeartbeatAckEvent.Action
    def __init__(self, requested_action: _Optional[_Union[HeartbeatAckEvent.Action, str]] = ...) -> None: ...

class WorkerCapacity(_message.Message):
    __slots__ = ("memory_bytes", "cpu_cores")
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_CORES_FIELD_NUMBER: _ClassVar[int]
    memory_bytes: int
    cpu_cores: int
    def __init__(self, memory_bytes: _Optional[int] = ..., cpu_cores: _Optional[int] = ...) -> None: ...

class ResourceStatus(_message.Message):
    __slots__ = ("memory_used_bytes", "cpu_load_avg_5m")
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_LOAD_AVG_5M_FIELD_NUMBER: _ClassVar[int]
    memory_used_bytes: int
    cpu_load_avg_5m: float
    def __init__(self, memory_used_bytes: _Optional[int] = ..., cpu_load_avg_5m: _Optional[float] = ...) -> None: ...

class LoadPlan(_message.Message):
    __slots__ = ("plan_id", "source", "destination_table_name", "arrow_schema", "tenant_id", "dataset_id", "epoch_id", "estimated_memory_bytes", "total_rows", "partition_columns", "base_epoch_id", "version", "tail")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_TABLE_NAME_FIELD_NUMBER: _ClassVar[int]
    ARROW_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_ID_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_ROWS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    BASE_EPOCH_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    source: DataSource
    destination_table_name: str
    arrow_schema: bytes
    tenant_id: str
    dataset_id: str
    epoch_id: str
    estimated_memory_bytes: int
    total_rows: int
    partition_columns: _containers.RepeatedScalarFieldContainer[str]
    base_epoch_id: str
    version: int
    tail: str
    def __init__(self, plan_id: _Optional[str] = ..., source: _Optional[_Union[DataSource, _Mapping]] = ..., destination_table_name: _Optional[str] = ..., arrow_schema: _Optional[bytes] = ..., tenant_id: _Optional[str] = ..., dataset_id: _Optional[str] = ..., epoch_id: _Optional[str] = ..., estimated_memory_bytes: _Optional[int] = ..., total_rows: _Optional[int] = ..., partition_columns: _Optional[_Iterable[str]] = ..., base_epoch_id: _Optional[str] = ..., version: _Optional[int] = ..., tail: _Optional[str] = ...) -> None: ...

class DataSource(_message.Message):
    __slots__ = ("iceberg", "olap", "delta")
    ICEBERG_FIELD_NUMBER: _ClassVar[int]
    OLAP_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    iceberg: IcebergSource
    olap: OlapSource
    delta: DeltaSource
    def __init__(self, iceberg: _Optional[_Union[IcebergSource, _Mapping]] = ..., olap: _Optional[_Union[OlapSource, _Mapping]] = ..., delta: _Optional[_Union[DeltaSource, _Mapping]] = ...) -> None: ...

class IcebergSource(_message.Message):
    __slots__ = ("table_name", "snapshot_id", "files")
    TABLE_NAME_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    table_name: str
    snapshot_id: str
    files: _containers.RepeatedCompositeFieldContainer[DataFile]
    def __init__(self, table_name: _Optional[str] = ..., snapshot_id: _Optional[str] = ..., files: _Optional[_Iterable[_Union[DataFile, _Mapping]]] = ...) -> None: ...

class DeltaSource(_message.Message):
    __slots__ = ("table_uri", "version", "commit_timestamp_ms", "files", "added_files")
    TABLE_URI_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    ADDED_FILES_FIELD_NUMBER: _ClassVar[int]
    table_uri: str
    version: int
    commit_timestamp_ms: int
    files: _containers.RepeatedCompositeFieldContainer[DataFile]
    added_files: _containers.RepeatedCompositeFieldContainer[DataFile]
    def __init__(self, table_uri: _Optional[str] = ..., version: _Optional[int] = ..., commit_timestamp_ms: _Optional[int] = ..., files: _Optional[_Iterable[_Union[DataFile, _Mapping]]] = ..., added_files: _Optional[_Iterable[_Union[DataFile, _Mapping]]] = ...) -> None: ...

class OlapSource(_message.Message):
    __slots__ = ("dsn", "snapshot_query", "catalog", "database", "table", "partition_spec")
    class PartitionSpecEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DSN_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_QUERY_FIELD_NUMBER: _ClassVar[int]
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    DATABASE_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_SPEC_FIELD_NUMBER: _ClassVar[int]
    dsn: str
    snapshot_query: str
    catalog: str
    database: str
    table: str
    partition_spec: _containers.ScalarMap[str, str]
    def __init__(self, dsn: _Optional[str] = ..., snapshot_query: _Optional[str] = ..., catalog: _Optional[str] = ..., database: _Optional[str] = ..., table: _Optional[str] = ..., partition_spec: _Optional[_Mapping[str, str]] = ...) -> None: ...

class DataFile(_message.Message):
    __slots__ = ("uri", "format", "size_bytes", "partition_values", "record_count")
    class PartitionValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    URI_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PARTITION_VALUES_FIELD_NUMBER: _ClassVar[int]
    RECORD_COUNT_FIELD_NUMBER: _ClassVar[int]
    uri: str
    format: str
    size_bytes: int
    partition_values: _containers.ScalarMap[str, str]
    record_count: int
    def __init__(self, uri: _Optional[str] = ..., format: _Optional[str] = ..., size_bytes: _Optional[int] = ..., partition_values: _Optional[_Mapping[str, str]] = ..., record_count: _Optional[int] = ...) -> None: ...
