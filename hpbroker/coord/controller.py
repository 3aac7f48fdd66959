"""The controller: the one broker of a cluster that decides who leads each replicated partition.

Every broker runs a :class:`Controller`; at most one is *active* at a time, as in Kafka's
ZooKeeper-era clusters.  ``docs/COORDINATION.md`` draws the znodes; in short::

    /controller        ephemeral   {"version": 1, "broker_id": 0, "timestamp_ms": 1718000000000}
    /controller_epoch  persistent  {"version": 1, "epoch": 7}

**Election.**  A controller that finds no ``/controller`` node commits one ZooKeeper transaction
that creates it (ephemeral, its broker id) *and* increments ``/controller_epoch`` (created with
1 the first time), conditional on the epoch node's version it read.  Winning the node and bumping
the epoch are one step, so a broker that lost the race, or whose session has expired, can never
bump the epoch.  The winner remembers the epoch node's new znode version; every partition state it
writes afterwards (``hpbroker.coord.partition_state``: :func:`create_states`, :func:`update_state`
with ``controller_epoch_version``) is a transaction that checks that version.  Once another
controller has been elected the version has moved on, so a deposed controller's writes are
refused by ZooKeeper itself; the refused controller checks and steps down.  Every controller
watches ``/controller``: when it disappears (its holder's session expired, or the holder resigned
in :meth:`Controller.close`) each tries again.  The active one steps down when its session
expires, when the node is deleted (it then competes again) or when it finds another holder.

**What the active controller does** (Kafka's partition state machine, on level: every pass reads
the live brokers, the replicated topics and their partition states, and writes what the rules
below change, so a missed or merged event is repaired by the next pass):

- a replicated topic (a topic node with ``replicas``) whose partitions have no state yet: leader =
  its first live replica in assignment order, ISR = its live replicas in assignment order, leader
  epoch 0; none alive: leader -1 and an empty ISR (the first replica to appear then becomes
  leader, as the partition never held a record);
- a leader gone (or no longer a replica of its partition, after a reassignment, or -1): the new
  leader is the first replica in assignment order that is alive and in the ISR; the ISR loses
  the brokers that are gone; the leader epoch goes up by one.  No ISR member alive:
  ``unclean_leader_election(topic)`` true elects the first live replica (ISR = just it), else the
  partition goes offline (leader -1, leader epoch + 1, the ISR left as its last members so that
  the first of them to return becomes leader);
- a reassignment dropped the leader but no replica of the new list is in the ISR (the new replica
  fell behind just before the last step): the leader keeps leading with its ISR, logged at
  WARNING, until a replica of the list is in the ISR; then leadership moves to it.  A broker that
  is no longer a replica leaves the ISR only when a replica stays in it: the ISR never loses the
  only brokers that hold the committed records;
- a follower gone: the ISR loses it, leader and leader epoch unchanged;
- a broker that reports its replica of a partition offline (``offline_partitions`` in its
  registration: its worker slot crash-loops) counts as gone for that partition alone, and as
  back once the report is withdrawn;
- a broker that re-registered with a new session (a restart faster than ZooKeeper noticed, seen
  by the creation zxid of its node) is treated as gone and back, once per topic, and never by an
  unclean election: with the ISR holding just it, the partition goes offline for a moment and it
  leads again in a new epoch;
- every ``rebalance_interval_s`` (``auto_leader_rebalance``): a partition whose preferred replica
  (the first of its assignment) is alive, in the ISR and not the leader gets it back as leader
  (leader epoch + 1, ISR unchanged).

A state write whose version condition fails (a leader changed its ISR meanwhile) is followed by
a read of the state and a new decision; leaders' own ISR writes never conflict with ours unseen.
Each decision is logged at INFO: ``[controller] elected broker 2 leader of orders-0 in epoch 3
(broker 1 gone); isr [2, 0]``.

**Threads.**  Watch callbacks and kazoo's state listener run on kazoo's threads; they only add an
event to a coalescing queue (controller node changed, brokers changed, topics changed, session
lost or re-established) and wake the controller's own thread, which does every read, decision and
write, one event batch at a time.  Decisions are therefore serial and kazoo's threads never wait
for ZooKeeper.  Brokers and topics are watched with ZooKeeper's one-shot watches, set again by
each pass's reads: kazoo's re-arming children watch stays silent when a broker's node is replaced
by an identical name, which is exactly a fast restart.  A failed pass (connection lost) is retried
on reconnection and at least every :data:`RETRY_S`; a topic whose reads or writes fail is logged
and left for that retry while the pass goes on with the other topics.

Create the controller in the process that uses it, after any ``fork``, on a started session.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NoNodeError, RolledBackError, RuntimeInconsistency

from hpbroker.coord.partition_state import (
    NO_LEADER,
    PartitionState,
    create_states,
    decode_state,
    read_state,
    update_state,
)
from hpbroker.coord.paths import ZkPaths, check_broker_id
from hpbroker.coord.registry import TopicRegistration, decode_broker, decode_topic
from hpbroker.coord.session import Session
from hpbroker.coord.watches import Watch, watch_data
from hpbroker.errors import CoordinationError, HPBrokerError, InvalidConfigError

__all__ = [
    "RETRY_S",
    "Controller",
    "awaits_new_replicas",
    "failover_state",
    "initial_state",
    "preferred_state",
    "read_controller",
]

logger = logging.getLogger(__name__)

RETRY_S = 1.0  # longest wait before a failed election or pass is tried again
FORMAT_VERSION = 1  # the "version" field of /controller and /controller_epoch
_JOIN_TIMEOUT_S = 5.0  # how long close() waits for the controller's thread
_CLOSE_TIMEOUT_S = 2.0  # how long close() waits for ZooKeeper to delete /controller
_WRITE_ATTEMPTS = 5  # decide-and-write rounds for one partition whose state keeps changing

# Events handed from kazoo's threads to the controller's thread (a set: repeats merge).
_ELECTION = "controller node changed"
_BROKERS = "brokers changed"
_TOPICS = "topics changed"
_SESSION = "session re-established"
_SESSION_LOST = "session lost"
_REBALANCE = "preferred leader rebalance"

Unclean = Callable[[str], bool]  # topic -> whether an out-of-sync replica may become leader


# --- the rules, pure ----------------------------------------------------------------------------


def initial_state(replicas: Sequence[int], live: Collection[int], *, controller_epoch: int,
                  topic_id: str = "") -> PartitionState:
    """A new partition's state: its live replicas in assignment order, the first of them leader
    (leader -1 and an empty ISR when none is alive), leader epoch 0, the topic's id."""
    isr = tuple(r for r in replicas if r in live)
    return PartitionState(isr[0] if isr else NO_LEADER, 0, isr, controller_epoch, topic_id)


