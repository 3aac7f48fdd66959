"""``GET /metrics`` over HTTP, off the caller's thread: :class:`MetricsServer`.

A :class:`http.server.ThreadingHTTPServer` whose accept loop runs on one daemon thread and each
client on a daemon thread of its own, so the process's own loop never waits on a scraper.  Paths:

- ``/metrics``: ``render()``'s text, ``text/plain; version=0.0.4; charset=utf-8`` (a query string
  is ignored); 500 when ``render`` raises (logged).  With a ``token`` (the broker's
  ``metrics_token_file``, :func:`load_metrics_token`), only a request with the header
  ``Authorization: Bearer <token>`` gets it (compared in constant time); any other gets 401 with
  ``WWW-Authenticate: Bearer realm="hpbroker"``, and nothing is rendered;
- ``/healthz``: 200 with ``health()``'s text when it says healthy, else 503 with it (never
  behind the token: load balancers probe it, and it names no topic or group);
- ``/``: a line pointing at ``/metrics``;
- anything else: 404.  Methods other than GET get 501 (``http.server``'s rule).

A slow or hostile client costs a thread and a socket, never the broker, and not for long: every
read and write of a client's socket times out after ``timeout_s`` of silence, the request line
and headers must all arrive within ``request_timeout_s`` of the connection (so that a client
sending a byte now and then cannot hold its slot), at most ``max_clients`` clients are served at
once (a connection beyond that is closed unanswered), HTTP/1.0 closes each connection after its
response, and ``http.server`` bounds the request line and headers.

The listening socket is bound in the constructor (so a port in use fails at once, in the
caller); :meth:`start` starts the thread.  In a process that forks, start it after the fork, or
have the children close the inherited socket; the threads never exist in a child.  Whoever
starts it decides which signals its threads see (they inherit the starting thread's mask).
"""

from __future__ import annotations

import hmac
import io
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from hpbroker.metrics.exposition import CONTENT_TYPE

__all__ = ["MetricsServer", "load_metrics_token"]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0  # a client silent this long is dropped
DEFAULT_REQUEST_TIMEOUT_S = 10.0  # a client that has not sent its request line and headers by then too
DEFAULT_MAX_CLIENTS = 8  # clients served at once; more are closed at once
_STOP_TIMEOUT_S = 5.0
_POLL_S = 0.1  # how often the accept loop looks for a stop request: close() waits at most this
_MAX_TOKEN_BYTES = 4096  # a token file holds one short line
_MIN_TOKEN_CHARS = 16  # shorter than this is guessable: refused
_REALM = 'Bearer realm="hpbroker"'
_REFUSAL_LOG_INTERVAL_S = 60.0  # refused scrapes are logged at most this often

Render = Callable[[], str]
Health = Callable[[], tuple[bool, str]]


def _config_error(message: str) -> Exception:
    """hpbroker's InvalidConfigError, imported only when a token is refused: this package
    loads nothing but the standard library."""
    from hpbroker.errors import InvalidConfigError

    return InvalidConfigError(message)


