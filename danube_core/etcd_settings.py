"""How to reach an etcd: endpoints, user/password, TLS files and timeout, for every part.

The broker (`meta_store.*`), the data source (options `etcd.*`), a pipeline (its source's
options, and its speed-layer feed) and the speed layer's masters and gateway (`etcd:` in
conf/speedlayer.yaml) all reach etcd through one `EtcdSettings`, checked by one
`parse_etcd_settings` and connected by one `EtcdSettings.connect`. Each part spells the keys
its own way (`meta_store.ca_cert`, `etcd.caCert`, `etcd.ca_cert`), so it hands its spelling in
as `EtcdKeyNames`: a bad value, and a connection that fails, name the key the user wrote and
what to fix there.

Secrets: the password never appears in a repr, an error or a log line (errors show
`<hidden>`); the TLS files are named by path only, their content is read by the etcd client.
This module imports nothing heavy (the data source's options, which hold an `EtcdSettings`, are
unpickled in every Python worker): the etcd client is imported by `connect`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from danube_core.errors import ConfigError, MetadataError, MetadataUnavailableError

if TYPE_CHECKING:
    from danube_core.metadata import MetadataStore

DEFAULT_TIMEOUT_MS = 5000
HIDDEN = "<hidden>"
ENDPOINT_FORMS = "host:port or http(s)://host:port, comma-separated for several"

# Words in a failed connection check that say what is wrong (etcd's and gRPC's texts).
_AUTH_FAILED = ("authentication failed", "invalid user id or password")
_AUTH_MISSING = ("user name is empty", "permission denied", "invalid auth token", "user name not found")
_TLS_FAILED = ("handshake", "certificate", "ssl")


@dataclass(frozen=True)
class EtcdKeyNames:
    """How one configuration spells the settings: errors and hints name these keys.

    `where` says what holds them (`speed layer config conf/speedlayer.yaml`) and prefixes
    connection errors; empty when the caller adds its own context."""

    endpoints: str
    user: str
    password: str
    ca_cert: str
    cert_key: str
    cert_cert: str
    timeout_ms: str
    where: str = ""

    @classmethod
    def section(cls, section: str, where: str = "") -> "EtcdKeyNames":
        """Keys of a YAML section, in the broker's spelling: `<section>.ca_cert`, ..."""
        names = {f.name: f"{section}.{f.name}" for f in dataclasses.fields(cls) if f.name != "where"}
        return cls(**names, where=where)


# The keys of a YAML section holding etcd settings (the speed layer's `etcd:`).
SECTION_KEYS = ("endpoints", "user", "password", "ca_cert", "cert_key", "cert_cert", "timeout_ms")

ErrorFactory = Callable[[str, Any, str], ConfigError]
"""(key, value as shown, what is expected) -> the caller's ConfigError, in its own wording."""


@dataclass(frozen=True)
class EtcdSettings:
    """How to reach one etcd. Picklable; equality ignores `names`.

    `endpoints`: comma-separated `host:port` / `http(s)://host:port`. `user`+`password`: etcd
    authentication. `ca_cert` (PEM path; or an `https://` endpoint with the system's roots)
    turns TLS on; `cert_key`+`cert_cert` add a client certificate. `timeout_ms` bounds every
    request and each endpoint's connection check."""

    endpoints: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_cert: str | None = None
    cert_key: str | None = None
    cert_cert: str | None = None
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    names: EtcdKeyNames | None = field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "names"}
        shown["password"] = None if self.password is None else HIDDEN
        return "EtcdSettings(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"

    @property
    def tls(self) -> bool:
        return self.ca_cert is not None or self.cert_cert is not None or "https://" in self.endpoints

    def with_endpoints(self, endpoints: str) -> "EtcdSettings":
        """The same credentials for another etcd (a pipeline's speed layer, a cursor store)."""
        return dataclasses.replace(self, endpoints=endpoints)

    def connect(self) -> "MetadataStore":
        """An `EtcdMetadataStore` on these settings, its connection checked now.

        Errors keep their type (`MetadataUnavailableError` stays retriable) and gain what to
        fix, naming the keys of `names`: the user and password etcd refused, the CA to set for
        a TLS etcd, the TLS files whose handshake failed. The password is never in them."""
        from danube_core.metadata_etcd import EtcdMetadataStore

        names = self.names or _PLAIN_NAMES
        try:
            return EtcdMetadataStore(
                self.endpoints, user=self.user, password=self.password, ca_cert=self.ca_cert,
                cert_key=self.cert_key, cert_cert=self.cert_cert, timeout_s=self.timeout_ms / 1000,
            )
        except MetadataError as exc:
            raise type(exc)(_with_context(names, f"{exc}; {self._hint(exc, names)}")) from exc
        except ConfigError as exc:  # a TLS file that cannot be read, a malformed endpoint
            raise ConfigError(_with_context(names, f"{_key_of(exc, names)}: {exc}")) from exc

    def _hint(self, exc: MetadataError, names: EtcdKeyNames) -> str:
        text = str(exc).lower()
        client_cert = f"{names.cert_key} and {names.cert_cert}"
        if isinstance(exc, MetadataUnavailableError):
            if self.tls and any(word in text for word in _TLS_FAILED):
                return (f"the TLS handshake failed: check {names.ca_cert} (the CA that signed etcd's certificate) "
                        f"and, if etcd asks for client certificates, {client_cert}")
            if not self.tls:
                return f"is etcd running there ({names.endpoints})? If it serves TLS (https), set {names.ca_cert}"
            return f"is etcd running there ({names.endpoints}), and does it serve TLS as {names.ca_cert} says?"
        if any(word in text for word in _AUTH_FAILED):
            return f"etcd refused the user and password: check {names.user} and {names.password}"
        if any(word in text for word in _AUTH_MISSING):
            return (f"etcd has authentication enabled: set {names.user} and {names.password}, "
                    f"or a client certificate ({client_cert})")
        return f"check {names.endpoints} and the etcd settings next to it"


