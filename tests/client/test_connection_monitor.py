"""A BrokerConnection's handshake monitor must never hold up its ZeroMQ context.

libzmq writes monitor events from the context's I/O thread, blocking when the monitor's pipe is
full.  A connection whose owner never reads its monitor (an idle Admin, a consumer's metadata
connection) therefore must not let events pile up to a bound: a broker that keeps dropping the
connection (restarts, a wrong server key) would otherwise stall every socket of the process.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
import zmq

from hpbroker import protocol
from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.errors import AuthenticationError

RECONNECTS = 1500  # each one a monitor event or two: well past libzmq's default HWM of 1000


class DroppingServer:
    """A TCP server on 127.0.0.1 that accepts each connection and closes it at once: every
    connect of a ZeroMQ client ends in a failed handshake or a disconnect."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(512)
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.close()
            self.accepted += 1

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.listener.close()


def _round_trip(context: zmq.Context, timeout_ms: int = 5000) -> bool:
    """Whether a REQ/REP pair made now on ``context`` gets a request across and answered."""
    rep = context.socket(zmq.REP)
    req = context.socket(zmq.REQ)
    try:
        for s in (rep, req):
            s.setsockopt(zmq.LINGER, 0)
        port = rep.bind_to_random_port("tcp://127.0.0.1")
        req.connect(f"tcp://127.0.0.1:{port}")
        req.send(b"ping")
        if not rep.poll(timeout_ms):
            return False
        rep.recv()
        rep.send(b"pong")
        return bool(req.poll(timeout_ms)) and req.recv() == b"pong"
    finally:
        req.close()
        rep.close()


def test_unread_monitor_events_never_stall_other_sockets_of_the_context():
    server = DroppingServer()
    context = zmq.Context()
    connection = BrokerConnection(BrokerAddress("127.0.0.1", server.port), context=context, connect=False)
    connection.socket.setsockopt(zmq.RECONNECT_IVL, 1)
    connection.socket.setsockopt(zmq.RECONNECT_IVL_MAX, 1)
    try:
        connection.connect()
        # A stalled I/O thread stops reconnecting: the count then stops short of RECONNECTS.
        deadline, seen, progress_at = time.monotonic() + 60, -1, time.monotonic()
        while server.accepted < RECONNECTS and time.monotonic() < deadline:
            if server.accepted != seen:
                seen, progress_at = server.accepted, time.monotonic()
            elif time.monotonic() - progress_at > 5:
                break  # no reconnect for 5 s: stalled
            time.sleep(0.02)
        assert _round_trip(context), (f"another socket of the context stalled after {server.accepted} "
                                      f"reconnects of a connection whose monitor nobody read")
        assert server.accepted >= RECONNECTS, f"only {server.accepted} reconnects in 60 s"
        # The events are still there for whoever asks (the connection keeps the newest).
        assert zmq.EVENT_DISCONNECTED in connection.monitor_events()
    finally:
        server.close()
        with_events = connection.monitor
        while with_events.poll(0):  # release an I/O thread blocked on a full monitor pipe
            with_events.recv_multipart()
        connection.close()
        context.destroy(linger=0)


class CurveServer:
    """A CurveZMQ ROUTER on 127.0.0.1 whose key no client here is given: every handshake fails
    (the client has a wrong server key), and libzmq keeps reconnecting."""

    def __init__(self, context: zmq.Context) -> None:
        self.router = context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.setsockopt(zmq.CURVE_SERVER, 1)
        self.router.setsockopt(zmq.CURVE_SECRETKEY, zmq.curve_keypair()[1])
        self.port = self.router.bind_to_random_port("tcp://127.0.0.1")

    def close(self) -> None:
        self.router.close()


def _curve_connection(context: zmq.Context, port: int) -> BrokerConnection:
    from hpbroker.security.client import ClientSecurity

    public, secret = zmq.curve_keypair()
    server_public, _ = zmq.curve_keypair()  # not the server's key
    security = ClientSecurity("alice", public, secret, server_public)
    connection = BrokerConnection(BrokerAddress("127.0.0.1", port), context=context, connect=False,
                                  security=security, connect_timeout_s=10.0)
    connection.socket.setsockopt(zmq.RECONNECT_IVL, 5)  # a failed handshake every few ms
    connection.socket.setsockopt(zmq.RECONNECT_IVL_MAX, 5)
    return connection


def _backlog(connection: BrokerConnection) -> int:
    """The events waiting in the connection's monitor pipe (read off, so counted once)."""
    count = 0
    while connection.monitor.poll(0):
        connection.monitor.recv_multipart()
        count += 1
    return count


def test_an_idle_polled_connection_whose_handshakes_fail_keeps_its_monitor_backlog_short():
    context = zmq.Context()
    server = CurveServer(context)
    connection = _curve_connection(context, server.port)
    try:
        connection.connect()
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:  # its owner polls it, never sends
            assert connection.poll(0.05) is None
        # At most what came since the last poll (50 ms of failures), not 3 s of them.
        assert _backlog(connection) < 100
        assert connection.refused is not None and "not the broker's public key" in str(connection.refused)
        assert len(connection.monitor_events()) <= 256
    finally:
        connection.close()
        server.close()
        context.destroy(linger=0)


def test_a_connection_refused_at_a_send_stops_reconnecting_until_the_next_send():
    context = zmq.Context()
    server = CurveServer(context)
    connection = _curve_connection(context, server.port)
    try:
        connection.connect()
        with pytest.raises(AuthenticationError, match="not the broker's public key"):
            connection.send(protocol.MetadataRequest([]))
        _backlog(connection)
        time.sleep(1.0)  # idle, nobody reads the monitor: no reconnect, no failed handshake
        assert _backlog(connection) <= 4
        # The next send tries again (the key may have been allowlisted since), and is told again.
        with pytest.raises(AuthenticationError, match="not the broker's public key"):
            connection.send(protocol.MetadataRequest([]))
    finally:
        connection.close()
        server.close()
        context.destroy(linger=0)
