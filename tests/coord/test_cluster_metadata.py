"""Two brokers on one ZooKeeper: each answers metadata for the other's topics too, so a client
bootstrapped at either finds every partition (and fetches it from the broker that stores it)."""

from __future__ import annotations

import pytest
from harness import Client, start_broker, wait_until

from hpbroker import protocol
from hpbroker.client import Consumer, Producer, TopicPartition
from hpbroker.client.admin import Admin
from hpbroker.errors import UnknownTopicOrPartitionError

pytestmark = pytest.mark.zookeeper


@pytest.fixture
def two_brokers(tmp_path, zk_connect):
    started = []
    for broker_id in (1, 2):
        config = tmp_path / f"broker-{broker_id}.toml"
        config.write_text(f'[broker]\nbroker_id = {broker_id}\nzookeeper = "{zk_connect}"\n'
                          f"zookeeper_session_timeout_ms = 4000\n")
        process, port = start_broker(tmp_path / f"data-{broker_id}", tmp_path / f"broker-{broker_id}.log",
                                     config=config)
        started.append((process, port, Client(port)))
    try:
        yield started
    finally:
        for process, _port, client in started:
            client.close()
            assert process.stop() == 0, process.log()


def _metadata(client, *names):
    header, response = client.request(protocol.MetadataRequest(list(names)))
    assert header.error_code == 0
    return response


def test_metadata_from_either_broker_names_every_topic_and_where_it_is_served(two_brokers):
    (_, port_1, client_1), (_, port_2, client_2) = two_brokers
    assert client_1.request(protocol.CreateTopicRequest("on-one", 2))[0].error_code == 0
    assert client_2.request(protocol.CreateTopicRequest("on-two", 3, [
        protocol.TopicConfigEntry("retention_ms", "60000")]))[0].error_code == 0

    def other_broker_topic_served():
        response = _metadata(client_1)
        served = {t.name for t in response.topics
                  if t.partitions and all(p.error_code == 0 for p in t.partitions)}
        return served == {"on-one", "on-two"} and response
    response = wait_until(other_broker_topic_served, 10, what="broker 1 to see broker 2's topic served")
    assert [(b.broker_id, b.port, b.fetch_port) for b in response.brokers] == \
        [(1, port_1, port_1 + 1), (2, port_2, port_2 + 1)]
    remote = next(t for t in response.topics if t.name == "on-two")
    assert remote.error_code == 0
    assert [(c.key, c.value) for c in remote.configs] == [("retention_ms", "60000")]
    assert [p.leader for p in remote.partitions] == [2, 2, 2]
    assert {p.fetch_port for p in remote.partitions} <= {port_2 + 1, port_2 + 2}
    own = _metadata(client_2, "on-two").topics[0]
    assert [p.fetch_port for p in own.partitions] == [p.fetch_port for p in remote.partitions]
    wait_until(lambda: {t.name for t in _metadata(client_2).topics} == {"on-one", "on-two"}, 10,
               what="broker 2 to see broker 1's topic")
    assert _metadata(client_1, "nowhere").topics[0].error_code == 6


def test_a_consumer_bootstrapped_at_one_broker_reads_a_topic_stored_on_the_other(two_brokers):
    (_, port_1, client_1), (_, port_2, client_2) = two_brokers
    # Created through broker 1, so stored there; produced through broker 1, consumed via broker 2.
    assert client_1.request(protocol.CreateTopicRequest("elsewhere", 1))[0].error_code == 0
    with Producer(f"127.0.0.1:{port_1}") as producer:
        for i in range(20):
            producer.send("elsewhere", f"record {i}".encode())
    wait_until(lambda: any(t.name == "elsewhere" and t.partitions[0].leader == 1
                           for t in _metadata(client_2).topics), 10, what="broker 2 to see the topic")
    with Consumer(f"127.0.0.1:{port_2}", consumer_timeout_ms=2000) as consumer:
        tp = TopicPartition("elsewhere", 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        values = [record.value for record in consumer]
    assert values == [f"record {i}".encode() for i in range(20)]


def test_a_consumer_bootstrapped_at_one_broker_finds_offsets_of_a_topic_stored_on_the_other(two_brokers):
    (_, port_1, client_1), (_, port_2, client_2) = two_brokers
    # Stored on broker 1; the consumer knows only broker 2, whose front-end answers error 6 for it.
    assert client_1.request(protocol.CreateTopicRequest("offsets-elsewhere", 1))[0].error_code == 0
    with Producer(f"127.0.0.1:{port_1}") as producer:
        for i in range(20):
            producer.send("offsets-elsewhere", f"record {i}".encode(), timestamp=1_000 + i)
    wait_until(lambda: any(t.name == "offsets-elsewhere" and t.partitions[0].leader == 1
                           for t in _metadata(client_2).topics), 10, what="broker 2 to see the topic")
    tp = TopicPartition("offsets-elsewhere", 0)
    with Consumer(f"127.0.0.1:{port_2}", auto_offset_reset="earliest", consumer_timeout_ms=2000,
                  reconnect_timeout_ms=3000) as consumer:
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 20}
        assert consumer.offsets_for_times({tp: 1_015}) == {tp: 15}
        consumer.assign([tp])
        assert consumer.position(tp) == 0, "auto_offset_reset='earliest' looked up where the log starts"
        consumer.seek_to_end(tp)
        assert consumer.position(tp) == 20
        consumer.seek_to_beginning(tp)
        assert [record.value for record in consumer] == [f"record {i}".encode() for i in range(20)]


