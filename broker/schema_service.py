"""Danube's `SchemaRegistry` gRPC service (package `danube_schema`) over `danube_core.schema_registry`.

danube-client's `client.schema()` registers and reads schemas here, and a producer built
`with_schema(subject)` asks for the subject's latest version, then stamps every message with
its schema id and version: the ids the pipelines decode by. Subject operations are served in
full. The topic-level validation settings (ConfigureTopicSchema, UpdateTopicValidationPolicy,
GetTopicSchemaConfig) are refused as UNIMPLEMENTED: this broker stores payloads without
validating them, so accepting a policy it would not enforce would mislead the caller.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from danube.proto import SchemaRegistry_pb2 as pb
from danube.proto import SchemaRegistry_pb2_grpc as pb_grpc

from danube_core.metadata import MetadataStore
from danube_core.schema_compat import MODES
from danube_core.schema_records import SchemaDef, SchemaMetadata, SchemaVersion
from danube_core.schema_registry import (
    KIND_CLIENT_NAMES, IncompatibleSchemaError, InvalidSchemaError, SchemaNotFoundError, SchemaRegistry, schema_def,
)

from broker.client_errors import ConflictError, InvalidRequestError, NotFoundError
from broker.grpc_services import translated

TOPIC_VALIDATION_UNSUPPORTED = ("topic schema validation is not supported by this broker: it stores payloads "
                                "without validating them against a schema")


async def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a blocking registry call off the event loop, its errors as the broker's client errors."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except SchemaNotFoundError as exc:
        raise NotFoundError(str(exc)) from exc
    except InvalidSchemaError as exc:
        raise InvalidRequestError(str(exc)) from exc
    except IncompatibleSchemaError as exc:
        raise ConflictError(str(exc)) from exc


def _definition(schema_type: str, data: bytes, field: str) -> SchemaDef:
    """The request's schema as a checked `schema_def`; INVALID_ARGUMENT naming `field` if it is not one."""
    try:
        return schema_def(schema_type, data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InvalidRequestError(f"{field} is not UTF-8 text: {exc}") from exc
    except InvalidSchemaError as exc:
        raise InvalidRequestError(f"{field}: {exc}") from exc


def _schema_response(meta: SchemaMetadata, version: SchemaVersion, mode: str) -> pb.GetSchemaResponse:
    definition = version.schema_def
    return pb.GetSchemaResponse(
        schema_id=meta.id, version=version.version, subject=meta.subject,
        schema_type=KIND_CLIENT_NAMES[definition.kind],
        schema_definition=(definition.raw_schema or "").encode(), description=version.description,
        created_at=version.created_at, created_by=version.created_by, tags=version.tags,
        fingerprint=version.fingerprint, compatibility_mode=mode,
    )


class SchemaRegistryService(pb_grpc.SchemaRegistryServicer):
    def __init__(self, metadata: MetadataStore) -> None:
        self._registry = SchemaRegistry(metadata)

    def _lookup(self, subject: str, number: int | None) -> pb.GetSchemaResponse:
        meta, version = self._registry.version(subject, number)
        return _schema_response(meta, version, self._registry.mode(subject))

    @translated
    async def RegisterSchema(self, request: pb.RegisterSchemaRequest, context: Any) -> pb.RegisterSchemaResponse:
        definition = _definition(request.schema_type, request.schema_definition, "schema_definition")
        found = await _call(self._registry.register, request.subject, definition,
                            created_by=request.created_by or "unknown", description=request.description,
                            tags=list(request.tags))
        return pb.RegisterSchemaResponse(schema_id=found.schema_id, version=found.version,
                                         is_new_version=found.is_new_version, fingerprint=found.fingerprint)

    @translated
    async def GetSchema(self, request: pb.GetSchemaRequest, context: Any) -> pb.GetSchemaResponse:
        subject = await _call(self._registry.subject_of, request.schema_id)
        number = request.version if request.HasField("version") else None
        return await _call(self._lookup, subject, number)

    @translated
    async def GetLatestSchema(self, request: pb.GetLatestSchemaRequest, context: Any) -> pb.GetSchemaResponse:
        return await _call(self._lookup, request.subject, None)

    @translated
    async def ListVersions(self, request: pb.ListVersionsRequest, context: Any) -> pb.ListVersionsResponse:
        meta = await _call(self._registry.subject, request.subject)
        return pb.ListVersionsResponse(versions=[
            pb.SchemaVersionInfo(version=v.version, created_at=v.created_at, created_by=v.created_by,
                                 description=v.description, fingerprint=v.fingerprint, schema_id=meta.id)
            for v in meta.versions])

    @translated
    async def CheckCompatibility(self, request: pb.CheckCompatibilityRequest,
                                 context: Any) -> pb.CheckCompatibilityResponse:
        definition = _definition(request.schema_type, request.new_schema_definition, "new_schema_definition")
        mode = request.compatibility_mode.lower() if request.HasField("compatibility_mode") else None
        if mode is not None and mode not in MODES:
            raise InvalidRequestError(f"compatibility_mode {request.compatibility_mode!r}: expected one of "
                                      f"{', '.join(MODES)}")
        errors = await _call(self._registry.check, request.subject, definition, mode)
        return pb.CheckCompatibilityResponse(is_compatible=not errors, errors=errors)

    @translated
    async def DeleteSchemaVersion(self, request: pb.DeleteSchemaVersionRequest,
                                  context: Any) -> pb.DeleteSchemaVersionResponse:
        await _call(self._registry.delete_version, request.subject, request.version)
        return pb.DeleteSchemaVersionResponse(success=True,
                                              message=f"deleted {request.subject} version {request.version}")

    @translated
    async def SetCompatibilityMode(self, request: pb.SetCompatibilityModeRequest,
                                   context: Any) -> pb.SetCompatibilityModeResponse:
        await _call(self._registry.set_mode, request.subject, request.compatibility_mode)
        return pb.SetCompatibilityModeResponse(success=True, message=f"{request.subject}: {request.compatibility_mode}")

    async def ConfigureTopicSchema(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, TOPIC_VALIDATION_UNSUPPORTED)

    async def UpdateTopicValidationPolicy(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, TOPIC_VALIDATION_UNSUPPORTED)

    async def GetTopicSchemaConfig(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, TOPIC_VALIDATION_UNSUPPORTED)


def add_schema_registry(server: grpc.aio.Server, metadata: MetadataStore) -> None:
    """Serve the `danube_schema.SchemaRegistry` service on `server`."""
    pb_grpc.add_SchemaRegistryServicer_to_server(SchemaRegistryService(metadata), server)
