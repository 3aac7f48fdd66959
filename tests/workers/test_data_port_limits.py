"""What a hostile or broken client can hold on a worker's data port, and for how long: a client
that leaves while its fetch is parked frees its connection at once, a parked fetch waits at most
``fetch_max_wait_ms``, an idle connection is closed after ``connections_max_idle_ms``, and a
request whose header parses is answered (error 9 or 10) instead of costing the connection."""

from __future__ import annotations

import socket
import time

from worker_harness import (
    TIMEOUT_S,
    TcpClient,
    batch_values,
    fetch_request,
    make_batch,
    produce_request,
    values_of,
)

from hpbroker import protocol
from hpbroker.protocol import ApiKey

FOREVER_MS = 2**32 - 1  # the largest max_wait_ms a request can carry: 49.7 days


def _served_within(port: int, timeout_s: float) -> TcpClient:
    """A new consumer whose fetch of orders-0 is answered, retried until ``timeout_s`` passes
    (a connection refused for max_connections is closed at once by the worker)."""
    deadline = time.monotonic() + timeout_s
    while True:
        client = TcpClient(port)
        try:
            client.send(fetch_request("orders", 0, 0), 99)
            header, response = client.response(ApiKey.FETCH)
            assert header.correlation_id == 99 and header.error_code == 0
            return client
        except (ConnectionError, OSError):
            client.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_clients_that_leave_while_a_fetch_is_parked_free_their_connections_at_once(start_worker, arbiter):
    """Three times as many such clients as the worker takes connections: each one's slot is given
    back as it leaves, so a later consumer is served (before, each kept its slot for 49.7 days)."""
    worker = start_worker(max_connections=4)
    arbiter.call(0, produce_request("orders", 0, make_batch("kept")))
    for i in range(12):
        client = TcpClient(worker.port)
        client.send(fetch_request("orders", 1, 0, max_wait_ms=FOREVER_MS), i)  # empty: parks
        assert client.nothing_within(0.05)  # parked, not refused
        client.close()
    started = time.monotonic()
    consumer = _served_within(worker.port, TIMEOUT_S)
    assert time.monotonic() - started < 5
    consumer.close()


def test_a_client_that_shuts_down_its_side_while_parked_is_closed_at_once(start_worker):
    worker = start_worker()
    client = TcpClient(worker.port)
    client.send(fetch_request("orders", 1, 0, max_wait_ms=FOREVER_MS), 1)
    assert client.nothing_within(0.1)
    started = time.monotonic()
    client.sock.shutdown(socket.SHUT_WR)
    assert client.is_closed_by_peer(5) and time.monotonic() - started < 5
    client.close()


def test_a_client_over_the_queue_limit_that_leaves_is_noticed_without_reading(start_worker):
    """70 pipelined long polls: the worker stops reading the connection at 64 in flight, and still
    sees the client go (EPOLLRDHUP)."""
    worker = start_worker()
    client = TcpClient(worker.port)
    client.sock.sendall(b"".join(
        bytes(frame)
        for i in range(70)
        for frame in protocol.frame_tcp(protocol.encode_request(
            fetch_request("orders", 1, 0, max_wait_ms=FOREVER_MS), i, "tcp-test"))))
    assert client.nothing_within(0.2)
    client.sock.shutdown(socket.SHUT_WR)
    assert client.is_closed_by_peer(5)
    client.close()


def test_a_fetch_waits_at_most_fetch_max_wait_ms(start_worker):
    worker = start_worker(fetch_max_wait_ms=300)
    client = TcpClient(worker.port)
    started = time.monotonic()
    client.send(fetch_request("orders", 1, 0, max_wait_ms=FOREVER_MS), 1)
    header, response = client.response(ApiKey.FETCH)
    waited = time.monotonic() - started
    assert (header.correlation_id, header.error_code, bytes(response.payload)) == (1, 0, b"")
    assert 0.25 < waited < 5
    client.close()


def test_an_idle_connection_is_closed_but_not_one_with_a_parked_fetch(start_worker, arbiter):
    worker = start_worker(connections_max_idle_ms=300, fetch_max_wait_ms=10_000)
    arbiter.call(0, produce_request("orders", 0, make_batch("idle")))
    idle = TcpClient(worker.port)
    idle.send(fetch_request("orders", 0, 0), 1)
    assert values_of(idle.response(ApiKey.FETCH)[1].payload) == batch_values(make_batch("idle"))
    answered = time.monotonic()  # the worker's last activity on it came before
    waiting = TcpClient(worker.port)
    waiting.send(fetch_request("orders", 1, 0, max_wait_ms=1500), 2)  # parked five times the idle time
    started = time.monotonic()
    assert idle.is_closed_by_peer(5)
    assert 0.2 < time.monotonic() - answered < 5
    header, response = waiting.response(ApiKey.FETCH)  # still open: answered when its wait ended
    assert (header.correlation_id, bytes(response.payload)) == (2, b"")
    assert time.monotonic() - started > 1.3
    assert waiting.is_closed_by_peer(5)  # and idle from then on
    for client in (idle, waiting):
        client.close()


def test_a_request_whose_header_parses_is_answered_and_the_connection_kept(start_worker, arbiter):
    """Unknown key or version: error 9 (PROTOCOL.md, Versioning); a body that does not parse:
    error 10.  The framing says where each message ends, so the connection goes on."""
    worker = start_worker()
    arbiter.call(0, produce_request("orders", 0, make_batch("after")))
    head = bytes(protocol.encode_request(fetch_request("orders", 0, 0), 5, "tcp-test")[0])
    client = TcpClient(worker.port)
    unknown_key = (77).to_bytes(2, "little") + head[2:]
    unknown_version = head[:2] + (3).to_bytes(2, "little") + head[4:]
    truncated = head[:-3]
    for correlation_id, message in ((5, unknown_key), (6, unknown_version), (7, truncated)):
        message = message[:4] + correlation_id.to_bytes(4, "little") + message[8:]
        client.sock.sendall(b"".join(bytes(f) for f in protocol.frame_tcp([message])))
    header, _ = client.response(ApiKey.CREATE_TOPIC)  # a bare header and payload_length 0
    assert (header.correlation_id, header.error_code) == (5, 9) and "api_key 77" in header.error_message
    header, _ = client.response(ApiKey.FETCH)
    assert (header.correlation_id, header.error_code) == (6, 9) and "version 3" in header.error_message
    header, _ = client.response(ApiKey.FETCH)
    assert (header.correlation_id, header.error_code) == (7, 10)
    client.send(fetch_request("orders", 0, 0), 8)
    header, response = client.response(ApiKey.FETCH)
    assert (header.correlation_id, header.error_code) == (8, 0)
    assert values_of(response.payload) == batch_values(make_batch("after"))
    client.close()


def test_a_produce_with_acks_0_on_the_data_port_is_answered_and_does_not_stall_the_connection(start_worker):
    worker = start_worker()
    client = TcpClient(worker.port)
    client.send(produce_request("orders", 0, make_batch("no"), acks=0), 1)
    client.send(fetch_request("orders", 0, 0), 2)
    header, _ = client.response(ApiKey.PRODUCE)
    assert (header.correlation_id, header.error_code) == (1, 10)
    assert client.response(ApiKey.FETCH)[0].correlation_id == 2
    client.close()
