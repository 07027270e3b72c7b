"""Fault-injecting proxies on loopback, for the fault battery (`bench/faults.py`).

`FaultProxy` forwards TCP from a free local port to a target port (or, given several, to each
in turn, skipping one that refuses: a load balancer in front of an etcd cluster, as the soak's
brokers use, whose `meta_store` names one endpoint), in one of four modes, switchable while it
runs:

* `pass`: bytes forwarded as they come;
* `delay`: every chunk, either way, held `delay_s` before it is forwarded (an etcd slowed past
  its request timeout, HTTP/2 pings included);
* `reset`: every live connection is cut with a TCP RST and new ones are accepted and reset at
  once (a dropped network path);
* `http503`: every live connection is cut, and each new one gets, to its first request, an
  S3 `503 SlowDown` error with `Connection: close` (a throttling S3, as moto never is).

Switching to `reset` or `http503` cuts the live connections, so pooled keep-alive
connections meet the fault too.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

PASS, DELAY, RESET, HTTP503 = "pass", "delay", "reset", "http503"
_SLOWDOWN = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>"
             b"<Message>Please reduce your request rate.</Message></Error>")
_SLOWDOWN_RESPONSE = (b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nConnection: close\r\n"
                      b"Content-Length: " + str(len(_SLOWDOWN)).encode() + b"\r\n\r\n" + _SLOWDOWN)


class FaultProxy:
    """A loopback TCP proxy to `127.0.0.1:target_port` with a switchable fault mode."""

    def __init__(self, target_port: int, *more_ports: int) -> None:
        self.target_port = target_port
        self.target_ports = (target_port, *more_ports)
        self._next_target = 0
        self.mode = PASS
        self.delay_s = 0.0
        self.faulted = 0  # connections reset or answered 503
        self.delayed = 0  # chunks held back in delay mode
        self._live: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set_mode(self, mode: str, delay_s: float = 0.0) -> None:
        self.mode, self.delay_s = mode, delay_s
        if mode in (RESET, HTTP503):
            with self._lock:
                live, self._live = list(self._live), set()
            for sock in live:
                _reset(sock)

    def close(self) -> None:
        self._closed = True
        self._server.close()
        self.set_mode(RESET)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        mode = self.mode
        if mode == RESET:
            self.faulted += 1
            _reset(client)
            return
        if mode == HTTP503:
            self.faulted += 1
            client.settimeout(5)
            try:
                client.recv(65536)
                client.sendall(_SLOWDOWN_RESPONSE)
            except OSError:
                pass
            client.close()
            return
        upstream = self._connect_upstream()
        if upstream is None:
            _reset(client)
            return
        upstream.settimeout(None)
        with self._lock:
            self._live.update((client, upstream))
        for src, dst in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _connect_upstream(self) -> socket.socket | None:
        """A connection to the next target in turn that accepts one (None: none does)."""
        with self._lock:
            first, self._next_target = self._next_target, self._next_target + 1
        for i in range(len(self.target_ports)):
            port = self.target_ports[(first + i) % len(self.target_ports)]
            try:
                return socket.create_connection(("127.0.0.1", port), timeout=10)
            except OSError:
                continue
        return None

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                chunk = src.recv(65536)
                if not chunk:
                    break
                if self.mode == DELAY and self.delay_s:
                    self.delayed += 1
                    time.sleep(self.delay_s)
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with self._lock:
                    self._live.discard(sock)
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()


def _reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), as a dropped connection looks to the peer."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()
