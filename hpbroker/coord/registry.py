"""The broker registry and the topic registry in ZooKeeper.

**Broker registry** (``<root>/brokers/ids/<broker_id>``, ephemeral, one per live broker): how to
reach the broker and what it stores.  The node lives exactly as long as the broker's session, so
its presence *is* the broker's liveness; :class:`BrokerRegistry` re-creates it after a session
expiry (through :meth:`Session.register_ephemeral`) with its latest data.

**Topic registry** (``<root>/brokers/topics/<topic>``, persistent): each topic's partition count
and per-topic settings, written by the broker that created the topic and removed by it when the
topic is deleted.  A replicated topic's node is the cluster's: no broker's unreplicated topic of
the same name overwrites it (:meth:`TopicRegistry.publish` refuses) or removes it
(:meth:`TopicRegistry.remove` with ``created_by`` leaves it); only an explicit delete of the
replicated topic removes it.

Node data is UTF-8 JSON with a ``version`` field (:data:`FORMAT_VERSION`).  Readers ignore fields
they do not know, so fields can be added without a new version; a change old readers would
misread gets a new version, and readers refuse versions they do not know::

    brokers/ids/0      {"version": 1, "broker_id": 0, "host": "127.0.0.1", "port": 9092,
                        "data_ports": [9093, 9094], "topics": {"orders": [0, 1, 2, 3]},
                        "timestamp_ms": 1718000000000}
    brokers/topics/orders
                       {"version": 1, "partitions": 4, "config": {"retention_ms": 86400000},
                        "created_by": 0}
    brokers/topics/events                               (replicated: it has "replicas")
                       {"version": 1, "partitions": 2, "config": {}, "created_by": 0,
                        "replicas": {"0": [1, 2, 0], "1": [2, 0, 1]},
                        "topic_id": "9b2f6c1e0d4a4e8f8c3b5a7d6e1f2a3b"}

``data_ports``: worker ``s`` of the broker serves fetches on ``data_ports[s]`` (which partition on
which port is in the broker's Metadata response).  ``topics`` maps each topic the broker stores to
the partitions it stores.  ``config`` holds only the topic's overrides of the broker's log
defaults, typed as in the topic store.  ``timestamp_ms`` is when the registration was written.
``replicas`` (replicated topics only; written only when there are some, so an unreplicated
topic's node keeps its bytes) maps each partition to its replicas' broker ids, the preferred
leader first; a replicated topic's partition states hang below its node
(``hpbroker.coord.partition_state``).  ``topic_id`` (replicated topics created by this version;
written only when there is one, so older nodes keep their bytes) is a random uuid4 in hex drawn
when the topic is created, as Kafka's topic ids (KIP-516): a topic deleted and created again under
the same name gets another, so a broker that still stores the old one's replicas (it was down, or
its watches saw the delete and the create as one change) tells them apart and drops its old copy.

Watches (``watch_*``) re-arm (``hpbroker.coord.watches``) and hand decoded registrations to the
callback; a node whose data does not decode is logged and passed on as None.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError

from hpbroker.coord.assignment import check_replica_assignment
from hpbroker.coord.paths import ZkPaths, check_broker_id, check_topic
from hpbroker.coord.session import Session
from hpbroker.coord.watches import Watch, watch_children, watch_data
from hpbroker.errors import CoordinationError, HPBrokerError, InvalidConfigError

__all__ = [
    "FORMAT_VERSION",
    "BrokerRegistration",
    "BrokerRegistry",
    "TopicRegistration",
    "TopicRegistry",
    "decode_broker",
    "decode_topic",
    "encode_broker",
    "encode_topic",
]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1  # the "version" field of every node written here


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """One live broker, as its ephemeral node describes it.  ``timestamp_ms`` (when it was
    written) does not take part in comparisons.  ``offline_partitions``: the replicated
    partitions whose replica on this broker cannot serve now (their worker slot is
    crash-looping), topic -> partitions, sorted; the controller treats the broker as gone for
    them (as Kafka does for a replica on a failed log directory, KIP-112)."""

    broker_id: int
    host: str
    port: int
    data_ports: tuple[int, ...]
    topics: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    timestamp_ms: int = field(default=0, compare=False)
    offline_partitions: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def offline(self, topic: str, partition: int) -> bool:
        """Whether this broker reported its replica of ``topic``-``partition`` offline."""
        return partition in self.offline_partitions.get(topic, ())


@dataclass(frozen=True, slots=True)
class TopicRegistration:
    """One topic's metadata: ``config`` maps LogConfig field names to the topic's own values;
    ``created_by`` is the broker that wrote the node (and removes it).

    ``replicas`` maps each partition to its replicas' broker ids, the preferred leader first;
    empty for an unreplicated topic (stored whole by the broker that created it).  When
    non-empty it is checked on construction (ValueError): exactly the partitions
    ``0 .. partitions-1``, each with distinct broker ids.  ``topic_id``: the replicated topic's
    identity, uuid4 hex drawn at its creation ("" for unreplicated topics and for replicated
    ones created before topic ids existed)."""

    name: str
    partitions: int
    config: Mapping[str, Any] = field(default_factory=dict)
    created_by: int = -1
    replicas: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    topic_id: str = ""

    def __post_init__(self) -> None:
        if self.replicas:
            object.__setattr__(self, "replicas", _checked_replicas(self.partitions, self.replicas))

    @property
    def replicated(self) -> bool:
        """Whether the topic has a replica assignment (and so partition states)."""
        return bool(self.replicas)

    @property
    def replication_factor(self) -> int:
        """Replicas per partition: 1 for an unreplicated topic."""
        return len(self.replicas[0]) if self.replicas else 1


def _checked_replicas(partitions: int, replicas: Mapping[int, Any]) -> dict[int, tuple[int, ...]]:
    """The assignment rule (``hpbroker.coord.assignment``), its refusal as ValueError."""
    try:
        return check_replica_assignment(partitions, replicas)
    except HPBrokerError as e:
        raise ValueError(e.message) from None


def _dump(document: dict[str, Any]) -> bytes:
    return json.dumps({"version": FORMAT_VERSION, **document}, sort_keys=True,
                      separators=(",", ":")).encode("utf-8")


def _load(data: bytes, what: str) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise CoordinationError(f"{what}: not JSON: {e}") from None
    if not isinstance(document, dict):
        raise CoordinationError(f"{what}: expected a JSON object, got {document!r:.200}")
    if document.get("version") != FORMAT_VERSION:
        raise CoordinationError(f"{what}: format version {document.get('version')!r} is not "
                                f"{FORMAT_VERSION}, the one this hpbroker reads")
    return document


def encode_broker(registration: BrokerRegistration) -> bytes:
    """``offline_partitions`` is written only when there are some: a broker whose replicas all
    serve keeps the bytes it always had."""
    topics = {name: list(partitions) for name, partitions in sorted(registration.topics.items())}
    document: dict[str, Any] = {
        "broker_id": registration.broker_id, "host": registration.host, "port": registration.port,
        "data_ports": list(registration.data_ports), "topics": topics,
        "timestamp_ms": registration.timestamp_ms or int(time.time() * 1000)}
    offline = {name: sorted(partitions)
               for name, partitions in sorted(registration.offline_partitions.items()) if partitions}
    if offline:
        document["offline_partitions"] = offline
    return _dump(document)


def decode_broker(data: bytes) -> BrokerRegistration:
    """Raises CoordinationError when ``data`` is not a broker registration."""
    document = _load(data, "broker registration")
    try:
        topics = document.get("topics", {})
        offline = document.get("offline_partitions", {})
        if not isinstance(topics, dict) or not isinstance(offline, dict):
            raise TypeError("topics or offline_partitions is not an object")
        return BrokerRegistration(
            broker_id=check_broker_id(document["broker_id"]), host=_typed(document["host"], str),
            port=_typed(document["port"], int),
            data_ports=tuple(_typed(p, int) for p in document["data_ports"]),
            topics={check_topic(name): tuple(_typed(p, int) for p in partitions)
                    for name, partitions in topics.items()},
            timestamp_ms=_typed(document.get("timestamp_ms", 0), int),
            offline_partitions={check_topic(name): tuple(sorted(_typed(p, int)
                                                                for p in _typed(partitions, list)))
                                for name, partitions in offline.items()})
    except (KeyError, TypeError, ValueError) as e:
        raise CoordinationError(f"broker registration {data[:200]!r}: {e!r}") from None


def encode_topic(topic: TopicRegistration) -> bytes:
    """``replicas`` and ``topic_id`` are written only when there are some: an unreplicated
    topic's node, and a replicated one's created before topic ids, keep the bytes they had."""
    document: dict[str, Any] = {"partitions": topic.partitions, "config": dict(topic.config),
                                "created_by": topic.created_by}
    if topic.replicas:
        document["replicas"] = {str(p): list(brokers) for p, brokers in sorted(topic.replicas.items())}
    if topic.topic_id:
        document["topic_id"] = topic.topic_id
    return _dump(document)


def decode_topic(name: str, data: bytes) -> TopicRegistration:
    """Raises CoordinationError when ``data`` is not topic metadata."""
    document = _load(data, f"topic {name!r}")
    try:
        config = document.get("config", {})
        if not isinstance(config, dict):
            raise TypeError("config is not an object")
        replicas = document.get("replicas", {})
        if not isinstance(replicas, dict):
            raise TypeError("replicas is not an object")
        return TopicRegistration(check_topic(name), _typed(document["partitions"], int), config,
                                 _typed(document.get("created_by", -1), int),
                                 {_partition_key(k): _typed(b, list) for k, b in replicas.items()},
                                 _typed(document.get("topic_id", ""), str))
    except (KeyError, TypeError, ValueError) as e:
        raise CoordinationError(f"topic {name!r} metadata {data[:200]!r}: {e!r}") from None


def _partition_key(key: str) -> int:
    """A partition number written as a JSON object key: decimal, no sign, no leading zero."""
    if not key.isdigit() or not key.isascii() or (len(key) > 1 and key[0] == "0"):
        raise ValueError(f"replicas key {key!r} is not a partition number")
    return int(key)


def _typed(value: Any, kind: type) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"expected {kind.__name__}, got {value!r}")
    return value


def _decoded(decode: Callable[[bytes], Any], data: bytes | None, path: str) -> Any:
    if data is None:
        return None
    try:
        return decode(data)
    except CoordinationError as e:
        logger.warning("[zookeeper] ignoring %s: %s", path, e.message)
        return None


class BrokerRegistry:
    """Live brokers: register this one, read and watch them all."""

    def __init__(self, session: Session, paths: ZkPaths | None = None) -> None:
        self._session = session
        self.paths = paths or ZkPaths()

    def register(self, registration: BrokerRegistration) -> None:
        """Create or update this broker's ephemeral node; it is re-created after a session
        expiry.  A node of the same id left by this broker's previous process (same host and
        port) is replaced; one held by another live broker is a CoordinationError."""

        def previous_incarnation(existing: bytes) -> bool:
            try:
                old = decode_broker(existing)
            except CoordinationError:
                return False
            return (old.broker_id, old.host, old.port) == \
                (registration.broker_id, registration.host, registration.port)

        self._session.register_ephemeral(self.paths.broker(registration.broker_id),
                                         encode_broker(registration), takeover=previous_incarnation)

    def unregister(self, broker_id: int) -> None:
        self._session.unregister_ephemeral(self.paths.broker(broker_id))

    def get(self, broker_id: int) -> BrokerRegistration | None:
        path = self.paths.broker(broker_id)
        try:
            data, _ = self._session.client.get(path)
        except NoNodeError:
            return None
        return decode_broker(data)

    def ids(self) -> list[int]:
        """The ids of the live brokers, ascending."""
        try:
            children = self._session.client.get_children(self.paths.broker_ids)
        except NoNodeError:
            return []
        return sorted(self._ids(children))

    def brokers(self) -> dict[int, BrokerRegistration]:
        """Every live broker's registration (one that vanishes while being read is left out)."""
        found = {}
        for broker_id in self.ids():
            registration = _decoded(decode_broker, self._get_or_none(self.paths.broker(broker_id)),
                                    self.paths.broker(broker_id))
            if registration is not None:
                found[broker_id] = registration
        return found

    def watch_ids(self, callback: Callable[[list[int]], None]) -> Watch:
        """``callback(live broker ids)`` now and whenever a broker comes or goes."""
        return watch_children(self._session.client, self.paths.broker_ids,
                              lambda children: callback(sorted(self._ids(children))))

    def watch(self, broker_id: int, callback: Callable[[BrokerRegistration | None], None]) -> Watch:
        """``callback(registration or None)`` now and whenever the broker registers, changes or goes."""
        path = self.paths.broker(broker_id)
        return watch_data(self._session.client, path,
                          lambda data, stat: callback(_decoded(decode_broker, data, path)))

    def _ids(self, children: list[str]) -> list[int]:
        ids = []
        for child in children:
            try:
                ids.append(self.paths.broker_id_of(child))
            except InvalidConfigError as e:  # a stray node
                logger.warning("[zookeeper] ignoring %s/%s: %s", self.paths.broker_ids, child, e)
        return ids

    def _get_or_none(self, path: str) -> bytes | None:
        try:
            return self._session.client.get(path)[0]
        except NoNodeError:
            return None


