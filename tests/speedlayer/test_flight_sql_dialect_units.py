"""The Spark JDBC dialect's jar (`speedlayer.clients.spark_jdbc`), built without Spark.

Spark reads through it in `test_flight_sql_jdbc.py`; here only what the jar holds: the dialect's
class for Java 17 and the ServiceLoader entry naming it, never the compile-time stand-ins of
Spark's classes (on spark.jars they would shadow Spark's own), and one build per source version.
"""

from __future__ import annotations

import shutil
import zipfile

import pytest

from speedlayer.clients.spark_jdbc import DIALECT_CLASS, SERVICE, dialect_jar

pytestmark = pytest.mark.skipif(shutil.which("javac") is None, reason="javac (a JDK) is not on the PATH")


def test_the_jar_holds_the_dialect_and_its_service_entry_and_no_stand_ins(tmp_path):
    jar = dialect_jar(tmp_path)
    with zipfile.ZipFile(jar) as archive:
        names = set(archive.namelist())
        assert names == {"META-INF/MANIFEST.MF", SERVICE, DIALECT_CLASS.replace(".", "/") + ".class"}
        assert archive.read(SERVICE).decode().split() == [DIALECT_CLASS]
        header = archive.read(DIALECT_CLASS.replace(".", "/") + ".class")[:8]
    assert header[:4] == b"\xca\xfe\xba\xbe" and int.from_bytes(header[6:8], "big") == 61  # Java 17
    built = jar.stat().st_mtime_ns
    assert dialect_jar(tmp_path) == jar and jar.stat().st_mtime_ns == built  # cached by the source's hash
