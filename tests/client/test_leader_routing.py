"""Where the producer sends a partition's requests (ClusterMetadata.leader_address, BrokerLinks):
pure routing logic over metadata responses, and real ZeroMQ sockets for the links."""

from __future__ import annotations

import types

import pytest
import zmq
from harness import free_ports

from hpbroker import protocol
from hpbroker.client.connection import BrokerAddress
from hpbroker.client.links import BrokerLinks
from hpbroker.client.metadata import ClusterMetadata
from hpbroker.errors import PartitionNotAvailableError

BOOTSTRAP = BrokerAddress("127.0.0.1", 9092)


def metadata_of(brokers: dict[int, int], leaders: list[int]) -> ClusterMetadata:
    """Metadata as the bootstrap broker would describe topic ``t``: ``brokers`` id -> port."""
    metadata = ClusterMetadata(types.SimpleNamespace(address=BOOTSTRAP))
    metadata.update(protocol.MetadataResponse(
        [protocol.BrokerInfo(b, "127.0.0.1", port, port + 1) for b, port in brokers.items()],
        [protocol.TopicMetadata("t", 0, [protocol.PartitionMetadata(p, 0, leader)
                                         for p, leader in enumerate(leaders)])]))
    return metadata


def test_a_standalone_broker_is_always_the_bootstrap_connection():
    assert metadata_of({0: 7000}, [0, 0]).leader_address("t", 1) is None  # advertised otherwise


def test_a_cluster_partition_goes_to_its_leader_or_the_bootstrap_broker_when_it_leads():
    metadata = metadata_of({1: 9092, 2: 9192}, [1, 2])
    assert metadata.leader_address("t", 0) is None
    assert metadata.leader_address("t", 1) == BrokerAddress("127.0.0.1", 9192)
    assert metadata.leader_address("unknown", 0) is None


def test_a_cluster_partition_without_a_live_leader_goes_nowhere():
    metadata = metadata_of({1: 9092, 2: 9192}, [1, 3])
    with pytest.raises(PartitionNotAvailableError, match="t-1 has no live leader"):
        metadata.leader_address("t", 1)


def test_links_to_brokers_that_lead_nothing_are_closed_unless_busy():
    poller = zmq.Poller()
    base = free_ports(3)
    links = BrokerLinks(BrokerAddress("127.0.0.1", base), "test", poller)
    try:
        metadata = metadata_of({1: base, 2: base + 1, 3: base + 2}, [1, 2, 3])
        second = links.for_partition(metadata, "t", 1)
        third = links.for_partition(metadata, "t", 2)
        assert links.for_partition(metadata, "t", 0) is links.bootstrap
        third.in_flight[7] = object()  # a request still out on it
        links.prune({BrokerAddress("127.0.0.1", base)}, 0)
        assert set(links) == {links.bootstrap, third}
        assert second.connection.socket.closed
        third.in_flight.clear()
        links.prune(set(), 0)
        assert set(links) == {links.bootstrap}
    finally:
        links.close(0)
