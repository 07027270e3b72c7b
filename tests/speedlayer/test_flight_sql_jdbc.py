"""The Data Gateway's Arrow Flight SQL with the Arrow Flight SQL JDBC driver (issue 27).

The driver (`org.apache.arrow:flight-sql-jdbc-driver` from Maven Central, its SHA-1 checked
against Central's `.sha1`) is downloaded once into ~/.cache/danube-spark and driven by
`FlightSqlJdbcCheck.java` (Java's single-file source launch): listing tables, columns and (no) keys, a
group-by and a parameterised point query, with exact answers, and a wrong password refused;
`FlightSqlJdbcParameters.java` binds timestamps, dates and a quoted string with drivers 17.0.0
and 18.3.0 in JVMs in two time zones; `spark_jdbc_reads.py` reads with Spark's JDBC reader (a
local session in a subprocess, the driver jar on spark.jars).
The cluster is `test_flight_sql`'s module fixture.
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.speedlayer.test_flight_sql import (  # noqa: F401 - gateways: the module's cluster fixture
    HEAVY, assert_freed_in_time, events_since, freed_at, gateways, worker_log_offset,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# The newest release Maven Central serves that runs on Java 17.
JDBC_VERSION = "18.3.0"
CENTRAL = "https://repo1.maven.org/maven2/org/apache/arrow/flight-sql-jdbc-driver"
CHECK = Path(__file__).with_name("FlightSqlJdbcCheck.java")
PARAMETERS = Path(__file__).with_name("FlightSqlJdbcParameters.java")
CANCEL = Path(__file__).with_name("FlightSqlJdbcCancel.java")
# Arrow's memory module needs this on Java 17 (the driver's documented JVM flag).
JVM_FLAGS = ["--add-opens=java.base/java.nio=org.apache.arrow.memory.core,ALL-UNNAMED"]


@pytest.fixture(scope="session")
def jdbc_driver() -> Path:
    return driver_jar(JDBC_VERSION)


def driver_jar(version: str) -> Path:
    """The driver's jar of `version`, downloaded once from Maven Central (skips without java)."""
    if shutil.which("java") is None:
        pytest.skip("java is not on the PATH")
    cache = Path.home() / ".cache" / "danube-spark"
    jar = cache / f"flight-sql-jdbc-driver-{version}.jar"
    recorded = jar.with_name(jar.name + ".sha1")  # Central's digest, kept so a cached jar needs no network
    url = f"{CENTRAL}/{version}/{jar.name}"
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


