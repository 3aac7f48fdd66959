"""The producer I/O thread's connections: one per broker that leads a partition it writes to.

A :class:`BrokerLink` is a :class:`~hpbroker.client.connection.BrokerConnection` (with
``security``, the producer's CurveZMQ identity, if any) whose monitor (handshakes and disconnects)
the I/O thread polls, whether it is known to be connected, and the produce
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
from typing import TYPE_CHECKING, Any

import zmq

from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.client.metadata import ClusterMetadata

if TYPE_CHECKING:
    from hpbroker.security.client import ClientSecurity

__all__ = ["BrokerLink", "BrokerLinks"]


class BrokerLink:
    """One broker connection of the I/O thread (module docstring)."""

    def __init__(self, address: BrokerAddress, client_id: str, poller: zmq.Poller,
                 security: ClientSecurity | None = None) -> None:
        self.address = address
        # The connection's monitor is attached before its socket connects: a handshake it missed
        # would leave the link "not connected" for good, and a retry is never sent on such a link.
        self.connection = BrokerConnection(address, client_id=client_id, connect_timeout_s=0.5, connect=False,
                                           security=security)
        self.monitor = self.connection.monitor
        self.connection.connect()
        self.connected = False
        self.in_flight: dict[int, Any] = {}  # correlation id -> the producer's request
        poller.register(self.connection.socket, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)

    def __repr__(self) -> str:
        return f"BrokerLink({self.address}, connected={self.connected}, in_flight={len(self.in_flight)})"

    def monitor_events(self) -> list[int]:
        """The monitor's events since the last call (handshake succeeded or failed, disconnected;
        a failed one is kept as ``connection.refused``)."""
        return self.connection.monitor_events()

    def close(self, poller: zmq.Poller, linger_ms: int) -> None:
        """Stop polling and close (the monitor too); ``linger_ms`` as in BrokerConnection.close."""
        for socket in (self.monitor, self.connection.socket):
            with contextlib.suppress(KeyError):
                poller.unregister(socket)
        self.connection.close(linger_ms)


class BrokerLinks:
    """The I/O thread's links by broker address, and which one serves a partition."""

    def __init__(self, bootstrap: BrokerAddress, client_id: str, poller: zmq.Poller,
                 security: ClientSecurity | None = None) -> None:
        self._client_id = client_id
        self._poller = poller
        self._security = security
        self.bootstrap = BrokerLink(bootstrap, client_id, poller, security)
        self._links: dict[BrokerAddress, BrokerLink] = {bootstrap: self.bootstrap}

    def __iter__(self):
        return iter(list(self._links.values()))

    def rebootstrap(self, address: BrokerAddress) -> BrokerLink:
        """Make the link to ``address`` (opened now unless there is one) the bootstrap link: the
        metadata moved there, its broker having stopped answering.  The old one is closed by
        :meth:`prune` once it leads nothing and has nothing in flight."""
        link = self._links.get(address)
        if link is None:
            link = self._links[address] = BrokerLink(address, self._client_id, self._poller, self._security)
        self.bootstrap = link
        return link

    def for_partition(self, metadata: ClusterMetadata, topic: str, partition: int) -> BrokerLink:
        """The link to the partition's leader (module docstring for the rules)."""
        address = metadata.leader_address(topic, partition)
        if address is None:
            return self.bootstrap
        link = self._links.get(address)
        if link is None:
            link = self._links[address] = BrokerLink(address, self._client_id, self._poller, self._security)
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
