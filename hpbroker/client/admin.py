"""Create, list, describe, alter and delete topics: a thin layer over the protocol's admin requests.

Each method is one request on the broker's ZeroMQ front-end (docs/PROTOCOL.md:
``CreateTopicRequest``, ``AlterTopicConfigRequest``, ``DeleteTopicRequest``, ``MetadataRequest``)
and raises the broker's error as its exception (``TopicAlreadyExistsError``,
``UnknownTopicOrPartitionError``, ``InvalidTopicError``, ``InvalidReplicationFactorError`` ...).
A topic is created in CreateTopicRequest version 0 unless a replication factor is given (version
1), so a broker without replication takes every other creation.

**Which broker.**  Requests go to the first bootstrap address.  When that broker cannot be
reached (no connection within ``connect_timeout_ms``: the request was never handed to it) or
does not answer a metadata request, the other brokers are asked in turn (those the last
metadata named, then the other bootstrap addresses, ``hpbroker.client.metadata``), and the first
that answers is asked from then on; when none answers, BrokerNotAvailableError names every
address tried.  A create, alter or delete goes on to the next broker only when it was never
handed to the one asked.  Whatever a broker answers is the outcome and is raised as it is, error
12 included (the change is made and goes on; for a create: the topic exists, its leaders
follow).  An alter or delete handed to a broker that then does not answer raises
RequestTimedOutError (it may or may not have happened); any other call either happened or
raised.

**Creating after no answer.**  A create handed to a broker that then does not answer (it may
have created the topic, then vanished) goes on to the next broker, as one never handed over
does.  When a create of a topic had no answer, in this call or an earlier one of this Admin, a
TopicAlreadyExistsError that follows is checked: the topic is described, and if it has the
partition count asked for (and the replication factor, when one was given) the create is taken
as done and returns, as if the first attempt had been answered; if it differs,
TopicAlreadyExistsError says how.  Settings are not compared.  Kafka's admin client leaves this
to the application; the price of doing it here is that a topic created by someone else at the
same moment, with the same partitions, is also taken as ours.  Without an attempt that had no
answer, TopicAlreadyExistsError is raised as it is.

In a cluster (brokers on ZooKeeper) a topic is stored, and so can be altered or deleted, only by
the broker that created it; any broker describes it.  Alter and delete therefore ask the
bootstrap broker's metadata which broker leads the topic's partitions and send the request
there (a connection opened on first use, kept until :meth:`Admin.close`).

Threads: an Admin, like its connection, belongs to the thread that uses it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType

from hpbroker import protocol
from hpbroker.client.connection import BrokerAddress, BrokerConnection, Response, parse_bootstrap
from hpbroker.client.metadata import ClusterMetadata, PartitionInfo, topic_error
from hpbroker.errors import (
    BrokerNotAvailableError,
    HPBrokerError,
    InvalidReplicationFactorError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from hpbroker.security.client import ClientSecurity, resolve_client_security

__all__ = ["Admin", "TopicDescription"]

logger = logging.getLogger(__name__)

_CREATE_TOPIC_REPLICATED_VERSION = 1  # CreateTopicRequest's first version with replication_factor
_DESCRIBE_AGAIN_S = 0.1  # pause before describing again a topic a broker said exists


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """A topic as the broker describes it: its partitions (each with its leader, replicas, ISR,
    leader epoch, data port, log start offset and high watermark, as of the serving worker's
    last heartbeat) and the settings it overrides."""

    name: str
    partitions: list[PartitionInfo]
    configs: dict[str, str] = field(default_factory=dict)

    @property
    def replication_factor(self) -> int:
        """How many replicas each partition has (of its first partition; 1 when unreplicated)."""
        return len(self.partitions[0].replicas) if self.partitions and self.partitions[0].replicas else 1


class Admin:
    """Topic administration against the brokers at ``bootstrap`` (``"host:port"``, or several,
    comma-separated or as a list: module docstring, "Which broker")."""

    def __init__(self, bootstrap: str | Sequence[str], *, client_id: str = "hpbroker-admin",
                 request_timeout_ms: int = 30_000, connect_timeout_ms: int = 5_000,
                 security: ClientSecurity | None = None) -> None:
        """``security``: the CurveZMQ identity for a broker with ``security = "curve"``; None:
        from the environment or the client config file, else none (``resolve_client_security``)."""
        self._client_id = client_id
        self._connect_timeout_s = connect_timeout_ms / 1000
        self._timeout_s = request_timeout_ms / 1000
        self.security = resolve_client_security(security)
        self._metadata = ClusterMetadata.for_bootstrap(parse_bootstrap(bootstrap), client_id=client_id,
                                                       connect_timeout_s=self._connect_timeout_s,
                                                       timeout_s=self._timeout_s, security=self.security)
        self._leaders: dict[BrokerAddress, BrokerConnection] = {}  # other brokers, by front-end
        # topics an attempt to create had no answer for: the topic may exist by our doing
        self._uncertain_creates: set[str] = set()

    def __repr__(self) -> str:
        return f"Admin({self._metadata.connection.address})"

    @property
    def _connection(self) -> BrokerConnection:
        """The broker asked now (the metadata's: the first bootstrap address that answered)."""
        return self._metadata.connection

    def create_topic(self, name: str, partitions: int, configs: Mapping[str, object] | None = None, *,
                     replication_factor: int | None = None) -> None:
        """Create ``name`` with ``partitions`` partitions; ``configs`` overrides log settings of the
        broker's defaults by name (``{"retention_ms": 86_400_000, "flush_fsync": False}``).
        ``replication_factor``: how many brokers keep a replica of each partition (None: the
        broker's ``default_replication_factor``); InvalidReplicationFactorError when it is below
        1, above the live brokers, or above 1 on a broker without ZooKeeper.  Returns once the
        broker has created it.  An attempt with no answer goes on to the next broker, and a
        TopicAlreadyExistsError after it is checked (module docstring, "Creating after no
        answer")."""
        entries = [protocol.TopicConfigEntry(key, _config_string(value))
                   for key, value in (configs or {}).items()]
        if replication_factor is None:  # version 0: any broker takes it, and applies its default
            self._create(protocol.CreateTopicRequest(name, partitions, entries), 0)
            return
        if isinstance(replication_factor, bool) or not isinstance(replication_factor, int) \
                or not 1 <= replication_factor <= 0x7FFF:
            raise InvalidReplicationFactorError(
                f"replication factor of topic {name!r} must be an integer from 1, got {replication_factor!r}")
        request = protocol.CreateTopicRequest(name, partitions, entries,
                                              replication_factor=replication_factor)
        self._create(request, _CREATE_TOPIC_REPLICATED_VERSION)

    def _create(self, request: protocol.CreateTopicRequest, version: int) -> None:
        """Send a CreateTopicRequest (:meth:`_call`).  When an attempt of it had no answer (by
        this call or an earlier one of this Admin: it may have created the topic), a later
        TopicAlreadyExistsError is checked against the topic as it is (module docstring,
        "Creating after no answer")."""
        try:
            self._call(request, version=version)
        except TopicAlreadyExistsError as exists:
            if request.name not in self._uncertain_creates:
                raise
            self._check_created(request, version, exists)
        self._uncertain_creates.discard(request.name)

    def _check_created(self, request: protocol.CreateTopicRequest, version: int,
                       exists: TopicAlreadyExistsError) -> None:
        """Return if topic ``request.name`` is as the request asked (its partition count, and
        its replication factor when one was given); else raise TopicAlreadyExistsError saying
        how it differs.  Its settings are not compared.  A broker that said the topic exists
        may describe it a moment later (its metadata follows ZooKeeper's): asked again for up
        to the request timeout."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                description = self.describe_topic(request.name)
                break
            except UnknownTopicOrPartitionError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(_DESCRIBE_AGAIN_S)
        differences = []
        if len(description.partitions) != request.partitions:
            differences.append(f"{len(description.partitions)} partitions, not {request.partitions}")
        if version >= _CREATE_TOPIC_REPLICATED_VERSION \
                and description.replication_factor != request.replication_factor:
            differences.append(f"replication factor {description.replication_factor}, "
                               f"not {request.replication_factor}")
        if differences:
            self._uncertain_creates.discard(request.name)
            raise TopicAlreadyExistsError(
                f"topic {request.name!r} exists with {' and '.join(differences)}: not the one this "
                f"client's earlier attempt, which had no answer, asked for ({exists.message})") from exists
        logger.info("topic %r exists as asked after an attempt to create it had no answer: "
                    "taken as created", request.name)

    def alter_topic(self, name: str, configs: Mapping[str, object | None]) -> None:
        """Change settings of ``name`` (``{"retention_ms": 3_600_000, "flush_ms": None}``): each
        value replaces the topic's own, None removes it so the broker's default applies again;
        settings not named keep their values.  Returns once the partitions' logs have them
        (docs/CONFIGURATION.md says when each takes effect); InvalidConfigError names a setting
        refused (nothing changes then), UnknownTopicOrPartitionError a topic that is not there."""
        entries = [protocol.TopicConfigEntry(key, "" if value is None else _config_string(value))
                   for key, value in configs.items()]
        self._call(protocol.AlterTopicConfigRequest(name, entries), leader_of=name)

    def delete_topic(self, name: str) -> None:
        """Delete ``name`` and its records; UnknownTopicOrPartitionError if there is none."""
        self._call(protocol.DeleteTopicRequest(name), leader_of=name)
        self._uncertain_creates.discard(name)  # a topic of that name now is someone else's

    def list_topics(self) -> list[str]:
        """The names of every topic, sorted."""
        response = self._metadata.request([])
        return sorted(topic.name for topic in response.topics if not topic.error_code)

    def describe_topic(self, name: str) -> TopicDescription:
        """``name``'s partitions (leader, replicas, ISR ...) and settings;
        UnknownTopicOrPartitionError if there is none."""
        metadata = self._metadata
        response = metadata.refresh(name)
        for topic in response.topics:
            if topic.name != name:
                continue
            if topic.error_code:
                raise topic_error(name, topic.error_code)
            return TopicDescription(name, metadata.partitions(name),
                                    {entry.key: entry.value for entry in topic.configs})
        raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")

    def describe_topics(self) -> list[TopicDescription]:
        """Every topic, as :meth:`describe_topic` describes it, sorted by name (one request)."""
        metadata = self._metadata
        response = metadata.refresh()
        return [TopicDescription(topic.name, metadata.partitions(topic.name),
                                 {entry.key: entry.value for entry in topic.configs})
                for topic in sorted(response.topics, key=lambda t: t.name) if not topic.error_code]

    def close(self) -> None:
        for connection in self._leaders.values():
            connection.close()
        self._leaders.clear()
        self._metadata.close()

    def _call(self, request: protocol.Message, *, version: int | None = None,
              leader_of: str | None = None) -> protocol.Message:
        """Send ``request`` to the broker asked now (or to the one storing topic ``leader_of``)
        and return its answer, raising the broker's error (module docstring, "Which broker").

        Only a request never handed to the broker asked now (BrokerNotAvailableError at the
        send) goes to the next broker that takes it.  An answer is the outcome, whatever its
        error (error 12 included: the change happened, and goes on).  No answer in time
        (RequestTimedOutError) leaves the outcome unknown: raised as it is, but for a
        CreateTopicRequest, which is sent to the next broker (:meth:`_create`)."""
        connection = self._connection if leader_of is None else self._leader(leader_of)
        creating = isinstance(request, protocol.CreateTopicRequest)

        def exchange(broker: BrokerConnection) -> Response:
            try:
                return _exchange(broker, request, version, self._timeout_s)
            except RequestTimedOutError:
                if creating:  # it may have created the topic: a later "exists" is checked
                    self._uncertain_creates.add(request.name)
                raise

        try:
            answer = exchange(connection)
        except BrokerNotAvailableError as unreachable:  # never handed to it
            if connection is not self._connection:  # the topic's leader: only it can answer
                raise
            error: HPBrokerError = unreachable
        except RequestTimedOutError as unanswered:  # handed to it: it may have been applied
            if not creating or connection is not self._connection:
                raise
            error = unanswered
        else:
            return answer.raise_for_error()
        moves_on = (BrokerNotAvailableError, RequestTimedOutError) if creating else (BrokerNotAvailableError,)
        answer = self._metadata.fail_over(error, exchange, f"a {type(request).__name__}", moves_on=moves_on)
        return answer.raise_for_error()

    def _leader(self, name: str) -> BrokerConnection:
        """The connection to the broker storing topic ``name`` (the leader of its partition 0);
        the bootstrap broker when that is the one, or when its metadata cannot tell (no such
        topic, a standalone broker): its answer then says what is wrong.  In a cluster, a topic
        whose leader is not live raises PartitionNotAvailableError."""
        metadata = self._metadata
        try:
            metadata.partitions(name, refresh=True)
        except HPBrokerError:
            return self._connection
        address = metadata.leader_address(name, 0)
        if address is None:
            return self._connection
        if address not in self._leaders:
            self._leaders[address] = BrokerConnection(address, client_id=self._client_id,
                                                      connect_timeout_s=self._connect_timeout_s,
                                                      security=self.security)
        return self._leaders[address]

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def _exchange(connection: BrokerConnection, request: protocol.Message, version: int | None,
              timeout_s: float) -> Response:
    """``connection``'s broker's answer to ``request``, its error not raised: whatever it
    answered is the outcome.  BrokerNotAvailableError: never handed to that broker (no
    connection within its connect timeout); RequestTimedOutError: handed to it, no answer
    within ``timeout_s`` (it may or may not have been applied)."""
    sent = connection.send(request, version=version)
    try:
        return connection.wait_for(sent, timeout_s)
    except RequestTimedOutError:
        raise RequestTimedOutError(f"no answer from {connection.address} to a {type(request).__name__} "
                                   f"within {timeout_s} s: it may or may not have been applied") from None


def _config_string(value: object) -> str:
    """A setting as the protocol carries it: decimal, or ``true``/``false``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