class TopicRegistry:
    """Topics' metadata: publish, remove, read and watch."""

    def __init__(self, session: Session, paths: ZkPaths | None = None) -> None:
        self._session = session
        self.paths = paths or ZkPaths()

    def publish(self, topic: TopicRegistration) -> bool:
        """Create or overwrite the topic's node; False when it already held exactly this, and
        False (logged) when the node is a replicated topic's and ``topic`` is not: a broker's
        unreplicated topic of the same name never takes over the cluster's replicated one (its
        node is written only by the replicated topic's own create, alter and reassignment)."""
        client = self._session.client
        path = self.paths.topic(topic.name)
        while True:
            try:
                client.create(path, encode_topic(topic), makepath=True)
                return True
            except NodeExistsError:
                pass
            try:
                existing, stat = client.get(path)
                current = _decoded(lambda d: decode_topic(topic.name, d), existing, path)
                if current is not None and current.replicas and not topic.replicas:
                    logger.warning("[zookeeper] not publishing unreplicated topic %s of broker %d: "
                                   "the cluster has a replicated topic of that name", topic.name,
                                   topic.created_by)
                    return False
                if current == topic:
                    return False
                client.set(path, encode_topic(topic), version=stat.version)
                return True
            except (NoNodeError, BadVersionError):
                continue  # deleted or changed in between: look again

    def remove(self, name: str, *, created_by: int | None = None) -> bool:
        """Delete the topic's node, and with it its partitions' state nodes (one transaction);
        with ``created_by``, only if that broker wrote it and it is not a replicated topic's (a
        replicated topic is deleted only by an explicit remove without ``created_by``, the
        cluster-wide delete).  False when there was nothing to delete, or it was left."""
        client = self._session.client
        path = self.paths.topic(name)
        while True:
            try:
                data, stat = client.get(path)
                if created_by is not None:
                    current = _decoded(lambda d: decode_topic(name, d), data, path)
                    if current is None or current.created_by != created_by:
                        return False
                    if current.replicas:
                        logger.warning("[zookeeper] not removing topic %s for broker %d: it is the "
                                       "cluster's replicated topic", name, created_by)
                        return False
                if stat.numChildren == 0:
                    client.delete(path, version=stat.version)
                    return True
                txn = client.transaction()
                for child in self._subtree(path):
                    txn.delete(child)
                txn.delete(path, version=stat.version)
                if all(not isinstance(result, Exception) for result in txn.commit()):
                    return True
            except NoNodeError:
                return False
            except (BadVersionError, NotEmptyError):
                continue  # changed in between: look again

    def _subtree(self, path: str) -> list[str]:
        """Every node below ``path``, deepest first (the order they can be deleted in)."""
        client = self._session.client
        below = []
        for child in client.get_children(path):
            child_path = f"{path}/{child}"
            below.extend(self._subtree(child_path))
            below.append(child_path)
        return below

    def get(self, name: str) -> TopicRegistration | None:
        path = self.paths.topic(name)
        try:
            data, _ = self._session.client.get(path)
        except NoNodeError:
            return None
        return decode_topic(name, data)

    def names(self) -> list[str]:
        try:
            return sorted(self._session.client.get_children(self.paths.topics))
        except NoNodeError:
            return []

    def topics(self) -> dict[str, TopicRegistration]:
        """Every topic's metadata (undecodable nodes are logged and left out)."""
        found = {}
        for name in self.names():
            path = self.paths.topic(name)
            try:
                data = self._session.client.get(path)[0]
            except NoNodeError:
                continue
            topic = _decoded(lambda d, n=name: decode_topic(n, d), data, path)
            if topic is not None:
                found[name] = topic
        return found

    def watch_names(self, callback: Callable[[list[str]], None]) -> Watch:
        """``callback(topic names)`` now and whenever a topic is published or removed."""
        return watch_children(self._session.client, self.paths.topics, callback)

    def watch(self, name: str, callback: Callable[[TopicRegistration | None], None]) -> Watch:
        """``callback(metadata or None)`` now and whenever the topic's node changes."""
        path = self.paths.topic(name)
        return watch_data(self._session.client, path,
                          lambda data, stat: callback(_decoded(lambda d: decode_topic(name, d), data, path)))
