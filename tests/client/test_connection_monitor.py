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

import zmq

from hpbroker.client.connection import BrokerAddress, BrokerConnection

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
