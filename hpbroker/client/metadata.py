"""What a client knows about the cluster: topics, their partitions, and where each is served.

Built from ``MetadataResponse`` (docs/PROTOCOL.md): for every partition its leader broker, the
TCP data port that serves its fetches, its leader epoch, replicas and in-sync replicas (ISR).  A
client refreshes a topic's entry when a request fails with a retriable error that means "the
picture changed" (unknown partition, partition not available, not the leader: error 23 after a
failover) and before its first use of a topic.

**Versions.**  Requests go in version 1 (replicas, ISR and leader epoch per partition).  A broker
that serves only version 0 answers UnsupportedVersionError (error 9); the metadata then asks it
again in version 0, and keeps asking that connection in version 0: each of its partitions is then
described as unreplicated (``replicas == isr == (leader,)``, leader epoch -1), as is a partition
a version 1 answer gives no replicas for (a topic that is not replicated).

:meth:`ClusterMetadata.refresh` waits for its answer; a loop that must not block (the consumer's
fetch loop, which ``poll(timeout_ms)``, ``wakeup()`` and ``close()`` must be able to end at any
moment) refreshes through :class:`MetadataRefreshes` instead.

**Bootstrap addresses.**  A client is given one or more brokers' front-ends (``"a:9092,b:9092"``)
and asks the first for metadata.  When the broker it asks does not answer (not reachable within
the connection's ``connect_timeout_s``, or no answer within the request's timeout), the others
are asked in turn, as a Kafka client does: first the brokers the last metadata named, then the
bootstrap addresses, from the one after the broker that failed, each address once; the first
that answers becomes the broker asked from then on (:meth:`ClusterMetadata.move_to`).  When none
answers, the error names every address tried and what each did.

**Security.**  Every connection the metadata opens is the same kind of client as the one it was
given (``connection.security``, a CurveZMQ identity or None).

Threads: one instance per client thread, used with that thread's connection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import zmq

from hpbroker import protocol
from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.errors import (
    AuthorizationError,
    BrokerNotAvailableError,
    HPBrokerError,
    PartitionNotAvailableError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
    error_for_code,
)

if TYPE_CHECKING:
    from hpbroker.security.client import ClientSecurity

__all__ = ["ClusterMetadata", "MetadataRefreshes", "PartitionInfo", "falls_back", "metadata_version",
           "none_answered", "partition_info", "topic_error"]

logger = logging.getLogger(__name__)

# What "the broker does not answer" is: the request was never handed to it, or never answered.
_UNANSWERED = (BrokerNotAvailableError, RequestTimedOutError)
T = TypeVar("T")


def topic_error(topic: str, code: int) -> HPBrokerError:
    """The error a broker's metadata reported for ``topic``: the class names the error (code
    ``code``), the message says which topic."""
    if code == UnknownTopicOrPartitionError.code:
        return UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
    if code == AuthorizationError.code:
        return AuthorizationError(f"the broker's ACLs do not allow this client's key to describe topic "
                                  f"{topic!r} (describe, or produce or consume, which imply it)")
    return error_for_code(code, f"metadata of topic {topic!r}")


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition as the broker described it: ``error_code`` 0 when it is being served.
    ``replicas`` (the preferred leader first) and ``isr`` are broker ids; an unreplicated
    partition has ``(leader,)`` for both (none while it has no leader), leader epoch -1."""

    topic: str
    partition: int
    leader: int
    host: str
    fetch_port: int
    error_code: int
    log_start_offset: int
    high_watermark: int
    leader_epoch: int = -1
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()


def partition_info(topic: str, described: protocol.PartitionMetadata, host: str) -> PartitionInfo:
    """What a client keeps of a partition's metadata (``host``: the leader's advertised host).
    A partition described without replicas (a version 0 answer, or an unreplicated topic) is
    its leader alone."""
    replicas = tuple(getattr(described, "replicas", ()) or ())
    isr = tuple(getattr(described, "isr", ()) or ())
    if not replicas:
        alone = (described.leader,) if described.leader >= 0 else ()
        replicas, isr = alone, alone
    return PartitionInfo(topic, described.partition, described.leader, host, described.fetch_port,
                         described.error_code, described.log_start_offset, described.high_watermark,
                         getattr(described, "leader_epoch", -1), replicas, isr)


