"""A worker's TCP data port: fetches sent with sendfile, in request order, without letting a slow
or broken client hold the worker up."""

from __future__ import annotations

import socket
import struct
import threading
import time

from worker_harness import TcpClient, batch_values, fetch_request, make_batch, produce_request, values_of

from hpbroker import protocol, records
from hpbroker.protocol import ApiKey


def test_tcp_fetch_returns_the_same_bytes_as_the_relayed_fetch(start_worker, arbiter):
    worker = start_worker()
    for i in range(5):
        arbiter.call(0, produce_request("orders", 1, make_batch(f"t{i}", count=10)))
    _header, relayed = arbiter.call(0, fetch_request("orders", 1, 12, max_bytes=2000))
    client = TcpClient(worker.port)
    client.send(fetch_request("orders", 1, 12, max_bytes=2000), 5)
    header, response = client.response(ApiKey.FETCH)
    assert (header.correlation_id, header.error_code) == (5, 0)
    assert (response.high_watermark, response.log_start_offset) == (relayed.high_watermark, 0)
    assert bytes(response.payload) == bytes(relayed.payload) and len(response.payload) > 0
    client.send(protocol.ListOffsetsRequest("orders", 1, protocol.LATEST_TIMESTAMP), 6)
    header, response = client.response(ApiKey.LIST_OFFSETS)
    assert (header.correlation_id, response.offset) == (6, 50)
    client.close()


def test_a_slow_reader_gets_a_multi_mib_fetch_whole_and_does_not_block_the_worker(start_worker, arbiter):
    worker = start_worker()
    batches = [records.build_batch([bytes([65 + i]) * 1000] * 1000) for i in range(6)]  # ~1 MiB each
    for batch in batches:
        assert arbiter.call(0, produce_request("orders", 0, batch))[0].error_code == 0
    _header, relayed = arbiter.call(0, fetch_request("orders", 0, 0, max_bytes=16 << 20))
    assert len(relayed.payload) > 5 << 20

    slow = TcpClient(worker.port, rcvbuf=8192)
    slow.send(fetch_request("orders", 0, 0, max_bytes=16 << 20), 1)
    slow.send(fetch_request("orders", 0, 3000), 2)  # queued behind the big one on this connection
    time.sleep(0.2)  # the worker has filled the socket and waits for it to drain
    started = time.monotonic()
    header, response = arbiter.call(0, fetch_request("orders", 0, 5000, max_bytes=100))
    assert header.error_code == 0 and time.monotonic() - started < 1.0  # the worker is not stuck
    other = TcpClient(worker.port)
    other.send(fetch_request("orders", 0, 1000), 9)
    assert other.response(ApiKey.FETCH)[0].correlation_id == 9
    other.close()

    result: dict[str, object] = {}

    def read_slowly() -> None:
        result["first"] = slow.response(ApiKey.FETCH, chunk=32 << 10, pause_s=0.0005)
        result["second"] = slow.response(ApiKey.FETCH)

    reader = threading.Thread(target=read_slowly)
    reader.start()
    reader.join(30)
    assert not reader.is_alive()
    (first_header, first), (second_header, second) = result["first"], result["second"]
    assert (first_header.correlation_id, second_header.correlation_id) == (1, 2)
    assert bytes(first.payload) == bytes(relayed.payload)
    assert records.scan_batches(bytes(second.payload)).base_offsets[0] == 3000
    slow.close()


def test_tcp_fetch_for_another_workers_partition_is_error_6_and_other_requests_error_10(start_worker):
    worker = start_worker()
    client = TcpClient(worker.port)
    client.send(fetch_request("orders", 9, 0), 1)
    header, response = client.response(ApiKey.FETCH)
    assert (header.correlation_id, header.error_code) == (1, 6)
    assert (response.high_watermark, response.log_start_offset, bytes(response.payload)) == (-1, -1, b"")
    client.send(produce_request("orders", 0, make_batch("no")), 2)
    header, response = client.response(ApiKey.PRODUCE)
    assert (header.correlation_id, header.error_code, response.base_offset) == (2, 10, -1)
    client.send(protocol.MetadataRequest(), 3)
    assert client.response(ApiKey.METADATA)[0].error_code == 10
    client.send(fetch_request("orders", 0, 0), 4)  # the connection still serves
    assert client.response(ApiKey.FETCH)[0].error_code == 0
    client.close()


