"""The client's connection and metadata against a real broker."""

from __future__ import annotations

import time

import pytest
import zmq
from harness import free_ports

from hpbroker import protocol
from hpbroker.client.connection import BrokerAddress, BrokerConnection, parse_bootstrap
from hpbroker.client.metadata import ClusterMetadata
from hpbroker.errors import BrokerNotAvailableError, TopicAlreadyExistsError, UnknownTopicOrPartitionError


@pytest.mark.parametrize(("bootstrap", "expected"), [
    ("localhost:9192", [BrokerAddress("localhost", 9192)]),
    ("localhost", [BrokerAddress("localhost", 9092)]),
    ("a:1, b:2", [BrokerAddress("a", 1), BrokerAddress("b", 2)]),
    (["[::1]:9000"], [BrokerAddress("::1", 9000)]),
])
def test_bootstrap_addresses_parse(bootstrap, expected):
    assert parse_bootstrap(bootstrap) == expected


@pytest.mark.parametrize("bad", ["", "host:port", "host:0", ":9092", "a:70000"])
def test_bad_bootstrap_addresses_are_refused_by_name(bad):
    with pytest.raises(ValueError, match="broker address|no broker"):
        parse_bootstrap(bad)


def test_calls_match_responses_by_correlation_id(broker, topic_name):
    _process, port = broker
    connection = BrokerConnection(BrokerAddress("127.0.0.1", port))
    try:
        connection.call(protocol.CreateTopicRequest(topic_name, 3))
        with pytest.raises(TopicAlreadyExistsError):
            connection.call(protocol.CreateTopicRequest(topic_name, 3))
        ids = [connection.send(protocol.MetadataRequest([topic_name])) for _ in range(5)]
        last = connection.wait_for(ids[-1], 10)  # the others are kept for poll()
        assert last.correlation_id == ids[-1] and connection.in_flight == 0
        taken = {connection.poll(1).correlation_id for _ in range(4)}
        assert taken == set(ids[:-1]) and connection.poll(0) is None
    finally:
        connection.close()


def test_metadata_knows_partitions_and_their_data_ports(broker, topic_name):
    _process, port = broker
    connection = BrokerConnection(BrokerAddress("127.0.0.1", port))
    try:
        connection.call(protocol.CreateTopicRequest(topic_name, 4))
        metadata = ClusterMetadata(connection)
        partitions = metadata.partitions(topic_name)
        assert [p.partition for p in partitions] == [0, 1, 2, 3]
        assert {p.fetch_port for p in partitions} == {port + 1, port + 2}, "two workers, two data ports"
        assert all(p.host == "127.0.0.1" and p.error_code == 0 for p in partitions)
        with pytest.raises(UnknownTopicOrPartitionError, match="no partition 4"):
            metadata.partition(topic_name, 4)
        with pytest.raises(UnknownTopicOrPartitionError):
            metadata.partitions("no-such-topic")
    finally:
        connection.close()


def test_an_unreachable_broker_is_a_clear_error_within_the_timeout():
    port = free_ports(1)
    connection = BrokerConnection(BrokerAddress("127.0.0.1", port), connect_timeout_s=0.3)
    try:
        started = time.monotonic()
        with pytest.raises(BrokerNotAvailableError, match=f"127.0.0.1:{port} is not reachable"):
            connection.send(protocol.MetadataRequest([]))
        assert time.monotonic() - started < 5
    finally:
        connection.close()


class _DroppedAfterPollout:
    """A socket whose poll says a peer is connected (POLLOUT) but which has lost it again by the
    time of the send: a non-blocking send finds nobody; a blocking one would wait forever."""

    def __init__(self) -> None:
        self.blocking_sends = 0

    def poll(self, timeout_ms=None, flags=zmq.POLLIN):
        return zmq.POLLOUT

    def send_multipart(self, frames, flags=0, copy=True):
        if not flags & zmq.NOBLOCK:
            self.blocking_sends += 1
            raise AssertionError("a blocking send: it never returns if the peer stays away")
        raise zmq.Again()


def test_a_connection_lost_between_pollout_and_the_send_is_broker_not_available():
    connection = BrokerConnection(BrokerAddress("127.0.0.1", free_ports(1)), connect_timeout_s=0.2)
    real_socket, stub = connection._socket, _DroppedAfterPollout()
    connection._socket = stub
    try:
        with pytest.raises(BrokerNotAvailableError, match="is not reachable"):
            connection.send(protocol.MetadataRequest([]))
        assert stub.blocking_sends == 0 and connection.in_flight == 0
    finally:
        connection._socket = real_socket
        connection.close()
