"""The metadata results of Flight SQL (`GetSqlInfo`, `GetCatalogs`, `GetDbSchemas`, `GetTables`,
`GetTableTypes`) as Arrow tables with the schemas FlightSql.proto prescribes.

The tree a BI tool shows is one catalog (`speedlayer`), one schema per tenant (the caller's
own only) and one table per dataset of the tenant, each with the Arrow schema of its newest
READY epoch and Flight SQL's column metadata (`column_metadata`). Filter patterns are SQL LIKE patterns (`%`, `_`, escaped with `\\`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa

from speedlayer.gateway.flight_sql.column_metadata import described
from speedlayer.gateway.flight_sql.statements import CATALOG

TABLE_TYPE = "TABLE"
SERVER_NAME = "danube-spark speed layer"

CATALOGS_SCHEMA = pa.schema([pa.field("catalog_name", pa.utf8(), nullable=False)])
DB_SCHEMAS_SCHEMA = pa.schema([pa.field("catalog_name", pa.utf8()),
                               pa.field("db_schema_name", pa.utf8(), nullable=False)])
TABLES_SCHEMA = pa.schema([pa.field("catalog_name", pa.utf8()), pa.field("db_schema_name", pa.utf8()),
                           pa.field("table_name", pa.utf8(), nullable=False),
                           pa.field("table_type", pa.utf8(), nullable=False)])
TABLES_WITH_SCHEMA_SCHEMA = TABLES_SCHEMA.append(pa.field("table_schema", pa.binary(), nullable=False))
TABLE_TYPES_SCHEMA = pa.schema([pa.field("table_type", pa.utf8(), nullable=False)])
PRIMARY_KEYS_SCHEMA = pa.schema([
    pa.field("catalog_name", pa.utf8()), pa.field("db_schema_name", pa.utf8()),
    pa.field("table_name", pa.utf8(), nullable=False), pa.field("column_name", pa.utf8(), nullable=False),
    pa.field("key_name", pa.utf8()), pa.field("key_sequence", pa.int32(), nullable=False)])
FOREIGN_KEYS_SCHEMA = pa.schema([
    pa.field("pk_catalog_name", pa.utf8()), pa.field("pk_db_schema_name", pa.utf8()),
    pa.field("pk_table_name", pa.utf8(), nullable=False), pa.field("pk_column_name", pa.utf8(), nullable=False),
    pa.field("fk_catalog_name", pa.utf8()), pa.field("fk_db_schema_name", pa.utf8()),
    pa.field("fk_table_name", pa.utf8(), nullable=False), pa.field("fk_column_name", pa.utf8(), nullable=False),
    pa.field("key_sequence", pa.int32(), nullable=False), pa.field("fk_key_name", pa.utf8()),
    pa.field("pk_key_name", pa.utf8()), pa.field("update_rule", pa.uint8(), nullable=False),
    pa.field("delete_rule", pa.uint8(), nullable=False)])

_SQL_INFO_VALUE = pa.dense_union([
    pa.field("string_value", pa.utf8()), pa.field("bool_value", pa.bool_()),
    pa.field("bigint_value", pa.int64()), pa.field("int32_bitmask", pa.int32()),
    pa.field("string_list", pa.list_(pa.field("item", pa.utf8()))),
    pa.field("int32_to_int32_list_map", pa.map_(pa.int32(), pa.list_(pa.field("item", pa.int32())))),
])
SQL_INFO_SCHEMA = pa.schema([pa.field("info_name", pa.uint32(), nullable=False),
                             pa.field("value", _SQL_INFO_VALUE, nullable=False)])

# SqlInfo ids (FlightSql.proto's `SqlInfo` enum) and their values here.
SERVER_NAME_ID, SERVER_VERSION_ID, ARROW_VERSION_ID, READ_ONLY_ID, SQL_ID = 0, 1, 2, 3, 4
SUBSTRAIT_ID, TRANSACTION_ID, CANCEL_ID, STATEMENT_TIMEOUT_ID = 5, 8, 9, 100
IDENTIFIER_QUOTE_CHAR_ID, SCHEMA_TERM_ID, CATALOG_TERM_ID = 504, 529, 531
TRANSACTION_NONE = 0  # SqlSupportedTransaction.SQL_SUPPORTED_TRANSACTION_NONE


@dataclass(frozen=True)
class DatasetTable:
    """One dataset as a table: its name and the schema of its newest READY epoch (None: no READY
    epoch yet)."""

    name: str
    schema: pa.Schema | None


def sql_info(requested: list[int], server_version: str, statement_timeout_ms: int) -> pa.Table:
    """The `GetSqlInfo` answer: `requested` ids (all known ones if empty); unknown ids are left out."""
    values: dict[int, tuple[int, object]] = {  # id -> (union type code, value)
        SERVER_NAME_ID: (0, SERVER_NAME), SERVER_VERSION_ID: (0, server_version),
        ARROW_VERSION_ID: (0, pa.__version__), READ_ONLY_ID: (1, True), SQL_ID: (1, True),
        SUBSTRAIT_ID: (1, False), TRANSACTION_ID: (3, TRANSACTION_NONE), CANCEL_ID: (1, False),
        STATEMENT_TIMEOUT_ID: (3, statement_timeout_ms), IDENTIFIER_QUOTE_CHAR_ID: (0, '"'),
        SCHEMA_TERM_ID: (0, "tenant"), CATALOG_TERM_ID: (0, "catalog"),
    }
    ids = [i for i in (requested or sorted(values)) if i in values]
    children: list[list] = [[] for _ in _SQL_INFO_VALUE.type_codes]
    codes, offsets = [], []
    for info_id in ids:
        code, value = values[info_id]
        codes.append(code)
        offsets.append(len(children[code]))
        children[code].append(value)
    arrays = [pa.array(items, type=field.type) for items, field in zip(children, _SQL_INFO_VALUE)]
    union = pa.UnionArray.from_dense(pa.array(codes, pa.int8()), pa.array(offsets, pa.int32()), arrays,
                                     [f.name for f in _SQL_INFO_VALUE])
    return pa.Table.from_arrays([pa.array(ids, pa.uint32()), union], schema=SQL_INFO_SCHEMA)


def like(pattern: str | None, value: str) -> bool:
    """SQL LIKE (`%`, `_`, `\\` escapes) as Flight SQL's filter patterns mean it; None matches all."""
    if pattern is None:
        return True
    def piece(part: str) -> str:
        if part in ("%", "_"):
            return ".*" if part == "%" else "."
        return re.escape(part[1:] if part.startswith("\\") and len(part) == 2 else part)

    regex = "".join(piece(part) for part in re.findall(r"\\.|%|_|[^%_\\]+|\\", pattern))
    return re.fullmatch(regex, value, re.DOTALL) is not None


