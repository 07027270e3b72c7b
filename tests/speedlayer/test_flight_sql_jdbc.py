"""The Data Gateway's Arrow Flight SQL with the Arrow Flight SQL JDBC driver (issue 27).

The driver (`org.apache.arrow:flight-sql-jdbc-driver` from Maven Central, its SHA-1 checked
against Central's `.sha1`) is downloaded once into ~/.cache/danube-spark and driven by
`FlightSqlJdbcCheck.java` (Java's single-file source launch): listing tables, columns and (no) keys, a
group-by and a parameterised point query, with exact answers, and a wrong password refused.
The cluster is `test_flight_sql`'s module fixture.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.speedlayer.test_flight_sql import gateways  # noqa: F401 - the module's cluster fixture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# The newest release Maven Central serves that runs on Java 17.
JDBC_VERSION = "18.3.0"
CENTRAL = "https://repo1.maven.org/maven2/org/apache/arrow/flight-sql-jdbc-driver"
CHECK = Path(__file__).with_name("FlightSqlJdbcCheck.java")
# Arrow's memory module needs this on Java 17 (the driver's documented JVM flag).
JVM_FLAGS = ["--add-opens=java.base/java.nio=org.apache.arrow.memory.core,ALL-UNNAMED"]


@pytest.fixture(scope="session")
def jdbc_driver() -> Path:
    if shutil.which("java") is None:
        pytest.skip("java is not on the PATH")
    cache = Path.home() / ".cache" / "danube-spark"
    jar = cache / f"flight-sql-jdbc-driver-{JDBC_VERSION}.jar"
    recorded = jar.with_name(jar.name + ".sha1")  # Central's digest, kept so a cached jar needs no network
    url = f"{CENTRAL}/{JDBC_VERSION}/{jar.name}"
    if jar.exists() and recorded.exists() and hashlib.sha1(jar.read_bytes()).hexdigest() == recorded.read_text():
        return jar
    with urllib.request.urlopen(f"{url}.sha1", timeout=60) as reply:
        expected = reply.read().decode().split()[0].strip()
    if not jar.exists() or hashlib.sha1(jar.read_bytes()).hexdigest() != expected:
        cache.mkdir(parents=True, exist_ok=True)
        partial = jar.with_suffix(".part")
        with urllib.request.urlopen(url, timeout=300) as reply, open(partial, "wb") as out:
            shutil.copyfileobj(reply, out)
        actual = hashlib.sha1(partial.read_bytes()).hexdigest()
        if actual != expected:
            partial.unlink()
            raise AssertionError(f"{url}: SHA-1 {actual}, Maven Central says {expected}")
        partial.rename(jar)
    recorded.write_text(expected)
    return jar


def _run_check(jar: Path, gateway: str, user: str, password: str) -> subprocess.CompletedProcess:
    url = f"jdbc:arrow-flight-sql://{gateway}?useEncryption=false"
    return subprocess.run(["java", *JVM_FLAGS, "-cp", str(jar), str(CHECK), url, user, password],
                          capture_output=True, text=True, timeout=180)


def test_jdbc_lists_tables_and_answers_group_by_and_point_queries_exactly(jdbc_driver, gateways):  # noqa: F811
    result = _run_check(jdbc_driver, gateways["plain"], "acme", "s3cret")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line.split("\t") for line in result.stdout.splitlines()]
    assert [line[1:] for line in lines if line[0] == "TABLE"] == [
        ["speedlayer", "acme", "items", "TABLE"], ["speedlayer", "acme", "orders", "TABLE"]]
    assert {line[1] for line in lines if line[0] == "COLUMN"} == {"id", "day", "amount"}
    assert [line for line in lines if line[0] == "KEY"] == []  # no keys, asked without an error
    totals = {d: sum(i * 0.5 for i in range(d - 1, 3000, 3)) for d in (1, 2, 3)}
    assert [line[1:] for line in lines if line[0] == "GROUP"] == [
        [f"2024-01-0{d}", "1000", repr(totals[d])] for d in (1, 2, 3)]
    assert [line[1:] for line in lines if line[0] == "POINT"] == [
        ["1234", "2024-01-02", "617.0"], ["2999", "2024-01-03", "1499.5"]]


def test_jdbc_wrong_password_is_refused(jdbc_driver, gateways):  # noqa: F811
    result = _run_check(jdbc_driver, gateways["plain"], "acme", "wrong")
    assert result.returncode != 0
    assert "wrong password" in result.stderr or "UNAUTHENTICATED" in result.stderr, result.stderr[-3000:]