def test_a_producer_bootstrapped_at_one_broker_writes_to_topics_stored_on_either(two_brokers):
    """Each partition's requests go to its leader: records for broker 1's topic sent through a
    producer that knows only broker 2 are stored on broker 1, and so are its monitoring events
    when the audit topic lives there."""
    from hpbroker.audit.events import AUDIT_TOPIC, decode_event

    (_, port_1, client_1), (_, port_2, client_2) = two_brokers
    for name, client in (("stored-on-one", client_1), ("stored-on-two", client_2), (AUDIT_TOPIC, client_1)):
        assert client.request(protocol.CreateTopicRequest(name, 2))[0].error_code == 0
    wait_until(lambda: {"stored-on-one", AUDIT_TOPIC} <= {t.name for t in _metadata(client_2).topics
                                                          if t.partitions and t.partitions[0].leader == 1},
               10, what="broker 2 to see broker 1's topics")
    with Producer(f"127.0.0.1:{port_2}", name="routed") as producer:
        futures = [producer.send_future(topic, b"%s %d" % (topic.encode(), i), partition=i % 2)
                   for i in range(40) for topic in ("stored-on-one", "stored-on-two")]
        offsets = [future.result(10) for future in futures]
    assert len(offsets) == 80
    for topic, port in (("stored-on-one", port_1), ("stored-on-two", port_2)):
        with Consumer(f"127.0.0.1:{port}", consumer_timeout_ms=2000) as consumer:
            partitions = [TopicPartition(topic, p) for p in (0, 1)]
            consumer.assign(partitions)
            consumer.seek_to_beginning(*partitions)
            values = sorted(record.value for record in consumer)
        assert values == sorted(b"%s %d" % (topic.encode(), i) for i in range(40))
    with Consumer(f"127.0.0.1:{port_1}", consumer_timeout_ms=2000) as consumer:
        partitions = [TopicPartition(AUDIT_TOPIC, p) for p in (0, 1)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        announced = {}
        for record in consumer:
            event = decode_event(record.producer, record.value)
            announced[event.topic] = announced.get(event.topic, 0) + event.record_count
    assert announced == {"stored-on-one": 40, "stored-on-two": 40}


def test_admin_alters_and_deletes_a_topic_through_any_broker(two_brokers):
    """Only the broker storing a topic can change it: Admin sends alter and delete to it."""
    (_, port_1, client_1), (_, port_2, client_2) = two_brokers
    assert client_2.request(protocol.CreateTopicRequest("on-two", 2))[0].error_code == 0
    with Admin(f"127.0.0.1:{port_1}") as admin:
        wait_until(lambda: [p.leader for p in _metadata(client_1, "on-two").topics[0].partitions] == [2, 2],
                   10, what="broker 1 to see broker 2's topic served")
        admin.alter_topic("on-two", {"retention_ms": 60_000})
        configs = {(c.key, c.value) for t in _metadata(client_2, "on-two").topics for c in t.configs}
        assert configs == {("retention_ms", "60000")}
        admin.delete_topic("on-two")
        assert all(p.leader != 2 for p in _metadata(client_2, "on-two").topics[0].partitions)

        def gone(client):
            return _metadata(client, "on-two").topics[0].error_code == UnknownTopicOrPartitionError.code

        wait_until(lambda: gone(client_1) and gone(client_2), 10, what="the deletion to reach ZooKeeper")
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.alter_topic("on-two", {"retention_ms": 1000})


def test_the_producer_follows_a_leader_that_comes_back_on_another_port(two_brokers, tmp_path):
    """A leader that stops answering makes the producer ask the bootstrap broker where the
    partition is now: broker 1 restarted on new ports, records sent meanwhile arrive there."""
    (process_1, port_1, client_1), (_, port_2, client_2) = two_brokers
    assert client_1.request(protocol.CreateTopicRequest("moving", 1))[0].error_code == 0
    wait_until(lambda: any(t.name == "moving" and t.partitions and t.partitions[0].leader == 1
                           for t in _metadata(client_2).topics), 10, what="broker 2 to see the topic")
    with Producer(f"127.0.0.1:{port_2}", name="follower", request_timeout_ms=2000,
                  delivery_timeout_ms=60_000, audit_topic=None) as producer:
        producer.send_future("moving", b"before").result(10)
        client_1.close()
        assert process_1.stop() == 0, process_1.log()
        futures = [producer.send_future("moving", b"during %d" % i) for i in range(10)]
        config = tmp_path / "broker-1.toml"  # the fixture's file: same id, same ZooKeeper
        moved, new_port = start_broker(tmp_path / "data-1", tmp_path / "broker-1-again.log", config=config)
        try:
            assert new_port != port_1
            assert [f.result(45).offset for f in futures] == list(range(1, 11))
        finally:
            assert moved.stop() == 0, moved.log()
