"""What every broker of the cluster stores, as ZooKeeper's broker and topic registries say: the
view a broker answers metadata requests from, so a client finds any partition from any broker.

A :class:`ClusterView` watches the live broker ids and each live broker's registration, and the
topic registry; after every change it builds a new immutable :class:`ClusterSnapshot` and swaps
it in with one assignment.  Readers (the broker's loop, answering a metadata request) take
:attr:`ClusterView.snapshot` and never wait, never lock, never see a half-built picture; a
snapshot may lag ZooKeeper by the time the watches take to fire.

Threads: the watch callbacks run on kazoo's thread and touch only this object's own fields.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from hpbroker.coord.registry import BrokerRegistration, BrokerRegistry, TopicRegistration, TopicRegistry
from hpbroker.coord.watches import Watch

__all__ = ["ClusterSnapshot", "ClusterView", "PartitionLocation"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PartitionLocation:
    """Where a partition is served: its broker and that broker's data port for it."""

    broker_id: int
    host: str
    fetch_port: int


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """Live brokers by id, and every registered topic's metadata (whether or not a live broker
    stores it now)."""

    brokers: Mapping[int, BrokerRegistration] = field(default_factory=dict)
    topics: Mapping[str, TopicRegistration] = field(default_factory=dict)

    def location(self, topic: str, partition: int,
                 slot_of: Callable[[str, int, int], int]) -> PartitionLocation | None:
        """The live broker storing ``partition`` of ``topic`` (the lowest id if several claim it),
        with the data port its worker ``slot_of(topic, partition, workers)`` serves; None when
        no live broker stores it."""
        for broker_id in sorted(self.brokers):
            broker = self.brokers[broker_id]
            if partition in broker.topics.get(topic, ()) and broker.data_ports:
                port = broker.data_ports[slot_of(topic, partition, len(broker.data_ports))]
                return PartitionLocation(broker_id, broker.host, port)
        return None


class ClusterView:
    """The latest :class:`ClusterSnapshot` of the registries, kept by watches (module docstring)."""

    def __init__(self, brokers: BrokerRegistry, topics: TopicRegistry) -> None:
        self._brokers = brokers
        self._topics = topics
        self._lock = threading.Lock()  # the watches' own bookkeeping, never held by readers
        self._registrations: dict[int, BrokerRegistration] = {}
        self._broker_watches: dict[int, Watch] = {}
        self._topic_registrations: dict[str, TopicRegistration] = {}
        self._topic_watches: dict[str, Watch] = {}
        self._top_watches: list[Watch] = []
        self._closed = False
        self.snapshot = ClusterSnapshot()

    def start(self) -> None:
        """Set the watches (the first callbacks run here, so the snapshot is complete on return)."""
        self._top_watches = [self._brokers.watch_ids(self._on_broker_ids),
                             self._topics.watch_names(self._on_topic_names)]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            watches = [*self._top_watches, *self._broker_watches.values(), *self._topic_watches.values()]
            self._broker_watches.clear()
            self._topic_watches.clear()
        for watch in watches:
            watch.cancel()

    # --- kazoo's thread ---------------------------------------------------------------------------

    def _on_broker_ids(self, ids: list[int]) -> None:
        with self._lock:
            if self._closed:
                return
            for gone in set(self._broker_watches) - set(ids):
                self._broker_watches.pop(gone).cancel()
                self._registrations.pop(gone, None)
            new = [broker_id for broker_id in ids if broker_id not in self._broker_watches]
            self._publish()
        for broker_id in new:  # outside the lock: the first callback runs right here
            watch = self._brokers.watch(broker_id,
                                        lambda r, broker_id=broker_id: self._on_broker(broker_id, r))
            with self._lock:
                if self._closed or broker_id in self._broker_watches:
                    watch.cancel()
                else:
                    self._broker_watches[broker_id] = watch

    def _on_broker(self, broker_id: int, registration: BrokerRegistration | None) -> None:
        with self._lock:
            if registration is None:
                self._registrations.pop(broker_id, None)
            else:
                self._registrations[broker_id] = registration
            self._publish()

    def _on_topic_names(self, names: list[str]) -> None:
        with self._lock:
            if self._closed:
                return
            for gone in set(self._topic_watches) - set(names):
                self._topic_watches.pop(gone).cancel()
                self._topic_registrations.pop(gone, None)
            new = [name for name in names if name not in self._topic_watches]
            self._publish()
        for name in new:
            watch = self._topics.watch(name, lambda t, name=name: self._on_topic(name, t))
            with self._lock:
                if self._closed or name in self._topic_watches:
                    watch.cancel()
                else:
                    self._topic_watches[name] = watch

    def _on_topic(self, name: str, topic: TopicRegistration | None) -> None:
        with self._lock:
            if topic is None:
                self._topic_registrations.pop(name, None)
            else:
                self._topic_registrations[name] = topic
            self._publish()

    def _publish(self) -> None:
        """Swap in a new snapshot (caller holds the lock)."""
        self.snapshot = ClusterSnapshot(dict(self._registrations), dict(self._topic_registrations))