def load_metrics_token(path: str | os.PathLike[str]) -> str:
    """The bearer token in ``path``: its one line, surrounding whitespace stripped, at least
    16 characters of printable ASCII without spaces (``openssl rand -hex 32`` writes one).
    InvalidConfigError naming the file and what is wrong with it."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            raw = f.read(_MAX_TOKEN_BYTES + 1)
    except FileNotFoundError:
        raise _config_error(f"metrics token file {name}: no such file") from None
    except OSError as e:
        raise _config_error(f"metrics token file {name}: cannot read it: {e.strerror or e}") from None
    if len(raw) > _MAX_TOKEN_BYTES:
        raise _config_error(f"metrics token file {name}: larger than {_MAX_TOKEN_BYTES} bytes; "
                                 "expected one line, the token")
    token = raw.strip()
    if not token:
        raise _config_error(f"metrics token file {name}: empty; expected one line, the token")
    if not all(0x21 <= byte < 0x7F for byte in token):
        raise _config_error(f"metrics token file {name}: the token must be one line of printable "
                                 "ASCII without spaces")
    if len(token) < _MIN_TOKEN_CHARS:
        raise _config_error(f"metrics token file {name}: the token has {len(token)} characters; "
                                 f"at least {_MIN_TOKEN_CHARS} (openssl rand -hex 32 makes one)")
    return token.decode("ascii")


class MetricsServer:
    """Serves ``render()`` at ``/metrics`` and ``health()`` at ``/healthz`` (module docstring).
    ``token``: the bearer token ``/metrics`` asks for; None: none asked."""

    def __init__(self, host: str, port: int, render: Render, health: Health | None = None, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S, request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 max_clients: int = DEFAULT_MAX_CLIENTS, token: str | None = None) -> None:
        if token is not None and not token:
            raise _config_error("the metrics token must not be empty")
        self._http = _HttpServer(host, port, render, health or _always_healthy, timeout_s, request_timeout_s,
                                 max_clients, token)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port); the port is the real one when 0 was asked for."""
        host, port = self._http.server_address[:2]
        return str(host), int(port)

    def fileno(self) -> int:
        return self._http.fileno()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": _POLL_S},
                                        name="hpbroker-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop accepting and close the listening socket (clients being served finish on their
        own threads).  Idempotent."""
        if self._thread is not None:
            self._http.shutdown()
            self._thread.join(_STOP_TIMEOUT_S)
            self._thread = None
        self._http.server_close()


def _always_healthy() -> tuple[bool, str]:
    return True, "ok"


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 16

    def __init__(self, host: str, port: int, render: Render, health: Health, timeout_s: float,
                 request_timeout_s: float, max_clients: int, token: str | None) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.token = None if token is None else token.encode("ascii")
        self.refusals_logged_at = float("-inf")  # monotonic time of the last refusal logged
        self.render, self.health, self.client_timeout_s = render, health, timeout_s
        self.request_timeout_s = request_timeout_s
        self.max_clients = max_clients
        self._clients = threading.BoundedSemaphore(max_clients)
        super().__init__((host, port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._clients.acquire(blocking=False):
            logger.warning("metrics: %s refused: %d clients are being served already", client_address,
                           self.max_clients)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._clients.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._clients.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("metrics: error serving %s", client_address, exc_info=True)


class _DeadlineReader(io.RawIOBase):
    """A client socket's reads, each bounded by the per-read timeout and by what is left until
    ``deadline`` (``time.monotonic()``); past it, every read raises TimeoutError, which
    ``http.server`` takes as a request timed out (the connection is closed unanswered)."""

    def __init__(self, sock: socket.socket, timeout_s: float, deadline: float) -> None:
        super().__init__()
        self._sock, self._timeout_s, self.deadline = sock, timeout_s, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self._sock.settimeout(min(self._timeout_s, left))
        return self._sock.recv_into(buffer)


class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer
    server_version = "hpbroker"
    protocol_version = "HTTP/1.0"

    def setup(self) -> None:
        self.timeout = self.server.client_timeout_s  # StreamRequestHandler applies it to the socket
        super().setup()
        self.rfile.close()  # reads go through the request's deadline instead
        self._reader = _DeadlineReader(self.connection, self.timeout,
                                       time.monotonic() + self.server.request_timeout_s)
        self.rfile = io.BufferedReader(self._reader)

    def parse_request(self) -> bool:
        parsed = super().parse_request()  # the request line was read, this reads the headers
        self._reader.deadline = float("inf")  # received: the response has timeout_s per write
        self.connection.settimeout(self.timeout)
        return parsed

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = urlsplit(self.path).path
        if path == "/metrics":
            if not self._authorized():
                return
            try:
                body = self.server.render().encode("utf-8")
            except Exception:
                logger.exception("metrics: rendering failed")
                self._reply(500, b"rendering the metrics failed; see the broker's log\n")
                return
            self._reply(200, body, CONTENT_TYPE)
        elif path == "/healthz":
            healthy, text = self.server.health()
            self._reply(200 if healthy else 503, f"{text}\n".encode())
        elif path == "/":
            self._reply(200, b"hpbroker: metrics at /metrics, health at /healthz\n")
        else:
            self._reply(404, f"no {path} here: metrics are at /metrics\n".encode())

    def _authorized(self) -> bool:
        """Whether the request presents the token (always, without one); else answers 401."""
        expected = self.server.token
        if expected is None:
            return True
        scheme, _, given = self.headers.get("Authorization", "").strip().partition(" ")
        # compared whatever the scheme, so that the time taken tells nothing either way
        matches = hmac.compare_digest(given.strip().encode("utf-8", "replace"), expected)
        if matches and scheme.lower() == "bearer":
            return True
        now = time.monotonic()
        if now - self.server.refusals_logged_at >= _REFUSAL_LOG_INTERVAL_S:  # a prober cannot flood the log
            self.server.refusals_logged_at = now
            logger.info("metrics: %s refused: %s bearer token (refusals logged once a minute)",
                        self.address_string(), "a wrong" if given else "no")
        self._reply(401, b"the metrics endpoint needs the header Authorization: Bearer <token>\n",
                    headers={"WWW-Authenticate": _REALM})
        return False

    def _reply(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
               headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        logger.debug("metrics: %s %s", self.address_string(), format % args)
