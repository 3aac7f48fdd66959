"""The ZeroMQ front-end's connections: bounded in number, in memory and in silence.

ZeroMQ accepts connections in its own I/O thread and offers no hook to refuse one, so the
front-end's limits are made of what it does offer, set by :func:`configure_front` before the
ROUTER binds (a listener copies the socket's options when it is bound):

- ``ZMQ_MAXMSGSIZE`` = ``max_request_bytes``: a peer announcing a larger frame is disconnected
  before any of it is buffered;
- ``ZMQ_HANDSHAKE_IVL`` = ``frontend_heartbeat_timeout_ms``: a peer that connects and never
  completes its ZMTP handshake is disconnected; with ``security = "curve"`` within
  :data:`CURVE_HANDSHAKE_MS` at most (a CurveZMQ client completes its handshake in one round
  trip and a ZAP lookup; an unauthenticated peer holds a connection slot, and the I/O thread's
  Curve25519 work, only that long);
- ``ZMQ_HEARTBEAT_IVL`` / ``ZMQ_HEARTBEAT_TIMEOUT`` = ``frontend_heartbeat_interval_ms`` /
  ``frontend_heartbeat_timeout_ms``: the broker PINGs every peer and disconnects one from which
  nothing (a request or a PONG, which any libzmq >= 4.2 sends by itself) arrived within the
  timeout; ``ZMQ_HEARTBEAT_TTL`` tells the peer the same timeout.  A disconnection frees what the
  peer held, a partial message included, so the memory partial messages take is at most
  ``frontend_max_connections`` x ``max_request_bytes`` and is given back within the timeout of
  a peer falling silent.

:class:`FrontendPeers` caps the connections.  It reads the ROUTER's socket monitor (accepted and
disconnected events, each carrying the connection's file descriptor) on the arbiter's loop and,
while more than ``frontend_max_connections`` are open, shuts the newest down with
``shutdown(2)`` on its descriptor: libzmq then sees the connection end and closes it as if the
peer had left (its requests already queued are still answered, to nobody).  Because events are
read after the fact, a descriptor is first checked to still be a connected TCP socket on the
front-end's port; libzmq may have closed it and the kernel reused the number for a newer
front-end connection, which is then the one shut down (it is over the cap too).  The count is
also the metrics endpoint's ``hpbroker_frontend_connections``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from hpbroker.broker.config import BrokerConfig

__all__ = ["CURVE_HANDSHAKE_MS", "FrontendPeers", "configure_front", "handshake_ms"]

logger = logging.getLogger(__name__)

_PEER_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED
_REFUSAL_LOG_INTERVAL_S = 10.0  # one WARNING per this long while connections are refused
CURVE_HANDSHAKE_MS = 5_000  # the longest a CurveZMQ handshake may take on the front-end


def handshake_ms(config: BrokerConfig) -> int:
    """The front-end's handshake deadline (``ZMQ_HANDSHAKE_IVL``, module docstring)."""
    if config.security == "curve":
        return min(CURVE_HANDSHAKE_MS, config.frontend_heartbeat_timeout_ms)
    return config.frontend_heartbeat_timeout_ms


def configure_front(front: zmq.Socket, config: BrokerConfig) -> None:
    """Set the front-end ROUTER's limits (module docstring); call before it binds."""
    front.setsockopt(zmq.MAXMSGSIZE, config.max_request_bytes)
    front.setsockopt(zmq.HANDSHAKE_IVL, handshake_ms(config))
    if config.frontend_heartbeat_interval_ms:
        front.setsockopt(zmq.HEARTBEAT_IVL, config.frontend_heartbeat_interval_ms)
        front.setsockopt(zmq.HEARTBEAT_TIMEOUT, config.frontend_heartbeat_timeout_ms)
        front.setsockopt(zmq.HEARTBEAT_TTL, config.frontend_heartbeat_timeout_ms)


class FrontendPeers:
    """The front-end's open connections, counted and capped (module docstring).  Construct it
    before the ROUTER binds, so that every connection is seen; :meth:`drain` from the loop that
    owns the ROUTER whenever :attr:`socket` is readable; :meth:`close` before the context ends."""

    def __init__(self, front: zmq.Socket, *, port: int, max_connections: int) -> None:
        self._front = front
        self._port = port
        self._max_connections = max_connections
        self._monitor: zmq.Socket | None = front.get_monitor_socket(_PEER_EVENTS)
        # Descriptors of the open connections, oldest accepted first (dicts keep insertion order).
        self._open: dict[int, None] = {}
        self._refusals = 0  # since the last WARNING
        self._warned_at = -_REFUSAL_LOG_INTERVAL_S

    @property
    def socket(self) -> zmq.Socket:
        assert self._monitor is not None
        return self._monitor

    @property
    def count(self) -> int:
        """Open front-end connections, those being refused not counted."""
        return len(self._open)

    def drain(self) -> None:
        """Read the monitor's events, then refuse the newest connections over the cap."""
        assert self._monitor is not None
        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            fd = event["value"]
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._open[fd] = None
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self._open.pop(fd, None)  # unknown: accepted before the monitor, or refused
        while len(self._open) > self._max_connections:
            fd = next(reversed(self._open))
            del self._open[fd]
            self._refuse(fd)

    def _refuse(self, fd: int) -> None:
        try:
            duplicate = os.dup(fd)
        except OSError:
            return  # closed meanwhile: its disconnection is on its way
        try:
            sock = socket.socket(fileno=duplicate)
        except OSError:  # the number now names something else than a socket
            os.close(duplicate)
            return
        with sock:
            try:
                if (sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM
                        or sock.getsockname()[1] != self._port):
                    return  # the number now names another socket (a socketpair, a client's)
                peer = sock.getpeername()
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                return
        self._refusals += 1
        now = time.monotonic()
        if now - self._warned_at >= _REFUSAL_LOG_INTERVAL_S:
            logger.warning("[arbiter] front-end: refused %d connections (the latest from %s): "
                           "frontend_max_connections %d reached", self._refusals, peer, self._max_connections)
            self._refusals, self._warned_at = 0, now

    def close(self) -> None:
        """Stop monitoring (before the ROUTER and the context close).  Idempotent."""
        if self._monitor is not None:
            with contextlib.suppress(zmq.ZMQError):  # the router may be closed already
                self._front.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None
