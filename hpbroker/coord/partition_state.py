"""The state of a replicated partition in ZooKeeper: its leader, leader epoch and in-sync replicas.

One persistent node per partition of a replicated topic (a topic node with ``replicas``,
``hpbroker.coord.registry``)::

    brokers/topics/<topic>/partitions/<p>/state
        {"version": 1, "leader": 1, "leader_epoch": 3, "isr": [1, 2, 0], "controller_epoch": 7,
         "topic_id": "9b2f6c1e0d4a4e8f8c3b5a7d6e1f2a3b"}

- ``leader``: the broker that leads the partition; ``-1``: none (no ISR member alive, unclean
  leader election off);
- ``leader_epoch``: bumped by the controller at every change of leader; the leader stamps it into
  every batch it appends;
- ``isr``: the in-sync replicas, the leader included while there is one; with ``leader`` -1, the
  last members (the first of them to return becomes leader);
- ``controller_epoch``: the epoch of the controller that wrote the node last (an ISR change by a
  leader keeps it);
- ``topic_id``: the topic id (KIP-516) of the topic whose partition this is, as its topic node
  holds it; absent (``""`` here) in nodes written before topic ids, and for topics without one:
  unknown.  A topic deleted and created again under the same name keeps the same path, so a
  broker still holding the old topic may see the new topic's state before it has seen the new
  topic: it ignores a state whose topic id differs from the topic it holds (both known).  Every
  writer keeps the id of the state it replaces.

**Who writes it.**  The controller creates the nodes when a replicated topic appears
(:func:`create_states`) and replaces them when a leader must change (:func:`update_state` with
``controller_epoch_version``): each of its writes is a ZooKeeper transaction that also *checks*
the version of ``/controller_epoch`` the controller set when it was elected, so once another
controller has been elected (and has bumped that node) a deposed controller's writes fail, as
Kafka's ZooKeeper-era controller does.  A partition's leader writes ISR shrinks and expansions
with :func:`update_state` and no controller check.  Every replacement is conditional on the
znode version the writer read (``expected_version``): two writers never overwrite each other
unseen; the one that loses reads again and decides again.

**Who reads it.**  Every broker hosting a replica watches its partitions' states
(:class:`PartitionStateWatch`) and takes its role from them; the controller reads them
(:func:`read_state`) before deciding.

Functions take the kazoo client or a :class:`~hpbroker.coord.session.Session`.  ZooKeeper
failures other than a failed condition (connection lost, session expired) are
:class:`~hpbroker.errors.CoordinationError`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    RuntimeInconsistency,
)
from kazoo.protocol.states import ZnodeStat

from hpbroker.coord.paths import ZkPaths, check_broker_id, check_topic
from hpbroker.coord.registry import _dump, _load, _typed
from hpbroker.coord.session import Session
from hpbroker.coord.watches import Watch, watch_data
from hpbroker.errors import CoordinationError, HPBrokerError

__all__ = [
    "NO_LEADER",
    "PartitionState",
    "PartitionStateWatch",
    "StateCallback",
    "create_states",
    "decode_state",
    "encode_state",
    "read_state",
    "update_state",
]

logger = logging.getLogger(__name__)

NO_LEADER = -1  # the "leader" of a partition that has none

# on_change(topic, partition, state or None, znode version or -1)
StateCallback = Callable[[str, int, "PartitionState | None", int], None]


@dataclass(frozen=True, slots=True)
class PartitionState:
    """One partition's leadership (module docstring).  Checked on construction: ``leader`` a
    broker id or :data:`NO_LEADER`, ``leader_epoch`` and ``controller_epoch`` >= 0, ``isr``
    distinct broker ids (a list is kept as a tuple, in its order).  A bad value is ValueError."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    topic_id: str = ""  # "" unknown (module docstring)

    def __post_init__(self) -> None:
        if not isinstance(self.topic_id, str):
            raise ValueError(f"topic_id must be a string, got {self.topic_id!r}")
        leader = _int(self.leader, "leader")
        if leader != NO_LEADER:
            _broker(leader, "leader")
        if _int(self.leader_epoch, "leader_epoch") < 0:
            raise ValueError(f"leader_epoch must be >= 0, got {self.leader_epoch}")
        if _int(self.controller_epoch, "controller_epoch") < 0:
            raise ValueError(f"controller_epoch must be >= 0, got {self.controller_epoch}")
        if not isinstance(self.isr, (list, tuple)):
            raise ValueError(f"isr must be a list of broker ids, got {self.isr!r}")
        isr = tuple(_broker(b, "isr member") for b in self.isr)
        if len(set(isr)) != len(isr):
            raise ValueError(f"isr {list(isr)} names a broker twice")
        object.__setattr__(self, "isr", isr)

    @property
    def has_leader(self) -> bool:
        return self.leader != NO_LEADER

    def of_other_topic(self, topic_id: str) -> bool:
        """Whether this state belongs to another topic than the one with ``topic_id`` (False when
        either id is unknown)."""
        return bool(self.topic_id and topic_id and self.topic_id != topic_id)


