"""A worker's TCP data port: fetches served with ``sendfile`` straight from the segment files.

Framing is docs/PROTOCOL.md's TCP form (``head_length`` u32, ``payload_length`` u32, head,
payload).  The port serves FetchRequest and ListOffsetsRequest (and AuthenticateRequest,
"Security" below); any other well-formed request gets
error 10, a fetch for a partition of another worker error 6.  A message whose header parses but
whose key or version is unknown gets error 9, one whose body does not parse error 10 (the framing
told where it ends, so the stream stays usable).  A stream that cannot be parsed (a bad length, an
empty head, a header that does not decode) closes its connection: nobody can be answered.

Followers fetch from their leader here too: a FetchRequest with ``replica_id`` >= 0 is a
replica fetch (``hpbroker.workers.replication``), sent from the same segment files with
``sendfile``, up to the leader's flushed end.

Each connection answers in request order.  Its requests get a *slot* each, in a queue; a slot is
filled when its reply is ready (at once, or later for a long poll) and the front slots are written
while they are filled: first the prefix and head with ``send`` (``MSG_MORE`` when a payload
follows, so they share a packet with it), then the payload with ``os.sendfile`` from the segment
file, never through a Python buffer.  Sockets are non-blocking: a send that would block leaves the
rest in its slot and waits for EPOLLOUT, so a slow reader costs the worker nothing but the slot.
A connection with :data:`MAX_QUEUED_RESPONSES` slots stops being read until it drains.

Clients that go away must not keep what they held.  A client that closes its side (EOF, or
``EPOLLRDHUP`` while the connection is not being read) while a fetch of its is parked has its
connection closed at once, the parked fetch (and anything queued behind it) dropped: the slot must
not wait up to ``max_wait_ms`` for a reader that is gone.  Without a parked fetch, what it asked is
answered first (a client may shut down its sending side and read on).  A connection that moves no
byte either way and has no fetch parked for ``connections_max_idle_ms`` is closed by
:meth:`FetchServer.close_idle`, which the worker calls on every turn of its loop (which wakes at
least every heartbeat); TCP keepalive is on, so the kernel also notices a peer that vanished.

**Connection limits** before a connection has shown it is a client (docs/PROTOCOL.md), on a
broker with security (the server holds a guard; without one, a connection counts as shown from
its accept and only ``connections_max_idle_ms`` applies, as for any connection).  A connection
that has not sent a whole first request within the first-request deadline
(:data:`FIRST_REQUEST_DEADLINE_S`, 10 s: what the worker passes as ``first_request_deadline_s``)
of its accept is closed by :meth:`FetchServer.close_idle`, whatever the bytes it trickles (they
would reset the idle clock).  With tokens required (``data_port_auth = "token"``) "shown" means
"authenticated": the deadline runs until its AuthenticateRequest is accepted; it may send at most
:data:`UNAUTHENTICATED_MAX_BYTES` (8 KiB) before that (more closes it, and no more is ever
buffered); and at most :data:`MAX_UNAUTHENTICATED_CONNECTIONS` (64, and at most half of
``max_connections``) such connections are held: a new connection beyond that, or beyond
``max_connections``, closes the oldest unauthenticated one instead of being refused.  So peers
that never authenticate cannot take the slots of consumers and followers, nor hold more than 64 x
8 KiB of a worker's memory.  The cost once a connection has shown itself: one attribute test per
``recv``, none per request.

File descriptors: a slice's descriptor belongs to the log, which may close it (topic deleted,
retention, shutdown) before a slow reader has it all.  So a slot that cannot be sent in the call
that filled it first ``dup``\\s the descriptor; the duplicate reads the same file (deleted or not)
and is closed when the slot is done.

**Security** (docs/SECURITY.md).  On a broker with ``security = "curve"`` and ``data_port_auth =
"token"`` the server holds a :class:`~hpbroker.security.data_port.DataPortGuard`.  A connection's
first request must then be an AuthenticateRequest whose fetch token the guard accepts; any other
first request, a refused token, any request after the token's expiry and any request once the
principal's key has been revoked (the allowlist no longer names it) are answered with error 27
and the connection closed once that answer is sent (nothing after it is read).  Each fetch
and list-offsets of an authenticated connection is checked against the ACLs for its principal:
a refusal is answered with error 28 and the connection stays.  Until the worker has the
broker's security state (it just started) an AuthenticateRequest is answered with error 15
(PartitionNotAvailableError, retriable: connect again shortly) and the connection closed.  A
connection may authenticate again with a newer token before its own expires.  With
``data_port_auth = "loopback"`` the server holds a guard too (``tokens_required`` False): consumer
fetches and list-offsets are served without a token or an ACL check, but a replica fetch
(``replica_id`` >= 0, which moves the leader's high watermark and ISR) is served only on a
connection authenticated with a token, and checked as above (``cluster_action``): on one that
is not, it is answered with error 27 and the connection closed; an AuthenticateRequest is
checked as with tokens.  Without a guard an AuthenticateRequest is answered with error 0 and an
empty principal, and each request costs one attribute check more.

The listener and every connection sit in one ``epoll`` object, level-triggered, whose own
descriptor the worker polls with its other sockets: the worker's poll stays four entries long
however many connections there are.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import select
import socket
import struct
import time
from collections import OrderedDict, deque

from hpbroker import protocol
from hpbroker.errors import (
    AuthenticationError,
    HPBrokerError,
    InvalidRequestError,
    PartitionNotAvailableError,
)
from hpbroker.protocol import ApiKey
from hpbroker.security.data_port import DataPortGuard
from hpbroker.workers.handlers import RequestHandler
from hpbroker.workers.replies import Reply, Responder, error_reply

__all__ = ["FIRST_REQUEST_DEADLINE_S", "MAX_QUEUED_RESPONSES", "MAX_UNAUTHENTICATED_CONNECTIONS",
           "SERVED_API_KEYS", "UNAUTHENTICATED_MAX_BYTES", "FetchServer"]

logger = logging.getLogger(__name__)

SERVED_API_KEYS = frozenset({ApiKey.FETCH, ApiKey.LIST_OFFSETS})
# Requests in flight per connection before the worker stops reading more from it.
MAX_QUEUED_RESPONSES = 64
RECV_BYTES = 256 << 10
# Connection limits before a connection has shown it is a client (module docstring, "Connection
# limits"; docs/PROTOCOL.md): seconds from accept to its first whole request (with tokens: to its
# accepted AuthenticateRequest); with tokens, the bytes it may send before that (an
# AuthenticateRequest is under 2 KiB) and how many such connections a worker holds at once
# (at most half of max_connections).
FIRST_REQUEST_DEADLINE_S = 10.0
UNAUTHENTICATED_MAX_BYTES = 8 << 10
MAX_UNAUTHENTICATED_CONNECTIONS = 64
# The TCP framing's prefix (docs/PROTOCOL.md, "Two transports"): head_length u32, payload_length
# u32.  Written here rather than with protocol.frame_tcp because the payload is a file slice.
_TCP_PREFIX = struct.Struct("<II")
# accept() errors that say "out of descriptors or memory": stop accepting until a connection closes.
_ACCEPT_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class _Slot:
    """One request's place in its connection's response order; once filled, what is left to send
    of its reply: ``head`` (prefix, head and any in-memory payload), then ``left`` bytes of the
    file ``fd`` from ``position``."""

    __slots__ = ("fd", "filled", "head", "left", "owned", "position")

    def __init__(self) -> None:
        self.filled = False
        self.head = memoryview(b"")
        self.fd = -1
        self.position = self.left = 0
        self.owned = False  # whether fd is our duplicate, to close

    def fill(self, reply: Reply) -> None:
        file_slice = reply.file_slice
        if file_slice is not None and file_slice.length:
            prefix = _TCP_PREFIX.pack(len(reply.head), file_slice.length)
            self.head = memoryview(prefix + reply.head)
            self.fd, self.position, self.left = file_slice.fd, file_slice.position, file_slice.length
        else:
            payload = bytes(reply.payload)
            self.head = memoryview(_TCP_PREFIX.pack(len(reply.head), len(payload)) + reply.head + payload)
        self.filled = True

    def own(self) -> None:
        """Hold a duplicate of the file descriptor, so the rest can be sent after the log closed it."""
        if self.left and not self.owned:
            self.fd = os.dup(self.fd)
            self.owned = True

    def release(self) -> None:
        if self.owned:
            self.owned = False
            os.close(self.fd)


class _Connection:
    """One client connection.  ``unfilled`` counts its slots still waiting for their reply (parked
    fetches and what queues behind them); ``active_at`` is when a byte last moved or a reply
    was made (``time.monotonic()``), for the idle timeout."""

    __slots__ = ("accepted_at", "active_at", "closed", "decoder", "expires_at_ms", "fd", "mask", "peer",
                 "principal", "reading", "received", "slots", "sock", "unfilled", "unproven")

    def __init__(self, sock: socket.socket, peer: object, max_request_bytes: int, now: float) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = peer
        self.decoder = protocol.TcpFrameDecoder(max_request_bytes)
        self.slots: deque[_Slot] = deque()
        self.unfilled = 0
        self.reading = True
        self.closed = False
        self.mask = select.EPOLLIN
        self.active_at = self.accepted_at = now
        # Not yet shown to be a client: no whole request yet (with tokens: not authenticated yet);
        # ``received`` counts its bytes until then.
        self.unproven = True
        self.received = 0
        self.principal: str | None = None  # who the connection acts for, once authenticated
        self.expires_at_ms = 0  # when its token expires (ms since the epoch)

    def __repr__(self) -> str:
        return f"connection from {self.peer}"


class FetchServer:
    """The data port of one worker: accepts, reads requests, writes replies in order."""

    def __init__(self, listener: socket.socket, handler: RequestHandler, *, max_connections: int,
                 max_request_bytes: int, max_idle_s: float = 600.0,
                 guard: DataPortGuard | None = None, tokens_required: bool = True,
                 first_request_deadline_s: float = FIRST_REQUEST_DEADLINE_S) -> None:
        """``guard``: set on a broker with ``security = "curve"`` (module docstring, "Security");
        None serves every connection.  ``tokens_required``: with a guard, whether every connection
        authenticates first (``data_port_auth = "token"``) or only those that send replica
        fetches (``"loopback"``).  ``first_request_deadline_s``: with a guard, the seconds a
        connection has from its accept to show it is a client (module docstring, "Connection
        limits"); unused without one."""
        self._listener = listener
        self._handler = handler
        self._guard = guard
        self._tokens_required = guard is not None and tokens_required
        # Connections not yet shown to be clients (_Connection.unproven), in accept order.
        self._unproven: OrderedDict[int, _Connection] = OrderedDict()
        self._max_unproven = max(1, min(MAX_UNAUTHENTICATED_CONNECTIONS, max_connections // 2))
        self._first_request_deadline_s = first_request_deadline_s
        self._max_connections = max_connections
        self._max_request_bytes = max_request_bytes
        self._max_idle_s = max_idle_s
        # fd -> connection, least recently active first (each activity moves it to the end).
        self._connections: OrderedDict[int, _Connection] = OrderedDict()
        self._epoll = select.epoll()
        listener.setblocking(False)
        self._listener_fd = listener.fileno()
        self._epoll.register(self._listener_fd, select.EPOLLIN)
        self._accepting = True  # registered for EPOLLIN
        self._stopped = False  # stop_accepting() was called

    def fileno(self) -> int:
        """The epoll descriptor: readable when any connection or the listener has an event."""
        return self._epoll.fileno()

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    @property
    def has_output(self) -> bool:
        """Whether some connection still has a response to send."""
        return any(conn.slots for conn in self._connections.values())

    def process_events(self, timeout_s: float = 0) -> None:
        for fd, events in self._epoll.poll(timeout_s):
            if fd == self._listener_fd:
                self._accept()
                continue
            conn = self._connections.get(fd)
            if conn is None:
                continue
            try:
                self._on_events(conn, events)
            except Exception:  # a bug must cost one connection, not the worker
                logger.exception("data port: unexpected error on %r; closing it", conn)
                self._close(conn, "internal error")

    def _on_events(self, conn: _Connection, events: int) -> None:
        if events & select.EPOLLERR:
            self._close(conn, "socket error")
            return
        if events & select.EPOLLIN:
            self._read(conn)
        if events & select.EPOLLOUT and not conn.closed:
            self._write(conn)
        if events & select.EPOLLHUP and not conn.closed:
            self._close(conn, "hung up")
        elif events & select.EPOLLRDHUP and not conn.closed:
            if conn.unfilled:
                self._close(conn, f"closed by the client with {conn.unfilled} fetches parked (dropped)")
            else:
                self._update_interest(conn)

    def _touch(self, conn: _Connection) -> None:
        conn.active_at = time.monotonic()
        self._connections.move_to_end(conn.fd)

    def close_idle(self, now: float) -> None:
        """Close the connections idle for ``connections_max_idle_ms`` (module docstring): no byte
        moved and no fetch parked; and, with a guard, those that have not sent a whole first
        request (with tokens: not authenticated) within the first-request deadline of their
        accept.  Cheap when none is: the oldest of each kind comes first."""
        unproven = self._unproven
        deadline = now - self._first_request_deadline_s
        while unproven:
            conn = next(iter(unproven.values()))
            if conn.accepted_at > deadline:
                break
            logger.info("data port: closing %r: %s within %.0f s of its connect", conn,
                        "not authenticated" if self._tokens_required else "no whole request",
                        self._first_request_deadline_s)
            self._close(conn, "no first request in time")
        connections = self._connections
        deadline = now - self._max_idle_s
        while connections:
            conn = next(iter(connections.values()))
            if conn.active_at > deadline:
                return
            if conn.unfilled:  # a parked fetch is owed an answer: not idle
                self._touch(conn)
                continue
            logger.info("data port: closing %r: idle for %.0f ms (connections_max_idle_ms)", conn,
                        (now - conn.active_at) * 1000)
            self._close(conn, "idle")

    # --- accepting -----------------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno in _ACCEPT_EXHAUSTED:
                    logger.error("data port: accept failed (%s); not accepting until a connection closes", e)
                    self._set_accepting(False)
                    return
                if e.errno == errno.ECONNABORTED:
                    continue
                logger.warning("data port: accept failed: %s", e)
                return
            if self._tokens_required and self._unproven and (
                    len(self._unproven) >= self._max_unproven
                    or len(self._connections) >= self._max_connections):
                # Not authenticated yet: never in the way of a new connection (module docstring,
                # "Connection limits").
                oldest = next(iter(self._unproven.values()))
                logger.debug("data port: closing %r: not authenticated, and %s connects", oldest, peer)
                self._close(oldest, "not authenticated; making room")
            if len(self._connections) >= self._max_connections:
                logger.warning("data port: refused %s: max_connections %d reached", peer,
                               self._max_connections)
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            conn = _Connection(sock, peer, self._max_request_bytes, time.monotonic())
            self._connections[conn.fd] = conn
            if self._guard is None:  # no first-request deadline without security (module docstring)
                conn.unproven = False
            else:
                self._unproven[conn.fd] = conn
            self._epoll.register(conn.fd, conn.mask)

    def _set_accepting(self, accepting: bool) -> None:
        if accepting != self._accepting and not self._stopped:
            self._epoll.modify(self._listener_fd, select.EPOLLIN if accepting else 0)
            self._accepting = accepting

    def stop_accepting(self) -> None:
        """Graceful stop, first step: accept nothing more (the listener stays open, the arbiter's)."""
        self._set_accepting(False)
        self._stopped = True

    def stop_reading(self) -> None:
        """Graceful stop: read no more requests; connections with nothing left to send close."""
        for conn in list(self._connections.values()):
            conn.reading = False
            if conn.slots:
                self._update_interest(conn)
            else:
                self._close(conn, "worker stopping")

    # --- reading -------------------------------------------------------------------------------

    def _read(self, conn: _Connection) -> None:
        if not conn.reading:
            return
        size = RECV_BYTES
        if conn.unproven and self._tokens_required:  # never buffer more than the limit
            size = UNAUTHENTICATED_MAX_BYTES + 1 - conn.received
        try:
            data = conn.sock.recv(size)
        except BlockingIOError:
            return
        except OSError as e:
            self._close(conn, f"recv failed: {e}")
            return
        if not data:
            conn.reading = False
            if conn.unfilled:  # a parked fetch: nobody is left to wait for it
                self._close(conn, f"closed by the client with {conn.unfilled} fetches parked (dropped)")
            elif conn.slots:
                self._update_interest(conn)  # answer what was asked, then close
            else:
                self._close(conn, "closed by the client")
            return
        self._touch(conn)
        try:
            messages = conn.decoder.feed(data)
        except HPBrokerError as e:
            self._close(conn, f"unparsable stream: {e}")
            return
        if conn.unproven:
            conn.received += len(data)
            if messages and not self._tokens_required:
                self._prove(conn)
        for frames in messages:
            slot = _Slot()
            conn.slots.append(slot)
            conn.unfilled += 1
            responder = functools.partial(self._deliver, conn, slot)
            try:
                header, request = protocol.decode_request(frames)
            except HPBrokerError as e:
                header = getattr(e, "header", None)
                if header is None:  # nobody to answer
                    self._close(conn, f"unparsable stream: {e}")
                    return
                responder(error_reply(header.api_key, header.correlation_id, e, version=header.api_version))
            else:
                if self._guard is not None:
                    self._serve_guarded(conn, header, request, responder)
                elif header.api_key not in SERVED_API_KEYS:  # answered even when an acks=0 produce
                    if header.api_key == ApiKey.AUTHENTICATE:  # no token needed here: welcome
                        responder(_authenticated_reply(header, "", -1))
                    else:
                        responder(_not_served_reply(header, request))
                else:
                    self._handler.dispatch(header, request, responder, conn, SERVED_API_KEYS, "tcp")
            if conn.closed or not conn.reading:  # (not reading: refused, the rest is not served)
                break
        if conn.unproven and conn.received > UNAUTHENTICATED_MAX_BYTES and self._tokens_required \
                and not conn.closed:
            logger.info("data port: closing %r: %d bytes without an accepted AuthenticateRequest", conn,
                        conn.received)
            self._close(conn, "too many bytes before authenticating")
            return
        if not conn.closed:
            self._update_interest(conn)

    def _prove(self, conn: _Connection) -> None:
        """``conn`` has shown it is a client: the first-request limits no longer apply."""
        conn.unproven = False
        del self._unproven[conn.fd]

    def _serve_guarded(self, conn: _Connection, header: protocol.RequestHeader, request: protocol.Message,
                       responder: Responder) -> None:
        """A request on a secured data port (module docstring, "Security")."""
        guard = self._guard
        assert guard is not None
        api_key = header.api_key
        if api_key == ApiKey.AUTHENTICATE:
            try:
                principal, expires_at_ms = guard.authenticate(request.token)  # type: ignore[attr-defined]
            except (AuthenticationError, PartitionNotAvailableError) as e:  # refused, or not ready yet
                logger.info("data port: refused %r: %s", conn, e)
                self._refuse(conn, header, e, responder)
                return
            if conn.principal is None:
                logger.debug("data port: %r authenticated as %r", conn, principal)
            if conn.unproven:
                self._prove(conn)
            conn.principal, conn.expires_at_ms = principal, expires_at_ms
            responder(_authenticated_reply(header, principal, expires_at_ms))
            return
        if not self._tokens_required and not (api_key == ApiKey.FETCH
                                              and request.replica_id >= 0):  # type: ignore[attr-defined]
            # Loopback: consumer requests are served as without a guard, authenticated or not.
            if api_key not in SERVED_API_KEYS:
                responder(_not_served_reply(header, request))
            else:
                self._handler.dispatch(header, request, responder, conn, SERVED_API_KEYS, "tcp")
            return
        if conn.principal is None:
            self._refuse(conn, header, AuthenticationError(
                "the first request on a data port of a secured broker must be AuthenticateRequest with a "
                "fetch token (FetchTokenRequest on the front-end gives one)" if self._tokens_required else
                "a replica fetch on a data port of a secured broker needs a connection authenticated with "
                "a fetch token of a principal allowed cluster_action, with data_port_auth = 'loopback' "
                "too"), responder)
            return
        now_ms = time.time_ns() // 1_000_000
        if now_ms >= conn.expires_at_ms:
            self._refuse(conn, header, AuthenticationError(
                f"the connection's fetch token (principal {conn.principal!r}) expired at "
                f"{conn.expires_at_ms} ms, {now_ms - conn.expires_at_ms} ms ago; connect again with a new "
                f"token"), responder)
            return
        if api_key not in SERVED_API_KEYS:
            responder(_not_served_reply(header, request))
            return
        error = guard.check(conn.principal, api_key, request)
        if isinstance(error, AuthenticationError):  # revoked since the connection authenticated
            logger.info("data port: refused %r: %s", conn, error)
            self._refuse(conn, header, error, responder)
            return
        if error is not None:
            responder(error_reply(api_key, header.correlation_id, error, version=header.api_version))
            return
        self._handler.dispatch(header, request, responder, conn, SERVED_API_KEYS, "tcp")

    def _refuse(self, conn: _Connection, header: protocol.RequestHeader, error: HPBrokerError,
                responder: Responder) -> None:
        """Answer ``error`` (27, or 15 while not ready), then close the connection once everything
        before it is sent: nothing more is read from it."""
        conn.reading = False
        responder(error_reply(header.api_key, header.correlation_id, error, version=header.api_version))

    # --- writing -------------------------------------------------------------------------------

    def _deliver(self, conn: _Connection, slot: _Slot, reply: Reply) -> None:
        """The responder of one slot: fill it, send what the socket takes now, and keep a
        duplicate descriptor for the rest."""
        if conn.closed:
            reply.file_slice = None  # nothing of it goes out (replies.py: the stats count what does)
            return
        slot.fill(reply)
        conn.unfilled -= 1
        self._touch(conn)
        if conn.slots[0] is slot:
            self._write(conn)
        elif not conn.unfilled:
            self._update_interest(conn)  # EPOLLRDHUP is no longer wanted
        if slot.left and not conn.closed:
            try:
                slot.own()
            except OSError as e:
                self._close(conn, f"cannot keep the segment file open: {e}")

    def _write(self, conn: _Connection) -> None:
        slots, sock, fd = conn.slots, conn.sock, conn.fd
        if slots and slots[0].filled:
            self._touch(conn)  # a byte moves, or the socket is full: the idle clock restarts
        try:
            while slots and slots[0].filled:
                slot = slots[0]
                while slot.head:
                    sent = sock.send(slot.head, socket.MSG_MORE if slot.left else 0)
                    slot.head = slot.head[sent:]
                while slot.left:
                    sent = os.sendfile(fd, slot.fd, slot.position, slot.left)
                    if sent == 0:
                        raise OSError(errno.EIO, f"segment file ended {slot.left} bytes before the slice")
                    slot.position += sent
                    slot.left -= sent
                slots.popleft()
                slot.release()
        except BlockingIOError:
            pass
        except OSError as e:
            self._close(conn, f"send failed: {e}")
            return
        if not slots and not conn.reading:
            self._close(conn, "done")
            return
        self._update_interest(conn)

    def _update_interest(self, conn: _Connection) -> None:
        slots = conn.slots
        mask = 0
        if conn.reading and len(slots) < MAX_QUEUED_RESPONSES:
            mask |= select.EPOLLIN
        if slots and slots[0].filled:  # the front is filled but not sent: the socket is full
            mask |= select.EPOLLOUT
        if conn.unfilled:  # see the client close while a fetch is parked, even when not reading
            mask |= select.EPOLLRDHUP
        if mask != conn.mask:
            self._epoll.modify(conn.fd, mask)
            conn.mask = mask

    # --- closing -------------------------------------------------------------------------------

    def _close(self, conn: _Connection, reason: str) -> None:
        if conn.closed:
            return
        conn.closed = True
        logger.debug("data port: closing %r: %s", conn, reason)
        del self._connections[conn.fd]
        if conn.unproven:
            del self._unproven[conn.fd]
        with contextlib.suppress(OSError):
            self._epoll.unregister(conn.fd)
        conn.sock.close()
        for slot in conn.slots:
            slot.release()
        conn.slots.clear()
        self._set_accepting(True)

    def close(self) -> None:
        """Close every connection and the epoll object (not the listener: the arbiter owns it)."""
        for conn in list(self._connections.values()):
            self._close(conn, "worker stopped")
        self._epoll.close()


def _authenticated_reply(header: protocol.RequestHeader, principal: str, expires_at_ms: int) -> Reply:
    response = protocol.AuthenticateResponse(principal=principal, expires_at_ms=expires_at_ms)
    head = protocol.encode_response(response, header.correlation_id, version=header.api_version)[0]
    return Reply(ApiKey.AUTHENTICATE, header.correlation_id, head, api_version=header.api_version)


def _not_served_reply(header: protocol.RequestHeader, request: protocol.Message) -> Reply:
    error = InvalidRequestError(f"{type(request).__name__} (api_key {header.api_key}) is not served on a "
                                f"data port; it serves api keys {sorted(SERVED_API_KEYS)} (and "
                                f"{ApiKey.AUTHENTICATE}: AuthenticateRequest)")
    return error_reply(header.api_key, header.correlation_id, error, version=header.api_version)