def none_answered(failures: Sequence[tuple[BrokerAddress, HPBrokerError]], what: str) -> HPBrokerError:
    """The error of ``what`` when no broker answered: ``failures``, each address tried with its
    error, in order.  One address: its own error; several: the first one's class, naming each."""
    if len(failures) == 1:
        return failures[0][1]
    tried = "; ".join(f"{address}: {error.message}" for address, error in failures)
    return type(failures[0][1])(f"no broker answered {what}; tried {len(failures)} addresses: {tried}")


def metadata_version(connection: BrokerConnection) -> int | None:
    """The version to send ``connection``'s broker a MetadataRequest in: None (the newest) until
    it refused that one (:func:`falls_back`)."""
    return connection.versions.get(protocol.ApiKey.METADATA)


def falls_back(connection: BrokerConnection, header: protocol.ResponseHeader, asked: int | None) -> bool:
    """Whether ``header``, the answer to a MetadataRequest sent in ``asked``, means: ask again in
    version 0, as from now on every metadata request over ``connection`` is (module docstring)."""
    if header.error_code == UnsupportedVersionError.code and asked != 0:
        connection.versions[protocol.ApiKey.METADATA] = 0
        return True
    return False


class ClusterMetadata:
    """Topic -> partitions, refreshed on demand through ``connection``, the broker asked for
    metadata, which moves to another broker when that one does not answer (module docstring).

    ``bootstrap``: every address the client was given (default: ``connection``'s alone).
    ``connect(address)``: the connection to ask ``address`` over once the metadata moves there,
    for a client that keeps its connections itself (the producer's links); without it the
    metadata opens that connection and closes the one it replaces, and the client closes
    :attr:`connection` (or calls :meth:`close`) when it is done."""

    def __init__(self, connection: BrokerConnection, *, timeout_s: float = 30.0,
                 bootstrap: Sequence[BrokerAddress] = (),
                 connect: Callable[[BrokerAddress], BrokerConnection] | None = None) -> None:
        self.connection = connection
        self._timeout_s = timeout_s
        self._bootstrap = list(bootstrap)
        self._connect = connect
        self._topics: dict[str, list[PartitionInfo]] = {}
        self._refreshed_at: dict[str, float] = {}
        self._brokers: dict[int, BrokerAddress] = {}  # front-end of each broker, by id

    @classmethod
    def for_bootstrap(cls, bootstrap: Sequence[BrokerAddress], *, client_id: str, connect_timeout_s: float,
                      timeout_s: float, security: ClientSecurity | None = None) -> ClusterMetadata:
        """Metadata asked of the first of ``bootstrap`` (then the others, module docstring) over
        a connection of its own, as the CurveZMQ client ``security`` if given; :meth:`close` it."""
        connection = BrokerConnection(bootstrap[0], client_id=client_id, connect_timeout_s=connect_timeout_s,
                                      security=security)
        return cls(connection, timeout_s=timeout_s, bootstrap=bootstrap)

    def close(self) -> None:
        """Close the connection (one the metadata opened, or was given without ``connect``)."""
        self.connection.close()

    @property
    def bootstrap(self) -> list[BrokerAddress]:
        """The addresses the client was given, in order."""
        return self._bootstrap or [self.connection.address]

    def refresh(self, *topics: str) -> protocol.MetadataResponse:
        """Ask the broker about ``topics`` (every topic when none is named) and remember them.
        Unknown topics are forgotten; other per-topic errors are kept in their entries."""
        response = self.request(list(topics))
        self.update(response)
        return response

    def request(self, topics: list[str], *, timeout_s: float | None = None) -> protocol.MetadataResponse:
        """The broker's MetadataResponse about ``topics`` (all when empty), in the newest version
        it takes (module docstring), without remembering it; raises the broker's error.

        When the broker asked cannot be reached (or does not answer), the others are asked in
        turn, each over a connection opened for the question, and the first that answers is
        asked from then on: in a cluster, the broker a client was bootstrapped at may be the one
        that failed.  When none answers, the error names each address tried."""
        timeout_s = self._timeout_s if timeout_s is None else timeout_s
        try:
            return _ask(self.connection, topics, timeout_s)
        except _UNANSWERED as unanswered:
            return self.fail_over(unanswered, lambda other: _ask(other, topics, timeout_s),
                                  "a metadata request")

    def fail_over(self, error: HPBrokerError, ask: Callable[[BrokerConnection], T], what: str, *,
                  moves_on: tuple[type[HPBrokerError], ...] = _UNANSWERED) -> T:
        """The broker asked did not answer (``error``): ``ask(connection)`` each other address in
        turn (:meth:`candidates`) until one answers, move there and return its answer.  Raises
        :func:`none_answered` (every address tried) when none does; any other error is raised
        as it is, without asking further.

        ``moves_on``: the errors of ``ask`` that mean "ask the next one" (default: not reachable,
        or no answer in time, right for requests that may be asked twice, as metadata).  A
        request that must not be applied twice passes ``(BrokerNotAvailableError,)``: it was
        never handed to that broker; a timeout may mean it was applied, and ends the round."""
        failures: list[tuple[BrokerAddress, HPBrokerError]] = [(self.connection.address, error)]
        for address in self.candidates({self.connection.address}):
            other = BrokerConnection(address, client_id=self.connection.client_id,
                                     connect_timeout_s=self.connection.connect_timeout_s,
                                     security=self.connection.security)
            try:
                answer = ask(other)
            except moves_on as e:
                other.close()
                failures.append((address, e))
                continue
            except BaseException:
                other.close()
                raise
            self.move_to(address, other, failures)
            return answer
        raise none_answered(failures, what)

    def move_on(self, error: HPBrokerError) -> None:
        """The broker asked did not answer another request (``error``): move to the next
        address that answers a metadata request (remembering its answer), as :meth:`request`
        does; :func:`none_answered` when none does."""
        self.update(self.fail_over(error, lambda other: _ask(other, [], self._timeout_s),
                                   "a metadata request"))

    def candidates(self, tried: set[BrokerAddress]) -> list[BrokerAddress]:
        """Where to ask next, but ``tried``: the brokers the last metadata named (sorted), then
        the bootstrap addresses from the one after the broker asked now, each once."""
        bootstrap = self.bootstrap
        current = self.connection.address
        start = bootstrap.index(current) + 1 if current in bootstrap else 0
        ordered = [*sorted(self._brokers.values(), key=lambda a: (a.host, a.port)),
                   *bootstrap[start:], *bootstrap[:start]]
        return [address for address in dict.fromkeys(ordered) if address not in tried]

    def move_to(self, address: BrokerAddress, connection: BrokerConnection | None = None,
                failures: Sequence[tuple[BrokerAddress, HPBrokerError]] = ()) -> BrokerConnection:
        """Ask ``address`` from now on: over ``connect(address)`` if the client keeps its
        connections (``connection``, one opened to ask it, is then closed), else over
        ``connection`` or a new one, closing the one it replaces.  ``failures``: why (logged)."""
        old = self.connection
        if self._connect is not None:
            if connection is not None:
                connection.close()
            connection = self._connect(address)
        else:
            if connection is None:
                connection = BrokerConnection(address, client_id=old.client_id,
                                              connect_timeout_s=old.connect_timeout_s, security=old.security)
            old.close()
        self.connection = connection
        why = "; ".join(f"{a}: {e.message}" for a, e in failures) or "moved"
        logger.info("metadata: asking broker %s from now on (%s)", address, why)
        return connection

    def update(self, response: protocol.MetadataResponse) -> None:
        """Remember what ``response`` says (as :meth:`refresh` does with its own)."""
        hosts = {broker.broker_id: broker.host for broker in response.brokers}
        if response.brokers:
            self._brokers = {broker.broker_id: BrokerAddress(broker.host, broker.port)
                             for broker in response.brokers}
        default_host = self.connection.address.host
        now = time.monotonic()
        for topic in response.topics:
            if topic.error_code:
                self._topics.pop(topic.name, None)
                continue
            self._topics[topic.name] = [
                partition_info(topic.name, p, hosts.get(p.leader, default_host))
                for p in sorted(topic.partitions, key=lambda p: p.partition)
            ]
            self._refreshed_at[topic.name] = now

    def partitions(self, topic: str, *, refresh: bool = False) -> list[PartitionInfo]:
        """The topic's partitions, asking the broker if unknown (or ``refresh``).  Raises
        UnknownTopicOrPartitionError for a topic the broker does not have."""
        if refresh or topic not in self._topics:
            response = self.refresh(topic)
            for described in response.topics:
                if described.name == topic and described.error_code:
                    raise topic_error(topic, described.error_code)
        found = self._topics.get(topic)
        if found is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        return found

    def cached(self, topic: str) -> list[PartitionInfo] | None:
        """The topic's partitions as last described, without asking; None if unknown."""
        return self._topics.get(topic)

    def leader_address(self, topic: str, partition: int) -> BrokerAddress | None:
        """The front-end of the partition's leader as last described, or None when that is the
        broker this metadata comes from, or cannot be told: the metadata named at most one
        broker (a standalone broker: its own address may be advertised differently from the
        one the client used), or the partition is unknown.  In a cluster, a partition whose
        leader is not a live broker raises PartitionNotAvailableError (retriable): sending it
        to the bootstrap broker instead could only fail, or worse."""
        partitions = self._topics.get(topic)
        if len(self._brokers) <= 1 or partitions is None or not 0 <= partition < len(partitions):
            return None
        leader = partitions[partition].leader
        address = self._brokers.get(leader)
        if address is None:  # a cluster, and no live broker leads it: nobody else may take it
            raise PartitionNotAvailableError(f"partition {topic}-{partition} has no live leader "
                                             f"(leader {leader}, brokers {sorted(self._brokers)})")
        return None if address == self.connection.address else address

    @property
    def in_cluster(self) -> bool:
        """Whether the last metadata named more than one broker."""
        return len(self._brokers) > 1

    def leader_addresses(self) -> set[BrokerAddress]:
        """The front-ends of the leaders of every partition known (for closing unused links)."""
        return {address for partitions in self._topics.values() for p in partitions
                if (address := self._brokers.get(p.leader)) is not None}

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