def _run_check(jar: Path, gateway: str, user: str, password: str, program: Path = CHECK,
               time_zone: str | None = None, url_time_zone: bool = False,
               extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`program` run with the driver `jar` against `gateway`, in a JVM in `time_zone` (given in
    the URL as `timeZone` too with `url_time_zone`), `extra` after its usual arguments."""
    url = f"jdbc:arrow-flight-sql://{gateway}?useEncryption=false"
    if url_time_zone:
        url += f"&timeZone={time_zone}"
    zone = [f"-Duser.timezone={time_zone}"] if time_zone else []
    return subprocess.run(["java", *JVM_FLAGS, *zone, "-cp", str(jar), str(program), url, user, password, *extra],
                          capture_output=True, text=True, timeout=180)


def test_jdbc_lists_tables_and_answers_group_by_and_point_queries_exactly(jdbc_driver, gateways):  # noqa: F811
    result = _run_check(jdbc_driver, gateways["plain"], "acme", "s3cret")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line.split("\t") for line in result.stdout.splitlines()]
    assert [line[1:] for line in lines if line[0] == "TABLE"] == [
        ["speedlayer", "acme", "events", "TABLE"], ["speedlayer", "acme", "items", "TABLE"],
        ["speedlayer", "acme", "orders", "TABLE"]]
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


# 17.0.0: the release before the driver reported zoned timestamps as TIMESTAMP_WITH_TIMEZONE.
@pytest.mark.parametrize("version", ["17.0.0", JDBC_VERSION])
@pytest.mark.parametrize("time_zone", ["UTC", "Asia/Kolkata"])
def test_jdbc_timestamp_parameters_count_exactly_not_every_row(gateways, version, time_zone):  # noqa: F811
    """Issue 41: `ts >= ?` with setTimestamp(2024-01-29T06:30Z) counted all 720 rows. The driver
    writes epoch milliseconds into whatever timestamp type the gateway asks for (apache/arrow-java#838),
    and the gateway asked for its column's microseconds, so the value meant January 1970; and
    those milliseconds are wall-clock time in the JVM's zone, so in Kolkata the count was off by
    5.5 hours. With the zone in the URL every count is exact; without it, comparing with the zoned
    column is refused, saying so, and the other comparisons (wall-clock, dates) stay exact. Read
    back, a zoned TIMESTAMP came back right only in a JVM in UTC (in Kolkata 07:00Z as 20:00Z the day
    before); with the zone in the URL the gateway labels the answer's zoned columns with it and the
    instant comes back in any JVM."""
    cut = datetime.datetime(2024, 1, 29, 6, 30, tzinfo=datetime.timezone.utc)
    exact = {"TS": str(events_since(cut)), "TS_NTZ": str(events_since(cut)),
             "DATE": str(events_since(cut.replace(hour=0, minute=0))), "QUOTED": "1000"}
    for url_time_zone in (True, False):
        result = _run_check(driver_jar(version), gateways["plain"], "acme", "s3cret", PARAMETERS, time_zone,
                            url_time_zone)
        assert result.returncode == 0, result.stderr[-3000:]
        counts = dict(line.split("\t") for line in result.stdout.splitlines())
        read = {label: counts.pop(label) for label in list(counts) if label.startswith("READ_")}
        if url_time_zone or time_zone == "UTC":  # the answer's zoned columns labelled in the URL's zone
            assert read["READ_TS"] == "2024-01-01T07:00:00Z", read
        else:  # the driver's wall-clock in UTC made a Timestamp in the JVM's zone: not the instant
            assert read["READ_TS"] == "2023-12-31T20:00:00Z", read
        # TIMESTAMP_NTZ: the driver shifts it by the JVM's offset (out of the gateway's reach); DATE exact.
        assert read["READ_TS_NTZ"] == ("2024-01-01 07:00:00.0" if time_zone == "UTC" else "2024-01-01 01:30:00.0")
        assert read["READ_DATE"] == "2024-01-01", read
        if url_time_zone:
            assert counts == exact, result.stdout
        else:
            assert counts.pop("TS").startswith("refused: ") and "timeZone=<zone> in the JDBC URL" in result.stdout
            assert counts == {k: v for k, v in exact.items() if k != "TS"}


@pytest.mark.parametrize("how", ["cancel", "timeout"])
def test_jdbc_cancel_and_query_timeout_free_the_worker_within_a_second(jdbc_driver, gateways, how):  # noqa: F811
    """Issue 41: the driver can only cancel an answer's stream (DoGet): `Statement.cancel()` and
    `setQueryTimeout` do nothing while it waits for GetFlightInfo, and the gateway answered a
    statement's GetFlightInfo only once the worker had its first batch, so a cancelled or timed-out
    JDBC query held the worker until the gateway's own deadline (30 s). Now GetFlightInfo announces
    the schema at once and the stream waits: `cancel()` (from another thread) and the timeout (the
    statement closed when it fails) free the worker within 1 s."""
    log = gateways["worker_log"]
    seen = worker_log_offset(log)
    result = _run_check(jdbc_driver, gateways["plain"], "acme", "s3cret", CANCEL, extra=(how, HEAVY))
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split("\t", 1) for line in result.stdout.splitlines() if "\t" in line)
    assert "GAVE_UP" in lines and "FAILED" in lines, result.stdout  # cancelled while it waited for the answer
    if how == "timeout":  # the driver's own timer, not the gateway's deadline 30 s on
        assert "Query timed out after 1 SECONDS" in lines["FAILED"], result.stdout
    assert_freed_in_time(freed_at(log, seen), int(lines["GAVE_UP"]) / 1e9, f"JDBC {how}")


SPARK_READS = Path(__file__).with_name("spark_jdbc_reads.py")
# `events` whole, partitioned: the driver reports every column unsigned (Spark reads a BIGINT as
# decimal(20,0), exact for any 64-bit value) and a list without its element type (array<string>).
EVENTS_SCHEMA = ("struct<id:decimal(20,0),ts:timestamp,ts_ntz:timestamp,d:date,b8:int,i16:int,i32:bigint,f32:float,"
                 "dec:decimal(10,2),flag:boolean,bin:binary,tags:array<string>,point:string,attrs:string>")


@pytest.mark.parametrize("version", ["17.0.0", JDBC_VERSION])
def test_spark_jdbc_reader_with_the_dialect_loads_every_delta_type_exactly(gateways, version):  # noqa: F811
    """Issue 41: Spark's JDBC reader refused a zoned TIMESTAMP (18.3.0 reports it as
    TIMESTAMP_WITH_TIMEZONE), lists (ARRAY) and structs or maps (JAVA_OBJECT), naming the type.
    With the project's dialect jar on spark.jars beside the driver's (`speedlayer.clients.spark_jdbc`,
    found by Spark's ServiceLoader: no registration call) the whole table of every Delta type loads,
    partitioned, with no type unrecognized: instants exact (JVMs in UTC), lists as text elements
    (or typed through customSchema), structs and maps as the driver's JSON text. Without the
    dialect the same read is still refused, naming the type."""
    from speedlayer.clients.spark_jdbc import DIALECT_CLASS, dialect_jar
    from tests.speedlayer.test_flight_sql import EVENTS_START, _connect

    if shutil.which("javac") is None:
        pytest.skip("building the dialect's jar needs javac (a JDK)")
    url = f"jdbc:arrow-flight-sql://{gateways['plain']}?useEncryption=false"
    whole = {"dbtable": "events", "partitionColumn": "id", "lowerBound": "0", "upperBound": "720",
             "numPartitions": "3"}
    reads = {
        "table": whole,
        "typed": {"query": "SELECT id, tags FROM events", "customSchema": "id BIGINT, tags ARRAY<BIGINT>"},
        "without": {**whole, "without_dialect": "true"},
    }
    jars = f"{driver_jar(version)},{dialect_jar()}"
    result = subprocess.run([sys.executable, str(SPARK_READS), jars, url, "acme", "s3cret", json.dumps(reads), "UTC"],
                            capture_output=True, text=True, timeout=240)
    answers = {line["read"]: line for line in map(json.loads, result.stdout.splitlines()) if line}
    assert set(answers) == set(reads), result.stderr[-3000:]
    table = answers["table"]
    assert "error" not in table, table
    assert table["dialect"] == DIALECT_CLASS and table["schema"] == EVENTS_SCHEMA and table["partitions"] == 3, table
    with _connect(gateways["plain"]) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT tags, point, attrs FROM events ORDER BY id")
        nested = cursor.fetchall()
    instants = [(EVENTS_START + datetime.timedelta(hours=i)).replace(tzinfo=None).isoformat() for i in range(720)]
    expected = [[f"{i}", instants[i], instants[i], instants[i][:10], i % 100, i, i, i / 4,
                 f"{decimal.Decimal(i) / 100:.2f}", i % 2 == 0, bytes([i % 256]).hex(), [str(v) for v in nested[i][0]],
                 json.dumps(nested[i][1], separators=(",", ":")), json.dumps(dict(nested[i][2]), separators=(",", ":"))]
                for i in range(720)]
    assert table["rows"] == expected
    assert answers["typed"]["schema"] == "struct<id:bigint,tags:array<bigint>>"
    assert answers["typed"]["rows"] == [[i, list(nested[i][0])] for i in range(720)]
    refused = "TIMESTAMP_WITH_TIMEZONE" if version == JDBC_VERSION else "ARRAY"
    assert answers["without"]["error"].startswith(
        f"org.apache.spark.SparkSQLException: [UNRECOGNIZED_SQL_TYPE] Unrecognized SQL type - name: {refused}"), answers
