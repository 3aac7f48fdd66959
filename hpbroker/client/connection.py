"""One ZeroMQ connection to a broker's front-end: requests out, responses matched by correlation id.

The wire format is ``hpbroker.protocol`` (docs/PROTOCOL.md): a ``DEALER`` socket connected to the
broker's ``ROUTER``; each request gets the next correlation id; the broker may answer requests in
any order, so responses are matched by id, and responses that arrive for requests other than the
one being waited for are kept until asked for.

No policy lives here: no retries, no metadata.  What this module decides is what "the broker
cannot be reached" means: a request that cannot be handed to a connected broker within
``connect_timeout_s`` raises :class:`~hpbroker.errors.BrokerNotAvailableError` (the socket sets
``ZMQ_IMMEDIATE``, so nothing queues up for a broker that is down), and a request whose response
does not come within its timeout raises :class:`~hpbroker.errors.RequestTimedOutError`.  After a
broker restart ZeroMQ reconnects by itself; requests that were in flight then never get an answer
(their timeout tells).

Threads: a connection, like its ZeroMQ socket, belongs to the thread that uses it.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from hpbroker import protocol
from hpbroker.errors import BrokerNotAvailableError, RequestTimedOutError, error_for_code

__all__ = ["DEFAULT_PORT", "BrokerAddress", "BrokerConnection", "Response", "parse_bootstrap"]

DEFAULT_PORT = 9092
_MAX_CORRELATION_ID = 2**32 - 1


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_bootstrap(bootstrap: str | Sequence[str]) -> list[BrokerAddress]:
    """``"host:port"``, ``"host"`` (port 9092), a comma-separated list of them, or a sequence of
    them; ``[v6::addr]:port`` for IPv6.  Raises ValueError naming the bad entry."""
    entries = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    addresses = []
    for raw in entries:
        entry = raw.strip()
        if not entry:
            continue
        host, port_text = entry, ""
        if entry.startswith("["):
            host, _, rest = entry[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else rest
        elif entry.count(":") == 1:
            host, port_text = entry.split(":")
        try:
            port = int(port_text) if port_text else DEFAULT_PORT
        except ValueError:
            raise ValueError(f"bad broker address {entry!r}: port {port_text!r} is not a number") from None
        if not host or not 0 < port < 65536:
            raise ValueError(f"bad broker address {entry!r}: expected host:port")
        addresses.append(BrokerAddress(host, port))
    if not addresses:
        raise ValueError(f"no broker address in bootstrap {bootstrap!r}")
    return addresses


@dataclass(slots=True)
class Response:
    correlation_id: int
    header: protocol.ResponseHeader
    body: protocol.Message

    def raise_for_error(self) -> protocol.Message:
        """The body, or the error the broker reported, as its exception."""
        if self.header.error_code:
            raise error_for_code(self.header.error_code, self.header.error_message)
        return self.body


class BrokerConnection:
    """A pipelining request/response channel to one broker's ZeroMQ front-end."""

    def __init__(self, address: BrokerAddress, *, client_id: str = "hpbroker-python",
                 context: zmq.Context | None = None, connect_timeout_s: float = 5.0,
                 connect: bool = True) -> None:
        """``connect=False``: the socket is made but not connected until :meth:`connect` (so a
        monitor attached in between sees the first handshake)."""
        self.address = address
        self.client_id = client_id
        self.connect_timeout_s = connect_timeout_s
        self._context = context if context is not None else zmq.Context.instance()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.IMMEDIATE, 1)
        self._socket.setsockopt(zmq.RECONNECT_IVL, 100)
        self._socket.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        if connect:
            self.connect()
        self._ids = itertools.count(1)
        # correlation id -> (api key, version asked: None for the newest), requests in flight
        self._waiting: dict[int, tuple[int, int | None]] = {}
        self._arrived: dict[int, Response] = {}  # answered, not yet taken
        # api key -> the version this broker takes, where it refused the newest (UnsupportedVersionError):
        # learned and used by the callers (hpbroker.client.metadata), not by this class.
        self.versions: dict[int, int] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"BrokerConnection({self.address}, in_flight={len(self._waiting)})"

    def connect(self) -> None:
        """Connect the socket to the broker (ZeroMQ reconnects by itself from then on)."""
        host = f"[{self.address.host}]" if ":" in self.address.host else self.address.host
        self._socket.connect(f"tcp://{host}:{self.address.port}")

    @property
    def socket(self) -> zmq.Socket:
        """For a poller: readable when a response has arrived."""
        return self._socket

    @property
    def in_flight(self) -> int:
        return len(self._waiting)

    @property
    def arrived(self) -> int:
        """Responses already read (while :meth:`wait_for` waited for another) and kept for
        :meth:`poll`: the socket no longer shows them, so a poller would not wake for them."""
        return len(self._arrived)

    def send(self, message: protocol.Message, *, expect_response: bool = True,
             version: int | None = None) -> int:
        """Send a request; its correlation id.  ``expect_response=False`` for a request the broker
        does not answer (acks=0 produce).  ``version``: the request's api_version (None: the
        newest the message type has); its response is decoded in the same version.  Raises
        BrokerNotAvailableError when no connection to the broker takes it within
        ``connect_timeout_s``, UnsupportedVersionError for a version the type does not have."""
        correlation_id = next(self._ids) & _MAX_CORRELATION_ID
        frames = protocol.encode_request(message, correlation_id, self.client_id, version)
        try:
            self._socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self._send_once_connected(frames)
        if expect_response:
            self._waiting[correlation_id] = (message.API_KEY, version)
        return correlation_id

    def _send_once_connected(self, frames: list) -> None:
        """Send ``frames``, which found no connected broker, once one is there: within
        ``connect_timeout_s`` or BrokerNotAvailableError.  Every try is non-blocking: the
        connection POLLOUT reported may be gone again by the send, and a blocking send would
        then wait for as long as the broker stays away."""
        deadline = time.monotonic() + self.connect_timeout_s
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not self._socket.poll(remaining_ms, zmq.POLLOUT):
                raise BrokerNotAvailableError(f"broker {self.address} is not reachable "
                                              f"(no connection within {self.connect_timeout_s} s)") from None
            try:
                self._socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
                return
            except zmq.Again:
                continue

    def poll(self, timeout_s: float) -> Response | None:
        """The next response to arrive (or already arrived and not taken), or None after
        ``timeout_s``.  Responses to requests this connection gave up on are dropped."""
        if self._arrived:
            return self._arrived.pop(next(iter(self._arrived)))
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
            if not self._socket.poll(remaining_ms):
                return None
            response = self._read_one()
            if response is not None:
                return response
            if time.monotonic() >= deadline:
                return None

    def _read_one(self) -> Response | None:
        frames = self._socket.recv_multipart(copy=False)
        head = frames[0].buffer
        correlation_id = int.from_bytes(head[:4], "little") if len(head) >= 4 else -1
        asked = self._waiting.pop(correlation_id, None)
        if asked is None:
            return None  # a late answer to an abandoned request, or garbage
        api_key, version = asked
        header, body = protocol.decode_response(api_key, [frame.buffer for frame in frames], version)
        return Response(correlation_id, header, body)

    def wait_for(self, correlation_id: int, timeout_s: float) -> Response:
        """The response to ``correlation_id``; others arriving meanwhile are kept for
        :meth:`poll`.  Raises RequestTimedOutError (and forgets the request) after ``timeout_s``."""
        if correlation_id in self._arrived:
            return self._arrived.pop(correlation_id)
        deadline = time.monotonic() + timeout_s
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not self._socket.poll(remaining_ms):
                self.forget(correlation_id)
                raise RequestTimedOutError(f"no response from {self.address} to request {correlation_id} "
                                           f"within {timeout_s} s")
            response = self._read_one()
            if response is None:
                continue
            if response.correlation_id == correlation_id:
                return response
            self._arrived[response.correlation_id] = response

    def call(self, message: protocol.Message, timeout_s: float = 30.0, *, version: int | None = None) -> Any:
        """Send ``message`` (in ``version``, as :meth:`send`) and return the response body,
        raising the broker's error if any."""
        return self.wait_for(self.send(message, version=version), timeout_s).raise_for_error()

    def forget(self, correlation_id: int) -> None:
        """Give up on a request: its response, if it ever comes, is dropped."""
        self._waiting.pop(correlation_id, None)
        self._arrived.pop(correlation_id, None)

    def close(self, linger_ms: int = 0) -> None:
        """Close the socket; requests it has not sent yet are dropped, or sent in the background
        for up to ``linger_ms`` (an acks=0 producer's last requests: nobody would resend them)."""
        if not self._closed:
            self._closed = True
            self._socket.close(linger=linger_ms)
