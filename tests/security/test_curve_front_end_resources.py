"""With ``security = "curve"`` the front-end spends less on peers that never authenticate: a
connection that does not complete its handshake is closed within 5 s (not the 30 s heartbeat
timeout), and the broker's ZeroMQ context has two I/O threads for the CurveZMQ work."""

from __future__ import annotations

import os
import socket
import time
from types import SimpleNamespace

from curve_probe import secured_broker
from harness import wait_until

from hpbroker.broker.config import BrokerConfig
from hpbroker.workers.peers import CURVE_HANDSHAKE_MS, handshake_ms


def _io_threads(pid: int) -> list[str]:
    names = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            continue  # the thread ended meanwhile
    return sorted(name for name in names if name.startswith("ZMQbg/IO"))


def test_a_silent_peer_is_closed_within_the_curve_handshake_deadline(tmp_path):
    with secured_broker(tmp_path, workers=1) as broker:
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", broker.port)) as sock:
            sock.settimeout(25)
            while sock.recv(4096):  # the server's greeting; then nothing until it closes
                pass
        waited = time.monotonic() - started
        assert waited < 15, f"closed after {waited:.1f} s"  # 5 s deadline; 30 s without curve
        # The arbiter (the broker's process) runs two ZeroMQ I/O threads.
        wait_until(lambda: len(_io_threads(broker.process.process.pid)) == 2, 10,
                   what="two ZeroMQ I/O threads in the arbiter")


def test_the_handshake_deadline_is_never_above_the_heartbeat_timeout():
    assert handshake_ms(BrokerConfig()) == 30_000
    curve = SimpleNamespace(security="curve", frontend_heartbeat_timeout_ms=30_000)  # what it reads
    assert handshake_ms(curve) == CURVE_HANDSHAKE_MS == 5_000
    curve.frontend_heartbeat_timeout_ms = 2_000
    assert handshake_ms(curve) == 2_000
