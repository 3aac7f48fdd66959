"""Replies come in the version their request was asked in: a version 0 client gets version 0
bytes, a version 1 produce its ``duplicate`` field, and a version the broker does not serve an
error it can still encode."""

from __future__ import annotations

import socket

import pytest
from worker_harness import TcpClient

from hpbroker import protocol
from hpbroker.errors import InvalidRequestError, UnsupportedVersionError
from hpbroker.protocol import ApiKey
from hpbroker.workers.replies import error_reply, produce_reply


def test_a_produce_reply_is_encoded_in_the_requests_version():
    v0 = produce_reply(7, 1234, 0)
    assert v0.head == protocol.encode_response(protocol.ProduceResponse(1234, 0), 7, version=0)[0]
    assert len(v0.head) == 28 and v0.api_version == 0
    v1 = produce_reply(7, 1234, 0, version=1, duplicate=True)
    assert v1.api_version == 1
    header, body = protocol.decode_response(ApiKey.PRODUCE, [v1.head], version=1)
    assert (header.error_code, body.base_offset, body.log_start_offset, body.duplicate) == (0, 1234, 0, 1)
    _, body = protocol.decode_response(ApiKey.PRODUCE, [produce_reply(7, 5, 0, version=1).head], version=1)
    assert body.duplicate == 0
    duplicate_v0 = produce_reply(7, 1234, 0, version=0, duplicate=True)
    assert duplicate_v0.head == v0.head, "version 0 has no duplicate field: answered like an append"


def test_an_error_reply_is_encoded_in_the_requests_version():
    error = InvalidRequestError("bad")
    v0 = error_reply(ApiKey.PRODUCE, 3, error, log_start_offset=9)
    header, body = protocol.decode_response(ApiKey.PRODUCE, [v0.head], version=0)
    assert (header.error_code, body.base_offset, body.log_start_offset) == (10, -1, 9)
    v1 = error_reply(ApiKey.PRODUCE, 3, error, version=1, log_start_offset=9)
    header, body = protocol.decode_response(ApiKey.PRODUCE, [v1.head], version=1)
    assert (header.error_code, body.log_start_offset, body.duplicate, v1.api_version) == (10, 9, 0, 1)


def test_an_error_reply_to_a_version_not_served_takes_the_nearest_served():
    error = UnsupportedVersionError("version 7 is not served")
    reply = error_reply(ApiKey.PRODUCE, 3, error, version=7)
    newest = protocol.ProduceResponse.VERSION
    header, _ = protocol.decode_response(ApiKey.PRODUCE, [reply.head], version=newest)
    assert header.error_code == 9
    reply = error_reply(99, 3, error, version=7)  # an unknown api key: the header and payload_length 0
    assert reply.head == bytes(protocol.encode_response(protocol.CreateTopicResponse(), 3, 9,
                                                        error.message)[0])


def _ask(port: int, head: bytes) -> list[bytes]:
    client = TcpClient(port)
    try:
        client.sock.sendall(b"".join(bytes(f) for f in protocol.frame_tcp([head])))
        while True:
            data = client.sock.recv(1 << 16)
            assert data, "the data port closed the connection"
            messages = client.decoder.feed(data)
            if messages:
                return messages[0]
    finally:
        with socket.socket():
            client.close()


def test_a_data_port_answers_a_request_it_does_not_serve_in_the_requests_version(start_worker):
    """A version 1 produce sent to a data port gets error 10 as a version 1 response (with
    ``duplicate``), a version 0 produce as a version 0 one (without)."""
    worker = start_worker()
    request = protocol.ProduceRequest("orders", 0, payload=b"")
    for version, other in ((1, 0), (0, 1)):
        frames = _ask(worker.port, bytes(protocol.encode_request(request, 5, "t", version=version)[0]))
        header, _ = protocol.decode_response(ApiKey.PRODUCE, frames, version=version)
        assert (header.correlation_id, header.error_code) == (5, 10)
        with pytest.raises(InvalidRequestError):
            protocol.decode_response(ApiKey.PRODUCE, frames, version=other)


def test_a_data_port_refuses_a_version_it_does_not_serve_with_error_9(start_worker):
    worker = start_worker()
    head = bytearray(protocol.encode_request(protocol.FetchRequest("orders", 0, 0), 6, "t")[0])
    head[2:4] = (3).to_bytes(2, "little")
    header, _ = protocol.decode_response(ApiKey.FETCH, _ask(worker.port, bytes(head)))
    assert (header.correlation_id, header.error_code) == (6, 9)
    assert "FetchRequest version 3 is not served; versions 0..2" in header.error_message
