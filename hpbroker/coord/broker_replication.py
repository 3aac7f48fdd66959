"""One broker's replication work in ZooKeeper, done on a thread of its own so that the broker's
loop never waits for ZooKeeper.

The arbiter's loop hands work over and takes results back; both return at once:

- :meth:`BrokerReplication.watch_topic` / :meth:`~BrokerReplication.unwatch_topic`: follow the
  partition states (``hpbroker.coord.partition_state``) of a replicated topic; every state read or
  changed comes back as a :class:`StateChanged` event;
- :meth:`~BrokerReplication.create_topic`, :meth:`~BrokerReplication.alter_topic`,
  :meth:`~BrokerReplication.delete_topic`: write a replicated topic's node (its assignment
  computed here from the live brokers, ``hpbroker.coord.assignment``); each answers with a
  :class:`Done` event carrying the request's id and the error, if any;
- :meth:`~BrokerReplication.propose_isr`: a partition this broker leads changes its ISR; written
  with a conditional update if the node still names this broker leader in that leader epoch
  (otherwise dropped: the leader learns its new role from the state itself);
- :meth:`~BrokerReplication.take_events`: what happened since the last call, in order.

It also runs this broker's :class:`~hpbroker.coord.controller.Controller` (at most one broker of
the cluster has the active one).  Events are handed over under a lock and announced with
``wake()``, which the arbiter points at its loop's wake-up pipe; the watch callbacks run on
kazoo's thread and only append events.  Create it after ``fork``, in the arbiter.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError

from hpbroker.broker.topics import alter_topic_config
from hpbroker.coord.assignment import assign_replicas
from hpbroker.coord.controller import Controller
from hpbroker.coord.partition_state import PartitionState, PartitionStateWatch, read_state, update_state
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.registry import (
    BrokerRegistry,
    TopicRegistration,
    TopicRegistry,
    decode_topic,
    encode_topic,
)
from hpbroker.coord.session import Session
from hpbroker.errors import (
    CoordinationError,
    HPBrokerError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

__all__ = ["BrokerReplication", "Done", "StateChanged", "TopicGone"]

logger = logging.getLogger(__name__)

_JOIN_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class StateChanged:
    """A partition's state as read now: None while it has no (readable) state node."""

    topic: str
    partition: int
    state: PartitionState | None
    version: int


@dataclass(frozen=True, slots=True)
class Done:
    """A create, alter or delete handed over with ``request_id`` is finished (``error`` None) or
    refused."""

    request_id: Any
    error: HPBrokerError | None


@dataclass(frozen=True, slots=True)
class TopicGone:
    """:meth:`BrokerReplication.confirm_gone` found no node for the topic: it was deleted."""

    topic: str


