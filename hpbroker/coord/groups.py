"""Consumer groups in ZooKeeper: who is in a group, which member owns which partition, how far the
group has consumed, and the range assignment that every member computes the same way.

Three registries under ``<root>/consumers/<group>`` (``docs/COORDINATION.md`` has the whole tree)::

    ids/<consumer_id>                 ephemeral   {"version": 1, "consumer_id": "web-1-4f2a9c3e",
                                                   "topics": ["orders"], "host": "web-1", "pid": 4242,
                                                   "timestamp_ms": 1718000000000}
    owners/<topic>/<partition>        ephemeral   {"version": 1, "consumer_id": "web-1-4f2a9c3e",
                                                   "timestamp_ms": 1718000000000}
    offsets/<topic>/<partition>       persistent  {"version": 1, "offset": 1234,
                                                   "committed_by": "web-1-4f2a9c3e",
                                                   "timestamp_ms": 1718000000000}

- **Consumer registry**: one node per live member, holding the topics it subscribes to.  Written
  through :meth:`Session.register_ephemeral`, so a member whose session expired is registered
  again in its next session.
- **Ownership registry**: one node per owned partition, naming its owner.  Created with a plain
  ephemeral ``create``, which fails when the node exists: that is what makes ownership exclusive.
  Never re-created after a session expiry (an expired member has lost what it owned and must
  claim it again, after everyone else has seen it leave).
- **Offset registry**: the group's committed offset of each partition, the offset of the *next*
  record to consume.  Written by the partition's owner, in a ZooKeeper transaction that also
  checks the owner node, so an offset is never written by a member that no longer owns the
  partition; or, for a group with no live members, by a tool (:meth:`GroupRegistry.write_offsets`).

Node data is JSON in the format of :mod:`hpbroker.coord.registry` (a ``version`` field; unknown
fields ignored).  :func:`range_assignment` is the assignment: a pure function of the members'
subscriptions and the topics' partitions.

**ACLs.**  With security on (docs/SECURITY.md), ``/consumers/<group>`` and everything under it
carry the group's ACL: all rights to the cluster's and the group's digest ids, read to the
world (``hpbroker.coord.zk_security``).  ``GroupRegistry(..., acl=)`` is what every node this
registry creates carries (None: the session's default ACL); a member's session holds the group's
credentials (a broker hands them out), a tool's the cluster's.  ZooKeeper's refusal (NoAuth: no
or other credentials) is an :class:`~hpbroker.errors.AuthorizationError` naming what was refused.

Every ZooKeeper call here waits at most :attr:`GroupRegistry.timeout_s` (a
:class:`~hpbroker.errors.CoordinationError` after that): a consumer's thread must never hang on a
server that went away.  Reads that pipeline (many partitions) send every request before waiting
for the first answer.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import (
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
)

from hpbroker.coord.paths import ZkPaths, check_consumer_id, check_group, check_partition, check_topic
from hpbroker.coord.registry import _decoded, _dump, _load, _typed, decode_topic
from hpbroker.coord.session import Session
from hpbroker.coord.watches import Watch, watch_children
from hpbroker.coord.zk_security import refused
from hpbroker.errors import CoordinationError, HPBrokerError

__all__ = [
    "CommittedOffset",
    "ConsumerRegistration",
    "GroupRegistry",
    "Partition",
    "PartitionOwner",
    "decode_consumer",
    "default_consumer_id",
    "decode_offset",
    "decode_owner",
    "encode_consumer",
    "encode_offset",
    "encode_owner",
    "list_groups",
    "range_assignment",
]

logger = logging.getLogger(__name__)

#: A partition of a topic: ``(topic, partition)`` (the client's ``TopicPartition`` is one).
Partition = tuple[str, int]

_WRITE_ATTEMPTS = 3  # rounds of an offset write whose node appeared or vanished in between


# --- node data ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConsumerRegistration:
    """One live member of a group: its id, the topics it subscribes to, where it runs."""

    consumer_id: str
    topics: tuple[str, ...]
    host: str = ""
    pid: int = 0
    timestamp_ms: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class PartitionOwner:
    """Who owns a partition: the member's id and the ZooKeeper session holding the node."""

    consumer_id: str
    session_id: int
    timestamp_ms: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """A committed offset (the next offset to consume), who wrote it ("" for a tool) and when."""

    offset: int
    committed_by: str = ""
    timestamp_ms: int = field(default=0, compare=False)