def test_garbage_closes_that_connection_while_another_keeps_working(start_worker, arbiter):
    worker = start_worker()
    arbiter.call(0, produce_request("orders", 0, make_batch("kept")))
    good, bad, huge, headless = (TcpClient(worker.port) for _ in range(4))
    bad.sock.sendall(struct.pack("<II", 5, 0) + b"\xff\xff\xff\xff\xff")  # a head that does not parse
    huge.sock.sendall(struct.pack("<II", 100, 1 << 30))  # over max_request_bytes
    headless.sock.sendall(struct.pack("<II", 0, 0))  # an empty head
    for client in (bad, huge, headless):
        assert client.is_closed_by_peer()
    good.send(fetch_request("orders", 0, 0), 1)
    header, response = good.response(ApiKey.FETCH)
    assert header.error_code == 0 and values_of(response.payload) == batch_values(make_batch("kept"))
    for client in (good, bad, huge, headless):
        client.close()


def test_a_request_over_the_data_port_limit_closes_the_connection(start_worker):
    """The data port serves requests without payload: 256 KiB is refused although max_request_bytes
    (64 MiB) would take it."""
    worker = start_worker()
    client = TcpClient(worker.port)
    client.sock.sendall(struct.pack("<II", 100, protocol.DATA_PORT_MAX_REQUEST_BYTES))
    assert client.is_closed_by_peer()
    client.close()


def test_tcp_long_poll_wakes_on_a_flush_and_answers_in_request_order(start_worker, arbiter):
    worker = start_worker(log={"flush_messages": 1_000_000, "flush_ms": 5})
    client = TcpClient(worker.port)
    client.send(fetch_request("orders", 0, 0, max_wait_ms=8_000), 1)  # empty partition: parks
    client.send(protocol.ListOffsetsRequest("orders", 0, protocol.EARLIEST_TIMESTAMP), 2)  # waits behind
    assert client.nothing_within(0.3)
    produced_at = time.monotonic()
    arbiter.call(0, produce_request("orders", 0, make_batch("poll")))
    header, response = client.response(ApiKey.FETCH)
    assert header.correlation_id == 1 and time.monotonic() - produced_at < 1.0
    assert values_of(response.payload) == batch_values(make_batch("poll"))
    assert client.response(ApiKey.LIST_OFFSETS)[0].correlation_id == 2
    client.send(fetch_request("orders", 0, 3, max_wait_ms=200), 3)  # times out, empty
    header, response = client.response(ApiKey.FETCH)
    assert (header.correlation_id, response.high_watermark, bytes(response.payload)) == (3, 3, b"")
    client.close()


def test_connections_over_max_connections_are_closed_at_once(start_worker):
    worker = start_worker(max_connections=2)
    kept = [TcpClient(worker.port) for _ in range(2)]
    for i, client in enumerate(kept):  # make sure both are accepted before the third arrives
        client.send(fetch_request("orders", 0, 0), i)
        client.response(ApiKey.FETCH)
    extra = TcpClient(worker.port)
    assert extra.is_closed_by_peer(5)
    kept[0].close()
    time.sleep(0.1)
    again = TcpClient(worker.port)
    again.send(fetch_request("orders", 0, 0), 7)
    assert again.response(ApiKey.FETCH)[0].correlation_id == 7
    for client in (*kept, extra, again):
        client.close()


def test_a_client_that_closes_its_side_still_gets_its_answers(start_worker, arbiter):
    worker = start_worker()
    arbiter.call(0, produce_request("orders", 1, make_batch("half")))
    client = TcpClient(worker.port)
    client.send(fetch_request("orders", 1, 0, max_wait_ms=100), 1)
    client.sock.shutdown(socket.SHUT_WR)
    header, response = client.response(ApiKey.FETCH)
    assert header.correlation_id == 1 and values_of(response.payload) == batch_values(make_batch("half"))
    assert client.is_closed_by_peer()
    client.close()