def catalogs() -> pa.Table:
    return pa.Table.from_pylist([{"catalog_name": CATALOG}], schema=CATALOGS_SCHEMA)


def _in_catalog(catalog: str | None) -> bool:
    """Flight SQL: an unset catalog matches all, an empty one only tables without a catalog."""
    return catalog is None or catalog == CATALOG


def db_schemas(tenant: str, catalog: str | None, schema_pattern: str | None) -> pa.Table:
    rows = [{"catalog_name": CATALOG, "db_schema_name": tenant}] \
        if _in_catalog(catalog) and like(schema_pattern, tenant) else []
    return pa.Table.from_pylist(rows, schema=DB_SCHEMAS_SCHEMA)


def tables(tenant: str, datasets: list[DatasetTable], *, catalog: str | None, schema_pattern: str | None,
           table_pattern: str | None, table_types: list[str], include_schema: bool) -> pa.Table:
    wanted = _in_catalog(catalog) and like(schema_pattern, tenant) and (not table_types or TABLE_TYPE in table_types)
    rows = []
    for dataset in sorted(datasets, key=lambda d: d.name) if wanted else []:
        if not like(table_pattern, dataset.name):
            continue
        row: dict[str, object] = {"catalog_name": CATALOG, "db_schema_name": tenant, "table_name": dataset.name,
                                  "table_type": TABLE_TYPE}
        if include_schema:
            schema = described(dataset.schema or pa.schema([]), (CATALOG, tenant, dataset.name))
            row["table_schema"] = schema.serialize().to_pybytes()
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=TABLES_WITH_SCHEMA_SCHEMA if include_schema else TABLES_SCHEMA)


def table_types() -> pa.Table:
    return pa.Table.from_pylist([{"table_type": TABLE_TYPE}], schema=TABLE_TYPES_SCHEMA)


def primary_keys() -> pa.Table:
    """Datasets have no keys: the answer to GetPrimaryKeys is empty."""
    return PRIMARY_KEYS_SCHEMA.empty_table()


def foreign_keys() -> pa.Table:
    """Nor foreign keys: GetExportedKeys, GetImportedKeys and GetCrossReference are empty."""
    return FOREIGN_KEYS_SCHEMA.empty_table()