def _int(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    return value


def _broker(value: object, what: str) -> int:
    try:
        return check_broker_id(value)
    except HPBrokerError as e:
        raise ValueError(f"{what}: {e.message}") from None


def encode_state(state: PartitionState) -> bytes:
    """``topic_id`` is written only when known: a state without one keeps its old bytes."""
    document: dict[str, Any] = {"leader": state.leader, "leader_epoch": state.leader_epoch,
                                "isr": list(state.isr), "controller_epoch": state.controller_epoch}
    if state.topic_id:
        document["topic_id"] = state.topic_id
    return _dump(document)


def decode_state(data: bytes) -> PartitionState:
    """Raises CoordinationError when ``data`` is not a partition state of a version this reads."""
    document = _load(data, "partition state")
    try:
        return PartitionState(leader=_typed(document["leader"], int),
                              leader_epoch=_typed(document["leader_epoch"], int),
                              isr=tuple(_typed(document["isr"], list)),
                              controller_epoch=_typed(document["controller_epoch"], int),
                              topic_id=_typed(document.get("topic_id", ""), str))
    except (KeyError, TypeError, ValueError) as e:
        raise CoordinationError(f"partition state {data[:200]!r}: {e!r}") from None


def _kazoo(client: KazooClient | Session) -> KazooClient:
    return client.client if isinstance(client, Session) else client


def read_state(client: KazooClient | Session, paths: ZkPaths, topic: str,
               partition: int) -> tuple[PartitionState, int] | None:
    """``(state, znode version)`` of the partition, None when it has no state node.  A node that
    does not decode is CoordinationError (a writer would overwrite what it cannot read)."""
    path = paths.partition_state(topic, partition)
    try:
        data, stat = _kazoo(client).get(path)
    except NoNodeError:
        return None
    except KazooException as e:
        raise CoordinationError(f"cannot read {path}: {e!r}") from e
    try:
        return decode_state(data), stat.version
    except CoordinationError as e:
        raise CoordinationError(f"{path}: {e.message}") from None


def create_states(client: KazooClient | Session, paths: ZkPaths, topic: str,
                  states: Mapping[int, PartitionState], *,
                  controller_epoch_version: int | None = None) -> bool:
    """Create the state node of each partition in ``states`` that has none, all in one transaction,
    which with ``controller_epoch_version`` also checks that ``/controller_epoch`` still has that
    version.  Nodes that exist already are left as they are.  The parents
    (``partitions/<p>``) are made first, outside the transaction; the topic node must exist
    (CoordinationError otherwise: the topic was deleted).

    Returns False, having created nothing, when the controller epoch check failed (another
    controller was elected since); True otherwise."""
    check_topic(topic)
    if not states:
        return True
    kazoo = _kazoo(client)
    encoded = {p: (paths.partition_state(topic, p), encode_state(state))
               for p, state in sorted(states.items())}
    try:
        _create_parents(kazoo, paths, topic, encoded)
        pending = dict(encoded)
        guard = 0 if controller_epoch_version is None else 1
        while pending:
            txn = kazoo.transaction()
            if guard:
                txn.check(paths.controller_epoch, controller_epoch_version)
            for path, data in pending.values():
                txn.create(path, data)
            failed = _failed_operation(txn.commit())
            if failed is None:
                return True
            index, error = failed
            if index < guard:
                return False
            partition = list(pending)[index - guard]
            if not isinstance(error, NodeExistsError):
                raise CoordinationError(f"cannot create {pending[partition][0]}: {error!r}")
            del pending[partition]  # created by someone else meanwhile: theirs stands
        return True
    except KazooException as e:
        raise CoordinationError(f"cannot create the partition states of {topic!r}: {e!r}") from e


def _create_parents(kazoo: KazooClient, paths: ZkPaths, topic: str,
                    encoded: Mapping[int, tuple[str, bytes]]) -> None:
    parents = [paths.topic_partitions(topic)] + [paths.topic_partition(topic, p) for p in encoded]
    for path in parents:
        try:
            kazoo.create(path)
        except NodeExistsError:
            pass
        except NoNodeError:
            raise CoordinationError(f"topic {topic!r} has no node at {paths.topic(topic)}: "
                                    "no partition state is created for it") from None


def update_state(client: KazooClient | Session, paths: ZkPaths, topic: str, partition: int,
                 state: PartitionState, *, expected_version: int,
                 controller_epoch_version: int | None = None) -> int | None:
    """Replace the partition's state if its znode still has ``expected_version`` (-1: any); with
    ``controller_epoch_version``, in one transaction with a check that ``/controller_epoch`` still
    has that version.  Returns the node's new version, or None when a condition failed: the
    state changed since it was read, the node is gone (topic deleted), or another controller was
    elected.  The caller reads again and decides again (or, a controller, steps down)."""
    path = paths.partition_state(topic, partition)
    data = encode_state(state)
    kazoo = _kazoo(client)
    try:
        if controller_epoch_version is None:
            try:
                return kazoo.set(path, data, version=expected_version).version
            except (BadVersionError, NoNodeError):
                return None
        txn = kazoo.transaction()
        txn.check(paths.controller_epoch, controller_epoch_version)
        txn.set_data(path, data, version=expected_version)
        results = txn.commit()
    except KazooException as e:
        raise CoordinationError(f"cannot write {path}: {e!r}") from e
    failed = _failed_operation(results)
    if failed is None:
        return results[1].version
    if isinstance(failed[1], (BadVersionError, NoNodeError)):
        return None
    raise CoordinationError(f"cannot write {path}: {failed[1]!r}")


def _failed_operation(results: list[Any]) -> tuple[int, Exception] | None:
    """The index and error of the operation that failed a transaction, None if it succeeded (the
    other operations of a failed transaction report RolledBackError or RuntimeInconsistency)."""
    for index, result in enumerate(results):
        if isinstance(result, Exception) and not isinstance(result, (RolledBackError, RuntimeInconsistency)):
            return index, result
    return None


class PartitionStateWatch:
    """Watches the state nodes of chosen partitions; a broker watches those it hosts a replica of.

    ``on_change(topic, partition, state, version)`` is called when :meth:`watch` starts a watch
    (on the caller's thread, before it returns) and whenever the node is created, replaced or
    deleted (on kazoo's callback thread, one call at a time): ``state`` None and ``version`` -1
    while the node does not exist; ``state`` None and the node's version when its data does not
    decode (logged).  Calls give the *current* state: intermediate ones may be skipped.  The
    callback must be quick and must not wait for ZooKeeper (``hpbroker.coord.watches``)."""

    def __init__(self, client: KazooClient | Session, paths: ZkPaths, on_change: StateCallback) -> None:
        self._client = _kazoo(client)
        self.paths = paths
        self._on_change = on_change
        self._lock = threading.Lock()
        self._watches: dict[tuple[str, int], Watch | object] = {}
        self._closed = False

    def watch(self, topic: str, partition: int) -> None:
        """Start watching the partition's state; a partition already watched is left as it is.
        When starting the watch fails (ZooKeeper unreachable) the error is raised and the
        partition is not watched: a later call tries again."""
        path = self.paths.partition_state(topic, partition)
        key, token = (topic, partition), object()
        with self._lock:
            if self._closed or key in self._watches:
                return
            self._watches[key] = token  # reserved: the first callback runs without the lock

        def deliver(data: bytes | None, stat: ZnodeStat | None) -> None:
            self._on_change(topic, partition, *self._decoded(path, data, stat))

        try:
            handle = watch_data(self._client, path, deliver)
        except BaseException:
            with self._lock:  # free the key: a later watch() tries again
                if self._watches.get(key) is token:
                    del self._watches[key]
            raise
        with self._lock:
            if self._watches.get(key) is token:
                self._watches[key] = handle
                return
        handle.cancel()  # unwatched or closed meanwhile

    def watched(self) -> list[tuple[str, int]]:
        """The partitions watched now, sorted."""
        with self._lock:
            return sorted(self._watches)

    def unwatch_topic(self, topic: str) -> None:
        """Stop watching every partition of ``topic``: no callback for it starts after this returns."""
        with self._lock:
            gone = [key for key in self._watches if key[0] == topic]
            handles = [self._watches.pop(key) for key in gone]
        for handle in handles:
            if isinstance(handle, Watch):
                handle.cancel()

    def close(self) -> None:
        """Stop every watch; later :meth:`watch` calls do nothing."""
        with self._lock:
            self._closed = True
            handles = list(self._watches.values())
            self._watches.clear()
        for handle in handles:
            if isinstance(handle, Watch):
                handle.cancel()

    @staticmethod
    def _decoded(path: str, data: bytes | None, stat: ZnodeStat | None) -> tuple[PartitionState | None, int]:
        if data is None or stat is None:
            return None, -1
        try:
            return decode_state(data), stat.version
        except CoordinationError as e:
            logger.warning("[zookeeper] ignoring %s: %s", path, e.message)
            return None, stat.version