def failover_state(replicas: Sequence[int], state: PartitionState, live: Collection[int], *,
                   controller_epoch: int, unclean: Callable[[], bool]) -> tuple[PartitionState, str] | None:
    """The state a partition must move to when brokers are gone or back (module docstring), with
    the reason to log; None when it stays.  ``unclean()`` is asked only when no ISR member is
    alive and another replica is.

    A reassignment's last step can leave the ISR with no member of the new replica list (the new
    replica fell behind just before): the ISR members that are no longer replicas then hold the
    only copies of the committed records, so they stay in the ISR and the current leader keeps
    leading (:func:`awaits_new_replicas`); a non-replica leaves the ISR only when a replica stays
    in it."""
    alive = [r for r in replicas if r in live]
    if not state.isr:  # never had a leader: it holds no record anywhere
        if not alive:
            return None
        return (PartitionState(alive[0], state.leader_epoch + 1, tuple(alive), controller_epoch,
                               state.topic_id),
                "its first live replica")
    live_isr = _live_isr(replicas, state.isr, live)
    if state.leader != NO_LEADER and state.leader in live and (state.leader in replicas
                                                               or state.leader in live_isr):
        if live_isr == state.isr:
            return None
        return (PartitionState(state.leader, state.leader_epoch, live_isr, controller_epoch, state.topic_id),
                _gone([b for b in state.isr if b not in live_isr], replicas))
    why = "it had no leader" if state.leader == NO_LEADER else _gone([state.leader], replicas)
    # the first in-sync replica in assignment order; none: an in-sync former replica (it holds
    # every committed record) until a replica of the new list is in sync
    candidates = [r for r in replicas if r in live_isr] or list(live_isr)
    if candidates:
        return (PartitionState(candidates[0], state.leader_epoch + 1, live_isr, controller_epoch,
                                state.topic_id), why)
    if alive and unclean():
        return (PartitionState(alive[0], state.leader_epoch + 1, (alive[0],), controller_epoch,
                               state.topic_id),
                f"{why}; no in-sync replica alive: unclean leader election")
    if state.leader == NO_LEADER:
        return None
    return (PartitionState(NO_LEADER, state.leader_epoch + 1, state.isr, controller_epoch, state.topic_id),
            f"{why}; no in-sync replica alive and unclean leader election off")


def awaits_new_replicas(replicas: Sequence[int], state: PartitionState, live: Collection[int]) -> bool:
    """Whether the partition is led by a broker that is no longer one of its replicas because no
    replica of the (reassigned) list is in the ISR yet: leadership moves once one is."""
    return (state.leader != NO_LEADER and state.leader not in replicas and state.leader in live
            and state.leader in state.isr and not any(r in state.isr for r in replicas))


