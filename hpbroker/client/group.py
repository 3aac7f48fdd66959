"""Consumer groups: the members of a group share the partitions of the topics they subscribe to,
coordinated through ZooKeeper with no master, as in the Kafka paper (section 3.2).  Every record
is handed out at least once to the group, in offset order per partition.

``Consumer(bootstrap, group="g", topics=["orders"], zookeeper="zk:2181/chroot")`` makes the
consumer a member: it holds a :class:`GroupMember`, which joins the group at construction (its
ephemeral node in the consumer registry, ``hpbroker.coord.groups``) and from then on decides
which partitions the consumer reads.  This module is the only part of the client that imports
ZooKeeper code, and only when a group is used.

**Joining.**  The constructor connects, registers and sets its watches before it returns; a
failure there (no server answering within ``zookeeper_timeout_ms``, the connection lost or a
write refused meanwhile) is a :class:`~hpbroker.errors.CoordinationError` and leaves nothing
running: a member that never joined is not retried.  Once it has joined, a member rides out
ZooKeeper outages and restarts by itself (connection states, below).

**Security.**  A consumer with a key pair (``security=``, ``hpbroker.security.client``) asks
its bootstrap broker for the group's ZooKeeper credentials (``GroupCredentialsRequest``, which
needs ``consume`` on the group) before it connects to ZooKeeper, adds them to its session, and
creates every node under ``/consumers/<group>`` with the group's ACL (all rights to the ids the
broker named, read to the world); the broker creates the group's node itself, and the member
waits for it (at most ``zookeeper_timeout_ms``).  A broker that answers error 10 runs without
security or without ZooKeeper: the member joins without credentials.  ZooKeeper's refusal
(another group's nodes, or no credentials where the ACLs ask for them) is an
:class:`~hpbroker.errors.AuthorizationError` naming what was refused, raised by the constructor
or by ``poll()``, never retried.

**One thread.**  kazoo calls back on its own threads (watches, connection states); those
callbacks only set a flag and wake the consumer (a wake-up that does not end an iteration).
Everything else (rebalancing, committing, confirming the lease) runs on the consumer's thread,
inside ``poll()`` or the iteration, between two handouts of records; so positions are exact, and
the consumer stays single-threaded.

**Rebalance.**  Any change of the group's members, of the live brokers or of a subscribed topic's
metadata (a watch on each) marks a rebalance, done at the next turn of the fetch loop:

1. make sure this member's registration exists in the current session;
2. read the members and the subscribed topics' partition counts; compute the range assignment
   (:func:`~hpbroker.coord.groups.range_assignment`): the partitions this member should own;
3. release the owned partitions it should no longer own: commit their positions (with
   auto-commit on), *then* delete their ownership nodes, and drop them (records fetched and not
   handed out are discarded);
4. claim each new partition (an ephemeral ownership node: creation fails when another member
   still owns it); claimed ones start at the group's committed offset, read *after* the claim,
   so the previous owner's final commit (written before it released the node) is seen; a
   partition never committed starts where ``auto_offset_reset`` says;
5. if a partition is still owned by another member (which has not released it yet, or computed
   its assignment from an older picture), release *everything* (committing first), wait a
   jittered, doubling back-off (``rebalance_backoff_ms`` up to ``rebalance_backoff_max_ms``)
   and start again at 1.  Members that see the same registries compute the same assignment,
   so after the last change every member converges; the jitter breaks ties.

A ZooKeeper failure during a pass is logged and the pass retried after the back-off.

**The lease.**  A member whose session expired has lost its ownership nodes, and another member
may take its partitions as soon as it has seen the session go.  The member itself may not know:
its process may have been paused (SIGSTOP, swapping, a long GC) or cut off.  So records of an
owned partition are handed out only under a *lease*: until ``lease = session_timeout / 3``
after the member's last *confirmed* contact, the moment before it sent a read of its ownership
nodes that ZooKeeper answered, in the same session, naming this member.  ZooKeeper cannot expire
that session earlier than one session timeout after it answered, so no other member can own the
partition while the lease runs; the remaining two thirds are the margin for clocks and
scheduling.  When the lease has run out, the member re-reads its ownership nodes synchronously
(one pipelined round) *before* handing out anything more: partitions whose node is gone or names
another member (or another session) are dropped with their fetched records, uncommitted, and a
rebalance follows; if ZooKeeper does not answer, nothing is handed out, and the read is tried
again.  The check is per record during iteration (a clock read) and per ``poll()``; the one
window no check can close is a pause between the check and the handover itself.

**Connection states.**  SUSPENDED (the connection dropped; the session may live on): the lease
ends at once, so nothing is handed out until kazoo reconnects *and* the ownership read succeeds.
LOST, or a CONNECTED with a new session (the session expired): every partition is dropped,
without committing (their offsets may be another member's by now); the registration comes back
by itself in the new session (``Session.register_ephemeral``) and a rebalance claims partitions
again.

**Commits.**  The committed offset of a partition is the position (the next offset the
application gets), written by :meth:`GroupRegistry.commit`, which checks the ownership node in
the same transaction: a member never commits a partition it no longer owns.  With
``enable_auto_commit`` (the default), positions that moved are committed every
``auto_commit_interval_ms`` (inside ``poll()``/iteration, so covering records handed out before
that call), before a partition is released in a rebalance, and at ``close()``.  ``commit()``
commits synchronously.  Delivery is at least once: a member that dies redelivers, through the
next owner, what it handed out after its last commit; nothing is skipped, since a commit never
runs ahead of the records handed out.

**Rebalance listener** (Kafka's ``ConsumerRebalanceListener``).  ``on_revoke``, ``on_assign``
and ``on_lost`` (settings, each ``callable(partitions)`` or None) are called with a non-empty
set of :class:`~hpbroker.client.consumer.TopicPartition`, on the consumer's thread, inside
``poll()`` or the iteration, never while a record is handed out; and ``on_lost`` also inside
``commit()`` (the application's, on the thread that calls it), when the commit finds
partitions no longer owned:

- ``on_revoke`` before partitions are released in a rebalance (step 3, and step 5's release of
  everything): they are still owned, their positions exact, so ``commit()`` commits them;
- ``on_assign`` after partitions were claimed and started (step 4): each has its position,
  the committed offset (or none yet, ``auto_offset_reset`` decides at the first fetch), which a
  ``seek()`` here may change;
- ``on_lost`` (``on_revoke`` when None) after partitions were found lost and dropped, without
  committing: a session that expired, an ownership node gone or someone else's at a lease
  check or a commit.  They are no longer owned; a commit of them is refused.

A partition dropped and claimed again, also inside one ``poll()``, is told as revoked (or lost)
and then assigned: it restarts at the committed offset, so records handed out before may come
again.  So the positions of the partitions a member reads move only forward between two calls,
but across a revoke or loss followed by an assign.  What a listener raises is logged and
raised by the ``poll()`` (or the iteration step) once the rebalance is over.  Inside a
listener, at any depth (a ``commit()`` there may call ``on_lost``), ``poll()``, iteration and
``close()`` are refused with RuntimeError: a listener that wants the consumer closed calls
``close()`` after ``poll()`` returns (or ``wakeup()`` to make it return).  ``close()`` calls no
listener, from any thread (with auto-commit on it commits itself, and partitions whose commit
is refused are dropped untold; else ``commit()`` before ``close()``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kazoo.client import KazooState
from kazoo.exceptions import KazooException

from hpbroker.client.consumer import TopicPartition
from hpbroker.coord.groups import (
    ConsumerRegistration,
    GroupRegistry,
    PartitionOwner,
    default_consumer_id,
    range_assignment,
)
from hpbroker.coord.paths import (
    DEFAULT_ROOT,
    ZkPaths,
    check_consumer_id,
    check_group,
    check_topic,
    parse_connect_string,
)
from hpbroker.coord.registry import BrokerRegistry
from hpbroker.coord.session import Session
from hpbroker.coord.watches import watch_data
from hpbroker.coord.zk_security import GroupCredentials, member_acl, wait_for_node
from hpbroker.errors import AuthorizationError, CoordinationError, InvalidConfigError, InvalidRequestError
from hpbroker.records import Record

if TYPE_CHECKING:
    from hpbroker.client.connection import BrokerConnection
    from hpbroker.client.consumer import Consumer

__all__ = ["LEASE_FRACTION", "GroupConfig", "GroupMember"]

logger = logging.getLogger(__name__)

LEASE_FRACTION = 3  # the lease is session_timeout / LEASE_FRACTION after the last confirmed contact
_CONFIRM_RETRY_S = 0.2  # pause between ownership reads that ZooKeeper did not answer
_WARN_EVERY_ATTEMPTS = 10  # a rebalance that keeps failing is a warning every this many attempts
_ZK_ERRORS = (KazooException, CoordinationError)


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """A group member's settings, validated on construction (given to ``Consumer`` by name)."""

    #: the group's id: the members of one group share the partitions of its topics.
    group: str
    #: the topics to consume (a list or tuple of names, at least one).
    topics: tuple[str, ...]
    #: ZooKeeper's connect string, ``host:port[,host:port...][/chroot]``: the brokers' one.
    zookeeper: str
    #: this member's id in the group; default ``<host>-<pid>-<8 random hex digits>``.
    consumer_id: str | None = None
    #: ms ZooKeeper keeps the member's session without hearing from it: a member that dies is
    #: replaced after this long.  The lease is a third of it.  Default 6000.
    session_timeout_ms: int = 6_000
    #: commit positions every ``auto_commit_interval_ms``, before a release and at close().
    enable_auto_commit: bool = True
    #: ms between automatic commits.  Default 5000.
    auto_commit_interval_ms: int = 5_000
    #: ms before retrying a rebalance that met a partition still owned by another member;
    #: doubles per attempt, jittered by ±50 %.  Default 200.
    rebalance_backoff_ms: int = 200
    #: ms, the longest of those waits.  Default 2000.
    rebalance_backoff_max_ms: int = 2_000
    #: ms one ZooKeeper round (and the first connection) may take; None: the session timeout.
    zookeeper_timeout_ms: int | None = None
    #: where hpbroker's tree hangs in ZooKeeper (``ZkPaths.root``).  Default ``/hpbroker``.
    zookeeper_root: str = DEFAULT_ROOT
    #: ``callable(partitions)``, told of partitions taken, after their positions are set (module
    #: docstring, "Rebalance listener").  Default None.
    on_assign: Callable[[set[TopicPartition]], object] | None = None
    #: ``callable(partitions)``, told of partitions about to be released, while still owned.
    on_revoke: Callable[[set[TopicPartition]], object] | None = None
    #: ``callable(partitions)``, told of partitions found lost (already dropped); None: ``on_revoke``.
    on_lost: Callable[[set[TopicPartition]], object] | None = None

    def __post_init__(self) -> None:
        check_group(self.group)
        topics = (self.topics,) if isinstance(self.topics, str) else self.topics
        if not isinstance(topics, (list, tuple)) or not topics:
            raise InvalidConfigError(f"topics must be a non-empty list of topic names, got {self.topics!r}")
        object.__setattr__(self, "topics", tuple(sorted({check_topic(topic) for topic in topics})))
        parse_connect_string(self.zookeeper)
        ZkPaths(self.zookeeper_root)
        if self.consumer_id is not None:
            check_consumer_id(self.consumer_id)
        for name in ("on_assign", "on_revoke", "on_lost"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise InvalidConfigError(f"{name} must be a callable taking a set of TopicPartitions, "
                                         f"or None, got {getattr(self, name)!r}")
        if not isinstance(self.enable_auto_commit, bool):
            raise InvalidConfigError(f"enable_auto_commit must be True or False, "
                                     f"got {self.enable_auto_commit!r}")
        for name in ("session_timeout_ms", "auto_commit_interval_ms", "rebalance_backoff_ms",
                     "rebalance_backoff_max_ms", "zookeeper_timeout_ms"):
            value = getattr(self, name)
            if value is None and name == "zookeeper_timeout_ms":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value < 2**31:
                raise InvalidConfigError(f"{name} must be an integer in [1, {2**31 - 1}], got {value!r}")

    @classmethod
    def take(cls, settings: dict[str, object]) -> GroupConfig:
        """Build from ``settings``, removing the names that are this class's fields."""
        names = {f.name for f in dataclasses.fields(cls)}
        taken = {name: settings.pop(name) for name in list(settings) if name in names}
        missing = [name for name in ("group", "topics", "zookeeper") if name not in taken]
        if missing:
            raise InvalidConfigError(f"a consumer group needs group=, topics= and zookeeper=; missing: "
                                     f"{', '.join(missing)}")
        return cls(**taken)  # type: ignore[arg-type]


class GroupMember:
    """A consumer's membership in its group (module docstring).  Made by the ``Consumer``; its
    methods run on the consumer's thread, except the kazoo callbacks ``_on_state`` and
    ``_changed``, which only set flags and wake the consumer.  ``connection``: the consumer's
    bootstrap connection, asked for the group's ZooKeeper credentials when it carries a key
    pair (module docstring, "Security")."""

    def __init__(self, consumer: Consumer, config: GroupConfig, connection: BrokerConnection) -> None:
        self.config = config
        self.consumer_id = config.consumer_id or default_consumer_id()
        self._consumer = consumer
        self._prefix = f"[group {config.group} {self.consumer_id}]"
        session_timeout_s = config.session_timeout_ms / 1000
        self.lease_s = session_timeout_s / LEASE_FRACTION
        timeout_s = (config.zookeeper_timeout_ms or config.session_timeout_ms) / 1000
        self._paths = ZkPaths(config.zookeeper_root)
        # Written by kazoo's threads (single assignments), read by the consumer's thread.
        self._epoch = 0  # +1 at every SUSPENDED or LOST: a lease confirmed across one is void
        self._losses = 0  # +1 at every LOST or new session
        self._suspended = False
        self._rebalance_needed = True
        self._lease_until = 0.0  # monotonic time until which owned records may be handed out
        self._session_id: int | None = None
        # The consumer's thread only.
        self._losses_handled = 0
        self._owned: dict[TopicPartition, int] = {}  # -> the session id that claimed it
        self._unstarted: set[TopicPartition] = set()  # claimed, committed offset not read yet
        self._committed: dict[TopicPartition, int] = {}  # what this member last committed or read
        self._announced: set[TopicPartition] = set()  # told to on_assign, not yet revoked or lost
        self._listener_error: BaseException | None = None  # the first a listener raised, to raise
        # listeners running (one inside another: a commit in one refused, telling on_lost), and the
        # thread they run on: poll() and close() from inside one are refused (in_listener)
        self._listener_depth = 0
        self._listener_thread: int | None = None
        self._attempts = 0  # failed rebalance passes in a row
        self._retry_at = 0.0
        self._confirm_retry_at = 0.0
        self._next_commit_at = time.monotonic() + config.auto_commit_interval_ms / 1000
        self._watches: list[Any] = []
        self._registration = ConsumerRegistration(self.consumer_id, config.topics, socket.gethostname(),
                                                  os.getpid())
        credentials = _group_credentials(connection, config.group, timeout_s, self._prefix)
        self._session = Session(config.zookeeper, session_timeout_s=session_timeout_s,
                                connect_timeout_s=timeout_s, name=f"group {config.group}",
                                auth=[credentials.credentials] if credentials else (),
                                acl=member_acl(credentials.acl_ids) if credentials else None)
        self._session.start()
        try:
            if credentials is not None:
                wait_for_node(self._session, self._paths.group(config.group), timeout_s,
                              "the broker that issued the group's credentials creates it")
            self._session_id = self._session.session_id
            self.registry = GroupRegistry(self._session, config.group, self._paths, timeout_s=timeout_s)
            self._session.client.add_listener(self._on_state)
            self.registry.register(self._registration)
            self._watches.append(self.registry.watch_members(self._changed))
            self._watches.append(BrokerRegistry(self._session, self._paths).watch_ids(self._changed))
            for topic in config.topics:
                self._watches.append(watch_data(self._session.client, self._paths.topic(topic),
                                                self._changed))
        except AuthorizationError as e:  # the group's ACL does not let this session in
            self._session.close()
            raise AuthorizationError(f"{self._prefix} cannot join the group through ZooKeeper at "
                                     f"{self._session.connect_string}: {e.message}") from None
        except KazooException as e:  # connected, then cut off while joining
            self._session.close()
            raise CoordinationError(f"{self._prefix} cannot join the group through ZooKeeper at "
                                    f"{self._session.connect_string}: {e!r}") from e
        except BaseException:
            self._session.close()
            raise
        logger.info("%s joined, subscribing to %s (session timeout %d ms, lease %.0f ms)", self._prefix,
                    ", ".join(config.topics), config.session_timeout_ms, self.lease_s * 1000)

    # --- kazoo's threads ------------------------------------------------------------------------

    def _changed(self, *_: object) -> None:
        """A watch fired: members, brokers or a topic changed."""
        self._rebalance_needed = True
        self._consumer._nudge()

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            client_id = self._session.client.client_id
            session_id = None if client_id is None else client_id[0]
            if session_id != self._session_id:
                self._session_id = session_id
                self._losses += 1
            self._suspended = False
        else:  # SUSPENDED or LOST: nothing is handed out until the ownership is confirmed again
            self._epoch += 1
            self._lease_until = 0.0
            self._suspended = True
            if state == KazooState.LOST:
                self._losses += 1
        self._rebalance_needed = True
        self._consumer._nudge()

    # --- the consumer's thread: called by the fetch loop ----------------------------------------

    def service(self, now: float) -> None:
        """Handle a lost session, rebalance, auto-commit: whatever is due."""
        if self._losses != self._losses_handled:
            self._losses_handled = self._losses
            if self._owned:
                logger.warning("%s the ZooKeeper session expired: dropping %s without committing",
                               self._prefix, _names(self._owned))
                self._lose(list(self._owned))
            self._attempts, self._retry_at = 0, 0.0
        if self._suspended:
            return
        if self._rebalance_needed and now >= self._retry_at:
            self._rebalance()
        if self.config.enable_auto_commit and now >= self._next_commit_at:
            self._next_commit_at = now + self.config.auto_commit_interval_ms / 1000
            try:
                self._commit_positions(self._owned)
            except _ZK_ERRORS as e:
                logger.warning("%s automatic commit failed (next in %d ms): %r", self._prefix,
                               self.config.auto_commit_interval_ms, e)

    def next_due(self, now: float) -> float:
        """When :meth:`service` or a new ownership read has something to do (monotonic time)."""
        if self._losses != self._losses_handled:
            return now
        if self._suspended:
            return float("inf")  # the reconnection wakes the consumer
        due = self._retry_at if self._rebalance_needed else float("inf")
        if self._owned and self.config.enable_auto_commit:
            due = min(due, self._next_commit_at)
        if self._owned and self._confirm_retry_at > now:
            due = min(due, self._confirm_retry_at)
        return due

    def may_hand_out(self) -> bool:
        """Whether records of the owned partitions may be handed out now: the lease runs, or a
        synchronous read of the ownership nodes renewed it (dropping partitions found lost)."""
        return time.monotonic() < self._lease_until or self._renew_lease()

    def leased(self, tp: TopicPartition, records: Iterator[Record]) -> Iterator[Record]:
        """``records`` of ``tp`` for an iteration, each handed out under the lease.  When the lease
        cannot be renewed the rest is not handed out: discarded if ``tp`` was lost, else fetched
        again later from the first record held back."""
        clock = time.monotonic
        for record in records:
            if clock() >= self._lease_until and not self._may_continue(tp, record.offset):
                return
            yield record

    def _may_continue(self, tp: TopicPartition, offset: int) -> bool:
        allowed = self._renew_lease()
        if tp not in self._owned:
            return False
        if not allowed:
            self._consumer.seek(tp, offset)
        return allowed

    # --- the lease ------------------------------------------------------------------------------

    def _renew_lease(self) -> bool:
        now = time.monotonic()
        if not self._owned:
            return True
        if self._suspended or self._losses != self._losses_handled or now < self._confirm_retry_at:
            return False
        epoch, sent_at = self._epoch, time.monotonic()
        try:
            owners = self.registry.owners(list(self._owned))
        except _ZK_ERRORS as e:
            self._confirm_retry_at = time.monotonic() + _CONFIRM_RETRY_S
            logger.info("%s cannot confirm ownership (%r): holding records back", self._prefix, e)
            return False
        lost = [TopicPartition(*tp) for tp, owner in owners.items()
                if owner != PartitionOwner(self.consumer_id, self._owned[TopicPartition(*tp)])]
        if lost:
            logger.warning("%s lost %s (owner node gone or someone else's): dropping, uncommitted",
                           self._prefix, _names(lost))
            self._lose(lost)
            self._rebalance_needed = True
        if epoch != self._epoch or self._suspended:
            return False
        self._lease_until = sent_at + self.lease_s
        return True

    # --- rebalancing ----------------------------------------------------------------------------

    def _rebalance(self) -> None:
        self._rebalance_needed = False  # a change during the pass marks another one
        before = set(self._owned)
        try:
            target = self._target()
            conflict = self._apply(target)
        except _ZK_ERRORS as e:
            self._backoff(f"rebalance failed: {e!r}")
            return
        if conflict is not None:
            topic, partition, owner = conflict
            try:
                self._release(list(self._owned))
            except _ZK_ERRORS as e:
                logger.warning("%s releasing after a conflict failed: %r", self._prefix, e)
            self._backoff(f"{topic}-{partition} is still owned by {owner}; released everything")
            return
        self._attempts = 0
        if set(self._owned) != before or not before:
            logger.info("%s owns %d partitions: %s", self._prefix, len(self._owned), _names(self._owned))

    def _backoff(self, reason: str) -> None:
        self._attempts += 1
        base_ms = min(self.config.rebalance_backoff_max_ms,
                      self.config.rebalance_backoff_ms << min(self._attempts - 1, 16))
        delay_s = base_ms * random.uniform(0.5, 1.5) / 1000
        self._retry_at = time.monotonic() + delay_s
        self._rebalance_needed = True
        level = logging.WARNING if self._attempts % _WARN_EVERY_ATTEMPTS == 0 else logging.INFO
        logger.log(level, "%s %s; rebalancing again in %.0f ms (attempt %d)", self._prefix, reason,
                   delay_s * 1000, self._attempts)

    def _target(self) -> set[TopicPartition]:
        """The partitions this member should own, from the registries as they are now."""
        if not self.registry.is_registered(self.consumer_id):
            self.registry.register(self._registration)
        members = self.registry.members()
        if self.consumer_id not in members:
            raise CoordinationError(f"{self._prefix} its own registration is not readable yet")
        partitions = self.registry.partition_counts(self.config.topics)
        assignment = range_assignment({c: m.topics for c, m in members.items()},
                                      {topic: range(count) for topic, count in partitions.items()})
        return {TopicPartition(topic, partition) for topic, partition in assignment[self.consumer_id]}

    def _apply(self, target: set[TopicPartition]) -> tuple[str, int, str] | None:
        """Release what is no longer ours, claim the rest, start what was claimed.  Returns
        ``(topic, partition, owner)`` of a partition still owned by another member, else None."""
        self._release([tp for tp in self._owned if tp not in target])
        for tp in sorted(target - set(self._owned)):
            if not self.registry.claim(tp.topic, tp.partition, self.consumer_id):
                owner = self.registry.owner(tp.topic, tp.partition)
                return tp.topic, tp.partition, owner.consumer_id if owner is not None else "(gone now)"
            assert self._session_id is not None
            self._owned[tp] = self._session_id
            self._unstarted.add(tp)
        if self._unstarted:
            starting = sorted(self._unstarted)
            committed = self.registry.committed_offsets(starting)
            started = []
            for tp in starting:
                found = committed.get(tp)
                offset = None if found is None else found.offset
                self._consumer._group_take(tp, offset)
                if offset is not None:
                    self._committed[tp] = offset
                self._unstarted.discard(tp)
                started.append(tp)
                logger.debug("%s took %s from %s", self._prefix, tp,
                             f"the committed offset {offset}" if offset is not None
                             else f"auto_offset_reset={self._consumer.config.auto_offset_reset}")
            self._announced.update(started)
            self._tell(self.config.on_assign, "on_assign", started)
        return None

    def _release(self, partitions: list[TopicPartition]) -> None:
        """Commit (with auto-commit on), then delete the ownership nodes, then drop."""
        if not partitions:
            return
        revoked = [tp for tp in partitions if tp in self._announced]
        self._announced.difference_update(revoked)
        self._tell(self.config.on_revoke, "on_revoke", revoked)
        if self.config.enable_auto_commit:
            self._commit_positions(partitions)
        for tp in partitions:
            if tp in self._owned:
                self.registry.release(tp.topic, tp.partition, self.consumer_id)
                self._drop([tp])
        logger.debug("%s released %s", self._prefix, _names(partitions))

    def _lose(self, partitions: Iterable[TopicPartition]) -> None:
        """Drop partitions found lost, uncommitted, and tell ``on_lost`` (or ``on_revoke``)."""
        partitions = list(partitions)
        self._drop(partitions)
        lost = [tp for tp in partitions if tp in self._announced]
        self._announced.difference_update(lost)
        self._tell(self.config.on_lost or self.config.on_revoke, "on_lost", lost)

    def _tell(self, listener: Callable[[set[TopicPartition]], object] | None, name: str,
              partitions: Iterable[TopicPartition]) -> None:
        """Call a rebalance listener with ``partitions`` (not when there are none); what it
        raises is logged and kept for :meth:`raise_listener_error`."""
        told = set(partitions)
        if listener is None or not told:
            return
        self._listener_depth += 1
        self._listener_thread = threading.get_ident()
        try:
            listener(told)
        except Exception as e:
            logger.error("%s the %s listener raised %r (told of %s)", self._prefix, name, e, _names(told))
            if self._listener_error is None:
                self._listener_error = e
        finally:
            self._listener_depth -= 1

    @property
    def in_listener(self) -> bool:
        """Whether the calling thread is inside a rebalance listener (at any depth): poll(),
        iteration and close() from there are refused."""
        return self._listener_depth > 0 and self._listener_thread == threading.get_ident()

    def raise_listener_error(self) -> None:
        """Raise (once) the first error a rebalance listener raised since the last call."""
        error, self._listener_error = self._listener_error, None
        if error is not None:
            raise error

    def _drop(self, partitions: Iterable[TopicPartition]) -> None:
        """Forget partitions locally: stop fetching them, discard their records."""
        for tp in list(partitions):
            self._owned.pop(tp, None)
            self._unstarted.discard(tp)
            self._committed.pop(tp, None)
            self._consumer._group_drop(tp)

    # --- commits --------------------------------------------------------------------------------

    def _commit_positions(self, partitions: Iterable[TopicPartition], positions: Mapping[TopicPartition, int]
                          | None = None, *, force: bool = False, tell: bool = True) -> set[TopicPartition]:
        """Commit the positions of ``partitions`` that moved since the last commit (all of them
        with ``force``); partitions found no longer owned are dropped and returned, and told to
        ``on_lost`` unless ``tell`` is False (at close)."""
        if positions is None:
            positions = self._consumer._group_positions()
        offsets = {tp: positions[tp] for tp in partitions
                   if tp in positions and tp in self._owned and tp not in self._unstarted
                   and (force or self._committed.get(tp) != positions[tp])}
        if not offsets:
            return set()
        refused = {TopicPartition(*tp) for tp in self.registry.commit(offsets, self.consumer_id)}
        for tp, offset in offsets.items():
            if tp not in refused:
                self._committed[tp] = offset
        if refused:
            logger.warning("%s not committed, no longer owned: %s; dropping", self._prefix, _names(refused))
            if tell:
                self._lose(refused)
            else:
                self._drop(refused)
                self._announced.difference_update(refused)
            self._rebalance_needed = True
        return refused

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Commit ``offsets`` (default: every owned partition's position), synchronously.
        CoordinationError when ZooKeeper cannot be reached or a partition is not owned."""
        if offsets is None:
            positions = self._consumer._group_positions()
            partitions: list[TopicPartition] = list(self._owned)
        else:
            positions = {TopicPartition(*tp): offset for tp, offset in offsets.items()}
            partitions = list(positions)
            strangers = [tp for tp in partitions if tp not in self._owned or tp in self._unstarted]
            if strangers:
                raise CoordinationError(f"{self._prefix} cannot commit {_names(strangers)}: not owned by "
                                        f"this consumer (owned: {_names(self._owned) or 'none'})")
        refused = self._commit_positions(partitions, positions, force=True)
        if refused:
            raise CoordinationError(f"{self._prefix} not committed: {_names(refused)} no longer owned by "
                                    "this consumer")

    def committed(self, tp: TopicPartition) -> int | None:
        return self.registry.committed(tp.topic, tp.partition)

    def close(self, positions: Mapping[TopicPartition, int]) -> None:
        """Commit ``positions`` (with auto-commit on and the session intact), then leave: closing
        the session deletes the registration and the ownership nodes at once.  Calls no
        listener, from whichever thread it runs on: partitions whose commit is refused (no
        longer owned) are dropped untold."""
        for watch in self._watches:
            watch.cancel()
        try:
            if self.config.enable_auto_commit and self._owned and not self._suspended \
                    and self._losses == self._losses_handled:
                self._commit_positions(list(self._owned), positions, tell=False)
        except (*_ZK_ERRORS, AuthorizationError) as e:
            logger.warning("%s the final commit failed: %r", self._prefix, e)
        finally:
            self._session.close()
        logger.info("%s left the group", self._prefix)


def _group_credentials(connection: BrokerConnection, group: str, timeout_s: float, prefix: str
                       ) -> GroupCredentials | None:
    """The group's ZooKeeper credentials from the broker at ``connection``, when the connection
    has a key pair (module docstring, "Security"); None without one, or from a broker without
    security or ZooKeeper (error 10).  AuthorizationError when the principal may not consume
    the group."""
    if connection.security is None:
        return None
    from hpbroker import protocol

    try:
        answer = connection.call(protocol.GroupCredentialsRequest(group=group), timeout_s)
    except InvalidRequestError as e:
        logger.info("%s broker %s hands out no ZooKeeper credentials (%s): joining without",
                    prefix, connection.address, e)
        return None
    if not answer.zookeeper_user or not answer.acl_ids:
        raise CoordinationError(f"{prefix} broker {connection.address} answered the group's credentials "
                                "without a user or ACL ids")
    return GroupCredentials(answer.zookeeper_user, answer.zookeeper_password, tuple(answer.acl_ids))


def _names(partitions: Iterable[tuple[str, int]]) -> str:
    return ", ".join(f"{topic}-{partition}" for topic, partition in sorted(partitions))