def _now_ms() -> int:
    return int(time.time() * 1000)


def encode_consumer(registration: ConsumerRegistration) -> bytes:
    return _dump({"consumer_id": registration.consumer_id, "topics": sorted(set(registration.topics)),
                  "host": registration.host, "pid": registration.pid,
                  "timestamp_ms": registration.timestamp_ms or _now_ms()})


def decode_consumer(data: bytes) -> ConsumerRegistration:
    """Raises CoordinationError when ``data`` is not a consumer registration."""
    document = _load(data, "consumer registration")
    try:
        topics = document["topics"]
        if not isinstance(topics, list):
            raise TypeError("topics is not a list")
        return ConsumerRegistration(
            consumer_id=check_consumer_id(document["consumer_id"]),
            topics=tuple(sorted({check_topic(topic) for topic in topics})),
            host=_typed(document.get("host", ""), str), pid=_typed(document.get("pid", 0), int),
            timestamp_ms=_typed(document.get("timestamp_ms", 0), int))
    except (KeyError, TypeError, HPBrokerError) as e:
        raise CoordinationError(f"consumer registration {data[:200]!r}: {e!r}") from None


def encode_owner(consumer_id: str) -> bytes:
    return _dump({"consumer_id": consumer_id, "timestamp_ms": _now_ms()})


def decode_owner(data: bytes, session_id: int) -> PartitionOwner:
    """``session_id`` is the node's ``ephemeralOwner``.  CoordinationError if ``data`` is not an
    ownership node."""
    document = _load(data, "partition owner")
    try:
        return PartitionOwner(check_consumer_id(document["consumer_id"]), session_id,
                              _typed(document.get("timestamp_ms", 0), int))
    except (KeyError, TypeError, HPBrokerError) as e:
        raise CoordinationError(f"partition owner {data[:200]!r}: {e!r}") from None


def encode_offset(offset: int, committed_by: str = "") -> bytes:
    return _dump({"offset": offset, "committed_by": committed_by, "timestamp_ms": _now_ms()})


def decode_offset(data: bytes) -> CommittedOffset:
    """CoordinationError if ``data`` is not a committed offset."""
    document = _load(data, "committed offset")
    try:
        offset = _typed(document["offset"], int)
        if offset < 0:
            raise ValueError(f"negative offset {offset}")
        return CommittedOffset(offset, _typed(document.get("committed_by", ""), str),
                               _typed(document.get("timestamp_ms", 0), int))
    except (KeyError, TypeError, ValueError) as e:
        raise CoordinationError(f"committed offset {data[:200]!r}: {e!r}") from None


# --- the assignment -----------------------------------------------------------------------------


def range_assignment(subscriptions: Mapping[str, Iterable[str]],
                     partitions: Mapping[str, Iterable[int]]) -> dict[str, list[Partition]]:
    """Which partitions each member owns: consumer id -> sorted ``(topic, partition)`` list.

    ``subscriptions`` maps each member to the topics it subscribes to; ``partitions`` each topic
    to its partitions.  Per topic, as in the Kafka paper: the topic's partitions and the members
    subscribing to it are both sorted; with P partitions and C members, member j (from 0) gets
    the contiguous range starting at ``j * (P // C) + min(j, P % C)`` of ``P // C`` partitions,
    plus one when ``j < P % C``.  So every partition of a subscribed topic goes to exactly one
    subscriber, range sizes differ by at most one, and every member computing this from the same
    registries gets the same answer whatever the order of its inputs.  A topic missing from
    ``partitions`` is assigned to nobody."""
    result: dict[str, list[Partition]] = {consumer: [] for consumer in subscriptions}
    subscribed = {consumer: set(topics) for consumer, topics in subscriptions.items()}
    for topic in sorted(partitions):
        members = sorted(consumer for consumer, topics in subscribed.items() if topic in topics)
        numbers = sorted(set(partitions[topic]))
        if not members or not numbers:
            continue
        size, extra = divmod(len(numbers), len(members))
        for j, consumer in enumerate(members):
            start = j * size + min(j, extra)
            result[consumer].extend((topic, p) for p in numbers[start:start + size + (j < extra)])
    for owned in result.values():
        owned.sort()
    return result