class BrokerReplication:
    """Replication's ZooKeeper side for one broker (module docstring)."""

    def __init__(self, session: Session, paths: ZkPaths, broker_id: int, *, wake: Callable[[], None],
                 unclean_leader_election: Callable[[str], bool],
                 auto_leader_rebalance: bool = True) -> None:
        self._session = session
        self.paths = paths
        self.broker_id = broker_id
        self._wake = wake
        self._brokers = BrokerRegistry(session, paths)
        self._topics = TopicRegistry(session, paths)
        self._states = PartitionStateWatch(session, paths, self._on_state)
        self.controller = Controller(session, paths, broker_id,
                                     unclean_leader_election=unclean_leader_election,
                                     auto_leader_rebalance=auto_leader_rebalance)
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._events: list[StateChanged | Done | TopicGone] = []
        self._confirming: set[str] = set()  # topics being read by confirm_gone
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._watched: set[str] = set()  # topics (the loop's side)

    # --- the loop's side ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread and the controller (which runs on a thread of its own: call this with
        the loop's signals blocked, so that both threads inherit that)."""
        self._thread = threading.Thread(target=self._run, name="hpbroker-replication", daemon=True)
        self._thread.start()
        self.controller.start()

    def close(self) -> None:
        """Resign as controller, stop watching, stop the thread (what it was doing is dropped)."""
        try:
            self.controller.close()
        except Exception:
            logger.exception("[replication] closing the controller failed")
        self._jobs.put(None)
        self._states.close()
        if self._thread is not None:
            self._thread.join(_JOIN_TIMEOUT_S)

    def take_events(self) -> list[StateChanged | Done | TopicGone]:
        with self._lock:
            events, self._events = self._events, []
        for event in events:
            if isinstance(event, TopicGone):
                self._confirming.discard(event.topic)
        return events

    def confirm_gone(self, name: str) -> None:
        """Read whether the topic's node is gone (a snapshot without it may only lag): a
        :class:`TopicGone` event when it is, nothing when it is there."""
        if name not in self._confirming:
            self._confirming.add(name)
            self._jobs.put(lambda: self._confirm_gone(name))

    def watch_topic(self, name: str, partitions: int) -> None:
        if name not in self._watched:
            self._watched.add(name)
            self._jobs.put(lambda: self._watch(name, partitions))

    def unwatch_topic(self, name: str) -> None:
        if name in self._watched:
            self._watched.discard(name)
            self._jobs.put(lambda: self._states.unwatch_topic(name))

    def create_topic(self, request_id: Any, name: str, partitions: int, replication_factor: int,
                     config: Mapping[str, Any]) -> None:
        self._jobs.put(lambda: self._done(request_id, lambda: self._create(name, partitions,
                                                                           replication_factor, config)))

    def alter_topic(self, request_id: Any, name: str, changes: Mapping[str, Any]) -> None:
        """Change settings of a replicated topic: ``changes`` maps each setting named to its new
        value (None or "" removes the topic's own value); settings not named keep the values the
        topic's node holds when the change is written (not this broker's copy, which may lag)."""
        changes = dict(changes)
        self._jobs.put(lambda: self._done(request_id, lambda: self._alter(name, changes)))

    def delete_topic(self, request_id: Any, name: str) -> None:
        self._jobs.put(lambda: self._done(request_id, lambda: self._delete(name)))

    def propose_isr(self, topic: str, partition: int, leader_epoch: int, isr: tuple[int, ...],
                    from_isr: tuple[int, ...] | None = None, *, topic_id: str = "") -> None:
        """``from_isr``: the ISR the leader computed the proposal from; the proposal is written only
        while ZooKeeper still holds that ISR (a change since, say the controller dropping a dead
        broker, makes the leader decide again from the new one).  ``topic_id``: the id of the
        topic the leader holds ("" unknown); a state of another topic id (the topic was deleted
        and created again) is never changed."""
        self._jobs.put(lambda: self._write_isr(topic, partition, leader_epoch, isr, from_isr, topic_id))

    # --- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except (KazooException, CoordinationError) as e:
                logger.warning("[replication] a ZooKeeper operation failed: %r", e)
            except Exception:
                logger.exception("[replication] unexpected failure")

    def _confirm_gone(self, name: str) -> None:
        present = True  # also when the read fails: asked again later
        try:
            present = self._session.client.exists(self.paths.topic(name)) is not None
        finally:
            if present:
                self._confirming.discard(name)  # one set operation: atomic under the GIL
        if not present:
            self._emit(TopicGone(name))

    def _emit(self, event: StateChanged | Done | TopicGone) -> None:
        with self._lock:
            self._events.append(event)
        self._wake()

    def _on_state(self, topic: str, partition: int, state: PartitionState | None, version: int) -> None:
        self._emit(StateChanged(topic, partition, state, version))

    def _watch(self, name: str, partitions: int) -> None:
        try:
            for partition in range(partitions):
                self._states.watch(name, partition)  # a partition watched already is left as it is
        except BaseException:
            self._watched.discard(name)  # asked again by the loop's next watch_topic (atomic under the GIL)
            raise

    def _done(self, request_id: Any, operation: Callable[[], None]) -> None:
        try:
            operation()
        except HPBrokerError as e:
            self._emit(Done(request_id, e))
        except KazooException as e:
            self._emit(Done(request_id, CoordinationError(f"ZooKeeper failed: {e!r}")))
        else:
            self._emit(Done(request_id, None))

    def _create(self, name: str, partitions: int, replication_factor: int, config: Mapping[str, Any]) -> None:
        """Write a new replicated topic's node, its assignment spread over the live brokers and a
        new random topic id (a topic created again under the same name is another topic); the
        controller then writes its partitions' states."""
        brokers = self._brokers.ids()
        replicas = assign_replicas(partitions, replication_factor, brokers)
        topic = TopicRegistration(name, partitions, dict(config), self.broker_id, replicas=replicas,
                                  topic_id=uuid.uuid4().hex)
        try:
            self._session.client.create(self.paths.topic(name), encode_topic(topic), makepath=True)
        except NodeExistsError:
            raise TopicAlreadyExistsError(f"topic {name!r} already exists in the cluster") from None
        logger.info("[replication] created topic %s: %d partitions, replication factor %d, replicas %s",
                    name, partitions, replication_factor, {p: list(r) for p, r in replicas.items()})

    def _alter(self, name: str, changes: Mapping[str, Any]) -> None:
        """Apply ``changes`` (key -> value; None or "" removes the topic's own value, as
        :func:`~hpbroker.broker.topics.alter_topic_config` takes them) to the settings the node
        holds now, with a write conditional on the version read (read and applied again when
        another alter came first), so that alters through any broker never undo each other.
        InvalidConfigError when the changes do not apply to the node's settings."""
        client, path = self._session.client, self.paths.topic(name)
        while True:
            try:
                data, stat = client.get(path)
            except NoNodeError:
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist in the cluster") from None
            current = decode_topic(name, data)
            config = alter_topic_config(current.config, changes)
            if dict(current.config) == config:
                return
            try:
                client.set(path, encode_topic(dataclasses.replace(current, config=config)),
                           version=stat.version)
            except BadVersionError:
                continue  # changed meanwhile: apply to the new one
            except NoNodeError:
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist in the cluster") from None
            logger.info("[replication] altered topic %s: %s", name, config)
            return

    def _delete(self, name: str) -> None:
        if not self._topics.remove(name):
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist in the cluster")
        logger.info("[replication] deleted topic %s from the cluster", name)

    def _write_isr(self, topic: str, partition: int, leader_epoch: int, isr: tuple[int, ...],
                   from_isr: tuple[int, ...] | None, topic_id: str = "") -> None:
        found = read_state(self._session, self.paths, topic, partition)
        if found is None:
            return
        state, version = found
        if state.of_other_topic(topic_id):
            logger.info("[replication] dropped the ISR change of %s-%d to %s: it was made for topic id %s, "
                        "the state is of topic id %s", topic, partition, list(isr), topic_id, state.topic_id)
            return
        if state.leader != self.broker_id or state.leader_epoch != leader_epoch:
            logger.info("[replication] dropped the ISR change of %s-%d to %s: the state says leader %d, "
                        "epoch %d", topic, partition, list(isr), state.leader, state.leader_epoch)
            return
        if from_isr is not None and tuple(from_isr) != state.isr:
            logger.info("[replication] dropped the ISR change of %s-%d to %s: it was made from ISR %s, the "
                        "state holds %s now", topic, partition, list(isr), list(from_isr), list(state.isr))
            return
        # Never add a broker that is not alive, nor one that reports its replica of the partition
        # offline (the controller removed it for that: its worker slot crash-loops), nor one that
        # is no longer a replica (a reassignment dropped it since the leader proposed).
        registration = self._topics.get(topic)
        replicas = set(registration.replicas.get(partition, ())) if registration is not None else set()
        dropped = [b for b in isr if b not in state.isr and not self._may_join(b, topic, partition, replicas)]
        isr = tuple(b for b in isr if b not in dropped)
        if dropped:
            logger.info("[replication] %s-%d: not adding %s to the ISR: not alive, reporting the partition "
                        "offline, or not a replica any more", topic, partition, dropped)
        if self.broker_id not in isr or state.isr == isr:
            return
        new = PartitionState(self.broker_id, leader_epoch, isr, state.controller_epoch, state.topic_id)
        if update_state(self._session, self.paths, topic, partition, new, expected_version=version) is None:
            logger.info("[replication] the ISR change of %s-%d to %s lost a race; the leader proposes "
                        "again if it still holds", topic, partition, list(isr))
            return
        logger.info("[replication] %s-%d: ISR %s -> %s (leader epoch %d)", topic, partition, list(state.isr),
                    list(isr), leader_epoch)

    def _may_join(self, broker_id: int, topic: str, partition: int, replicas: set[int]) -> bool:
        """Whether ``broker_id`` may be added to the ISR of ``topic``-``partition``: a replica,
        registered, and not reporting its replica of the partition offline."""
        if broker_id not in replicas:
            return False
        try:
            registration = self._brokers.get(broker_id)
        except CoordinationError as e:  # an unreadable registration: not added
            logger.warning("[replication] broker %d's registration: %s", broker_id, e.message)
            return False
        return registration is not None and not registration.offline(topic, partition)
