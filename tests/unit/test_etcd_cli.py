"""`danube_core.etcd_cli`: the etcd flags every command-line tool shares. Values become one
`EtcdSettings`; a bad value fails before any connection, naming the flag (or the password's
variable) and never showing the password; each tool (`broker.admin`, `broker.tools`,
`python -m connectors`) exits 2 on it. Connections to a secured etcd are tested in
tests/integration/test_cli_secured_etcd.py."""

from __future__ import annotations

import argparse
import io

import pytest

from broker import admin, tools
from connectors import __main__ as connectors_cli
from danube_core.errors import ConfigError
from danube_core.etcd_cli import PASSWORD_ENV, add_etcd_flags, etcd_settings_from_args
from danube_core.etcd_settings import EtcdSettings

SECRET = "cli-Pw-83xQ-never-shown"


def settings(*argv: str, environ: dict[str, str] | None = None, **flags) -> EtcdSettings:
    parser = argparse.ArgumentParser()
    add_etcd_flags(parser, **flags)
    return etcd_settings_from_args(parser.parse_args(list(argv)), environ or {})


def refused(*argv: str, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        settings(*argv, environ=environ)
    message = str(info.value)
    assert SECRET not in message
    return message


def test_flags_become_settings_with_the_password_from_the_environment():
    got = settings("--etcd", "a:1, https://b:2", "--etcd-user", "root", "--etcd-ca-cert", "/ca.pem",
                   "--etcd-cert-key", "/k.pem", "--etcd-cert-cert", "/c.pem", "--etcd-timeout-ms", "3000",
                   environ={PASSWORD_ENV: SECRET})
    assert got == EtcdSettings("a:1,https://b:2", "root", SECRET, "/ca.pem", "/k.pem", "/c.pem", 3000)
    assert got.names is not None and (got.names.ca_cert, got.names.password) == ("--etcd-ca-cert", f"${PASSWORD_ENV}")
    assert SECRET not in repr(got)


def test_endpoints_keep_each_tools_default_and_required_ness():
    assert settings(default="127.0.0.1:2379") == EtcdSettings("127.0.0.1:2379")
    with pytest.raises(SystemExit):
        settings(required=True)


def test_the_password_file_wins_over_the_environment_without_its_trailing_newline(tmp_path):
    path = tmp_path / "password"
    path.write_text(SECRET + "\n")
    got = settings("--etcd", "a:1", "--etcd-user", "root", "--etcd-password-file", str(path),
                   environ={PASSWORD_ENV: "from-the-environment"})
    assert got.password == SECRET and got.names is not None and got.names.password == "--etcd-password-file"
    path.write_text(" " + SECRET + " \r\n")  # only the line end is not part of it
    assert settings("--etcd", "a:1", "--etcd-user", "root", "--etcd-password-file", str(path)).password == \
        " " + SECRET + " "


@pytest.mark.parametrize("argv, environ, named, expected", [
    (["--etcd-timeout-ms", "abc"], {}, "--etcd-timeout-ms", "expected an integer >= 1 (milliseconds)"),
    (["--etcd-timeout-ms", "0"], {}, "--etcd-timeout-ms", "an integer >= 1"),
    (["--etcd", "a 1"], {}, "--etcd", "host:port"),
    (["--etcd", "a:1,"], {}, "--etcd", "host:port"),
    (["--etcd-user", "root"], {}, "--etcd-user", f"given together with ${PASSWORD_ENV} or --etcd-password-file"),
    ([], {PASSWORD_ENV: SECRET}, f"${PASSWORD_ENV}", "given together with --etcd-user"),
    (["--etcd-cert-key", "/k.pem"], {}, "--etcd-cert-key", "given together with --etcd-cert-cert"),
    (["--etcd-cert-cert", "/c.pem"], {}, "--etcd-cert-cert", "given together with --etcd-cert-key"),
    (["--etcd-ca-cert", " "], {}, "--etcd-ca-cert", "a non-empty string"),
    (["--etcd-user", "root", "--etcd-timeout-ms", "5s"], {PASSWORD_ENV: SECRET}, "--etcd-timeout-ms", "'5s'"),
])
def test_bad_values_name_the_flag_and_never_show_the_password(argv, environ, named, expected):
    message = refused("--etcd", "a:1", *argv, environ=environ)
    assert message.startswith(f"{named} ") and expected in message


def test_an_empty_password_variable_is_an_unset_one():
    message = refused("--etcd", "a:1", "--etcd-user", "root", environ={PASSWORD_ENV: ""})
    assert "--etcd-user" in message and PASSWORD_ENV in message


def test_a_missing_password_file_names_the_flag_and_the_path(tmp_path):
    path = tmp_path / "no-such-file"
    message = refused("--etcd", "a:1", "--etcd-user", "root", "--etcd-password-file", str(path))
    assert message == f"--etcd-password-file {str(path)!r}: cannot be read (No such file or directory)"


@pytest.mark.parametrize("content, expected", [
    (b"", "--etcd-password-file '<hidden>': expected a non-empty string"),
    (b"\n", "--etcd-password-file '<hidden>': expected a non-empty string"),
    (b"\xff" + SECRET.encode(), "not UTF-8 text"),
])
def test_an_unusable_password_file_names_the_flag_not_its_content(tmp_path, content, expected):
    path = tmp_path / "password"
    path.write_bytes(content)
    message = refused("--etcd", "a:1", "--etcd-user", "root", "--etcd-password-file", str(path))
    assert expected in message and "xff" not in message


def _run(main, argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, out, err)
    assert out.getvalue() == ""
    return code, err.getvalue()


BAD_TIMEOUT = ["--etcd", "127.0.0.1:1", "--etcd-user", "root", "--etcd-timeout-ms", "abc"]


@pytest.mark.parametrize("main, argv", [
    (admin.main, [*BAD_TIMEOUT, "namespaces", "list"]),
    (tools.main, ["objects", *BAD_TIMEOUT, "--topic", "/default/t"]),
    (connectors_cli.main, ["runs", *BAD_TIMEOUT, "--storage-url", "file:///nowhere", "--topic", "/default/t"]),
])
def test_every_tool_exits_2_naming_the_bad_flag_before_connecting(main, argv, monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, SECRET)
    code, err = _run(main, argv)
    assert code == 2 and "--etcd-timeout-ms 'abc': expected an integer >= 1" in err
    assert SECRET not in err


def test_admin_refuses_etcd_flags_beside_config(tmp_path):
    path = tmp_path / "broker.yaml"
    path.write_text("meta_store: {host: 127.0.0.1, port: 1}\n")
    code, err = _run(admin.main, ["--config", str(path), "--etcd-ca-cert", "/ca.pem", "namespaces", "list"])
    assert code == 2 and "--etcd-ca-cert: not with --config" in err


def test_connectors_refuses_etcd_options_so_no_password_is_on_the_command_line():
    code, err = _run(connectors_cli.main, ["runs", "--etcd", "127.0.0.1:1", "--storage-url", "file:///nowhere",
                                           "--topic", "/default/t", "--option", f"etcd.password={SECRET}"])
    assert code == 2 and "option 'etcd.password' is not accepted here" in err and SECRET not in err
