"""The producer I/O thread's connections: one per broker that leads a partition it writes to.

A :class:`BrokerLink` is a :class:`~hpbroker.client.connection.BrokerConnection` with a ZeroMQ
monitor of it (handshakes and disconnects), whether it is known to be connected, and the produce
requests in flight on it by correlation id (ids are per connection).  :class:`BrokerLinks` maps
a partition to the link of its leader, as the cluster metadata last described it: the bootstrap
broker's link (the broker asked for metadata: the first bootstrap address, until it stops
answering and the metadata moves to another, :meth:`BrokerLinks.rebootstrap`) when the metadata
names no other broker (a standalone broker) or the leader is the bootstrap address, else a
link opened on first use to the leader's advertised front-end.  A partition whose leader moved
is routed to the new one once its topic's metadata is refreshed (the producer refreshes after
errors 6 and 15).

Threads: everything here belongs to the producer's I/O thread.
"""

from __future__ import annotations

import contextlib
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.client.metadata import ClusterMetadata

__all__ = ["BrokerLink", "BrokerLinks"]

_MONITOR_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED


class BrokerLink:
    """One broker connection of the I/O thread (module docstring)."""

    def __init__(self, address: BrokerAddress, client_id: str, poller: zmq.Poller) -> None:
        self.address = address
        # The monitor is attached before the socket connects: a handshake it missed would leave the
        # link "not connected" for good, and a retry is never sent on such a link.
        self.connection = BrokerConnection(address, client_id=client_id, connect_timeout_s=0.5, connect=False)
        self.monitor = self.connection.socket.get_monitor_socket(_MONITOR_EVENTS)
        self.connection.connect()
        self.connected = False
        self.in_flight: dict[int, Any] = {}  # correlation id -> the producer's request
        poller.register(self.connection.socket, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)

    def __repr__(self) -> str:
        return f"BrokerLink({self.address}, connected={self.connected}, in_flight={len(self.in_flight)})"

    def monitor_events(self) -> list[int]:
        """The monitor's events since the last call (handshake succeeded or disconnected)."""
        events = []
        while self.monitor.get(zmq.EVENTS) & zmq.POLLIN:
            events.append(recv_monitor_message(self.monitor)["event"])
        return events

    def close(self, poller: zmq.Poller, linger_ms: int) -> None:
        """Stop monitoring and close; ``linger_ms`` as in BrokerConnection.close."""
        with contextlib.suppress(zmq.ZMQError):
            self.connection.socket.disable_monitor()
        for socket in (self.monitor, self.connection.socket):
            with contextlib.suppress(KeyError):
                poller.unregister(socket)
        self.monitor.close(linger=0)
        self.connection.close(linger_ms)


class BrokerLinks:
    """The I/O thread's links by broker address, and which one serves a partition."""

    def __init__(self, bootstrap: BrokerAddress, client_id: str, poller: zmq.Poller) -> None:
        self._client_id = client_id
        self._poller = poller
        self.bootstrap = BrokerLink(bootstrap, client_id, poller)
        self._links: dict[BrokerAddress, BrokerLink] = {bootstrap: self.bootstrap}

    def __iter__(self):
        return iter(list(self._links.values()))

    def rebootstrap(self, address: BrokerAddress) -> BrokerLink:
        """Make the link to ``address`` (opened now unless there is one) the bootstrap link: the
        metadata moved there, its broker having stopped answering.  The old one is closed by
        :meth:`prune` once it leads nothing and has nothing in flight."""
        link = self._links.get(address)
        if link is None:
            link = self._links[address] = BrokerLink(address, self._client_id, self._poller)
        self.bootstrap = link
        return link

    def for_partition(self, metadata: ClusterMetadata, topic: str, partition: int) -> BrokerLink:
        """The link to the partition's leader (module docstring for the rules)."""
        address = metadata.leader_address(topic, partition)
        if address is None:
            return self.bootstrap
        link = self._links.get(address)
        if link is None:
            link = self._links[address] = BrokerLink(address, self._client_id, self._poller)
        return link

    def prune(self, leaders: set[BrokerAddress], linger_ms: int) -> None:
        """Close the links, but the bootstrap one, to brokers that lead none of ``leaders`` and
        have nothing in flight (a leader that moved, or came back on other ports)."""
        for address, link in list(self._links.items()):
            if link is not self.bootstrap and address not in leaders and not link.in_flight:
                del self._links[address]
                link.close(self._poller, linger_ms)

    def close(self, linger_ms: int) -> None:
        for link in self._links.values():
            link.close(self._poller, linger_ms)
        self._links.clear()