# --- the registries -----------------------------------------------------------------------------


def list_groups(session: Session, paths: ZkPaths | None = None, *, timeout_s: float = 10.0) -> list[str]:
    """Every group that has a node under ``consumers``, live members or not, sorted."""
    paths = paths or ZkPaths()
    client = session.client
    try:
        children = client.get_children_async(paths.consumers).get(timeout=timeout_s)
    except NoNodeError:
        return []
    except client.handler.timeout_exception:
        raise CoordinationError(f"no answer from ZooKeeper within {timeout_s:g} s listing groups") from None
    return sorted(children)


class GroupRegistry:
    """The consumer, ownership and offset registries of one group (module docstring), for its
    members and for tools.  Thread-safe as kazoo is; ``timeout_s`` bounds every call."""

    def __init__(self, session: Session, group: str, paths: ZkPaths | None = None, *,
                 timeout_s: float = 10.0, acl: Sequence[Any] | None = None) -> None:
        self._session = session
        self.group = check_group(group)
        self.paths = paths or ZkPaths()
        self.timeout_s = timeout_s
        #: what every node this registry creates carries (kazoo ACLs); None: the session's default
        self.acl = None if acl is None else list(acl)

    # --- plumbing -------------------------------------------------------------------------------

    def _wait(self, async_result: Any, what: str) -> Any:
        """The result of one pending call; kazoo's error, or CoordinationError after timeout_s."""
        try:
            return async_result.get(timeout=self.timeout_s)
        except self._session.client.handler.timeout_exception:
            raise CoordinationError(f"[group {self.group}] no answer from ZooKeeper within "
                                    f"{self.timeout_s:g} s {what}") from None
        except NoAuthError:
            raise self._refused(what) from None

    def _refused(self, what: str) -> Exception:
        return refused(f"{what} in group {self.group}", self._credentials())

    def _credentials(self) -> Any:
        auth = getattr(self._session, "auth", ())
        return auth[-1] if auth else None

    def _session_id(self) -> int:
        client_id = self._session.client.client_id
        if client_id is None:
            raise CoordinationError(f"[group {self.group}] not connected to ZooKeeper")
        return client_id[0]

    def _children(self, path: str) -> list[str]:
        try:
            return sorted(self._wait(self._session.client.get_children_async(path), f"listing {path}"))
        except NoNodeError:
            return []

    def _read_many(self, paths: Mapping[Any, str], what: str) -> dict[Any, tuple[bytes, Any] | None]:
        """``key -> (data, stat)`` of each path (None where it does not exist), pipelined."""
        client = self._session.client
        pending = {key: client.get_async(path) for key, path in paths.items()}
        found: dict[Any, tuple[bytes, Any] | None] = {}
        for key, result in pending.items():
            try:
                found[key] = self._wait(result, what)
            except NoNodeError:
                found[key] = None
        return found

    def _partitions_under(self, parent: str) -> list[Partition]:
        """``(topic, partition)`` of every node ``parent/<topic>/<partition>``."""
        found = []
        for topic in self._children(parent):
            for child in self._children(f"{parent}/{topic}"):
                try:
                    found.append((check_topic(topic), self.paths.partition_of(child)))
                except HPBrokerError as e:
                    logger.warning("[group %s] ignoring %s/%s/%s: %s", self.group, parent, topic, child, e)
        return sorted(found)

    # --- members --------------------------------------------------------------------------------

    def register(self, registration: ConsumerRegistration) -> None:
        """Create or update this member's ephemeral node; re-created after a session expiry."""
        try:
            self._session.register_ephemeral(self.paths.consumer(self.group, registration.consumer_id),
                                             encode_consumer(registration), acl=self.acl)
        except NoAuthError:
            raise self._refused(f"registering {registration.consumer_id}") from None

    def unregister(self, consumer_id: str) -> None:
        self._session.unregister_ephemeral(self.paths.consumer(self.group, consumer_id))

    def is_registered(self, consumer_id: str) -> bool:
        """Whether ``consumer_id``'s node exists and belongs to this session."""
        path = self.paths.consumer(self.group, consumer_id)
        stat = self._wait(self._session.client.exists_async(path), f"looking for {path}")
        return stat is not None and stat.ephemeralOwner == self._session_id()

    def member_ids(self) -> list[str]:
        """The ids of the live members, sorted."""
        ids = []
        for child in self._children(self.paths.consumer_ids(self.group)):
            try:
                ids.append(check_consumer_id(child))
            except HPBrokerError as e:
                logger.warning("[group %s] ignoring member node %r: %s", self.group, child, e)
        return ids

    def members(self) -> dict[str, ConsumerRegistration]:
        """Every live member's registration (undecodable ones are logged and left out)."""
        ids = self.member_ids()
        read = self._read_many({c: self.paths.consumer(self.group, c) for c in ids}, "reading members")
        found = {}
        for consumer_id, entry in read.items():
            if entry is None:
                continue
            path = self.paths.consumer(self.group, consumer_id)
            registration = _decoded(decode_consumer, entry[0], path)
            if registration is not None and registration.consumer_id == consumer_id:
                found[consumer_id] = registration
        return found

    def watch_members(self, callback: Callable[[list[str]], None]) -> Watch:
        """``callback(live member ids)`` now and whenever a member joins or leaves."""
        return watch_children(self._session.client, self.paths.consumer_ids(self.group), callback)

    def partition_counts(self, topics: Iterable[str]) -> dict[str, int]:
        """Each topic's partition count from the topic registry, read in one pipelined round;
        topics without (decodable) metadata are left out."""
        wanted = sorted({check_topic(topic) for topic in topics})
        read = self._read_many({topic: self.paths.topic(topic) for topic in wanted}, "reading topics")
        counts = {}
        for topic, entry in read.items():
            if entry is not None:
                path = self.paths.topic(topic)
                registration = _decoded(lambda d, t=topic: decode_topic(t, d), entry[0], path)
                if registration is not None:
                    counts[topic] = registration.partitions
        return counts

    # --- ownership ------------------------------------------------------------------------------

    def claim(self, topic: str, partition: int, consumer_id: str) -> bool:
        """Make ``consumer_id`` (in this session) the owner of the partition.  False when someone
        else owns it; True also when this session already does."""
        path = self.paths.owner(self.group, topic, partition)
        try:
            self._wait(self._session.client.create_async(path, encode_owner(consumer_id), acl=self.acl,
                                                         ephemeral=True, makepath=True),
                       f"claiming {topic}-{partition}")
            return True
        except NodeExistsError:
            owner = self.owner(topic, partition)
            return owner == PartitionOwner(consumer_id, self._session_id())

    def release(self, topic: str, partition: int, consumer_id: str) -> bool:
        """Delete the ownership node if ``consumer_id`` holds it in this session; False if not."""
        path = self.paths.owner(self.group, topic, partition)
        entry = self._read_many({0: path}, f"reading the owner of {topic}-{partition}")[0]
        if entry is None or _owner(entry, path) != PartitionOwner(consumer_id, self._session_id()):
            return False
        try:
            self._wait(self._session.client.delete_async(path, version=entry[1].version),
                       f"releasing {topic}-{partition}")
            return True
        except NoNodeError:
            return False

    def owner(self, topic: str, partition: int) -> PartitionOwner | None:
        path = self.paths.owner(self.group, topic, partition)
        entry = self._read_many({0: path}, f"reading the owner of {topic}-{partition}")[0]
        return None if entry is None else _owner(entry, path)

    def owners(self, partitions: Iterable[Partition] | None = None) -> dict[Partition, PartitionOwner | None]:
        """The owner of each of ``partitions`` (None: not owned), read in one pipelined round;
        without ``partitions``, of every partition that has an owner now."""
        wanted = self._partitions_under(self.paths.group_owners(self.group)) if partitions is None \
            else [(topic, partition) for topic, partition in partitions]
        read = self._read_many({tp: self.paths.owner(self.group, *tp) for tp in wanted}, "reading owners")
        owners = {tp: None if entry is None else _owner(entry, self.paths.owner(self.group, *tp))
                  for tp, entry in read.items()}
        return owners if partitions is not None else {tp: o for tp, o in owners.items() if o is not None}

    # --- offsets --------------------------------------------------------------------------------

    def committed(self, topic: str, partition: int) -> int | None:
        """The group's committed offset of the partition (the next offset to consume), or None."""
        found = self.committed_offsets([(topic, partition)]).get((topic, partition))
        return None if found is None else found.offset

    def committed_offsets(self, partitions: Iterable[Partition] | None = None
                          ) -> dict[Partition, CommittedOffset]:
        """The committed offsets of ``partitions`` (all committed ones when None); partitions
        without a (decodable) committed offset are left out."""
        wanted = self._partitions_under(self.paths.group_offsets(self.group)) if partitions is None \
            else [(check_topic(topic), check_partition(partition)) for topic, partition in partitions]
        read = self._read_many({tp: self.paths.offset(self.group, *tp) for tp in wanted}, "reading offsets")
        found = {}
        for tp, entry in read.items():
            if entry is not None:
                offset = _decoded(decode_offset, entry[0], self.paths.offset(self.group, *tp))
                if offset is not None:
                    found[tp] = offset
        return found

    def commit(self, offsets: Mapping[Partition, int], consumer_id: str) -> set[Partition]:
        """Commit ``offsets`` for ``consumer_id``, the partitions' owner in this session.  Each
        partition is one transaction: *check* its ownership node's version, *write* its offset;
        so an offset never lands once the node is gone (released, or its session expired).
        Returns the partitions refused because ``consumer_id`` does not own them in this session;
        CoordinationError or kazoo's errors when ZooKeeper cannot be asked."""
        wanted = {(check_topic(t), check_partition(p)): _check_offset(o) for (t, p), o in offsets.items()}
        if not wanted:
            return set()
        session_id = self._session_id()
        owners = self._read_many({tp: self.paths.owner(self.group, *tp) for tp in wanted}, "reading owners")
        refused, versions = set(), {}
        for tp, entry in owners.items():
            path = self.paths.owner(self.group, *tp)
            if entry is None or _owner(entry, path) != PartitionOwner(consumer_id, session_id):
                refused.add(tp)
            else:
                versions[tp] = entry[1].version
        writes = {tp: (wanted[tp], consumer_id) for tp in versions}
        refused |= self._write_offsets(writes, lambda txn, tp: txn.check(self.paths.owner(self.group, *tp),
                                                                          versions[tp]))
        return refused

    def write_offsets(self, offsets: Mapping[Partition, int], *, force: bool = False) -> None:
        """Set the group's committed offsets, for a tool (``committed_by`` ""): refused while the
        group has live members unless ``force``; each partition is written only if no member owns
        it at that instant (the transaction creates and deletes its ownership node around the
        write), so a member that claims it later reads the new offset.  CoordinationError naming
        the partitions that were owned (the others are written)."""
        wanted = {(check_topic(t), check_partition(p)): _check_offset(o) for (t, p), o in offsets.items()}
        members = self.member_ids()
        if members and not force:
            raise CoordinationError(f"[group {self.group}] has {len(members)} live members "
                                    f"({', '.join(members[:5])}{', ...' if len(members) > 5 else ''}): "
                                    "stop them before writing offsets")
        client = self._session.client
        for topic in sorted({t for t, _ in wanted}):
            self._wait(client.ensure_path_async(self.paths.owners(self.group, topic), self.acl),
                       "creating owners")

        def unowned(txn: Any, tp: Partition) -> None:
            path = self.paths.owner(self.group, *tp)
            txn.create(path, encode_owner("tool"), acl=self.acl, ephemeral=True)
            txn.delete(path)

        owned = self._write_offsets({tp: (offset, "") for tp, offset in wanted.items()}, unowned, guard_ops=2)
        if owned:
            raise CoordinationError(f"[group {self.group}] not written, owned by a live member: "
                                    f"{', '.join(f'{t}-{p}' for t, p in sorted(owned))}")

    def _write_offsets(self, writes: Mapping[Partition, tuple[int, str]],
                       guard: Callable[[Any, Partition], None], guard_ops: int = 1) -> set[Partition]:
        """One transaction per partition, pipelined: the ``guard`` operations, then the offset's
        set (or create, where the node does not exist yet).  Returns the partitions whose guard
        failed."""
        client = self._session.client
        paths = {tp: self.paths.offset(self.group, *tp) for tp in writes}
        exists = {tp: client.exists_async(path) for tp, path in paths.items()}
        pending = {tp: self._wait(result, "reading offsets") is not None for tp, result in exists.items()}
        for topic in sorted({t for (t, _), there in pending.items() if not there}):
            self._wait(client.ensure_path_async(self.paths.offsets(self.group, topic), self.acl),
                       "creating offsets")
        refused: set[Partition] = set()
        for _ in range(_WRITE_ATTEMPTS):
            committing = {}
            for tp, there in pending.items():
                txn = client.transaction()
                guard(txn, tp)
                data = encode_offset(*writes[tp])
                if there:
                    txn.set_data(paths[tp], data)
                else:
                    txn.create(paths[tp], data, acl=self.acl)
                committing[tp] = txn.commit_async()
            again = {}
            for tp, result in committing.items():
                failed = _failed_operation(self._wait(result, f"committing {tp[0]}-{tp[1]}"))
                if failed is None:
                    continue
                index, error = failed
                if isinstance(error, NoAuthError):  # a guard's or the offset's node: no rights there
                    raise self._refused(f"committing {tp[0]}-{tp[1]}")
                if index < guard_ops:
                    refused.add(tp)
                elif isinstance(error, (NoNodeError, NodeExistsError)):
                    again[tp] = isinstance(error, NodeExistsError)  # appeared or vanished: the other way
                else:
                    raise CoordinationError(f"[group {self.group}] committing {tp[0]}-{tp[1]}: {error!r}")
            if not again:
                return refused
            pending = again
        raise CoordinationError(f"[group {self.group}] offsets of {sorted(pending)} kept changing; "
                                "not written")


def _owner(entry: tuple[bytes, Any], path: str) -> PartitionOwner | None:
    data, stat = entry
    return _decoded(lambda d: decode_owner(d, stat.ephemeralOwner), data, path)


def _check_offset(offset: object) -> int:
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ValueError(f"an offset must be an integer >= 0, got {offset!r}")
    return offset


def _failed_operation(results: list[Any]) -> tuple[int, Exception] | None:
    """The index and error of the operation that failed a transaction, None if it succeeded (the
    other operations of a failed transaction report RolledBackError or RuntimeInconsistency)."""
    for index, result in enumerate(results):
        if isinstance(result, Exception) and not isinstance(result, (RolledBackError, RuntimeInconsistency)):
            return index, result
    return None


def default_consumer_id() -> str:
    """``<host>-<pid>-<8 hex digits>``, the host name reduced to the characters an id may hold."""
    host = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "-" for c in os.uname().nodename)
    return f"{host[:200] or 'host'}-{os.getpid()}-{os.urandom(4).hex()}"
