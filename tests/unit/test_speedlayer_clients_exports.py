"""`speedlayer.clients` exports its clients by name, lazily; no server needed."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_query_stays_the_function_once_the_query_client_module_is_imported():
    # A submodule named `query` would replace the package attribute on first import.
    clients = importlib.import_module("speedlayer.clients")
    from speedlayer.clients import QueryClient, query

    assert callable(query) and not isinstance(query, type(clients)) and isinstance(QueryClient, type)
    assert clients.query is query


def test_the_management_client_does_not_import_pyarrow_flight():
    code = ("import sys; from speedlayer.clients import ManagementClient, delta_request; "
            "print('pyarrow.flight' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
