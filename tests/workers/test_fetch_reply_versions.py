"""Fetch replies come in the version their request was asked in, on both transports and for
errors too: a version 0 consumer gets the version 0 bytes it always got, a version 1 fetch the
version 1 fields (-1 where the partition is not replicated)."""

from __future__ import annotations

from worker_harness import TcpClient, fetch_request, make_batch, produce_request

from hpbroker import protocol
from hpbroker.protocol import ApiKey
from hpbroker.workers import backend


def _tcp_answer(client: TcpClient, request: protocol.Message, version: int,
                correlation_id: int) -> list[bytes]:
    frames = protocol.encode_request(request, correlation_id, "tcp-test", version=version)
    client.sock.sendall(b"".join(bytes(f) for f in protocol.frame_tcp(frames)))
    while True:
        data = client.sock.recv(1 << 16)
        assert data, "the data port closed the connection"
        messages = client.decoder.feed(data)
        if messages:
            return messages[0]


def _relayed_answer(arbiter, request: protocol.Message, version: int) -> list[bytes]:
    correlation_id = arbiter.next_correlation_id()
    frames = protocol.encode_request(request, correlation_id, "test", version=version)
    arbiter.send_frames(0, backend.encode_relay(b"client-1", frames))
    _identity, message = arbiter.receive()
    assert isinstance(message, backend.Relay), message
    return [bytes(memoryview(f)) for f in message.frames]


def test_a_fetch_is_answered_in_its_requests_version_on_both_transports(start_worker, arbiter):
    worker = start_worker()
    arbiter.call(0, produce_request("orders", 0, make_batch("v", count=4)))
    client = TcpClient(worker.port)
    try:
        for answer in (lambda request, version: _tcp_answer(client, request, version, 5),
                       lambda request, version: _relayed_answer(arbiter, request, version)):
            v0 = answer(fetch_request("orders", 0, 0), 0)
            header, body = protocol.decode_response(ApiKey.FETCH, v0, version=0)
            assert (header.error_code, body.high_watermark, len(v0[0])) == (0, 4, 28)
            records = bytes(body.payload)
            assert records, "the records come after a version 0 head"
            v1 = answer(fetch_request("orders", 0, 0), 1)
            header, body = protocol.decode_response(ApiKey.FETCH, v1, version=1)
            assert (header.error_code, body.high_watermark, len(v1[0])) == (0, 4, 28 + 16)
            assert (body.diverging_epoch, body.diverging_end_offset, body.leader_epoch) == (-1, -1, -1)
            assert bytes(body.payload) == records
    finally:
        client.close()


def test_a_fetch_error_is_answered_in_its_requests_version(start_worker, arbiter):
    """An offset past the end: error 5 with the offsets, in the version asked."""
    worker = start_worker()
    arbiter.call(0, produce_request("orders", 0, make_batch("v", count=2)))
    client = TcpClient(worker.port)
    try:
        for version, length in ((0, 28), (1, 28 + 16)):
            frames = _tcp_answer(client, fetch_request("orders", 0, 99), version, 7)
            header, body = protocol.decode_response(ApiKey.FETCH, frames, version=version)
            assert (header.error_code, body.high_watermark, body.log_start_offset) == (5, 2, 0)
            assert len(frames[0]) == length + len(header.error_message.encode())
    finally:
        client.close()
