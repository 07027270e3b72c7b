"""The etcd flags of every command-line tool: the same names, checks and errors everywhere.

`python -m broker.admin`, `python -m broker.tools objects` and `python -m connectors` reach
etcd through `add_etcd_flags` (on their argparse parser) and `etcd_settings_from_args` (the
parsed flags into one `EtcdSettings`, checked by `parse_etcd_settings`, so a bad value and a
refused connection name the flag to fix):

    --etcd HOST:PORT[,HOST:PORT]   endpoints (`https://host:port` for TLS with the system's CAs)
    --etcd-user USER               with the password from $DANUBE_ETCD_PASSWORD or
    --etcd-password-file PATH      a file holding it (one trailing newline is not part of it)
    --etcd-ca-cert PEM             the CA that signed etcd's certificate: TLS
    --etcd-cert-key PEM            a client certificate's key ...
    --etcd-cert-cert PEM           ... and the certificate
    --etcd-timeout-ms N            every request's and each endpoint's connection check's bound

The password is never a flag's value: a command line is visible to every user of the host
(`ps`, /proc). `--etcd-password-file` wins over the environment variable (an explicit flag
over an exported variable); errors name whichever was used, never the password.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Mapping

from danube_core.errors import ConfigError
from danube_core.etcd_settings import DEFAULT_TIMEOUT_MS, ENDPOINT_FORMS, EtcdKeyNames, EtcdSettings, parse_etcd_settings

PASSWORD_ENV = "DANUBE_ETCD_PASSWORD"
PASSWORD_FILE_FLAG = "--etcd-password-file"

# Each setting's flag (argparse stores `--etcd-ca-cert` as `etcd_ca_cert`); the password has none.
_FLAGS = {"endpoints": "--etcd", "user": "--etcd-user", "ca_cert": "--etcd-ca-cert",
          "cert_key": "--etcd-cert-key", "cert_cert": "--etcd-cert-cert", "timeout_ms": "--etcd-timeout-ms"}
# The flags beside --etcd: a tool that can take its settings from elsewhere (a config file)
# refuses them there rather than ignoring them.
CONNECTION_FLAGS = (_FLAGS["user"], PASSWORD_FILE_FLAG, _FLAGS["ca_cert"], _FLAGS["cert_key"],
                    _FLAGS["cert_cert"], _FLAGS["timeout_ms"])


def add_etcd_flags(parser: argparse.ArgumentParser, *, required: bool = False, default: str | None = None,
                   endpoints_group: Any = None) -> None:
    """Add `--etcd` and the `--etcd-*` flags to `parser`.

    `required`/`default` are `--etcd`'s; `endpoints_group` (e.g. a mutually exclusive group
    holding `--config`) receives `--etcd` instead of `parser`."""
    shown_default = f" (default {default})" if default else ""
    (endpoints_group or parser).add_argument(
        _FLAGS["endpoints"], required=required, default=default, metavar="HOST:PORT",
        help=f"etcd endpoints: {ENDPOINT_FORMS}{shown_default}")
    group = parser.add_argument_group(
        "etcd connection", f"TLS and authentication; the password comes from ${PASSWORD_ENV} or "
                           f"{PASSWORD_FILE_FLAG}, never from the command line")
    group.add_argument(_FLAGS["user"], metavar="USER", help="etcd user (with a password)")
    group.add_argument(PASSWORD_FILE_FLAG, metavar="PATH",
                       help=f"file holding the user's password (instead of ${PASSWORD_ENV})")
    group.add_argument(_FLAGS["ca_cert"], metavar="PEM", help="the CA that signed etcd's certificate (turns TLS on)")
    group.add_argument(_FLAGS["cert_key"], metavar="PEM", help=f"client key (with {_FLAGS['cert_cert']})")
    group.add_argument(_FLAGS["cert_cert"], metavar="PEM", help=f"client certificate (with {_FLAGS['cert_key']})")
    group.add_argument(_FLAGS["timeout_ms"], metavar="MS",
                       help=f"bound on every etcd request and connection check (default {DEFAULT_TIMEOUT_MS})")


def etcd_settings_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> EtcdSettings:
    """The settings the flags of `add_etcd_flags` give; ConfigError names the flag (or
    $DANUBE_ETCD_PASSWORD) of a bad value, and so do the hints of a failed `connect()`."""
    password, password_source = _password(args, os.environ if environ is None else environ)
    names = EtcdKeyNames(password=password_source, **_FLAGS)
    values = {name: getattr(args, _dest(flag)) for name, flag in _FLAGS.items()}
    return parse_etcd_settings({**values, "password": password}, names, _invalid)


def connection_flags_given(args: argparse.Namespace) -> list[str]:
    """The `--etcd-*` flags set on this command line (beside `--etcd`)."""
    return [flag for flag in CONNECTION_FLAGS if getattr(args, _dest(flag)) is not None]


def _password(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """(the password or None, what it came from: the name errors and hints use)."""
    path = getattr(args, _dest(PASSWORD_FILE_FLAG))
    if path is not None:
        return _read_password(path), PASSWORD_FILE_FLAG
    if environ.get(PASSWORD_ENV):  # an empty variable is an unset one
        return environ[PASSWORD_ENV], f"${PASSWORD_ENV}"
    return None, f"${PASSWORD_ENV} or {PASSWORD_FILE_FLAG}"


def _read_password(path: str) -> str:
    try:
        with open(path, "rb") as file:
            raw = file.read()
    except OSError as exc:
        raise ConfigError(f"{PASSWORD_FILE_FLAG} {path!r}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:  # its message quotes the bytes, which are the secret
        raise ConfigError(f"{PASSWORD_FILE_FLAG} {path!r}: not UTF-8 text") from None
    return text.removesuffix("\n").removesuffix("\r")


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _invalid(key: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"{key} {value!r}: expected {expected}")
