"""What a client knows about the cluster: topics, their partitions, and where each is served.

Built from ``MetadataResponse`` (docs/PROTOCOL.md): for every partition its leader broker and the
TCP data port that serves its fetches.  A client refreshes a topic's entry when a request fails
with a retriable error that means "the picture changed" (unknown partition, partition not
available) and before its first use of a topic.

Threads: one instance per client thread, used with that thread's connection.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hpbroker import protocol
from hpbroker.client.connection import BrokerConnection
from hpbroker.errors import UnknownTopicOrPartitionError, error_for_code

__all__ = ["ClusterMetadata", "PartitionInfo"]


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition as the broker described it: ``error_code`` 0 when it is being served."""

    topic: str
    partition: int
    leader: int
    host: str
    fetch_port: int
    error_code: int
    log_start_offset: int
    high_watermark: int


class ClusterMetadata:
    """Topic -> partitions, refreshed on demand through ``connection``."""

    def __init__(self, connection: BrokerConnection, *, timeout_s: float = 30.0) -> None:
        self._connection = connection
        self._timeout_s = timeout_s
        self._topics: dict[str, list[PartitionInfo]] = {}
        self._refreshed_at: dict[str, float] = {}

    def refresh(self, *topics: str) -> protocol.MetadataResponse:
        """Ask the broker about ``topics`` (every topic when none is named) and remember them.
        Unknown topics are forgotten; other per-topic errors are kept in their entries."""
        response: protocol.MetadataResponse = self._connection.call(protocol.MetadataRequest(list(topics)),
                                                                     self._timeout_s)
        hosts = {broker.broker_id: broker.host for broker in response.brokers}
        default_host = self._connection.address.host
        now = time.monotonic()
        for topic in response.topics:
            if topic.error_code:
                self._topics.pop(topic.name, None)
                continue
            self._topics[topic.name] = [
                PartitionInfo(topic.name, p.partition, p.leader, hosts.get(p.leader, default_host),
                              p.fetch_port, p.error_code, p.log_start_offset, p.high_watermark)
                for p in sorted(topic.partitions, key=lambda p: p.partition)
            ]
            self._refreshed_at[topic.name] = now
        return response

    def partitions(self, topic: str, *, refresh: bool = False) -> list[PartitionInfo]:
        """The topic's partitions, asking the broker if unknown (or ``refresh``).  Raises
        UnknownTopicOrPartitionError for a topic the broker does not have."""
        if refresh or topic not in self._topics:
            response = self.refresh(topic)
            for described in response.topics:
                if described.name == topic and described.error_code:
                    raise error_for_code(described.error_code, f"topic {topic!r}: broker says error "
                                                               f"{described.error_code}")
        found = self._topics.get(topic)
        if found is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        return found

    def partition_count(self, topic: str) -> int:
        return len(self.partitions(topic))

    def partition(self, topic: str, partition: int, *, refresh: bool = False) -> PartitionInfo:
        partitions = self.partitions(topic, refresh=refresh)
        if not 0 <= partition < len(partitions):
            raise UnknownTopicOrPartitionError(f"topic {topic!r} has {len(partitions)} partitions, "
                                               f"no partition {partition}")
        return partitions[partition]

    def age_s(self, topic: str) -> float:
        """Seconds since the topic's entry was refreshed (infinite if never)."""
        at = self._refreshed_at.get(topic)
        return float("inf") if at is None else time.monotonic() - at

    def forget(self, topic: str) -> None:
        self._topics.pop(topic, None)
        self._refreshed_at.pop(topic, None)
