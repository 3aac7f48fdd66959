"""A real standalone broker answers InitProducerId: distinct ids, the issued-ceiling file
covering each before it is answered, epoch bumps, refusals, and no id handed out twice across
restarts (a clean stop and a kill -9); and its front-end answers in the request's version."""

from __future__ import annotations

import struct

import pytest
from harness import Client, pid_alive, start_broker, wait_until

from hpbroker import protocol
from hpbroker.errors import InvalidRequestError
from hpbroker.protocol import ApiKey, InitProducerIdRequest

ISSUED = "producer-ids-issued"


def init(client: Client, producer_id: int = -1, producer_epoch: int = -1) -> tuple[int, int, int]:
    """(error code, producer id, epoch) of an InitProducerId."""
    header, body = client.request(InitProducerIdRequest(producer_id, producer_epoch))
    return header.error_code, body.producer_id, body.producer_epoch


def ceiling(data_dir) -> bytes:
    return (data_dir / ISSUED).read_bytes()


@pytest.fixture
def broker(tmp_path):
    started = []

    def start(log: str = "broker.log", port: int | None = None):
        process, port = start_broker(tmp_path / "data", tmp_path / log, port=port)
        client = Client(port)
        started.append((process, client))
        return process, port, client

    yield start
    for process, client in started:
        client.close()
        process.stop()


def test_init_producer_id_hands_out_distinct_ids_and_bumps_epochs(tmp_path, broker):
    _, _, client = broker()
    data = tmp_path / "data"
    ids = []
    for _ in range(5):
        code, producer_id, epoch = init(client)
        assert (code, epoch) == (0, 0)
        assert ceiling(data) == f"0\n{producer_id + 1}\n".encode(), "written before the answer"
        ids.append(producer_id)
    assert ids == list(range(5))
    assert init(client, 3, 0) == (0, 3, 1)
    assert init(client, 3, 1) == (0, 3, 2)
    assert init(client, 1, protocol.MAX_PRODUCER_EPOCH) == (0, 5, 0)  # epochs exhausted: a new id
    assert init(client, 10**12, 0) == (0, 6, 0)  # never issued: a new id
    assert ceiling(data) == b"0\n7\n"
    header, body = client.request(InitProducerIdRequest(-1, 4))
    assert (header.error_code, body.producer_id, body.producer_epoch) == (10, -1, -1)
    assert "producer id -1 with epoch 4" in header.error_message


def test_ids_are_never_handed_out_twice_across_restarts(tmp_path, broker):
    first, port, client = broker("first.log")
    handed = {init(client)[1] for _ in range(3)}
    assert handed == {0, 1, 2}
    assert first.stop() == 0
    second, _, client = broker("second.log", port)
    assert ceiling(tmp_path / "data") == b"0\n1000\n"  # rewritten at start from the durable block
    assert init(client) == (0, 1000, 0)
    assert init(client, 2, 0) == (0, 2, 1)  # issued before the restart: still known
    second.process.kill()  # no clean stop: the block file is all that survives
    second.wait_exit()
    pids = second.worker_pids().values()
    wait_until(lambda: not any(pid_alive(pid) for pid in pids), 10, what="the orphaned workers to exit")
    _, _, client = broker("third.log", port)
    assert init(client) == (0, 2000, 0)
    assert ceiling(tmp_path / "data") == b"0\n2001\n"


def test_the_front_end_answers_in_the_requests_version(broker):
    """A produce for a partition that does not exist is refused by the front-end itself: a
    version 0 request gets the version 0 body, a version 1 request the version 1 body; a version
    the broker does not serve gets error 9."""
    _, _, client = broker()
    request = protocol.ProduceRequest("absent", 999, payload=b"")
    for version, other in ((0, 1), (1, 0)):
        client.socket.send_multipart(protocol.encode_request(request, 50 + version, "t", version=version))
        frames = wait_until(lambda: client.socket.poll(100) and client.socket.recv_multipart(), 10,
                            what="the response")
        header, body = protocol.decode_response(ApiKey.PRODUCE, frames, version=version)
        assert (header.correlation_id, header.error_code, body.base_offset) == (50 + version, 6, -1)
        with pytest.raises(InvalidRequestError):
            protocol.decode_response(ApiKey.PRODUCE, frames, version=other)
    head = bytearray(protocol.encode_request(InitProducerIdRequest(), 60, "t")[0])
    struct.pack_into("<H", head, 2, 1)
    client.socket.send(bytes(head))
    frames = wait_until(lambda: client.socket.poll(100) and client.socket.recv_multipart(), 10,
                        what="error 9")
    header, _ = protocol.decode_response(ApiKey.INIT_PRODUCER_ID, frames)
    assert (header.correlation_id, header.error_code) == (60, 9)
    assert "InitProducerIdRequest version 1 is not served; versions 0..0" in header.error_message
