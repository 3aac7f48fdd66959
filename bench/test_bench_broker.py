"""The broker process: ingest over the ZeroMQ front-end and sendfile fetch over the data port, each
next to this machine's raw limit for that path, measured in the same run.

- ingest: pipelined ProduceRequests of pre-built ~1 MiB batches of 100-byte records (acks=1,
  default flush policy: every acknowledged record is fdatasync'd) to a 2-partition topic served by
  2 workers, against raw ZeroMQ loopback throughput of 1 MiB frames between two processes.
  Target: >= 0.5 of the raw limit.  Each round writes into a topic created afresh (the previous
  round's deleted, outside the timing), as the raw log benchmarks write into fresh files: on a
  virtual machine whose host backs guest memory lazily, a page cache growing into memory the
  guest has not touched yet can cost a host page fault per page, which would measure the host.
- fetch: FetchRequests of 1 MiB on the TCP data port (the broker sendfile()s from the segment
  file), against os.sendfile of the same cached file to a loopback socket.  Target: >= 0.7.

A real ``hpbroker serve`` runs as a subprocess; the clients are plain protocol code (no client
library), pipelining up to IN_FLIGHT requests.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import zmq

from bench.brokers import free_port_block, running_broker
from bench.conftest import ratio, throughput
from hpbroker import protocol
from hpbroker.records import BatchBuilder, read_header

BATCHES = 64  # per round, about 64 MiB
IN_FLIGHT = 8
TOPIC = "bench"
FRESH_TOPIC = "bench-fresh"
WORKERS = 2


@pytest.fixture(scope="module")
def batch():
    builder = BatchBuilder("bench", max_bytes=1 << 20)
    value = os.urandom(100)
    while builder.append(value):
        pass
    return builder.build()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with running_broker(tmp_path_factory.mktemp("broker")) as base:
        client = _Client(base)
        try:
            header, _ = client.call(protocol.CreateTopicRequest(TOPIC, WORKERS))
            assert header.error_code == 0, header
            yield base, client
        finally:
            client.close()


class _Client:
    """A pipelining DEALER speaking the protocol directly."""

    def __init__(self, port: int) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.connect(f"tcp://127.0.0.1:{port}")
        self.next_id = 0

    def send(self, request) -> int:
        self.next_id += 1
        self.socket.send_multipart(protocol.encode_request(request, self.next_id, "bench"), copy=False)
        return self.next_id

    def receive(self, api_key: int):
        if not self.socket.poll(30_000):
            raise TimeoutError("no response in 30 s")
        return protocol.decode_response(api_key, self.socket.recv_multipart(copy=False))

    def call(self, request):
        self.send(request)
        return self.receive(request.API_KEY)

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


def _produce_round(client: _Client, batch: bytes, topic: str = TOPIC) -> None:
    sent = received = 0
    while received < BATCHES:
        while sent < BATCHES and sent - received < IN_FLIGHT:
            client.send(protocol.ProduceRequest(topic, sent % WORKERS, payload=batch))
            sent += 1
        header, _ = client.receive(protocol.ApiKey.PRODUCE)
        assert header.error_code == 0, header
        received += 1


def _zmq_sink(port: int, frames: int, address: str | None = None) -> None:
    """Receive ``frames`` frames per round (on ``tcp://127.0.0.1:port``, or bound ``address``),
    then report the round on ``port + 1``; a frame starting with ``q`` ends it."""
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.bind(address or f"tcp://127.0.0.1:{port}")
    done = context.socket(zmq.PUSH)
    done.connect(f"tcp://127.0.0.1:{port + 1}")
    while True:
        for _ in range(frames):
            if pull.recv(copy=False).buffer[:1] == b"q":
                return
        done.send(b"round")


def _zmq_relay(port: int, address: str) -> None:
    """Forward every frame from ``tcp://127.0.0.1:port`` to ``address``, one at a time in a Python
    loop, as the arbiter relays requests to a worker (without the routing and the reply)."""
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.bind(f"tcp://127.0.0.1:{port}")
    push = context.socket(zmq.PUSH)
    push.connect(address)
    while True:
        frame = pull.recv(copy=False)
        push.send(frame, copy=False)
        if frame.buffer[:1] == b"q":
            return


@contextmanager
def _zmq_pipeline(*, relayed: bool, tmp_path) -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """A PUSH socket feeding a sink process (through a relay process over ipc when ``relayed``)
    and the socket the sink reports each round on."""
    port = free_port_block(2)
    spawn = multiprocessing.get_context("spawn")
    context = zmq.Context()
    done = context.socket(zmq.PULL)
    done.bind(f"tcp://127.0.0.1:{port + 1}")
    processes = []
    if relayed:
        address = f"ipc://{tmp_path}/relay.sock"
        processes.append(spawn.Process(target=_zmq_sink, args=(port, BATCHES, address)))
        processes.append(spawn.Process(target=_zmq_relay, args=(port, address)))
    else:
        processes.append(spawn.Process(target=_zmq_sink, args=(port, BATCHES)))
    for process in processes:
        process.start()
    push = context.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{port}")
    try:
        yield push, done
    finally:
        for _ in range(BATCHES):
            push.send(b"q")
        for process in processes:
            process.join(10)
        push.close(linger=0)
        done.close(linger=0)
        context.term()


@pytest.fixture(scope="module")
def zmq_sink(tmp_path_factory):
    with _zmq_pipeline(relayed=False, tmp_path=tmp_path_factory.mktemp("zmq")) as sockets:
        yield sockets


@pytest.fixture(scope="module")
def zmq_relay(tmp_path_factory):
    with _zmq_pipeline(relayed=True, tmp_path=tmp_path_factory.mktemp("relay")) as sockets:
        yield sockets


def _push_rounds(benchmark, batch, sockets) -> None:
    push, done = sockets

    def one_round():
        for _ in range(BATCHES):
            push.send(batch, copy=False)
        assert done.poll(30_000)
        done.recv()

    benchmark.pedantic(one_round, rounds=7, warmup_rounds=1)
    throughput(benchmark, records=BATCHES * read_header(batch).record_count, nbytes=BATCHES * len(batch))


def test_raw_zmq_relay_1mib_frames(benchmark, batch, zmq_relay):
    """Informational: the same frames through a relay process (tcp in, ipc out), the shape of the
    broker's front-end path without routing, storage or replies."""
    _push_rounds(benchmark, batch, zmq_relay)


def test_raw_zmq_loopback_1mib_frames(benchmark, batch, zmq_sink):
    _push_rounds(benchmark, batch, zmq_sink)


def _recreate(client: _Client, topic: str, **settings: str):
    """Set-up of a round (not timed): the topic deleted, with its data, and created again."""
    header, _ = client.call(protocol.DeleteTopicRequest(topic))
    assert header.error_code in (0, 6), header
    configs = [protocol.TopicConfigEntry(key, value) for key, value in settings.items()]
    header, _ = client.call(protocol.CreateTopicRequest(topic, WORKERS, configs))
    assert header.error_code == 0, header
    return (), {}


def test_broker_ingest(benchmark, batch, broker):
    _port, client = broker
    benchmark.pedantic(lambda: _produce_round(client, batch, FRESH_TOPIC),
                       setup=lambda: _recreate(client, FRESH_TOPIC), rounds=7, warmup_rounds=1)
    throughput(benchmark, records=BATCHES * read_header(batch).record_count, nbytes=BATCHES * len(batch))


def test_broker_ingest_page_cache(benchmark, batch, broker):
    """Informational: the same into a topic with flush_fsync off (acknowledged once in the page
    cache, Kafka's default), to show the broker's CPU path apart from the disk's fdatasync."""
    _port, client = broker
    benchmark.pedantic(lambda: _produce_round(client, batch, FRESH_TOPIC),
                       setup=lambda: _recreate(client, FRESH_TOPIC, flush_fsync="false"), rounds=7,
                       warmup_rounds=1)
    throughput(benchmark, records=BATCHES * read_header(batch).record_count, nbytes=BATCHES * len(batch))


_FETCH_RESPONSE_OVERHEAD = 8 + 28  # TCP prefix + response header and FetchResponse body


def _receive_exactly(connection: socket.socket, total: int, buffer: memoryview) -> None:
    """Read ``total`` bytes into a reused buffer: the receiving side costs the same in both
    the broker fetch and the raw baseline."""
    received = 0
    while received < total:
        n = connection.recv_into(buffer, min(len(buffer), total - received))
        assert n, "connection closed early"
        received += n


def _fetch_requests(batch: bytes, count: int) -> bytes:
    """``count`` pipelined fetches of partition 0, one batch each (all batches are the same size,
    so their offsets are known in advance)."""
    per_batch = read_header(batch).record_count
    return b"".join(
        bytes(part)
        for i in range(count)
        for part in protocol.frame_tcp(protocol.encode_request(
            protocol.FetchRequest(TOPIC, 0, i * per_batch, max_bytes=len(batch), max_wait_ms=0), i, "bench"))
    )


def _check_one_fetch(port: int, batch: bytes) -> None:
    """The responses really are the batches: parse one round trip fully."""
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.sendall(_fetch_requests(batch, 1))
        decoder = protocol.TcpFrameDecoder()
        messages = []
        while not messages:
            messages = decoder.feed(connection.recv(4 << 20))
        header, response = protocol.decode_response(protocol.ApiKey.FETCH, messages[0])
        assert header.error_code == 0 and len(response.payload) == len(batch), header
        assert bytes(response.payload)[12:] == batch[12:]  # equal but for the stamped base offset


def test_broker_sendfile_fetch(benchmark, batch, broker):
    port, client = broker
    _produce_round(client, batch)  # at least BATCHES // WORKERS batches in partition 0
    count = BATCHES // WORKERS
    fetch_port = port + 1 + _owner_of_partition_0(client)
    _check_one_fetch(fetch_port, batch)
    requests = _fetch_requests(batch, count)
    buffer = memoryview(bytearray(4 << 20))

    def one_round():
        with socket.create_connection(("127.0.0.1", fetch_port)) as connection:
            connection.sendall(requests)
            _receive_exactly(connection, count * (_FETCH_RESPONSE_OVERHEAD + len(batch)), buffer)

    benchmark.pedantic(one_round, rounds=7, warmup_rounds=1)
    throughput(benchmark, nbytes=count * len(batch))


def _owner_of_partition_0(client: _Client) -> int:
    header, metadata = client.call(protocol.MetadataRequest([TOPIC]))
    assert header.error_code == 0
    port = metadata.topics[0].partitions[0].fetch_port
    return port - metadata.brokers[0].fetch_port


def _sendfile_source(port: int, path: str) -> None:
    """Serve the file with sendfile to every connection that asks with b"g" (until killed)."""
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    with socket.create_server(("127.0.0.1", port)) as server:
        while True:
            connection, _ = server.accept()
            with connection:
                if connection.recv(1) != b"g":
                    continue  # a readiness probe
                sent = 0
                while sent < size:
                    sent += os.sendfile(connection.fileno(), fd, sent, size - sent)


def test_raw_sendfile_loopback(benchmark, batch, tmp_path):
    count = BATCHES // WORKERS
    path = tmp_path / "cached.log"
    path.write_bytes(batch * count)
    port = free_port_block(1)
    source = multiprocessing.get_context("spawn").Process(target=_sendfile_source, args=(port, str(path)))
    source.start()
    buffer = memoryview(bytearray(4 << 20))
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port)).close()  # a probe: the source ignores it
            break
        except ConnectionRefusedError:
            assert time.monotonic() < deadline
            time.sleep(0.05)

    def one_round():
        with socket.create_connection(("127.0.0.1", port)) as connection:
            connection.sendall(b"g")
            _receive_exactly(connection, count * len(batch), buffer)

    try:
        benchmark.pedantic(one_round, rounds=7, warmup_rounds=1)
    finally:
        source.kill()
        source.join(10)
    throughput(benchmark, nbytes=count * len(batch))


ratio("broker ingest / raw ZeroMQ loopback", "test_broker_ingest", "test_raw_zmq_loopback_1mib_frames", 0.5)
ratio("broker ingest / raw ZeroMQ relay (two hops)", "test_broker_ingest", "test_raw_zmq_relay_1mib_frames")
ratio("broker ingest, no fsync / raw ZeroMQ loopback", "test_broker_ingest_page_cache",
      "test_raw_zmq_loopback_1mib_frames")
ratio("raw ZeroMQ relay (two hops) / raw ZeroMQ loopback", "test_raw_zmq_relay_1mib_frames",
      "test_raw_zmq_loopback_1mib_frames")
ratio("broker sendfile fetch / raw sendfile loopback", "test_broker_sendfile_fetch",
      "test_raw_sendfile_loopback", 0.7)
