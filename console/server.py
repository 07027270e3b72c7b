"""The console's HTTP server: its app on uvicorn, in the foreground (`python -m console`) or on
a thread of the caller's process (the demo, the tests, the benchmark), on loopback unless the
configuration says otherwise.
"""

from __future__ import annotations

import logging
import threading
import time

import uvicorn

from console.app import build_app
from console.config import ConsoleConfig
from console.services import ConsoleServices

logger = logging.getLogger(__name__)


class ConsoleServer:
    """`start()` serves on a daemon thread and returns once the port listens; `stop()` ends it."""

    def __init__(self, config: ConsoleConfig, services: ConsoleServices | None = None) -> None:
        self.services = services or ConsoleServices(config)
        self.config = config
        app = build_app(self.services)
        self._server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                                                     access_log=False, lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, name="console-http", daemon=True)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "") else self.config.host
        port = self._server.servers[0].sockets[0].getsockname()[1] if self._server.servers else self.config.port
        return f"http://{host}:{port}"

    def start(self, timeout_s: float = 30.0) -> "ConsoleServer":
        self.services.start()
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the console did not start listening on {self.config.host}:{self.config.port}")
            time.sleep(0.02)
        return self

    def serve_forever(self) -> None:
        """Serve in the foreground until SIGINT/SIGTERM (uvicorn handles both)."""
        self.services.start()
        try:
            self._server.run()
        finally:
            self.services.close()

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(10)
        self.services.close()
