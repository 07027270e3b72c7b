"""What a pipeline needs before its Spark session starts: etcd answering, the storage URL
reachable, the registry subject registered.

A Spark session takes tens of seconds to start (JVM, Ivy, the Python data source), and a
wrong etcd endpoint, storage URL or subject found only by the query comes back after that as
chained Java and Python tracebacks. `check_services` asks each of them directly, in about a
second, and raises one error whose message names the pipeline file, the key to fix and what
was tried:

* `MetadataUnavailableError`: no endpoint of `source.etcd_endpoints` answered within the
  connection check's timeout (`MetadataError` if one answered and refused);
* `ObjectStoreError`: `source.storage_url` could not be reached, refused access, or names a
  path through a file or a bucket that does not exist;
* `ConfigError`: `decode.subject` is not registered.

The etcd check is `EtcdMetadataStore`'s own connection check (the broker and its admin CLI
make the same one), with a short timeout unless the source sets `etcd.timeoutMs`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping

from connectors import options as opt
from danube_core.errors import ConfigError, MetadataError, ObjectStoreError
from danube_core.metadata import MetadataStore
from danube_core.objectstore import ObjectStore, translate_error
from pipelines.config import PipelineConfig
from pipelines.subject_schemas import SubjectSchemas

logger = logging.getLogger(__name__)

# A live etcd answers the connection check (a Status call) in milliseconds; the run's own
# timeout (`etcd.timeoutMs`, 5 s by default) would make a silent host cost 5 s per endpoint.
ETCD_CHECK_TIMEOUT_MS = 2000
# botocore retries a refused connection four times with backoff (~8 s) and waits 60 s for a
# connection: the check makes one attempt, bounded, so the message comes in time and names
# the endpoint. Other settings of `config_kwargs` (addressing style, signature) are kept.
S3_CHECK_TIMEOUT_S = 2.0
_S3_CHECK_CONFIG = {"retries": {"max_attempts": 1}, "connect_timeout": S3_CHECK_TIMEOUT_S,
                    "read_timeout": S3_CHECK_TIMEOUT_S}
_S3_PROTOCOLS = ("s3", "s3a")


def check_services(config: PipelineConfig, options: Mapping[str, str]) -> None:
    """Check etcd, storage and the registry subject, in this order, for `config`, whose
    `danube` source options are `options`; the first problem found is raised (module doc)."""
    source = opt.parse_options(options)
    etcd_timeout_set = opt.ETCD_TIMEOUT_MS.lower() in {key.lower() for key in options}
    timeout_ms = source.etcd.timeout_ms if etcd_timeout_set else min(source.etcd.timeout_ms, ETCD_CHECK_TIMEOUT_MS)
    with connect_etcd(config, source.etcd, timeout_ms) as metadata:
        check_storage(config, source.storage_url, source.storage_options)
        check_subject(config, metadata)


def connect_etcd(config: PipelineConfig, settings: opt.EtcdSettings, timeout_ms: int) -> MetadataStore:
    """A store on `settings`' etcd, connected within `timeout_ms` per endpoint; the error
    names the file, `source.etcd_endpoints`, every endpoint tried and what to fix
    (`EtcdSettings.connect`: is etcd running there, the CA for a TLS etcd, the password)."""
    try:
        return dataclasses.replace(settings, timeout_ms=timeout_ms).connect()
    except MetadataError as exc:
        raise type(exc)(f"{config.file}: source.etcd_endpoints: {exc}") from exc
    except ConfigError as exc:  # a TLS file that cannot be read, user without password, ...
        raise ConfigError(f"{config.file}: source: {exc}") from exc


def check_subject(config: PipelineConfig, metadata: MetadataStore) -> None:
    """`decode.subject` (if any) is registered; ConfigError naming it and how to register it."""
    subject = config.decode.subject
    if subject is None:
        return
    try:
        SubjectSchemas(metadata, subject).subject_metadata()
    except ConfigError as exc:
        raise ConfigError(
            f"{config.file}: decode.subject: schema registry subject {subject!r} is not registered in etcd "
            f"{config.source.etcd_endpoints}; register it through the broker (danube-client "
            f"`client.schema().register_schema({subject!r})`, as `python -m devstack demo` does) "
            "or set decode.inline_schema instead"
        ) from exc


def check_storage(config: PipelineConfig, url: str, storage_options: Mapping[str, Any]) -> None:
    """`source.storage_url` answers and is (or is under) a directory.

    A root that does not exist yet is fine when its nearest existing parent is a directory:
    the broker creates it with its first upload. A missing bucket, a path through a file, a
    refused credential or an endpoint that does not answer are errors naming the URL.
    """
    store = ObjectStore(url, _check_options(url, storage_options))  # ConfigError on an unknown scheme
    fs = store.fs
    path = fs._strip_protocol(store.url)
    while True:
        try:
            info = fs.info(path)
            break
        except FileNotFoundError as exc:
            parent = fs._parent(path)
            if not parent or parent == path:
                raise _storage_error(config, url, f"{fs.unstrip_protocol(path)} does not exist") from exc
            path = parent
        except Exception as exc:  # the I/O boundary: every backend error becomes one message
            retriable = translate_error(exc, store.url, "check").retriable
            raise _storage_error(config, url, _cause(exc, retriable), retriable) from exc
    if info.get("type") != "directory":
        raise _storage_error(config, url, f"{fs.unstrip_protocol(path)} is a file, not a directory")
    logger.debug("storage %s reachable (%s exists)", store.url, fs.unstrip_protocol(path))


def _check_options(url: str, storage_options: Mapping[str, Any]) -> dict[str, Any]:
    """`storage_options` for the check: on S3, one bounded attempt (see `_S3_CHECK_CONFIG`)."""
    options = dict(storage_options)
    if url.split("://", 1)[0] in _S3_PROTOCOLS:
        options["config_kwargs"] = {**dict(options.get("config_kwargs") or {}), **_S3_CHECK_CONFIG}
    return options


def _cause(exc: BaseException, retriable: bool) -> str:
    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, PermissionError):
        return f"access refused (see the credentials in source.storage_options): {detail}"
    return f"not reachable: {detail}" if retriable else detail


def _storage_error(config: PipelineConfig, url: str, problem: str, retriable: bool = False) -> ObjectStoreError:
    error = ObjectStoreError(f"{config.file}: source.storage_url {url}: {problem}")
    error.retriable = retriable
    return error