class MetadataRefreshes:
    """Refreshes of topics' metadata that never block, for the consumer's fetch loop.

    The loop asks for a topic with :meth:`want`, polls the metadata's connection's socket
    (:attr:`connection`: it changes when the metadata moves) for :meth:`events` beside its
    other sockets, and calls :meth:`take`, which sends what can be sent, takes the answers
    (remembering them in the metadata) and gives up on what waited too long.  A topic has one
    request in flight at most.  A request waits, unsent, until the connection to the broker is
    up (``connect_timeout_s`` of the connection at most: nothing queues for a broker that is
    down), then ``timeout_s`` for its answer.  A broker that does not answer so is left for the
    next address the metadata names (:meth:`ClusterMetadata.candidates`), and every request on
    its way goes there; only when every address has failed in a row do the requests that ran
    out of time fail, with an error naming each address.
    """

    def __init__(self, metadata: ClusterMetadata, *, timeout_s: float) -> None:
        self._metadata = metadata
        self._timeout_s = timeout_s
        self._unsent: dict[str, float] = {}  # topic -> when it began to wait for the connection
        # correlation id -> (topic, deadline, the version it was asked in)
        self._sent: dict[int, tuple[str, float, int | None]] = {}
        # the addresses that failed in a row since the last answer, with their errors
        self._failures: dict[BrokerAddress, HPBrokerError] = {}

    @property
    def connection(self) -> BrokerConnection:
        """The connection requests go over now (the metadata's)."""
        return self._metadata.connection

    def want(self, topic: str, now: float) -> None:
        """Ask for ``topic`` unless a request for it is on its way."""
        if topic not in self._unsent and all(topic != sent for sent, _, _ in self._sent.values()):
            self._unsent[topic] = now

    def events(self) -> int:
        """What to poll the connection's socket for: POLLIN while answers are due, POLLOUT while
        requests wait for the connection; 0 when nothing is on its way."""
        return (zmq.POLLIN if self._sent else 0) | (zmq.POLLOUT if self._unsent else 0)

    def next_due(self) -> float:
        """When a request on its way times out (monotonic seconds; infinite when none is)."""
        connect_timeout_s = self.connection.connect_timeout_s
        return min([since + connect_timeout_s for since in self._unsent.values()]
                   + [deadline for _, deadline, _ in self._sent.values()], default=float("inf"))

    def take(self, now: float) -> dict[str, HPBrokerError | None]:
        """Take the answers that arrived, time out the requests that waited too long, send the
        requests that can go: the topics settled, each with None (its partitions are in the
        metadata now) or why not (unknown to the broker, no broker answering)."""
        settled: dict[str, HPBrokerError | None] = {}
        connection = self.connection
        while self._sent:
            response = connection.poll(0)
            if response is None:
                break
            entry = self._sent.pop(response.correlation_id, None)
            if entry is None:
                continue
            self._failures.clear()  # the broker answers
            if falls_back(connection, response.header, entry[2]):
                self._unsent[entry[0]] = now  # asked again, in version 0
                continue
            settled[entry[0]] = self._settle(entry[0], response.header, response.body)
        unanswered: dict[str, HPBrokerError] = {}
        for correlation_id, (topic, deadline, _version) in list(self._sent.items()):
            if now >= deadline:
                connection.forget(correlation_id)
                del self._sent[correlation_id]
                unanswered[topic] = RequestTimedOutError(
                    f"no answer from {connection.address} to a metadata request for topic {topic!r} "
                    f"within {self._timeout_s} s")
        for topic, since in list(self._unsent.items()):
            if connection.socket.poll(0, zmq.POLLOUT):
                del self._unsent[topic]
                version = metadata_version(connection)
                try:
                    correlation_id = connection.send(protocol.MetadataRequest([topic]), version=version)
                except HPBrokerError as e:
                    settled[topic] = e
                    continue
                self._sent[correlation_id] = (topic, now + self._timeout_s, version)
            elif now - since >= connection.connect_timeout_s:
                del self._unsent[topic]
                unanswered[topic] = BrokerNotAvailableError(
                    f"broker {connection.address} is not reachable (no connection within "
                    f"{connection.connect_timeout_s} s)")
        if unanswered:
            settled.update(self._broker_failed(unanswered, now))
        return settled

    def _broker_failed(self, unanswered: dict[str, HPBrokerError], now: float) -> dict[str, HPBrokerError]:
        """The broker asked left ``unanswered`` (topic -> why): move every request to the next
        address, or, when every address failed in a row, settle those topics, naming each."""
        address = self.connection.address
        self._failures[address] = next(iter(unanswered.values()))
        candidates = self._metadata.candidates(set(self._failures))
        if candidates:
            for topic, _deadline, _version in self._sent.values():
                self._unsent[topic] = now
            self._sent.clear()  # their connection is closed: they go again, to the next broker
            for topic in [*unanswered, *self._unsent]:
                self._unsent[topic] = now
            self._metadata.move_to(candidates[0], failures=list(self._failures.items()))
            return {}
        failures = list(self._failures.items())
        self._failures.clear()
        if len(failures) == 1:
            return dict(unanswered)
        error = none_answered(failures, "a metadata request")
        return {topic: error for topic in unanswered}

    def _settle(self, topic: str, header: protocol.ResponseHeader,
                body: protocol.Message) -> HPBrokerError | None:
        if header.error_code:
            return error_for_code(header.error_code, f"metadata of topic {topic!r}: {header.error_message}")
        assert isinstance(body, protocol.MetadataResponse)
        self._metadata.update(body)
        described = next((t for t in body.topics if t.name == topic), None)
        if described is None or described.error_code:
            code = described.error_code if described is not None else UnknownTopicOrPartitionError.code
            return topic_error(topic, code)
        return None



def _ask(connection: BrokerConnection, topics: list[str], timeout_s: float) -> protocol.MetadataResponse:
    """One broker's MetadataResponse about ``topics``, in the newest version it takes."""
    while True:
        asked = metadata_version(connection)
        sent = connection.send(protocol.MetadataRequest(topics), version=asked)
        answer = connection.wait_for(sent, timeout_s)
        if not falls_back(connection, answer.header, asked):
            return answer.raise_for_error()
