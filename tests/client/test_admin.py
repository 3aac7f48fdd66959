"""Topic administration against a real broker."""

from __future__ import annotations

import time

import pytest
from harness import free_ports, wait_until

from hpbroker import Admin, protocol
from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.errors import (
    BrokerNotAvailableError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from hpbroker.records import build_batch


@pytest.fixture
def admin(broker):
    with Admin(f"127.0.0.1:{broker[1]}") as admin:
        yield admin


def test_a_topic_is_created_listed_described_and_deleted(admin, broker, topic_name):
    admin.create_topic(topic_name, 3, {"retention_ms": 3_600_000, "flush_fsync": False})
    assert topic_name in admin.list_topics()
    description = admin.describe_topic(topic_name)
    assert description.name == topic_name
    assert [p.partition for p in description.partitions] == [0, 1, 2]
    assert {p.fetch_port for p in description.partitions} <= {broker[1] + 1, broker[1] + 2}
    assert description.configs["retention_ms"] == "3600000"
    assert description.configs["flush_fsync"] == "false"
    admin.delete_topic(topic_name)
    assert topic_name not in admin.list_topics()
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.describe_topic(topic_name)
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.delete_topic(topic_name)


def test_describe_shows_the_log_start_offset_and_high_watermark(admin, broker, topic_name):
    admin.create_topic(topic_name, 2)
    connection = BrokerConnection(BrokerAddress("127.0.0.1", broker[1]))
    try:
        connection.call(protocol.ProduceRequest(topic_name, 1, payload=build_batch([b"a", b"b", b"c"])))
    finally:
        connection.close()

    def offsets():
        return [(p.log_start_offset, p.high_watermark) for p in admin.describe_topic(topic_name).partitions]

    wait_until(lambda: offsets() == [(0, 0), (0, 3)], 10, what="the offsets in the workers' heartbeats")


def test_refusals_are_the_brokers_errors(admin, topic_name):
    admin.create_topic(topic_name, 1)
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_topic(topic_name, 1)
    with pytest.raises(InvalidTopicError):
        admin.create_topic("bad/name", 1)
    with pytest.raises(InvalidPartitionsError):
        admin.create_topic(topic_name + "-none", 0)
    with pytest.raises(InvalidConfigError, match="no_such_setting"):
        admin.create_topic(topic_name + "-cfg", 1, {"no_such_setting": 1})


def test_an_unreachable_broker_is_a_clear_error_within_the_timeout():
    port = free_ports(1)
    with Admin(f"127.0.0.1:{port}", connect_timeout_ms=300) as admin:
        started = time.monotonic()
        with pytest.raises(BrokerNotAvailableError, match=f"127.0.0.1:{port} is not reachable"):
            admin.list_topics()
        assert time.monotonic() - started < 5