def _live_isr(replicas: Sequence[int], isr: Sequence[int], live: Collection[int]) -> tuple[int, ...]:
    """The ISR without the brokers gone, and without the brokers that are no longer replicas
    provided a replica stays in it."""
    in_sync = tuple(b for b in isr if b in live)
    return tuple(b for b in in_sync if b in replicas) or in_sync


def preferred_state(replicas: Sequence[int], state: PartitionState, live: Collection[int], *,
                    controller_epoch: int) -> tuple[PartitionState, str] | None:
    """Leadership back to the preferred replica (the first of the assignment) when it is alive, in
    the ISR and not the leader; None otherwise."""
    preferred = replicas[0]
    if state.leader in (preferred, NO_LEADER) or preferred not in live or preferred not in state.isr:
        return None
    return (PartitionState(preferred, state.leader_epoch + 1, state.isr, controller_epoch, state.topic_id),
            f"preferred replica; broker {state.leader} led")


def _gone(brokers: Sequence[int], replicas: Sequence[int]) -> str:
    """``broker 1 gone``, ``brokers [1, 2] gone``, ``broker 3 no longer a replica``."""
    parts = []
    for what, group in (("gone", [b for b in brokers if b in replicas]),
                        ("no longer a replica", [b for b in brokers if b not in replicas])):
        if group:
            parts.append(f"broker {group[0]} {what}" if len(group) == 1 else f"brokers {group} {what}")
    return ", ".join(parts)


# --- node data ----------------------------------------------------------------------------------


def _encode(document: dict[str, Any]) -> bytes:
    return json.dumps({"version": FORMAT_VERSION, **document}, sort_keys=True,
                      separators=(",", ":")).encode("utf-8")


def _decode_field(data: bytes, field: str, path: str) -> int:
    """The integer ``field`` of a controller node; CoordinationError when it is not one."""
    try:
        document = json.loads(data)
        value = document[field] if document.get("version") == FORMAT_VERSION else None
    except (ValueError, UnicodeDecodeError, TypeError, KeyError, AttributeError):
        value = None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise CoordinationError(f"{path} holds {data[:200]!r}, not a version {FORMAT_VERSION} "
                                f"document with a {field!r}")
    return value


def _kazoo(session: Session | KazooClient) -> KazooClient:
    return session.client if isinstance(session, Session) else session


def read_controller(client: Session | KazooClient, paths: ZkPaths) -> tuple[int, int] | None:
    """``(broker id, controller epoch)`` of the active controller, None when there is none.  The
    pair is consistent: both nodes are written by one transaction, so their zxids match (read
    again when an election happened between the two reads)."""
    kazoo = _kazoo(client)
    for _ in range(3):
        try:
            data, stat = kazoo.get(paths.controller)
        except NoNodeError:
            return None
        broker_id = _decode_field(data, "broker_id", paths.controller)
        try:
            epoch_data, epoch_stat = kazoo.get(paths.controller_epoch)
        except NoNodeError:
            return broker_id, 0
        epoch = _decode_field(epoch_data, "epoch", paths.controller_epoch)
        if epoch_stat.mzxid == stat.czxid:
            break
    return broker_id, epoch


def _failed(results: list[Any]) -> tuple[int, Exception] | None:
    """The index and error of the operation that failed a transaction, None if it committed."""
    for index, result in enumerate(results):
        if isinstance(result, Exception) and not isinstance(result, (RolledBackError, RuntimeInconsistency)):
            return index, result
    return None


@dataclass(frozen=True, slots=True)
class _Held:
    """What an active controller won: its epoch, the epoch node's version it set, its session."""

    epoch: int
    epoch_version: int
    session_id: int


class _Deposed(Exception):
    """Another controller was elected while this one was deciding."""


# --- the controller -----------------------------------------------------------------------------


