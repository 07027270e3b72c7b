"""A tail process (`python -m pipelines tail`) seen from the speed layer: start it, ask it, stop it.

The master asks one (`check`) when it admits a dataset with a tail; a worker keeps one per
dataset tail it follows and reads through it (`open`, then `topics`, `earliest`, `latest`,
`read`). The requests and answers are `tail_wire`'s; the child's stderr is this process's, so
its log lines land in the worker's or master's log.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any, Mapping

import pyarrow as pa

from speedlayer.protocol.tail_wire import LOSS_ERROR, TailWireError, read_answer, write_request

STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class TailRead:
    """One `read`: the target rows of `[first[p], ends[p])` per topic partition, how many messages
    that was and how many the pipeline would quarantine (never served)."""

    rows: pa.Table
    first: Mapping[str, int]
    ends: Mapping[str, int]
    read: int
    quarantined: int


class TailProcess:
    """One child process; requests are serialised (one thread at a time)."""

    def __init__(self, command: list[str] | None = None) -> None:
        self._process = subprocess.Popen(command or [sys.executable, "-m", "pipelines", "tail"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def ask(self, op: str, **fields: Any) -> tuple[Any, pa.Table | None]:
        """Send one request and wait for its answer; a `DataLossError` the child hit is raised as
        one, any other failure as `TailWireError` naming the child's error class."""
        from danube_core.errors import DataLossError

        with self._lock:
            assert self._process.stdin is not None and self._process.stdout is not None
            try:
                write_request(self._process.stdin, op, **fields)
            except (BrokenPipeError, OSError) as exc:
                raise TailWireError("TailProcessExited", f"the tail process took no request: {exc}") from exc
            try:
                return read_answer(self._process.stdout)
            except TailWireError as exc:
                if exc.error == LOSS_ERROR:
                    raise DataLossError(exc.message) from exc
                raise

    def close(self) -> None:
        """Close its stdin (it exits), then wait; killed if it does not."""
        try:
            if self._process.stdin is not None:
                self._process.stdin.close()
        except OSError:
            pass
        try:
            self._process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


class TailProcessFeed:
    """The follower's reader (`speedlayer.worker.tail_follower`) through a tail process."""

    def __init__(self, pipeline_config: str, dataset: str, process: TailProcess | None = None) -> None:
        self._process = process or TailProcess()
        try:
            self._process.ask("open", pipeline_config=pipeline_config, dataset=dataset)
        except BaseException:
            self._process.close()
            raise

    @property
    def alive(self) -> bool:
        return self._process.alive

    def topics(self) -> list[str]:
        return list(self._process.ask("topics")[0])

    def earliest(self, topics: list[str]) -> dict[str, int]:
        return dict(self._process.ask("earliest", topics=topics)[0])

    def latest(self, topics: list[str], above: Mapping[str, int] | None = None, wait_s: float = 0.0) -> dict[str, int]:
        """The topics' next offsets; with `above`, answered once one is beyond it or after `wait_s`."""
        if above is None:
            return dict(self._process.ask("latest", topics=topics)[0])
        return dict(self._process.ask("latest", topics=topics, above=dict(above), wait_ms=int(wait_s * 1000))[0])

    def read(self, start: Mapping[str, int], end: Mapping[str, int]) -> TailRead:
        value, rows = self._process.ask("read", start=dict(start), end=dict(end))
        return TailRead(rows if rows is not None else pa.table({}), value["first"], value["ends"],
                        int(value["read"]), int(value["quarantined"]))

    def close(self) -> None:
        self._process.close()
