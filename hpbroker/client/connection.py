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

**Security.**  Given a :class:`~hpbroker.security.client.ClientSecurity`, the socket is a CurveZMQ
client of the broker (docs/SECURITY.md).  libzmq reports a refused handshake only to a socket
monitor, never as an error of a send: every connection therefore monitors its handshakes
(:meth:`BrokerConnection.monitor_events`), and a request that finds no connected broker because
the broker refused the handshake raises :class:`~hpbroker.errors.AuthenticationError` saying why
(the key is not on the broker's allowlist, the server key is wrong, or one side has no security)
at once, instead of BrokerNotAvailableError after ``connect_timeout_s``.  libzmq does not retry a
refused connection; the next request that finds no connected broker reconnects, so a key
allowlisted since gets in.

The monitor's events are written by the ZeroMQ context's I/O thread, which blocks once the
monitor's pipe is full, stalling every socket of the context (``Context.instance()`` is shared by
the whole process).  Reconnects happen whether anyone reads the events or not (a broker restart
gives a disconnect and a handshake, a wrong server key a failed handshake every reconnect
interval), and most owners never read them (an Admin, a consumer's metadata connection).  So the
monitor's receive HWM is 0 (never blocking the I/O thread), and its backlog is kept short
without a timer: every 1024th request drains it, and so does every :meth:`BrokerConnection.poll`
and :meth:`BrokerConnection.wait_for` that waited and got nothing (the idle path: at most
:data:`_DRAIN_MAX_EVENTS` events a call, non-blocking), each keeping the newest
:data:`_KEPT_EVENTS` for :meth:`BrokerConnection.monitor_events`.  A send that raises the
broker's refusal of the handshake also disconnects the socket from the broker, so that libzmq
stops reconnecting (and failing, an event or two each time) until the next send reconnects; so
an idle connection whose key or server key is wrong gathers no backlog even when nobody polls
it.  Other connected requests never touch the monitor: the unsecured path costs what it did.

Threads: a connection, like its ZeroMQ socket, belongs to the thread that uses it.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from hpbroker import protocol
from hpbroker.errors import AuthenticationError, BrokerNotAvailableError, RequestTimedOutError, error_for_code

if TYPE_CHECKING:
    from hpbroker.security.client import ClientSecurity

__all__ = ["DEFAULT_PORT", "BrokerAddress", "BrokerConnection", "Response", "parse_bootstrap"]

DEFAULT_PORT = 9092
_MAX_CORRELATION_ID = 2**32 - 1
#: What a connection's monitor reports: handshakes (their failures tell a refused key) and disconnects.
_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
MONITOR_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | _HANDSHAKE_FAILED | zmq.EVENT_DISCONNECTED
_MECHANISM_MISMATCH = zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH  # CURVE met NULL: one side has no security
_HANDSHAKE_CHECK_MS = 20  # how often a send waiting for a connection looks for a refused handshake
_KEPT_EVENTS = 256
_DRAIN_EVERY_MASK = 1023  # a send whose correlation id is a multiple of 1024 reads the monitor
_DRAIN_MAX_EVENTS = 1024  # the most an idle poll / wait_for reads off the monitor in one call
_monitor_numbers = itertools.count()


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
                 connect: bool = True, security: ClientSecurity | None = None) -> None:
        """``connect=False``: the socket is made but not connected until :meth:`connect` (for a
        caller that registers :attr:`monitor` with a poller first).  ``security``: connect as
        this CurveZMQ client (None: without security)."""
        self.address = address
        self.client_id = client_id
        self.connect_timeout_s = connect_timeout_s
        self.security = security
        self._context = context if context is not None else zmq.Context.instance()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.IMMEDIATE, 1)
        self._socket.setsockopt(zmq.RECONNECT_IVL, 100)
        self._socket.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        if security is not None:
            security.apply(self._socket)
        # The monitor is attached before the socket connects, so it sees the first handshake.
        monitor_address = f"inproc://hpbroker-connection-monitor-{os.getpid()}-{next(_monitor_numbers)}"
        self._socket.monitor(monitor_address, MONITOR_EVENTS)
        self._monitor = self._context.socket(zmq.PAIR)
        self._monitor.setsockopt(zmq.LINGER, 0)
        # Unbounded: libzmq writes the events from the context's I/O thread and blocks there once
        # the pipe is full, which would stall every socket of the context (module docstring).
        self._monitor.setsockopt(zmq.RCVHWM, 0)
        self._monitor.connect(monitor_address)
        self._refused: AuthenticationError | None = None  # the last handshake's failure, until one succeeds
        # Events read while a send waited for a connection, kept for monitor_events (bounded:
        # a connection whose owner never asks drops the oldest).
        self._events: collections.deque[int] = collections.deque(maxlen=_KEPT_EVENTS)
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
        """Connect the socket to the broker (ZeroMQ reconnects by itself from then on, but after
        a refused handshake: see :meth:`_handshake_again`)."""
        self._socket.connect(self._endpoint)

    @property
    def _endpoint(self) -> str:
        host = f"[{self.address.host}]" if ":" in self.address.host else self.address.host
        return f"tcp://{host}:{self.address.port}"

    @property
    def socket(self) -> zmq.Socket:
        """For a poller: readable when a response has arrived."""
        return self._socket

    @property
    def monitor(self) -> zmq.Socket:
        """For a poller: readable when the socket's monitor has events (:meth:`monitor_events`)."""
        return self._monitor

    def monitor_events(self) -> list[int]:
        """The monitor's events since the last call (``MONITOR_EVENTS``: handshake succeeded or
        failed, disconnected), those a send read while it waited included."""
        self._read_monitor()
        events = list(self._events)
        self._events.clear()
        return events

    @property
    def events_pending(self) -> bool:
        """Whether :meth:`monitor_events` has events a send already read (the monitor socket
        then no longer shows them to a poller)."""
        return bool(self._events)

    def _read_monitor(self, limit: int | None = None) -> None:
        """Read the monitor's events into ``_events`` (at most ``limit``; None: all there are),
        noting the last handshake's failure.  Never blocks."""
        monitor = self._monitor
        count = 0
        while (limit is None or count < limit) and monitor.poll(0):
            count += 1
            message = parse_monitor_message(self._monitor.recv_multipart())
            event = int(message["event"])
            self._events.append(event)
            if event & _HANDSHAKE_FAILED:
                self._refused = self._handshake_error(event, int(message["value"]))
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._refused = None

    @property
    def refused(self) -> AuthenticationError | None:
        """Why the broker refused the last handshake (None: it did not, or one succeeded since),
        as of the monitor's events read so far."""
        return self._refused

    def _handshake_error(self, event: int, value: int) -> AuthenticationError:
        """What a failed handshake means, in words a user can act on (docs/SECURITY.md)."""
        where = f"broker {self.address}"
        security = self.security
        if security is None:
            return AuthenticationError(f"the {where} requires CurveZMQ: give key_file and server_key_file "
                                       f"(or $HPBROKER_CLIENT_KEY_FILE and $HPBROKER_CLIENT_SERVER_KEY_FILE)")
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return AuthenticationError(f"{where} refused key {security.name!r} (not on its allowlist, "
                                       f"or revoked)")
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == _MECHANISM_MISMATCH:
            return AuthenticationError(f"{where} runs without security (security \"none\"): connect without "
                                       f"key_file and server_key_file, or turn security on at the broker")
        return AuthenticationError(f"{where} did not accept the CurveZMQ handshake of key {security.name!r}: "
                                   f"the server key given (server_key_file) is not the broker's public key, "
                                   f"or the broker runs without security")

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
        ``connect_timeout_s``, AuthenticationError when the broker refuses the CurveZMQ
        handshake (module docstring), UnsupportedVersionError for a version the type does not have."""
        correlation_id = next(self._ids) & _MAX_CORRELATION_ID
        if not correlation_id & _DRAIN_EVERY_MASK:  # now and then: keep the monitor's backlog short
            self._read_monitor()
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
        ``connect_timeout_s`` or BrokerNotAvailableError; AuthenticationError as soon as the
        broker refuses the handshake (a refusal seen before is tried again first, module
        docstring).  Every try is non-blocking: the
        connection POLLOUT reported may be gone again by the send, and a blocking send would
        then wait for as long as the broker stays away."""
        deadline = time.monotonic() + self.connect_timeout_s
        self._read_monitor()
        if self._refused is not None:
            self._handshake_again()
        while True:
            self._read_monitor()
            if self._refused is not None:
                # Stop libzmq reconnecting (and failing) until the next send tries again
                # (_handshake_again): an idle connection then gathers no events.
                with contextlib.suppress(zmq.ZMQError):
                    self._socket.disconnect(self._endpoint)
                raise self._refused
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                raise BrokerNotAvailableError(f"broker {self.address} is not reachable "
                                              f"(no connection within {self.connect_timeout_s} s)") from None
            # In slices, reading the monitor between them: a refused handshake shows only there.
            if not self._socket.poll(min(remaining_ms, _HANDSHAKE_CHECK_MS), zmq.POLLOUT):
                continue
            try:
                self._socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
                return
            except zmq.Again:
                continue

    def _handshake_again(self) -> None:
        """Reconnect after a refused handshake: libzmq gives up on a connection whose key the
        broker refused, and the request being sent deserves a handshake of its own (the key may
        have been allowlisted since).  The refusal is forgotten; the new handshake's outcome
        comes through the monitor."""
        self._refused = None
        with contextlib.suppress(zmq.ZMQError):
            self._socket.disconnect(self._endpoint)
        self._socket.connect(self._endpoint)

    def poll(self, timeout_s: float) -> Response | None:
        """The next response to arrive (or already arrived and not taken), or None after
        ``timeout_s``.  Responses to requests this connection gave up on are dropped."""
        if self._arrived:
            return self._arrived.pop(next(iter(self._arrived)))
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
            if not self._socket.poll(remaining_ms):
                self._read_monitor(_DRAIN_MAX_EVENTS)  # idle: keep the monitor's backlog short
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
                self._read_monitor(_DRAIN_MAX_EVENTS)  # idle: keep the monitor's backlog short
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
            with contextlib.suppress(zmq.ZMQError):
                self._socket.disable_monitor()
            self._monitor.close(linger=0)
            self._socket.close(linger=linger_ms)
