"""The pipe between a worker and its tail process (`python -m pipelines tail`): both ends.

A worker serving a dataset's tail runs the pipeline's own reads and split in a child process
(`pipelines.tail_server`): the speed layer may not import the pipelines package (which imports
the speed layer's announcer), and the split needs Spark, whose JVM is better kept out of the
worker's own process (its memory and a crash stay the child's). The worker asks, the child
answers, one request at a time:

* a request is one JSON line on the child's stdin: `{"op": "open", "pipeline_config": ...,
  "dataset": ...}` first, then `topics`, `earliest`/`latest` (`topics`; `latest` optionally with
  `above` and `wait_ms`: answered once an offset is beyond `above`, or after `wait_ms`),
  `read` (`start`, `end`);
  the child exits when its stdin closes (the worker stopped the tail, or died);
* an answer is a frame on the child's stdout: 4 bytes (big-endian length) and a JSON header
  (`{"ok": true, "value": ...}` or `{"ok": false, "error": <class>, "message": ...}`), then, when
  the header says `"rows": true`, 4 bytes and an Arrow IPC stream of the rows.
"""

from __future__ import annotations

import json
import struct
from typing import IO, Any

import pyarrow as pa

_LENGTH = struct.Struct(">I")
LOSS_ERROR = "DataLossError"  # the error class the worker turns back into a `DataLossError`


class TailWireError(Exception):
    """The tail process could not answer: it failed (`error`, `message`) or its pipe broke."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(f"{error}: {message}")
        self.error = error
        self.message = message


def write_request(out: IO[bytes], op: str, **fields: Any) -> None:
    out.write(json.dumps({"op": op, **fields}, separators=(",", ":")).encode() + b"\n")
    out.flush()


def read_request(inp: IO[bytes]) -> dict | None:
    """The next request, None at end of input."""
    line = inp.readline()
    if not line:
        return None
    value = json.loads(line)
    if not isinstance(value, dict) or not isinstance(value.get("op"), str):
        raise ValueError(f"tail request: expected a JSON object with an 'op', got {line[:80]!r}")
    return value


def write_answer(out: IO[bytes], value: Any = None, rows: pa.Table | None = None) -> None:
    header = {"ok": True, "value": value, "rows": rows is not None}
    _frame(out, json.dumps(header, separators=(",", ":")).encode())
    if rows is not None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, rows.schema) as writer:
            writer.write_table(rows)
        _frame(out, sink.getvalue().to_pybytes())
    out.flush()


def write_failure(out: IO[bytes], error: str, message: str) -> None:
    _frame(out, json.dumps({"ok": False, "error": error, "message": message}).encode())
    out.flush()


def read_answer(inp: IO[bytes]) -> tuple[Any, pa.Table | None]:
    """(value, rows) of the next answer; TailWireError for a failure or a broken pipe."""
    header = json.loads(_read_frame(inp))
    if not header.get("ok"):
        raise TailWireError(str(header.get("error", "Error")), str(header.get("message", "")))
    rows = None
    if header.get("rows"):
        rows = pa.ipc.open_stream(pa.py_buffer(_read_frame(inp))).read_all()
    return header.get("value"), rows


def _frame(out: IO[bytes], body: bytes) -> None:
    out.write(_LENGTH.pack(len(body)))
    out.write(body)


def _read_frame(inp: IO[bytes]) -> bytes:
    head = inp.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise TailWireError("TailProcessExited", "the tail process closed its output")
    (size,) = _LENGTH.unpack(head)
    body = inp.read(size)
    if len(body) < size:
        raise TailWireError("TailProcessExited", "the tail process closed its output mid-answer")
    return body