class Controller:
    """Competes for the controller role and, while it holds it, keeps every replicated
    partition's leader and ISR right (module docstring).  ``start``, ``close``, ``state`` and the
    properties may be called from any thread; the work runs on the controller's own thread."""

    def __init__(self, session: Session | KazooClient, paths: ZkPaths, broker_id: int, *,
                 unclean_leader_election: Unclean = lambda topic: False,
                 auto_leader_rebalance: bool = True, rebalance_interval_s: float = 5.0) -> None:
        if not isinstance(rebalance_interval_s, (int, float)) or not rebalance_interval_s > 0:
            raise InvalidConfigError(f"rebalance_interval_s must be positive, got {rebalance_interval_s!r}")
        self._client = _kazoo(session)
        self.paths = paths
        self.broker_id = check_broker_id(broker_id)
        self._unclean = unclean_leader_election
        self._auto_leader_rebalance = bool(auto_leader_rebalance)
        self._rebalance_interval_s = float(rebalance_interval_s)
        self._wake = threading.Condition()
        self._events: set[str] = set()  # handed over, not yet handled
        self._retry: set[str] = set()  # failed, to try again at _retry_at or on reconnection
        self._retry_at = 0.0
        self._rebalance_at: float | None = None  # monotonic; None while not active
        self._closing = False
        self._held: _Held | None = None  # set and cleared by the controller's thread only
        self._czxids: dict[int, int] = {}  # live broker -> creation zxid of its node, last pass
        self._bounces: dict[int, set[str]] = {}  # bounced broker -> topics not yet handled for it
        # live broker -> the partitions its registration reports offline, last pass
        self._offline: dict[int, Mapping[str, tuple[int, ...]]] = {}
        self._awaiting: dict[tuple[str, int], tuple[Any, ...]] = {}  # warned of (_note_awaiting)
        # state() is read from other threads (the metrics endpoint's): the counters change under
        # _state_lock; a snapshot is a new dict swapped in whole, never changed once published.
        self._state_lock = threading.Lock()
        self._counters = {"elections_won": 0, "leader_elections": 0, "isr_shrinks": 0,
                          "passes": 0, "rebalances": 0}
        self._snapshot: dict[str, Any] = self._inactive_snapshot()
        self._controller_watch: Watch | None = None
        self._thread: threading.Thread | None = None
        self._watcher = self._on_watch  # one object: kazoo keeps a set of watchers per path

    # --- any thread -----------------------------------------------------------------------------

    def start(self) -> None:
        """Watch ``/controller`` and start the controller's thread, which competes for the role
        now and whenever the node disappears.  Returns at once."""
        if self._thread is not None:
            raise RuntimeError("the controller is already started")
        self._client.add_listener(self._on_state)
        self._thread = threading.Thread(target=self._run, name=f"hpbroker-controller-{self.broker_id}",
                                        daemon=True)
        self._thread.start()
        self._controller_watch = watch_data(self._client, self.paths.controller,
                                            lambda data, stat: self._hand_over(_ELECTION))

    def close(self) -> None:
        """Stop the thread and resign: delete ``/controller`` if this controller's session holds
        it, so another broker takes over at once instead of after the session timeout.  The
        session is the caller's and stays open.  Idempotent."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._controller_watch is not None:
            self._controller_watch.cancel()
        self._client.remove_listener(self._on_state)
        if self._thread is not None:
            self._thread.join(_JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                logger.warning("[controller] the controller thread did not stop within %g s", _JOIN_TIMEOUT_S)
        held, self._held = self._held, None
        self._snapshot = self._inactive_snapshot()
        if self._thread is not None and self._client.connected:
            self._resign(held)

    @property
    def is_active(self) -> bool:
        """Whether this broker is the controller (as far as its thread knows)."""
        return self._held is not None

    @property
    def controller_epoch(self) -> int:
        """The controller epoch this controller was elected in; -1 when it is not active."""
        held = self._held
        return -1 if held is None else held.epoch

    def state(self) -> dict[str, Any]:
        """For metrics and ``hpbroker cluster``: ``active``, ``broker_id``, ``controller_epoch``
        (-1 when not active), and as of the last pass of the active controller ``live_brokers``,
        ``topics`` (replicated ones), ``partitions``, ``offline_partitions`` (leader -1),
        ``preferred_replica_imbalance`` (led by another than their first replica); counters since
        start: ``elections_won``, ``leader_elections``, ``isr_shrinks``, ``passes``,
        ``rebalances``.  A copy, consistent, and never waiting for ZooKeeper."""
        with self._state_lock:
            return {**self._snapshot, **self._counters}

    def _count(self, counter: str, n: int = 1) -> None:
        with self._state_lock:
            self._counters[counter] += n

    def _inactive_snapshot(self) -> dict[str, Any]:
        return {"active": False, "broker_id": self.broker_id, "controller_epoch": -1, "live_brokers": [],
                "topics": 0, "partitions": 0, "offline_partitions": 0, "preferred_replica_imbalance": 0}

    # --- kazoo's threads: hand over only ----------------------------------------------------------

    def _hand_over(self, event: str) -> None:
        with self._wake:
            self._events.add(event)
            self._wake.notify()

    def _on_watch(self, event: Any) -> None:
        """A one-shot watch on the brokers, a broker's node, the topics or a topic node fired.
        kazoo also calls every watcher with a path-less event (type NONE) when the connection is
        lost or the session closed, having forgotten the watches: nothing to do then, since
        :meth:`_on_state` queues a pass (which sets them again) once connected."""
        path = event.path
        if not path:
            return
        brokers = path == self.paths.broker_ids or path.startswith(self.paths.broker_ids + "/")
        self._hand_over(_BROKERS if brokers else _TOPICS)

    def _on_state(self, state: str) -> None:
        """kazoo's listener (its connection thread)."""
        if state == KazooState.CONNECTED:
            with self._wake:  # what failed while disconnected is due now
                self._events |= self._retry | {_SESSION, _ELECTION}
                self._retry.clear()
                self._wake.notify()
        elif state == KazooState.LOST:
            self._hand_over(_SESSION_LOST)

    # --- the controller's thread ----------------------------------------------------------------

    def _next_events(self) -> set[str] | None:
        """Wait for events, a due retry or a due rebalance; None when closing."""
        with self._wake:
            while True:
                if self._closing:
                    return None
                now = time.monotonic()
                if self._retry and now >= self._retry_at:
                    self._events |= self._retry
                    self._retry.clear()
                if self._rebalance_at is not None and now >= self._rebalance_at:
                    self._events.add(_REBALANCE)
                    self._rebalance_at = now + self._rebalance_interval_s
                if self._events:
                    events, self._events = self._events, set()
                    return events
                deadlines = [t for t in (self._retry_at if self._retry else None, self._rebalance_at)
                             if t is not None]
                self._wake.wait(max(0.0, min(deadlines) - now) if deadlines else None)

    def _run(self) -> None:
        while (events := self._next_events()) is not None:
            delay_s = RETRY_S
            try:
                self._handle(events)
                continue
            except _Deposed as e:
                self._step_down(str(e))
                events, delay_s = {_ELECTION}, 0.0  # look at /controller now
            except (KazooException, CoordinationError, self._client.handler.timeout_exception) as e:
                logger.warning("[controller] broker %d could not handle %s (trying again within %g s): %r",
                               self.broker_id, ", ".join(sorted(events)), RETRY_S, e)
            except Exception:
                logger.exception("[controller] broker %d failed handling %s", self.broker_id,
                                 ", ".join(sorted(events)))
            with self._wake:
                self._retry |= events - {_SESSION_LOST}
                self._retry_at = time.monotonic() + delay_s

    def _handle(self, events: set[str]) -> None:
        held = self._held
        if held is not None and (_SESSION_LOST in events or self._session_id() != held.session_id):
            self._step_down("its ZooKeeper session expired")
        full_pass = False
        if events & {_ELECTION, _SESSION}:
            full_pass = self._elect()
        if self._held is None:
            return
        rebalance = _REBALANCE in events and self._auto_leader_rebalance
        if full_pass or rebalance or events & {_BROKERS, _TOPICS, _SESSION}:
            self._pass(rebalance=rebalance)

    def _session_id(self) -> int | None:
        """The client's session (kept while disconnected, a new one after an expiry)."""
        client_id = self._client.client_id
        return None if client_id is None else client_id[0]

    # --- election -------------------------------------------------------------------------------

    def _elect(self) -> bool:
        """Look at ``/controller``; compete when it is absent.  True when this controller has
        just become active (a full pass is due)."""
        session_id = self._session_id()
        if session_id is None or not self._client.connected:
            raise CoordinationError("not connected to ZooKeeper")
        try:
            data, stat = self._client.get(self.paths.controller)
        except NoNodeError:
            stat = None
        if stat is not None:
            if stat.ephemeralOwner == session_id:
                if self._held is None:  # won by an earlier try whose answer was lost
                    epoch, version = self._read_epoch()
                    self._activate(epoch, version, session_id)
                    return True
                return False
            if self._held is not None:
                self._step_down(f"{self.paths.controller} is held by another session: {data[:100]!r}")
            return False
        if self._held is not None:
            self._step_down(f"{self.paths.controller} was deleted")
        epoch, version = self._read_epoch()
        if self.paths.root != "/":
            self._client.ensure_path(self.paths.root)
        txn = self._client.transaction()
        txn.create(self.paths.controller, _encode({"broker_id": self.broker_id,
                                                   "timestamp_ms": int(time.time() * 1000)}),
                   ephemeral=True)
        if version < 0:
            txn.create(self.paths.controller_epoch, _encode({"epoch": epoch + 1}))
        else:
            txn.set_data(self.paths.controller_epoch, _encode({"epoch": epoch + 1}), version=version)
        results = txn.commit()
        failed = _failed(results)
        if failed is None:
            self._activate(epoch + 1, 0 if version < 0 else results[1].version, session_id)
            return True
        if failed[0] == 0:  # another broker won: its node's watch brings the news
            logger.debug("[controller] broker %d lost the election: %r", self.broker_id, failed[1])
            return False
        raise CoordinationError(f"{self.paths.controller_epoch} changed during the election: {failed[1]!r}")

    def _read_epoch(self) -> tuple[int, int]:
        """``(epoch, znode version)`` of ``/controller_epoch``; ``(0, -1)`` when it is absent."""
        try:
            data, stat = self._client.get(self.paths.controller_epoch)
        except NoNodeError:
            return 0, -1
        return _decode_field(data, "epoch", self.paths.controller_epoch), stat.version

    def _activate(self, epoch: int, epoch_version: int, session_id: int) -> None:
        self._held = _Held(epoch, epoch_version, session_id)
        self._czxids, self._bounces, self._awaiting = {}, {}, {}
        self._count("elections_won")
        self._snapshot = {**self._inactive_snapshot(), "active": True, "controller_epoch": epoch}
        with self._wake:
            self._rebalance_at = (time.monotonic() + self._rebalance_interval_s
                                  if self._auto_leader_rebalance else None)
        logger.info("[controller] broker %d is the controller (controller epoch %d)", self.broker_id, epoch)

    def _step_down(self, reason: str) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        with self._wake:
            self._rebalance_at = None
        self._snapshot = self._inactive_snapshot()
        logger.warning("[controller] broker %d is no longer the controller (controller epoch %d): %s",
                       self.broker_id, held.epoch, reason)

    def _check_still_controller(self, held: _Held) -> None:
        """Raise _Deposed when another controller bumped the epoch since ``held`` was won."""
        try:
            data, stat = self._client.get(self.paths.controller_epoch)
        except NoNodeError:
            raise _Deposed(f"{self.paths.controller_epoch} was deleted") from None
        if stat.version != held.epoch_version:
            epoch = _decode_field(data, "epoch", self.paths.controller_epoch)
            raise _Deposed(f"another controller was elected (controller epoch {epoch}); "
                           "its state write was refused")

    def _resign(self, held: _Held | None) -> None:
        """Delete ``/controller`` if this session holds it (close())."""
        path = self.paths.controller
        try:
            stat = self._client.exists_async(path).get(timeout=_CLOSE_TIMEOUT_S)
            if stat is None or stat.ephemeralOwner != self._session_id():
                return
            self._client.delete_async(path, version=stat.version).get(timeout=_CLOSE_TIMEOUT_S)
            logger.info("[controller] broker %d resigned as controller (controller epoch %s)", self.broker_id,
                        "?" if held is None else held.epoch)
        except (KazooException, self._client.handler.timeout_exception) as e:
            logger.warning("[controller] broker %d could not resign (%r); %s goes with its session",
                           self.broker_id, e, path)

    # --- a pass over every replicated partition ---------------------------------------------------

    def _pass(self, *, rebalance: bool) -> None:
        """Read brokers, topics and states; write what the rules change (module docstring).  A
        topic that fails is logged and left for the next pass (raised at the end as
        CoordinationError, so that one is due soon) while the others are handled."""
        held = self._held
        assert held is not None
        live = self._live_brokers()
        topics = self._replicated_topics()
        self._note_bounces(live, topics)
        counts = {"partitions": 0, "offline_partitions": 0, "preferred_replica_imbalance": 0}
        failed: list[str] = []
        for name, topic in sorted(topics.items()):
            try:
                self._pass_topic(held, name, topic, set(live), counts, rebalance=rebalance)
            except _Deposed:
                raise
            except (KazooException, self._client.handler.timeout_exception) as e:
                if not self._client.connected:
                    raise  # every topic would fail alike: the pass is tried again on reconnection
                logger.warning("[controller] topic %s left for the next pass: %r", name, e)
                failed.append(name)
            except CoordinationError as e:
                logger.warning("[controller] topic %s left for the next pass: %s", name, e.message)
                failed.append(name)
            except Exception:
                logger.exception("[controller] topic %s left for the next pass", name)
                failed.append(name)
        with self._state_lock:
            self._counters["passes"] += 1
            self._counters["rebalances"] += rebalance
            self._snapshot = {"active": True, "broker_id": self.broker_id, "controller_epoch": held.epoch,
                              "live_brokers": sorted(live), "topics": len(topics), **counts}
        if failed:
            raise CoordinationError(f"the controller's pass failed for topics {failed}")

    def _note_bounces(self, live: dict[int, int], topics: Collection[str]) -> None:
        """Remember the live brokers' sessions; a broker seen with a new one (it bounced) has its
        bounce handled once in each topic (:attr:`_bounces`: done as each topic's pass completes,
        so that a pass tried again never handles it twice)."""
        for broker_id, czxid in sorted(live.items()):
            if self._czxids.get(broker_id, czxid) != czxid:
                logger.info("[controller] broker %d registered again with a new session: its partitions "
                            "move as if it had gone and come back", broker_id)
                self._bounces[broker_id] = set(topics)
        self._czxids = dict(live)
        for broker_id in list(self._bounces):
            pending = self._bounces[broker_id] & set(topics) if broker_id in live else set()
            if pending:
                self._bounces[broker_id] = pending
            else:
                del self._bounces[broker_id]  # handled, gone (handled as gone), or its topics deleted

    def _pass_topic(self, held: _Held, name: str, topic: TopicRegistration, live: set[int],
                    counts: dict[str, int], *, rebalance: bool) -> None:
        bounced = {b for b, pending in self._bounces.items() if name in pending}
        for partition, (state, version) in sorted(self._states(held, topic, live).items()):
            replicas = topic.replicas[partition]
            # a broker that reports its replica offline counts as gone for this partition
            offline = {b for b in live if self._offline.get(b, {}).get(name) and
                       partition in self._offline[b][name]}
            here = live - offline
            # never unclean: a bounced broker back at once is still in sync (it may lead again)
            rules = ([self._failover_rule(name, here - bounced, clean_only=True, offline=offline)]
                     if bounced & set(replicas) else [])
            rules.append(self._failover_rule(name, here, offline=offline))
            if rebalance:
                rules.append(lambda r, s, here=here: preferred_state(r, s, here, controller_epoch=held.epoch))
            for rule in rules:
                settled = self._settle(held, name, partition, replicas, state, version, rule)
                if settled is None:
                    break  # the state node is gone: the topic was deleted meanwhile
                state, version = settled
            else:
                self._note_awaiting(name, partition, replicas, state, here)
                counts["partitions"] += 1
                counts["offline_partitions"] += state.leader == NO_LEADER
                counts["preferred_replica_imbalance"] += state.leader != replicas[0]
        for pending in self._bounces.values():
            pending.discard(name)

    def _note_awaiting(self, topic: str, partition: int, replicas: Sequence[int], state: PartitionState,
                       live: set[int]) -> None:
        """Warn (once per leader epoch and ISR) about a partition whose leader stays on although a
        reassignment dropped it, because no replica of the new list is in the ISR yet."""
        key = (topic, partition)
        if not awaits_new_replicas(replicas, state, live):
            self._awaiting.pop(key, None)
            return
        seen = (state.leader_epoch, state.isr, tuple(replicas))
        if self._awaiting.get(key) != seen:
            self._awaiting[key] = seen
            logger.warning("[controller] broker %d keeps leading %s-%d in epoch %d although it is no longer "
                           "a replica: no replica of %s is in the isr %s yet", state.leader, topic, partition,
                           state.leader_epoch, list(replicas), list(state.isr))

    def _failover_rule(self, topic: str, live: set[int], *, clean_only: bool = False,
                       offline: Collection[int] = (),
                       ) -> Callable[[Sequence[int], PartitionState], tuple[PartitionState, str] | None]:
        held = self._held
        assert held is not None
        unclean = (lambda: False) if clean_only else (lambda: self._unclean_for(topic))

        def rule(replicas: Sequence[int], state: PartitionState) -> tuple[PartitionState, str] | None:
            change = failover_state(replicas, state, live, controller_epoch=held.epoch, unclean=unclean)
            if change is None or not offline:
                return change
            return change[0], f"{change[1]}; broker(s) {sorted(offline)} report their replica offline"
        return rule

    def _unclean_for(self, topic: str) -> bool:
        try:
            return bool(self._unclean(topic))
        except Exception:
            logger.exception("[controller] unclean_leader_election(%r) failed: taken as false", topic)
            return False

    def _settle(self, held: _Held, topic: str, partition: int, replicas: Sequence[int],
                state: PartitionState, version: int,
                rule: Callable[[Sequence[int], PartitionState], tuple[PartitionState, str] | None],
                ) -> tuple[PartitionState, int] | None:
        """Apply ``rule`` until the partition's state satisfies it: write, and on a failed
        condition read again and decide again.  None when the state node is gone."""
        for _ in range(_WRITE_ATTEMPTS):
            change = rule(replicas, state)
            if change is None:
                return state, version
            new, reason = change
            written = update_state(self._client, self.paths, topic, partition, new, expected_version=version,
                                   controller_epoch_version=held.epoch_version)
            if written is not None:
                self._log_change(topic, partition, state, new, reason)
                return new, written
            self._check_still_controller(held)
            current = read_state(self._client, self.paths, topic, partition)
            if current is None:
                return None
            state, version = current
        raise CoordinationError(f"the state of {topic}-{partition} changed {_WRITE_ATTEMPTS} times while "
                                "the controller was deciding")

    def _log_change(self, topic: str, partition: int, old: PartitionState, new: PartitionState,
                    reason: str) -> None:
        if new.leader != old.leader and new.leader != NO_LEADER:
            self._count("leader_elections")
            logger.info("[controller] elected broker %d leader of %s-%d in epoch %d (%s); isr %s",
                        new.leader, topic, partition, new.leader_epoch, reason, list(new.isr))
        elif new.leader != old.leader:
            logger.warning("[controller] %s-%d has no leader in epoch %d (%s); isr %s", topic, partition,
                           new.leader_epoch, reason, list(new.isr))
        else:
            self._count("isr_shrinks")
            logger.info("[controller] isr of %s-%d shrank to %s (%s); leader %d in epoch %d", topic,
                        partition, list(new.isr), reason, new.leader, new.leader_epoch)

    # --- reads (each sets the one-shot watches of the next pass) ----------------------------------

    def _live_brokers(self) -> dict[int, int]:
        """Live broker id -> creation zxid of its node; watches the children of brokers/ids."""
        client = self._client
        try:
            children = client.get_children(self.paths.broker_ids, watch=self._watcher)
        except NoNodeError:
            client.ensure_path(self.paths.broker_ids)
            children = client.get_children(self.paths.broker_ids, watch=self._watcher)
        ids = []
        for child in children:
            try:
                ids.append(self.paths.broker_id_of(child))
            except InvalidConfigError as e:
                logger.warning("[controller] ignoring %s/%s: %s", self.paths.broker_ids, child, e)
        # each node's data too (watched): the partitions a broker reports offline
        pending = {b: client.get_async(self.paths.broker(b), watch=self._watcher) for b in ids}
        live: dict[int, int] = {}
        offline: dict[int, Mapping[str, tuple[int, ...]]] = {}
        for broker_id, answer in pending.items():
            try:
                data, stat = answer.get()
            except NoNodeError:
                continue
            live[broker_id] = stat.czxid
            try:
                reported = decode_broker(data).offline_partitions
            except CoordinationError as e:
                logger.warning("[controller] broker %d's registration: %s; taken as all online", broker_id,
                               e.message)
                continue
            if reported:
                offline[broker_id] = reported
        if offline != self._offline:
            logger.info("[controller] replicas reported offline: %s",
                        {b: dict(topics) for b, topics in sorted(offline.items())} or "none")
        self._offline = offline
        return live

    def _replicated_topics(self) -> dict[str, TopicRegistration]:
        """Every topic node with a replica assignment; watches the topic list and each node."""
        client = self._client
        try:
            names = client.get_children(self.paths.topics, watch=self._watcher)
        except NoNodeError:
            client.ensure_path(self.paths.topics)
            names = client.get_children(self.paths.topics, watch=self._watcher)
        pending = {}
        for name in names:
            try:
                pending[name] = client.get_async(self.paths.topic(name), watch=self._watcher)
            except HPBrokerError as e:  # a name no topic can have
                logger.warning("[controller] ignoring %s/%s: %s", self.paths.topics, name, e)
        topics = {}
        for name, answer in pending.items():
            try:
                data, _ = answer.get()
            except NoNodeError:
                continue
            try:
                topic = decode_topic(name, data)
            except CoordinationError as e:
                logger.warning("[controller] ignoring topic %s: %s", name, e.message)
                continue
            if topic.replicated:
                topics[name] = topic
        return topics

    def _states(self, held: _Held, topic: TopicRegistration,
                live: set[int]) -> dict[int, tuple[PartitionState, int]]:
        """The topic's partition states with their versions, after creating the missing ones
        (raises _Deposed when the creation is refused).  Undecodable states are logged and left
        out: the controller does not overwrite what it cannot read."""
        found, missing = self._read_states(topic)
        if missing:
            states = {p: initial_state(topic.replicas[p], live, controller_epoch=held.epoch,
                                    topic_id=topic.topic_id) for p in missing}
            if not create_states(self._client, self.paths, topic.name, states,
                                 controller_epoch_version=held.epoch_version):
                self._check_still_controller(held)
                raise CoordinationError(f"creating the partition states of {topic.name} was refused")
            for p, state in sorted(states.items()):
                logger.info("[controller] created %s-%d: leader %d in epoch %d, isr %s (replicas %s)",
                            topic.name, p, state.leader, state.leader_epoch, list(state.isr),
                            list(topic.replicas[p]))
            found, missing = self._read_states(topic)
        return found

    def _read_states(self, topic: TopicRegistration) -> tuple[dict[int, tuple[PartitionState, int]],
                                                               list[int]]:
        """``({partition: (state, version)}, [partitions without a state node])``."""
        pending = {p: self._client.get_async(self.paths.partition_state(topic.name, p))
                   for p in range(topic.partitions)}
        found, missing = {}, []
        for partition, answer in pending.items():
            try:
                data, stat = answer.get()
            except NoNodeError:
                missing.append(partition)
                continue
            try:
                found[partition] = (decode_state(data), stat.version)
            except CoordinationError as e:
                logger.error("[controller] leaving %s-%d alone: %s", topic.name, partition, e.message)
        return found, missing
