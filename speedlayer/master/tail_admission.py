"""Admitting a dataset with its topic's tail: what must hold, each refusal naming the field.

A tail (`AdmitDatasetRequest.tail`, off when absent) is the pipeline's file, sent as text, and
the limits of what a worker may hold. Before anything is persisted the master checks:

* `tail.limit_rows` > 0 and `tail.limit_bytes` >= 0 (a tail that may hold nothing is no tail);
* the source is a Delta table followed at its latest version (`source.delta_table.pin_version`
  off): a pinned version would never hand over to a newer epoch;
* the tail process (`python -m pipelines tail`, `check`) finds it a valid pipeline file (the
  pipeline's own parser), its etcd and storage answering, its `decode.subject` registered and
  its named topics existing (the checks `python -m pipelines run` makes before Spark starts);
* its topics are in namespaces the tenant may read (`/tenants/{t}/config` `topic_namespaces`;
  empty: any), else PERMISSION_DENIED naming `source.topics`;
* the table's commits up to the admitted version name topic offsets in their `userMetadata`
  (the table was written by a pipeline), and by this pipeline (`name`): else the tail could
  not tell where the epoch ends.

The master may not import the pipelines package (it imports the speed layer's announcer): the
pipeline file is checked by the pipeline's own code in a tail process, asked once per admission.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Callable, Mapping

from speedlayer.api.v1 import management_service_pb2 as mg
from speedlayer.errors import InvalidRequestError, PreconditionError, TenantIsolationError
from speedlayer.records import AssignmentRecord, DatasetSpec, TenantConfig
from speedlayer.sources import ResolvedTable
from speedlayer.sources.delta_offsets import DeltaOffsets
from speedlayer.tail_spec import TailSpec

logger = logging.getLogger(__name__)

FIELD = "tail.pipeline_config"


def validate_tail(request: mg.AdmitDatasetRequest) -> None:
    """The request's own fields (no I/O)."""
    if not request.HasField("tail"):
        return
    tail = request.tail
    if tail.limit_rows <= 0:
        raise InvalidRequestError(f"tail.limit_rows={tail.limit_rows}: a tail holds at most this many rows "
                                  "on a worker; give a positive number (e.g. 1000000)")
    if tail.limit_bytes < 0:
        raise InvalidRequestError(f"tail.limit_bytes={tail.limit_bytes}: expected 0 (no byte limit) or more")
    if not tail.pipeline_config.strip():
        raise InvalidRequestError(f"{FIELD} is empty: give the pipeline file that writes the table")
    if request.source.WhichOneof("source_type") != "delta_table":
        raise InvalidRequestError("tail: only a Delta table written by a pipeline has a tail (source.delta_table)")
    if request.source.delta_table.pin_version:
        raise InvalidRequestError("tail with source.delta_table.pin_version: a pinned version never hands over "
                                  "to a newer epoch; admit the table at its latest version to serve its tail")


def admit_tail(request: mg.AdmitDatasetRequest, tenant: TenantConfig, resolved: ResolvedTable,
               offsets: DeltaOffsets, check: Callable[[str], dict] | None = None) -> TailSpec:
    """The tail spec of an admission (without offsets: each epoch's plan gets its own), or the
    refusal naming the field (module doc). `check`: the tail process's checks of the file."""
    uri, version = resolved.source.delta.table_uri, resolved.version
    held = offsets.at(uri, version)
    if not held.offsets:
        raise PreconditionError(f"source.delta_table.table_uri {uri}: no commit up to version {version} names "
                                "topic offsets in its userMetadata, so the table was not written by a pipeline "
                                "and has no tail to serve (admit it without a tail)")
    facts = pipeline_facts(request.tail.pipeline_config, check or check_in_tail_process)
    _check_namespaces(list(facts.get("namespaces", ())), tenant, request.tenant_id)
    if held.pipelines and facts.get("name") not in held.pipelines:
        raise InvalidRequestError(f"{FIELD}: name {facts.get('name')!r} is not the pipeline that writes "
                                  f"{uri} (its commits name {sorted(held.pipelines)})")
    return TailSpec(request.tail.pipeline_config, request.tail.limit_rows, request.tail.limit_bytes)


def plan_tail(record: AssignmentRecord, resolved: ResolvedTable, admitting: Mapping[tuple[str, str], TailSpec],
              spec_of: Callable[[str, str], DatasetSpec | None], offsets: DeltaOffsets) -> str:
    """An epoch plan's tail spec (JSON) with the offsets its version holds; "" without a tail. The
    tail is the one being admitted (`admitting`), else the dataset spec's. A sharded epoch serves
    none: its shards sit on several workers, and each would add the tail to the merge."""
    if record.sharded or record.kind == "shard":
        return ""
    tail = admitting.get((record.tenant, record.dataset))
    if tail is None:
        spec = spec_of(record.tenant, record.dataset)
        if spec is None or not spec.tail:
            return ""
        tail = TailSpec.from_json(spec.tail)
    return tail.at(offsets.at(resolved.source.delta.table_uri, resolved.version).offsets).to_json()


def pipeline_facts(text: str, check: Callable[[str], dict]) -> dict:
    """What the tail process says of the pipeline file (`check`: its name, the namespaces it reads)
    after its own checks; each failure as the refusal naming the field."""
    from speedlayer.protocol.tail_wire import TailWireError

    try:
        return check(text)
    except TailWireError as exc:
        said = exc.message if exc.message.startswith(FIELD) else f"{FIELD}: {exc.message}"
        if exc.error in ("ConfigError", "ValueError", "YAMLError", "ScannerError", "ParserError"):
            raise InvalidRequestError(said) from exc
        raise PreconditionError(said) from exc  # etcd or storage unreachable, the process failed


_CHECKED: dict[str, tuple[float, dict]] = {}  # sha256 of a pipeline file -> (when, what its check said)
_CHECKED_LOCK = threading.Lock()
CHECK_REUSE_S = 60.0  # a retried admission (its client timed out) reuses the check, not a second process


def check_in_tail_process(text: str) -> dict:
    """One `python -m pipelines tail` asked to `check` the pipeline file (the master may not
    import the pipelines package: it imports the speed layer's announcer). A file that passed
    within CHECK_REUSE_S is not checked again."""
    from speedlayer.protocol.tail_process import TailProcess

    key = hashlib.sha256(text.encode()).hexdigest()
    with _CHECKED_LOCK:
        known = _CHECKED.get(key)
    if known is not None and time.monotonic() - known[0] < CHECK_REUSE_S:
        return known[1]
    process = TailProcess()
    try:
        facts = dict(process.ask("check", pipeline_config=text)[0])
    finally:
        process.close()
    with _CHECKED_LOCK:
        _CHECKED[key] = (time.monotonic(), facts)
    return facts


def _check_namespaces(namespaces: list[str], tenant: TenantConfig, tenant_id: str) -> None:
    if not tenant.topic_namespaces:
        return
    refused = [ns for ns in namespaces if ns not in tenant.topic_namespaces]
    if refused:
        raise TenantIsolationError(f"{FIELD}: source.topics: tenant {tenant_id!r} may not read topics of "
                                   f"namespace(s) {refused} (its topic_namespaces: {list(tenant.topic_namespaces)})")
