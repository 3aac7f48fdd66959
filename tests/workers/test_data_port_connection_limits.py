"""Data-port limits on connections that have not shown they are clients (hpbroker.workers.fetch_server,
"Connection limits"): on a secured broker a deadline for the first whole request (with tokens:
the accepted AuthenticateRequest), and with tokens a byte limit before it and a cap of their own;
none of it without security.  The deadline is shortened to 1 s here (the worker, a forked child,
passes the module's value to its FetchServer)."""

from __future__ import annotations

import socket
import struct
import time

import pytest
from test_worker_data_port_security import SECURE, _authenticate, _state, _token
from worker_harness import TcpClient, fetch_request, make_batch, produce_request

from hpbroker.protocol import ApiKey
from hpbroker.workers import fetch_server
from hpbroker.workers.fetch_server import UNAUTHENTICATED_MAX_BYTES

DEADLINE_S = 1.0

HALF_PREFIX = b"\x40\x00\x00\x00"  # half of a frame's prefix: never a whole request


@pytest.fixture(autouse=True)
def short_deadline(monkeypatch):
    monkeypatch.setattr(fetch_server, "FIRST_REQUEST_DEADLINE_S", DEADLINE_S)


def _secured(start_worker, arbiter, **options):
    worker = start_worker(**SECURE, **options)
    assert arbiter.call(0, produce_request("orders", 0, make_batch("a")))[0].error_code == 0
    assert arbiter.control(0, "security", **_state())["error"] is None
    return worker


def _closed_now(sock: socket.socket) -> bool:
    """Whether the worker has closed the connection of ``sock`` (without waiting)."""
    sock.settimeout(0.05)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:  # reset
        return True


def _trickle_until_closed(client, timeout_s):
    """Send a byte every 0.2 s, as a slow peer keeping its idle clock fresh; the seconds it took
    the worker to close the connection."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if _closed_now(client.sock):
            return time.monotonic() - started
        try:
            client.sock.sendall(b"\x00")
        except OSError:
            return time.monotonic() - started
        time.sleep(0.2)
    raise AssertionError(f"still open after {timeout_s} s")


def _served(client, correlation_id):
    client.sock.settimeout(10)
    client.send(fetch_request("orders", 0, 0), correlation_id)
    return client.response(ApiKey.FETCH)[0].error_code == 0


def test_unauthenticated_connection_is_closed_at_the_deadline_however_it_trickles(start_worker, arbiter):
    worker = _secured(start_worker, arbiter)
    slow = TcpClient(worker.port)
    slow.sock.sendall(HALF_PREFIX)
    client = TcpClient(worker.port)
    assert _authenticate(client, _token())[0].error_code == 0
    took = _trickle_until_closed(slow, DEADLINE_S + 15)
    assert took >= DEADLINE_S - 0.5
    assert _served(client, 2), "the authenticated connection was closed too"
    client.close()


def test_more_than_the_byte_limit_before_authenticating_closes_the_connection(start_worker, arbiter):
    worker = _secured(start_worker, arbiter)
    client = TcpClient(worker.port)
    # A frame announcing a 100,000-byte head (under the 256 KiB frame limit), then its first bytes.
    client.sock.sendall(struct.pack("<II", 100_000, 0) + bytes(UNAUTHENTICATED_MAX_BYTES))
    assert client.is_closed_by_peer(timeout_s=5)


def test_unauthenticated_connections_cannot_take_the_slots_of_clients(start_worker, arbiter, monkeypatch):
    monkeypatch.setattr(fetch_server, "FIRST_REQUEST_DEADLINE_S", 60.0)  # room is made, not waited for
    worker = _secured(start_worker, arbiter, max_connections=8)
    kept = TcpClient(worker.port)
    assert _authenticate(kept, _token())[0].error_code == 0
    held = []
    for _ in range(12):  # more than max_connections
        s = socket.create_connection(("127.0.0.1", worker.port))
        s.sendall(HALF_PREFIX)
        held.append(s)
    # A new client is neither refused nor made to wait for the deadline: it authenticates at once.
    started = time.monotonic()
    client = TcpClient(worker.port)
    assert _authenticate(client, _token())[0].error_code == 0
    assert _served(client, 2) and time.monotonic() - started < 30
    assert _served(kept, 2)
    # The oldest unauthenticated connections made room: at most 4 (half of 8) are held.
    open_ = [s for s in held if not _closed_now(s)]
    assert len(open_) <= 4, len(open_)
    for s in held:
        s.close()
    client.close()
    kept.close()


def test_unsecured_data_port_has_no_first_request_deadline(start_worker, arbiter):
    """Without security only connections_max_idle_ms applies, as before: a connection opened
    ahead of use (a warmed pool), or one that trickles, is not closed at the deadline."""
    worker = start_worker()
    assert arbiter.call(0, produce_request("orders", 0, make_batch("a")))[0].error_code == 0
    slow = TcpClient(worker.port)
    slow.sock.sendall(HALF_PREFIX)
    silent = TcpClient(worker.port)
    client = TcpClient(worker.port)
    assert _served(client, 1)
    with pytest.raises(AssertionError, match="still open"):
        _trickle_until_closed(slow, DEADLINE_S * 4)
    assert not _closed_now(silent.sock)
    assert _served(silent, 1), "a connection opened ahead of use was closed"
    assert _served(client, 2)
    for c in (slow, silent, client):
        c.close()
