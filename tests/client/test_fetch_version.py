"""Consumers and the producer's look for an uncertain attempt fetch in FetchRequest version 0,
the lowest that carries what they use, so a client newer than a broker still reads from it.

The brokers that serve only version 0 are stand-ins (``standins``) answering any other version
with error 9, as a broker does for a version it does not serve; one test reads from a real broker."""

from __future__ import annotations

import select
import time

from standins import StandInDataPort, StandInFrontEnd

from hpbroker import protocol
from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.client.consumer import Consumer, TopicPartition
from hpbroker.client.fetcher import FETCH_VERSION, FetchConfig, PartitionFetcher
from hpbroker.client.metadata import ClusterMetadata
from hpbroker.client.producer import Producer
from hpbroker.errors import RequestTimedOutError, UnsupportedVersionError
from hpbroker.records import build_batch

TOPIC = "t"


def _stamped(batch: bytes, base_offset: int) -> bytes:
    return base_offset.to_bytes(8, "little") + batch[8:]


def version_0_only(answer):
    """A handler that refuses every FetchRequest version but 0 with error 9 and passes the rest
    to ``answer``."""

    def handler(header, request):
        if isinstance(request, protocol.FetchRequest) and header.api_version != 0:
            return (protocol.FetchResponse(), UnsupportedVersionError.code,
                    f"FetchRequest version {header.api_version} is not served; versions 0..0 are")
        return answer(header, request)

    return handler


def _receive(fetcher: PartitionFetcher, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        select.select([fetcher], [], [], 0.1)
        completed = fetcher.receive()
        if completed is not None:
            return completed
    raise AssertionError(f"no fetch response in {timeout_s} s")


def test_a_consumer_fetches_in_version_0_from_a_broker_serving_only_version_0(stand_ins):
    stored = _stamped(build_batch([b"a", b"b", b"c"]), 5)
    data = stand_ins(StandInDataPort, version_0_only(
        lambda header, request: (protocol.FetchResponse(8, 0, payload=stored), 0, "")))

    def front_end(header, request):
        return protocol.MetadataResponse(
            [protocol.BrokerInfo(0, "127.0.0.1", 1, data.port)],
            [protocol.TopicMetadata(TOPIC, 0, [protocol.PartitionMetadata(0, 0, 0, data.port, 0, 0)])]), 0, ""

    front = stand_ins(StandInFrontEnd, front_end)
    with Consumer(f"127.0.0.1:{front.port}", reconnect_timeout_ms=10_000) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        consumer.seek(TopicPartition(TOPIC, 0), 6)
        records: list = []
        deadline = time.monotonic() + 20
        while len(records) < 2 and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
    assert [(r.offset, r.value) for r in records] == [(6, b"b"), (7, b"c")]
    versions = {header.api_version for header, _ in data.requests}
    assert versions == {0} == {FETCH_VERSION}


def test_the_producers_look_for_an_uncertain_attempt_fetches_in_version_0(stand_ins):
    """An attempt answered with error 12 may be stored: before resending, the producer (without
    idempotence) looks for it with ListOffsets and a fetch, which a version 0 broker answers."""
    produced: list[bytes] = []

    def broker(header, request):
        if isinstance(request, protocol.MetadataRequest):
            return protocol.MetadataResponse(
                [protocol.BrokerInfo(0, "127.0.0.1", front.port, 0)],
                [protocol.TopicMetadata(TOPIC, 0, [protocol.PartitionMetadata(0, 0, 0, 0, 0, 0)])]), 0, ""
        if isinstance(request, protocol.ProduceRequest):
            produced.append(bytes(request.payload))
            return protocol.ProduceResponse(), RequestTimedOutError.code, "not flushed within timeout_ms"
        if isinstance(request, protocol.ListOffsetsRequest):
            return protocol.ListOffsetsResponse(40), 0, ""
        if isinstance(request, protocol.FetchRequest):
            return protocol.FetchResponse(41, 0, payload=_stamped(produced[0], 40)), 0, ""
        raise AssertionError(f"unexpected {request}")

    front = stand_ins(StandInFrontEnd, version_0_only(broker))
    with Producer(f"127.0.0.1:{front.port}", acks=1, enable_idempotence=False, audit_topic=None, linger_ms=0,
                  retry_backoff_ms=10, delivery_timeout_ms=20_000) as producer:
        metadata = producer.send_future(TOPIC, b"value", partition=0).result(20)
    assert (metadata.partition, metadata.offset) == (0, 40), "found where the first attempt put it"
    assert len(produced) == 1, "not sent twice"
    fetches = front.of_type(protocol.FetchRequest)
    assert fetches and {header.api_version for header, _ in fetches} == {0}


def test_a_fetcher_reads_from_a_real_broker_in_version_0(broker, topic_name, monkeypatch):
    _process, port = broker
    connection = BrokerConnection(BrokerAddress("127.0.0.1", port))
    sent: list[tuple[str, int | None]] = []
    encode = protocol.encode_request

    def spy(message, correlation_id, client_id="", version=None):
        frames = encode(message, correlation_id, client_id, version)
        header = protocol.decode_request(frames)[0]
        sent.append((type(message).__name__, header.api_version))
        return frames

    try:
        connection.call(protocol.CreateTopicRequest(topic_name, 1))
        connection.call(protocol.ProduceRequest(topic_name, 0, payload=build_batch([b"a", b"b"])))
        info = ClusterMetadata(connection).partition(topic_name, 0)
        monkeypatch.setattr(protocol, "encode_request", spy)
        fetcher = PartitionFetcher(topic_name, 0, info.host, info.fetch_port,
                                   FetchConfig(fetch_max_wait_ms=100))
        try:
            fetcher.fetch(0)
            completed = _receive(fetcher)
        finally:
            fetcher.close()
    finally:
        connection.close()
    assert completed.error is None
    assert [(r.offset, r.value) for r in completed.records] == [(0, b"a"), (1, b"b")]
    assert completed.high_watermark == 2
    assert sent and set(sent) == {("FetchRequest", 0)}
