"""Loopback ports for the processes a stack or a test starts (a free one, waiting for one), and stopping them.

In `danube_core` because `embedded_etcd` (which the broker may start) needs them; the
development stack, the tests and the benchmarks use the same helpers."""

from __future__ import annotations

import logging
import socket
import subprocess
import time
from typing import Iterable

logger = logging.getLogger(__name__)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, deadline_s: float = 30.0, process: subprocess.Popen | None = None) -> None:
    """Poll until something accepts connections on 127.0.0.1:port, else TimeoutError; with
    `process` (the one expected to listen), ProcessLookupError as soon as it has exited, rather
    than waiting out the deadline for a server that refused its command line."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        if process is not None and process.poll() is not None:
            raise ProcessLookupError(f"the process meant to listen on 127.0.0.1:{port} exited with code "
                                     f"{process.returncode}")
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {deadline_s}s")


def stop_processes(processes: Iterable[subprocess.Popen], timeout_s: float = 10.0) -> None:
    """Terminate every process still running, then wait for each; kill one that outlives `timeout_s`.

    All are signalled before any is waited for, so stopping N processes takes one timeout, not N.
    """
    processes = list(processes)
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("process %d (%s) did not stop within %gs; killing it", process.pid,
                           _program(process), timeout_s)
            process.kill()
            process.wait(timeout_s)


def _program(process: subprocess.Popen) -> str:
    args = process.args
    return " ".join(map(str, args[:3])) if isinstance(args, (list, tuple)) else str(args)


def stop_process(process: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Terminate `process` if it still runs, wait, and kill it if it outlives `timeout_s`."""
    stop_processes([process], timeout_s)
