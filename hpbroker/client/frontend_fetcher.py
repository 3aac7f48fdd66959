"""Fetches through a broker's ZeroMQ front-end: the encrypted fetch path (``fetch_via="frontend"``).

A consumer normally fetches over the TCP data ports (``hpbroker.client.fetcher``), where the
broker sends the record batches with ``sendfile`` and, with ``security = "curve"``, in the clear.
A :class:`FrontendFetcher` sends the same requests -- FetchRequest version 0 and
ListOffsetsRequest -- to the partition leader's front-end instead, the ZeroMQ port every client
already talks to: the front-end relays them to the worker that owns the partition, which reads the
batches into memory and answers over the same way back (docs/PROTOCOL.md, "Two transports").  With
security on, that connection is a CurveZMQ one, so the records travel encrypted, and each request
is checked against the ACLs at the front-end (``consume`` on the topic for a fetch, ``describe``
for list-offsets); no fetch token is needed.  The cost is the one Kafka documents for TLS: no
``sendfile``, one copy into the worker and one through the arbiter, and libzmq's encryption of
every byte (docs/SECURITY.md, "What it costs").

It has the interface of :class:`~hpbroker.client.fetcher.PartitionFetcher` (``fetch``,
``list_offsets``, ``receive``, ``in_flight``, ``overdue``, ``disconnect``, ``close``) and checks
and decodes responses with the same code (raw, columns, corrupt batches, broker errors), so the
consumer and the Spark source drive either the same way.  What differs is the transport:

- **One connection per broker, shared.**  The fetchers of the partitions a broker leads share one
  :class:`~hpbroker.client.connection.BrokerConnection` (:class:`FrontendConnections`, counted by
  users: the last fetcher to close it closes it).  Each fetcher has at most one request in flight
  on it, under its own correlation id.  The front-end answers in any order (only one client's
  fetches *of one partition* come back in the order sent), so a long poll parked on a caught-up
  partition holds back nobody else's answers: whoever reads the socket keeps the answers for the
  other fetchers (:meth:`_SharedConnection.pump`), each fetcher takes its own.
- **Waiting.**  A fetcher has no descriptor of its own: :meth:`FrontendFetcher.pollables` are the
  ZeroMQ sockets to hand to a ``zmq.Poller`` (the connection's and its monitor's), and
  :attr:`FrontendFetcher.answered` says that its answer was already read off the socket by
  another fetcher (the socket no longer shows it, so the caller must not sleep on it).
- **A lost connection.**  ZeroMQ reconnects by itself, and requests in flight when the connection
  dropped are never answered.  The connection's monitor reports the disconnect: every fetcher
  whose request was sent before it gets a ConnectionError from :meth:`receive` at once (as a TCP
  fetcher does when its socket closes), instead of waiting for ``request_timeout_ms``.
- **Unreachable.**  A request that no connected broker takes within the connection's
  ``connect_timeout_s`` raises ConnectionError (an OSError, as a refused TCP connect does);
  a refused CurveZMQ handshake raises AuthenticationError.
- **Pipelining.**  As with the data ports: the moment an answer is taken, the next FetchRequest
  leaves, then the answer is checked and decoded.  Its payload is a view of the received ZeroMQ
  frame, with no further copy.

Threads: the fetchers and their connections belong to the consumer's thread.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING

import zmq

from hpbroker import protocol
from hpbroker.client.connection import BrokerAddress, BrokerConnection, Response
from hpbroker.client.fetcher import FETCH_VERSION, CompletedFetch, FetchConfig, ListedOffset, PartitionFetcher
from hpbroker.errors import BrokerNotAvailableError

if TYPE_CHECKING:
    from hpbroker.security.client import ClientSecurity

__all__ = ["FETCH_VIAS", "FrontendConnections", "FrontendFetcher"]

logger = logging.getLogger(__name__)

#: Where a consumer's fetches go: the TCP data ports (sendfile; in the clear) or the front-end
#: (CurveZMQ-encrypted when the broker has security on).
FETCH_VIAS = ("data_port", "frontend")


class _SharedConnection:
    """One broker's front-end connection and the answers read off it that their fetchers have
    not taken yet.  ``generation`` counts the disconnects its monitor reported."""

    def __init__(self, connection: BrokerConnection) -> None:
        self.connection = connection
        self.users = 0
        self.generation = 0
        self._arrived: dict[int, Response] = {}

    def pump(self) -> None:
        """Read every answer the socket holds (without waiting) and the monitor's events."""
        connection = self.connection
        socket = connection.socket
        while socket.poll(0):
            response = connection.poll(0)
            if response is not None:
                self._arrived[response.correlation_id] = response
        self.check_monitor()

    def check_monitor(self) -> None:
        if any(event == zmq.EVENT_DISCONNECTED for event in self.connection.monitor_events()):
            self.generation += 1
            logger.info("front-end connection to %s lost; its requests in flight are sent again",
                        self.connection.address)

    def has(self, correlation_id: int) -> bool:
        return correlation_id in self._arrived

    def take(self, correlation_id: int) -> Response | None:
        return self._arrived.pop(correlation_id, None)

    def forget(self, correlation_id: int) -> None:
        self.connection.forget(correlation_id)
        self._arrived.pop(correlation_id, None)


