"""Sampled CPU profiles of a running JVM (Spark's driver in local mode) with Flight Recorder.

Most of a `read -> Delta` case's CPU is in the JVM: rows converted from the Python worker's
Arrow stream, Delta's Parquet writer, Kafka's consumer. `JvmProfile` starts a Flight Recorder
recording with the `profile` settings (`jcmd <pid> JFR.start`), stops it after the block and
aggregates `jdk.ExecutionSample` events (Java threads in Java code, every ~10 ms) into the
methods with the most own and inclusive samples. Time spent in native code or in the Python
workers is not in these samples (see `pyspy_profile`).

    with JvmProfile(jvm_pid) as prof:
        run_case()
    prof.summary(top=15)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import uuid
from collections import Counter
from pathlib import Path


def available() -> bool:
    return shutil.which("jcmd") is not None and shutil.which("jfr") is not None


class JvmProfile:
    """A Flight Recorder recording of JVM `pid` while the `with` block runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.name = f"bench-{uuid.uuid4().hex[:8]}"
        self.dir = Path(tempfile.mkdtemp(prefix="jfr-"))
        self.stacks: Counter[tuple[str, ...]] = Counter()

    def _jcmd(self, *args: str) -> None:
        subprocess.run(["jcmd", str(self.pid), *args], check=True, capture_output=True, text=True)

    def __enter__(self) -> "JvmProfile":
        self._jcmd("JFR.start", f"name={self.name}", "settings=profile")
        return self

    def __exit__(self, *exc: object) -> None:
        path = self.dir / "rec.jfr"
        try:
            self._jcmd("JFR.stop", f"name={self.name}", f"filename={path}")
            out = subprocess.run(["jfr", "print", "--json", "--events", "jdk.ExecutionSample", str(path)],
                                 check=True, capture_output=True, text=True).stdout
            for event in json.loads(out)["recording"]["events"]:
                frames = event["values"]["stackTrace"]["frames"]
                self.stacks[tuple(_frame(f) for f in frames)] += 1
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def summary(self, top: int = 15) -> dict:
        own: Counter[str] = Counter()
        inclusive: Counter[str] = Counter()
        for frames, count in self.stacks.items():
            if frames:
                own[frames[0]] += count
            for frame in set(frames):
                inclusive[frame] += count
        total = sum(self.stacks.values()) or 1

        def rows(counter: Counter[str]) -> list[dict]:
            return [{"function": f, "samples": n, "share": round(n / total, 3)} for f, n in counter.most_common(top)]

        return {"samples": sum(self.stacks.values()), "own": rows(own), "inclusive": rows(inclusive)}


def _frame(frame: dict) -> str:
    method = frame["method"]
    cls = method["type"]["name"].rsplit("/", 1)[-1]
    return f"{cls}.{method['name']}"
