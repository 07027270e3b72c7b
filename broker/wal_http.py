"""A read-only HTTP file server for a broker's WAL root, so readers on other hosts reach the tail.

Messages not uploaded yet live only in the owning broker's WAL directory. A Spark executor on
another host reads them through fsspec, which needs a URL it can reach: a shared volume, or
HTTP. fsspec's `HTTPFileSystem` lists directories from the links of an HTML index, gets sizes
from HEAD and reads byte ranges with `Range` requests; this server answers exactly those, for
the files under one root and nothing else (no writes, no paths outside the root). It serves
the real v0.7.3 broker's WAL root just as well, run beside it:

    python -m broker.wal_http --dir ./danube-data/wal --listen 0.0.0.0:7700

and is what our broker starts itself when `wal_cloud.wal.http_listen` is set, publishing
`http://<broker host>:<port>/` as its `wal_url`. The connector then reads the tail with
`walRoot=auto` (our brokers), or with `walRoot={"<broker id>": "http://host:7700/"}`.
"""

from __future__ import annotations

import argparse
import html
import logging
import os
import re
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, unquote, urlsplit

logger = logging.getLogger(__name__)

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_COPY_BLOCK = 1024 * 1024


class _WalFileHandler(BaseHTTPRequestHandler):
    """GET/HEAD of files and directory indexes under the server's root, with single ranges."""

    server: "WalHttpServer"

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
        self._serve(body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._serve(body=True)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        logger.debug("%s %s", self.address_string(), format % args)

    def _serve(self, body: bool) -> None:
        try:
            self._answer(body)
        except (BrokenPipeError, ConnectionResetError):
            logger.debug("%s closed the connection early", self.address_string())

    def _answer(self, body: bool) -> None:
        path = self._local_path()
        if path is None:
            self.send_error(HTTPStatus.NOT_FOUND, "outside the WAL root")
        elif os.path.isdir(path):
            self._index(path, body)
        elif os.path.isfile(path):
            self._file(path, body)
        else:
            self.send_error(HTTPStatus.NOT_FOUND)

    def _local_path(self) -> str | None:
        relative = unquote(urlsplit(self.path).path).lstrip("/")
        root = self.server.root
        path = os.path.realpath(os.path.join(root, relative))
        return path if path == root or path.startswith(root + os.sep) else None

    def _index(self, path: str, body: bool) -> None:
        names = sorted(os.listdir(path))
        links = "".join(
            f'<a href="{quote(n)}{"/" if os.path.isdir(os.path.join(path, n)) else ""}">{html.escape(n)}</a>\n'
            for n in names)
        data = f"<html><body>\n{links}</body></html>\n".encode()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _file(self, path: str, body: bool) -> None:
        size = os.path.getsize(path)
        start, end = 0, size  # end exclusive
        requested = self.headers.get("Range")
        if requested:
            match = _RANGE.match(requested.strip())
            if match is None or not (match.group(1) or match.group(2)):
                self.send_error(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, "one byte range expected")
                return
            first, last = match.group(1), match.group(2)
            if first:
                start, end = int(first), min(size, int(last) + 1 if last else size)
            else:
                start = max(0, size - int(last))
            if start >= size and size > 0:
                self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                self.send_header("Content-Range", f"bytes */{size}")
                self.end_headers()
                return
        self.send_response(HTTPStatus.PARTIAL_CONTENT if requested else HTTPStatus.OK)
        if requested:
            self.send_header("Content-Range", f"bytes {start}-{max(start, end - 1)}/{size}")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if body:
            with open(path, "rb") as fh:
                fh.seek(start)
                _copy(fh, self.wfile, end - start)


def _copy(src, dst, count: int) -> None:
    while count > 0:
        chunk = src.read(min(_COPY_BLOCK, count))
        if not chunk:
            break  # the file shrank under us; the reader sees a short body
        dst.write(chunk)
        count -= len(chunk)


class WalHttpServer(ThreadingHTTPServer):
    """Serves `root` read-only on `host:port` (port 0 picks a free one) from a daemon thread."""

    daemon_threads = True

    def __init__(self, root: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.root = os.path.realpath(root)
        os.makedirs(self.root, exist_ok=True)
        super().__init__((host, port), _WalFileHandler)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.server_address[1]

    def url(self, host: str | None = None) -> str:
        """The root URL readers use (`host` defaults to the bound address)."""
        bound = self.server_address[0]
        assert isinstance(bound, str), "an AF_INET server is bound to a str address"
        return f"http://{host or bound}:{self.port}/"

    def start(self) -> "WalHttpServer":
        self._thread = threading.Thread(target=self.serve_forever, name="wal-http", daemon=True)
        self._thread.start()
        logger.info("serving WAL root %s read-only at %s", self.root, self.url())
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def parse_listen(value: str) -> tuple[str, int]:
    """`host:port` -> (host, port); ValueError naming the value otherwise."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"listen address {value!r}: expected host:port (port 0 picks a free one)")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m broker.wal_http", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, help="the broker's WAL root (wal_cloud.wal.dir)")
    parser.add_argument("--listen", default="127.0.0.1:7700", help="host:port to serve on")
    args = parser.parse_args(argv)
    try:
        host, port = parse_listen(args.listen)
    except ValueError as exc:
        parser.error(str(exc))
    if not os.path.isdir(args.dir):
        parser.error(f"--dir {args.dir!r} is not a directory")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    server = WalHttpServer(args.dir, host, port)
    print(f"serving {server.root} at {server.url()}", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