class FrontendConnections:
    """The front-end connections of one client's fetchers, one per broker address, shared and
    counted (module docstring).  ``security``: connect as this CurveZMQ client."""

    def __init__(self, *, client_id: str, connect_timeout_s: float = 5.0,
                 security: ClientSecurity | None = None) -> None:
        self.client_id = client_id
        self.connect_timeout_s = connect_timeout_s
        self.security = security
        self._shared: dict[BrokerAddress, _SharedConnection] = {}

    def acquire(self, address: BrokerAddress) -> _SharedConnection:
        shared = self._shared.get(address)
        if shared is None:
            connection = BrokerConnection(address, client_id=self.client_id,
                                          connect_timeout_s=self.connect_timeout_s, security=self.security)
            shared = self._shared[address] = _SharedConnection(connection)
        shared.users += 1
        return shared

    def release(self, shared: _SharedConnection) -> None:
        shared.users -= 1
        if shared.users <= 0 and self._shared.get(shared.connection.address) is shared:
            del self._shared[shared.connection.address]
            shared.connection.close()

    def __len__(self) -> int:
        return len(self._shared)

    def close(self) -> None:
        for shared in self._shared.values():
            shared.connection.close()
        self._shared.clear()


class FrontendFetcher(PartitionFetcher):
    """Fetches one partition through the front-end at ``address`` (module docstring), over a
    connection of ``connections``."""

    def __init__(self, topic: str, partition: int, connections: FrontendConnections, address: BrokerAddress,
                 config: FetchConfig, client_id: str = "hpbroker-python", *, raw: bool = False,
                 columns: tuple[str, ...] | None = None) -> None:
        super().__init__(topic, partition, address.host, address.port, config, client_id, raw=raw,
                         columns=columns)
        self.address = address
        self._connections = connections
        self._shared: _SharedConnection | None = None
        self._correlation_id = -1  # of the request in flight
        self._generation = 0  # the connection's generation it was sent in

    def __repr__(self) -> str:
        return f"FrontendFetcher({self.topic}-{self.partition} via front-end {self.address})"

    def pollables(self) -> list[zmq.Socket]:
        """What to wait on for this fetcher's answer (a ``zmq.Poller``): the connection's socket,
        and its monitor's (a lost connection)."""
        assert self._shared is not None, "nothing in flight"
        connection = self._shared.connection
        return [connection.socket, connection.monitor]

    @property
    def answered(self) -> bool:
        """Whether :meth:`receive` has something to give without the socket showing it: the
        answer (or the loss of the connection) was already read by another fetcher."""
        shared = self._shared
        return self.in_flight and shared is not None and (
            shared.has(self._correlation_id) or shared.generation != self._generation
            or shared.connection.events_pending)

    def fileno(self) -> int:
        raise TypeError(f"{self!r} has no descriptor of its own: wait on pollables()")

    def fetch(self, offset: int) -> None:
        """Send a FetchRequest (version 0) from ``offset``.  ConnectionError when no connected
        broker takes it (nothing is then in flight); AuthenticationError for a refused key."""
        config = self._config
        request = protocol.FetchRequest(self.topic, self.partition, offset, config.max_partition_fetch_bytes,
                                        config.fetch_max_wait_ms, config.fetch_min_bytes)
        self._request(request, (config.fetch_max_wait_ms + config.request_timeout_ms) / 1000, FETCH_VERSION)
        self._fetch_offset = offset

    def list_offsets(self, timestamp: int) -> None:
        """Send a ListOffsetsRequest for ``timestamp``; raises as :meth:`fetch`."""
        self._request(protocol.ListOffsetsRequest(self.topic, self.partition, timestamp),
                      self._config.request_timeout_ms / 1000, None)
        self._listing = timestamp

    def _request(self, request: protocol.Message, limit_s: float, version: int | None) -> None:
        if self.in_flight:
            raise RuntimeError(f"{self!r}: {self.waiting_for()} is already in flight")
        if self._shared is None:
            self._shared = self._connections.acquire(self.address)
        shared = self._shared
        shared.check_monitor()  # a disconnect seen before this request is not this request's
        try:
            self._correlation_id = shared.connection.send(request, version=version)
        except BrokerNotAvailableError as e:
            raise ConnectionError(e.message) from None
        self._generation = shared.generation
        self._sent_at = time.monotonic()
        self._limit_s = limit_s

    def receive(self) -> CompletedFetch | ListedOffset | None:
        """The answer to the request in flight once it has arrived (None until then): for a fetch,
        the next fetch is sent first, then the answer decoded (as PartitionFetcher.receive);
        for a ListOffsetsRequest, its :class:`ListedOffset`.  Raises ConnectionError when the
        connection was lost with the request unanswered (nothing is then in flight)."""
        shared = self._shared
        if not self.in_flight or shared is None:
            return None
        shared.pump()
        response = shared.take(self._correlation_id)
        if response is None:
            if shared.generation == self._generation:
                return None
            waiting_for = self.waiting_for()
            self.disconnect()
            raise ConnectionError(f"the connection to the front-end {self.address} was lost with "
                                  f"{waiting_for} unanswered")
        self._correlation_id = -1
        header, body = response.header, response.body
        timestamp = self._listing
        if timestamp is not None:
            assert isinstance(body, protocol.ListOffsetsResponse)
            self._listing = None
            return self._listed(timestamp, header, body)
        assert isinstance(body, protocol.FetchResponse)
        fetch_offset = self._fetch_offset
        self._fetch_offset = -1
        if header.error_code:
            error = self._broker_error(header, body, fetch_offset)
            return CompletedFetch(fetch_offset, [], fetch_offset, body.high_watermark, body.log_start_offset,
                                  error)
        return self._complete(fetch_offset, body)

    def disconnect(self) -> None:
        """Forget the request in flight (its answer, should it come, is dropped); the shared
        connection stays for the others."""
        if self._shared is not None and self._correlation_id >= 0:
            self._shared.forget(self._correlation_id)
        self._correlation_id = -1
        self._fetch_offset = -1
        self._listing = None

    def close(self) -> None:
        """Forget the request in flight and let go of the connection (closed with its last user)."""
        self.disconnect()
        shared, self._shared = self._shared, None
        if shared is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._connections.release(shared)
