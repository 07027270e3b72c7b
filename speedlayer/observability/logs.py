"""Structured logs: one JSON object per line with the process's role and ids, plus any
`tenant_id` / `worker_id` / `epoch_id` a call passes in `extra`."""

from __future__ import annotations

import json
import logging
import sys
import time

CONTEXT_FIELDS = ("tenant_id", "worker_id", "epoch_id", "dataset_id", "master_id")


class JsonFormatter(logging.Formatter):
    def __init__(self, static: dict[str, str]) -> None:
        super().__init__()
        self._static = static

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname, "logger": record.name, "msg": record.getMessage(), **self._static,
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, separators=(",", ":"))


def configure_logging(level: str, **static: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter({k: v for k, v in static.items() if v}))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
