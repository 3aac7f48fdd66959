"""What a hostile or broken client can hold on the ZeroMQ front-end: connections beyond
``frontend_max_connections`` are disconnected, a silent peer is dropped after
``frontend_heartbeat_timeout_ms`` (handshake or not), and every malformed message whose header
parses is answered, as docs/PROTOCOL.md says.  The workers are the stand-in of standin_broker.py."""

from __future__ import annotations

import socket
import time

import pytest
import zmq
from harness import Client, wait_until

from hpbroker import protocol

# A ZMTP 3.1 greeting (signature, version 3.1, the NULL mechanism, as client) and the READY
# command of a DEALER: what a ZeroMQ peer sends before its first message.
GREETING = b"\xff" + bytes(8) + b"\x7f" + bytes([3, 1]) + b"NULL".ljust(20, b"\x00") + bytes(32)
_READY_BODY = b"\x05READY" + b"\x0bSocket-Type" + (6).to_bytes(4, "big") + b"DEALER"
READY = bytes([0x04, len(_READY_BODY)]) + _READY_BODY


@pytest.fixture
def one_worker(standin):
    """``one_worker(**config)``: the shared stand-in arbiter with one worker, once it serves."""

    def start(**config):
        broker, spec, client = standin(workers=1, **config)
        broker.wait_for_log(r"all 1 workers serving")
        return broker, spec, client

    return start


def raw_connection(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def closed_by_broker(sock: socket.socket, timeout_s: float) -> bool:
    """Whether the broker ends the connection (EOF or reset) within ``timeout_s``; what it sends
    meanwhile (its greeting, heartbeats) is read and dropped."""
    deadline = time.monotonic() + timeout_s
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return False


def test_connections_over_frontend_max_connections_are_disconnected(one_worker):
    broker, spec, first = one_worker(frontend_max_connections=2)
    assert first.request(protocol.MetadataRequest([]))[0].error_code == 0
    second = Client(spec["port"])
    try:
        assert second.request(protocol.MetadataRequest([]))[0].error_code == 0
        extra = raw_connection(spec["port"])
        assert closed_by_broker(extra, 10)
        extra.close()
        broker.wait_for_log(r"refused 1 connections .* frontend_max_connections 2 reached")
        for client in (first, second):  # the two kept still serve
            assert client.request(protocol.MetadataRequest([]))[0].error_code == 0
    finally:
        second.close()
    later = Client(spec["port"])  # a place is free again: a new client gets in
    try:
        wait_until(lambda: _served(later), 10, what="a client served once a connection closed")
    finally:
        later.close()


def test_a_peer_silent_after_its_handshake_is_disconnected(one_worker):
    _broker, spec, client = one_worker(frontend_heartbeat_interval_ms=100, frontend_heartbeat_timeout_ms=500)
    silent = raw_connection(spec["port"])
    silent.sendall(GREETING + READY)  # a ZeroMQ peer, then nothing: no request, no PONG
    started = time.monotonic()
    assert closed_by_broker(silent, 10)
    assert 0.4 < time.monotonic() - started < 10
    silent.close()
    mute = raw_connection(spec["port"])  # connects and never even greets
    assert closed_by_broker(mute, 10)
    mute.close()
    monitor = client.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    try:
        time.sleep(1.5)  # three timeouts: a live client's libzmq answers the PINGs, so it stays connected
        assert not monitor.poll(0), "the live client was disconnected"
    finally:
        client.socket.disable_monitor()
        monitor.close()
    assert client.request(protocol.MetadataRequest([]), timeout_s=2)[0].error_code == 0


def test_a_message_of_three_frames_whose_header_parses_gets_error_10(one_worker):
    broker, _spec, client = one_worker()
    head = protocol.encode_request(protocol.MetadataRequest([]), 51, "x")[0]
    client.socket.send_multipart([head, b"payload", b"one too many"])
    header, _ = client.receive(protocol.ApiKey.METADATA, 51)
    assert header.error_code == 10 and "1 or 2 frames, got 3" in header.error_message
    client.socket.send_multipart([b"a", b"b", b"c"])  # no header: nobody to answer, logged
    assert client.silent_for(0.3)
    broker.wait_for_log(r"header does not parse")
    assert client.request(protocol.MetadataRequest([]))[0].error_code == 0


def test_requests_over_max_request_bytes(one_worker):
    """Frames together over the limit: error 10.  One frame over it: ZeroMQ's ZMQ_MAXMSGSIZE
    disconnects the peer unanswered, and the client's libzmq connects again."""
    _broker, _spec, client = one_worker(max_request_bytes=4096)
    produce = protocol.ProduceRequest("orders", 0, payload=b"x" * 4090)  # head + payload > 4096
    header, _ = client.request(produce)
    assert header.error_code == 10 and "exceeds max_request_bytes 4096" in header.error_message
    client.send(protocol.ProduceRequest("orders", 0, payload=b"x" * 5000))
    assert client.silent_for(1.0)
    wait_until(lambda: _served(client), 10, what="the client served again after its reconnection")


def _served(client: Client) -> bool:
    """Whether ``client`` gets a metadata answer within half a second."""
    try:
        return client.request(protocol.MetadataRequest([]), timeout_s=0.5)[0].error_code == 0
    except TimeoutError:
        return False
