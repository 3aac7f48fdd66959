"""The producer: one application thread calling ``send()`` per record, 100-byte values.

- end to end: a Producer with default settings (acks=1, linger 5 ms, 1 MiB batches, no
  compression, sticky partitioning) sends RECORDS records to a 2-partition topic of a real
  ``hpbroker serve`` (2 workers) on this machine, then ``flush()``: the time until every record is
  acknowledged, i.e. flushed by the broker.  Each round writes into a topic created afresh (the
  previous one deleted), so the log does not grow from round to round.  Target: >= 2,000,000
  records/s on this 2-core machine, which also runs the broker.
- ``send()`` alone: the same call into the compiled accumulator with no I/O thread and no network
  (a subclass that knows the topic), to show what one call costs: 1 / records per second.
- ``send(..., callback=f)`` and ``send_future()`` alone: the same, asking for a delivery report
  per record (a shared callback costs a tuple; a ``concurrent.futures.Future`` costs its creation).
- ``send_many()`` alone, in chunks of 1,000 values (as loadgen sends): from a list of bytes, and
  from one 2-D numpy array whose rows are the values (no Python object per record).
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest

from bench.brokers import running_broker
from bench.conftest import throughput
from hpbroker import Producer, protocol
from hpbroker.client._accumulator import RecordAccumulator
from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.client.producer import ProducerConfig
from hpbroker.errors import UnknownTopicOrPartitionError

TOPIC = "bench-produce"
PARTITIONS = 2
RECORDS = 2_000_000  # per round, about 214 MB of records
MICRO_RECORDS = 200_000
VALUE_BYTES = 100


@pytest.fixture(scope="module")
def value() -> bytes:
    return os.urandom(VALUE_BYTES)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with running_broker(tmp_path_factory.mktemp("broker")) as port:
        connection = BrokerConnection(BrokerAddress("127.0.0.1", port))
        try:
            yield port, connection
        finally:
            connection.close()


def _recreate(connection: BrokerConnection, topic: str) -> None:
    with contextlib.suppress(UnknownTopicOrPartitionError):  # absent on the first round
        connection.call(protocol.DeleteTopicRequest(topic))
    connection.call(protocol.CreateTopicRequest(topic, PARTITIONS))


def test_producer_send_then_flush(benchmark, broker, value):
    port, connection = broker
    state = {}

    def setup():
        if "producer" in state:
            state["producer"].close()
        _recreate(connection, TOPIC)
        producer = state["producer"] = Producer(f"127.0.0.1:{port}")
        producer.send_future(TOPIC, value).result(30)  # learns the partitions before the clock starts

    def one_round():
        producer = state["producer"]
        for _ in range(RECORDS):
            producer.send(TOPIC, value)
        producer.flush()

    try:
        benchmark.pedantic(one_round, setup=setup, rounds=5, warmup_rounds=1)
    finally:
        state["producer"].close()
    throughput(benchmark, records=RECORDS, nbytes=RECORDS * VALUE_BYTES)


class _KnownTopics(RecordAccumulator):
    send_future = Producer.send_future  # the producer's own code, on an accumulator without I/O

    def _topic_partition_count(self, topic: str) -> int:
        return PARTITIONS


@pytest.fixture
def accumulator():
    """The producer's accumulator with its default settings, and no I/O thread: between rounds
    the batches are finished and released (as the I/O thread would), outside the timing."""
    config = ProducerConfig()
    accumulator = _KnownTopics("bench", 0, config.batch_bytes, config.linger_ms, 1 << 40)

    def release():
        ready, _ = accumulator.drain(float("inf"), 1 << 30)
        for _queue, batches in ready:
            accumulator.build_payload(batches)
            accumulator.finish(batches)

    return accumulator, release


def test_producer_send_alone(benchmark, accumulator, value):
    accumulator, release = accumulator

    def one_round():
        for _ in range(MICRO_RECORDS):
            accumulator.send(TOPIC, value)

    benchmark.pedantic(one_round, setup=release, rounds=20, warmup_rounds=2)
    throughput(benchmark, records=MICRO_RECORDS, nbytes=MICRO_RECORDS * VALUE_BYTES)


def test_producer_send_future_alone(benchmark, accumulator, value):
    accumulator, release = accumulator

    def one_round():
        for _ in range(MICRO_RECORDS):
            accumulator.send_future(TOPIC, value)

    benchmark.pedantic(one_round, setup=release, rounds=10, warmup_rounds=1)
    throughput(benchmark, records=MICRO_RECORDS, nbytes=MICRO_RECORDS * VALUE_BYTES)


def test_producer_send_with_callback_alone(benchmark, accumulator, value):
    accumulator, release = accumulator

    def delivered(metadata, error):
        pass

    def one_round():
        for _ in range(MICRO_RECORDS):
            accumulator.send(TOPIC, value, callback=delivered)

    benchmark.pedantic(one_round, setup=release, rounds=20, warmup_rounds=2)
    throughput(benchmark, records=MICRO_RECORDS, nbytes=MICRO_RECORDS * VALUE_BYTES)


CHUNK = 1_000


@pytest.mark.parametrize("form", ["list", "2-D array"])
def test_producer_send_many_alone(benchmark, accumulator, value, form):
    accumulator, release = accumulator
    rows = np.frombuffer(value * CHUNK, dtype=np.uint8).reshape(CHUNK, VALUE_BYTES)
    chunk = [bytes(row) for row in rows] if form == "list" else rows

    def one_round():
        for _ in range(MICRO_RECORDS // CHUNK):
            accumulator.send_many(TOPIC, chunk)

    benchmark.pedantic(one_round, setup=release, rounds=20, warmup_rounds=2)
    throughput(benchmark, records=MICRO_RECORDS, nbytes=MICRO_RECORDS * VALUE_BYTES)
