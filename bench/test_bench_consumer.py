"""The consumer: one process iterating records of 100-byte values from the start of a topic.

A real ``hpbroker serve`` (2 workers) runs as a subprocess on this machine; its topic is filled
once with pre-built ~1 MiB batches (about 9,800 records each) through pipelined ProduceRequests.
Each round opens a Consumer, assigns every partition from offset 0 and iterates until it has seen
every record: fetch over the data ports (sendfile), CRC check and decode in Cython, and the
application's loop itself (``for record in consumer``, counting).  Target: >= 4,000,000 records/s.

A second benchmark reads ``record.value`` of each record as well, as most applications do; a
third polls the values as columns (``Consumer(columns=("value",))``, no object per record) and
sums their lengths with numpy.
"""

from __future__ import annotations

import os

import pytest
import zmq

from bench.brokers import running_broker
from bench.conftest import throughput
from hpbroker import Consumer, TopicPartition, protocol
from hpbroker.records import BatchBuilder, read_header

TOPIC = "bench-consume"
PARTITIONS = 2
BATCHES_PER_PARTITION = 160  # ~1.57 M records, ~165 MB per partition
IN_FLIGHT = 8
VALUE_BYTES = 100


@pytest.fixture(scope="module")
def batch() -> bytes:
    builder = BatchBuilder("bench", max_bytes=1 << 20)
    value = os.urandom(VALUE_BYTES)
    while builder.append(value):
        pass
    return builder.build()


@pytest.fixture(scope="module")
def filled_topic(tmp_path_factory, batch):
    """``(bootstrap, record_count)`` of a broker whose topic holds the records."""
    with running_broker(tmp_path_factory.mktemp("broker")) as port:
        _fill(port, batch)
        yield f"127.0.0.1:{port}", PARTITIONS * BATCHES_PER_PARTITION * read_header(batch).record_count


def _fill(port: int, batch: bytes) -> None:
    """Create the topic and append the batches with up to IN_FLIGHT produces in flight."""
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{port}")

    def receive() -> None:
        assert dealer.poll(60_000), "no produce response in 60 s"
        header, _ = protocol.decode_response(protocol.ApiKey.PRODUCE, dealer.recv_multipart())
        assert header.error_code == 0, header

    try:
        dealer.send_multipart(protocol.encode_request(protocol.CreateTopicRequest(TOPIC, PARTITIONS), 0))
        assert dealer.poll(30_000)
        header, _ = protocol.decode_response(protocol.ApiKey.CREATE_TOPIC, dealer.recv_multipart())
        assert header.error_code == 0, header
        total = PARTITIONS * BATCHES_PER_PARTITION
        for sent in range(total):
            if sent >= IN_FLIGHT:
                receive()
            request = protocol.ProduceRequest(TOPIC, sent % PARTITIONS, payload=batch)
            dealer.send_multipart(protocol.encode_request(request, sent + 1), copy=False)
        for _ in range(min(IN_FLIGHT, total)):
            receive()
    finally:
        dealer.close(linger=0)
        context.term()


def _consume(bootstrap: str, record_count: int, *, read_values: bool) -> None:
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        seen = 0
        value_bytes = 0
        if read_values:
            for record in consumer:
                value_bytes += len(record.value)
                seen += 1
                if seen == record_count:
                    break
            assert value_bytes == record_count * VALUE_BYTES
        else:
            for _record in consumer:
                seen += 1
                if seen == record_count:
                    break


def _consume_columns(bootstrap: str, record_count: int) -> None:
    with Consumer(bootstrap, auto_offset_reset="earliest", columns=("value",)) as consumer:
        consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        seen = value_bytes = 0
        while seen < record_count:
            for part in consumer.poll(timeout_ms=1000).values():
                seen += len(part)
                value_bytes += int(part.values.lengths.sum())
        assert (seen, value_bytes) == (record_count, record_count * VALUE_BYTES)


def test_consumer_iterates_records(benchmark, filled_topic):
    bootstrap, record_count = filled_topic
    benchmark.pedantic(_consume, args=(bootstrap, record_count), kwargs={"read_values": False},
                       rounds=5, warmup_rounds=1)
    throughput(benchmark, records=record_count, nbytes=record_count * VALUE_BYTES)


def test_consumer_iterates_records_reading_values(benchmark, filled_topic):
    bootstrap, record_count = filled_topic
    benchmark.pedantic(_consume, args=(bootstrap, record_count), kwargs={"read_values": True},
                       rounds=5, warmup_rounds=1)
    throughput(benchmark, records=record_count, nbytes=record_count * VALUE_BYTES)


def test_consumer_polls_value_columns(benchmark, filled_topic):
    bootstrap, record_count = filled_topic
    benchmark.pedantic(_consume_columns, args=(bootstrap, record_count), rounds=5, warmup_rounds=1)
    throughput(benchmark, records=record_count, nbytes=record_count * VALUE_BYTES)