def _key_of(exc: ConfigError, names: EtcdKeyNames) -> str:
    """The key a connection-time ConfigError is about (`EtcdMetadataStore` names the file's role)."""
    text = str(exc)
    for role, key in (("CA certificate", names.ca_cert), ("client key", names.cert_key),
                      ("client certificate", names.cert_cert)):
        if f"etcd {role} file" in text:
            return key
    return names.endpoints


def _with_context(names: EtcdKeyNames, message: str) -> str:
    return f"{names.where}: {message}" if names.where else message


def parse_etcd_settings(values: Mapping[str, Any], names: EtcdKeyNames, error: ErrorFactory, *,
                        default_endpoints: str | None = None) -> EtcdSettings:
    """Check one configuration's etcd values into `EtcdSettings`.

    `values` holds them by field (`endpoints`, `user`, `password`, `ca_cert`, `cert_key`,
    `cert_cert`, `timeout_ms`; absent or None: not set). `endpoints` is a string or a list of
    strings, `timeout_ms` an integer or its digits, the rest non-empty strings. `error` builds
    the caller's ConfigError; the password's value is shown as `<hidden>`."""
    endpoints = _endpoints(values.get("endpoints", default_endpoints), names.endpoints, error)
    text = {name: _text(values.get(name), getattr(names, name), error)
            for name in ("user", "ca_cert", "cert_key", "cert_cert")}
    password = values.get("password")
    if password is not None and not (isinstance(password, str) and password):
        raise error(names.password, HIDDEN, "a non-empty string")
    if (text["user"] is None) != (password is None):
        key, value, other = ((names.user, text["user"], names.password) if password is None
                             else (names.password, HIDDEN, names.user))
        raise error(key, value, f"given together with {other}")
    if (text["cert_key"] is None) != (text["cert_cert"] is None):
        key, other = ((names.cert_key, names.cert_cert) if text["cert_cert"] is None
                      else (names.cert_cert, names.cert_key))
        raise error(key, text["cert_key"] or text["cert_cert"], f"given together with {other}")
    return EtcdSettings(endpoints, password=password, timeout_ms=_timeout(values.get("timeout_ms"), names, error),
                        names=names, **text)


def _endpoints(value: Any, key: str, error: ErrorFactory) -> str:
    if value is None:
        raise error(key, value, ENDPOINT_FORMS)
    if isinstance(value, list):
        if not all(isinstance(v, str) for v in value):
            raise error(key, value, ENDPOINT_FORMS)
        value = ",".join(value)
    if not isinstance(value, str):
        raise error(key, value, ENDPOINT_FORMS)
    parts = [part.strip() for part in value.split(",")]
    if any(not part or any(ch.isspace() for ch in part) for part in parts):
        raise error(key, value, ENDPOINT_FORMS)
    return ",".join(parts)


def _text(value: Any, key: str, error: ErrorFactory) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise error(key, value, "a non-empty string")
    return value.strip()


def _timeout(value: Any, names: EtcdKeyNames, error: ErrorFactory) -> int:
    if value is None:
        return DEFAULT_TIMEOUT_MS
    number = value
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        number = int(value.strip())  # options are text
    if type(number) is not int or number < 1:
        raise error(names.timeout_ms, value, "an integer >= 1 (milliseconds)")
    return number


# For settings built without names (tests, tools): the speed layer's spelling, `etcd.ca_cert`.
_PLAIN_NAMES = EtcdKeyNames.section("etcd")
