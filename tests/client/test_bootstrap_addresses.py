"""Several bootstrap addresses: a client asks the first for metadata and, when it does not
answer, the others in turn; when none answers, its error names every address tried.  Against
the module's real broker, with a dead address (a free port) first.  The cluster case (the
first broker of three stopped) is tests/cluster/test_bootstrap_failover.py."""

from __future__ import annotations

import time

import pytest
from harness import free_ports
from standins import StandInFrontEnd

from hpbroker import protocol
from hpbroker.client import Admin, Consumer, Producer, TopicPartition
from hpbroker.errors import BrokerNotAvailableError, CoordinationError


def dead_addresses(count: int) -> list[str]:
    """``count`` loopback addresses nothing listens on (free ports at the time of asking)."""
    first = free_ports(count)
    return [f"127.0.0.1:{port}" for port in range(first, first + count)]


def create(bootstrap: str, topic: str, partitions: int) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions)


def test_a_producer_asks_the_next_bootstrap_address_when_the_first_is_dead(bootstrap, topic_name):
    create(bootstrap, topic_name, 2)
    (dead,) = dead_addresses(1)
    with Producer(f"{dead},{bootstrap}", audit_topic=None, max_block_ms=10_000) as producer:
        offsets = [producer.send_future(topic_name, b"v", partition=p).result(20).offset for p in (0, 1)]
    assert offsets == [0, 0]


def test_admin_calls_go_to_the_next_bootstrap_address_when_the_first_is_dead(bootstrap, topic_name):
    (dead,) = dead_addresses(1)
    with Admin([dead, bootstrap], connect_timeout_ms=1000) as admin:
        admin.create_topic(topic_name, 3)  # not a metadata request: sent where the metadata moved
        assert topic_name in admin.list_topics()
        assert len(admin.describe_topic(topic_name).partitions) == 3
        admin.alter_topic(topic_name, {"retention_ms": 3_600_000})
        assert admin.describe_topic(topic_name).configs["retention_ms"] == "3600000"
        admin.delete_topic(topic_name)
        assert topic_name not in admin.list_topics()


@pytest.mark.parametrize("kind", ["assigned", "positions"])
def test_a_consumer_asks_the_next_bootstrap_address_when_the_first_is_dead(bootstrap, topic_name, kind):
    """Its fetch loop's metadata (``poll``) and the calls that wait for an answer alike."""
    create(bootstrap, topic_name, 1)
    with Producer(bootstrap, audit_topic=None) as producer:
        producer.send_many(topic_name, [b"a", b"b", b"c"], partition=0)
    (dead,) = dead_addresses(1)
    tp = TopicPartition(topic_name, 0)
    settings = {"auto_offset_reset": "earliest", "reconnect_timeout_ms": 10_000}
    with Consumer(f"{dead},{bootstrap}", **settings) as consumer:
        if kind == "positions":
            assert consumer.partitions_for_topic(topic_name) == {0}
            assert consumer.end_offsets([tp]) == {tp: 3}
        consumer.assign([tp])
        records = []
        deadline = time.monotonic() + 20
        while len(records) < 3 and time.monotonic() < deadline:
            for batch in consumer.poll(200).values():
                records.extend(batch)
    assert [r.value for r in records] == [b"a", b"b", b"c"]


def test_admin_names_every_address_when_none_answers():
    addresses = dead_addresses(3)
    with Admin(",".join(addresses), connect_timeout_ms=300) as admin, \
            pytest.raises(BrokerNotAvailableError) as raised:
        admin.list_topics()
    assert all(address in str(raised.value) for address in addresses), raised.value
    with Admin(",".join(addresses), connect_timeout_ms=300) as admin, \
            pytest.raises(BrokerNotAvailableError) as raised:
        admin.create_topic("nowhere", 1)
    assert all(address in str(raised.value) for address in addresses), raised.value


def test_a_producer_names_every_address_when_none_answers():
    addresses = dead_addresses(2)
    with Producer(addresses, audit_topic=None, max_block_ms=3000) as producer, \
            pytest.raises(BrokerNotAvailableError) as raised:
        producer.send("nowhere", b"v")
    assert all(address in str(raised.value) for address in addresses), raised.value


def test_a_consumer_names_every_address_when_none_answers():
    addresses = dead_addresses(2)
    with Consumer(",".join(addresses), reconnect_timeout_ms=1500) as consumer:
        consumer.assign([TopicPartition("nowhere", 0)])
        deadline = time.monotonic() + 20
        with pytest.raises(BrokerNotAvailableError) as raised:
            while time.monotonic() < deadline:
                consumer.poll(200)
    assert all(address in str(raised.value) for address in addresses), raised.value


def test_an_idempotent_producer_asks_the_next_broker_for_its_id_when_the_bootstrap_broker_stops_answering(
        bootstrap, connection, topic_name, stand_ins):
    """The first address answers metadata (relaying the real broker's) but not InitProducerId:
    the producer moves to the broker its metadata named, takes its id there and delivers."""
    create(bootstrap, topic_name, 1)

    def first(header, request):
        if isinstance(request, protocol.InitProducerIdRequest):
            time.sleep(3)  # past the producer's control timeout (request_timeout_ms 2000)
            return protocol.InitProducerIdResponse(), CoordinationError.code, "late", 0
        answer = connection.wait_for(connection.send(request, version=header.api_version), 10)
        return answer.body, answer.header.error_code, answer.header.error_message

    relay = stand_ins(StandInFrontEnd, first)
    settings = {"audit_topic": None, "request_timeout_ms": 2000, "delivery_timeout_ms": 20_000}
    with Producer(f"127.0.0.1:{relay.port},{bootstrap}", **settings) as producer:
        metadata = producer.send_future(topic_name, b"v").result(30)
    assert metadata.offset == 0
    assert len(relay.of_type(protocol.InitProducerIdRequest)) == 1
