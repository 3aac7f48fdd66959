"""The arbiter's side of replication: each replicated partition's state as ZooKeeper holds it, the
replica role that gives each partition stored here, and those roles handed to the worker slots.

A replicated topic (``Topic.replicas``, docs/REPLICATION.md) has a state node per partition
(``hpbroker.coord.partition_state``): leader, leader epoch, ISR.  The arbiter follows every one of
them (:class:`~hpbroker.coord.broker_replication.BrokerReplication` delivers each change) and
:class:`Leadership` keeps the latest, from which

- **roles** go to the slots: for each partition of a replicated topic that a slot's current process
  has been told to open (``TopicAdmin.assigned``), a backend control ``replica_role``
  (``hpbroker.workers.backend``): *leader* when the state names this broker, else *follower* of the
  broker it names (with that broker's address and the data port serving the partition there;
  none while the partition has no leader, or while the leader's registration is not seen yet,
  or while this broker reports its replica offline: :meth:`Leadership.set_offline`).
  A role is sent when it differs from the last one the slot's process took; a slot whose process
  is gone forgets what it was sent (its next process opens its partitions again and gets its roles
  again).  Controls travel in order on the backend socket, so a role follows the ``open`` of its
  partition;
- **metadata** answers for replicated partitions: leader, leader epoch, replicas, ISR, and the
  leader's data port for it;
- **routing**: a request for a replicated partition that this broker does not store is refused
  with NotLeaderOrFollowerError naming the leader (:meth:`Leadership.not_here`).

Single-threaded: used only by the arbiter's loop.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpbroker.broker.config import BrokerConfig
from hpbroker.broker.topics import Topic
from hpbroker.errors import NotLeaderOrFollowerError
from hpbroker.workers.ownership import owner_slot

if TYPE_CHECKING:  # kazoo is loaded only by a broker configured with ZooKeeper
    from hpbroker.coord.cluster import ClusterSnapshot
    from hpbroker.coord.partition_state import PartitionState

__all__ = ["LeaderLocation", "Leadership", "Role"]

logger = logging.getLogger(__name__)

ROLE_ID_PREFIX = "role-"  # the ids of replica_role controls, told apart from TopicAdmin's integers
RESEND_AFTER_S = 1.0  # a role a worker refused is sent again this long after


@dataclass(frozen=True, slots=True)
class LeaderLocation:
    """Where a replicated partition's leader serves it."""

    broker_id: int
    host: str
    port: int  # its ZeroMQ front-end
    fetch_port: int  # the data port of its worker owning the partition


@dataclass(frozen=True, slots=True)
class Role:
    """What one replica of a partition does, as the worker is told (``replica_role``)."""

    role: str  # "leader" or "follower"
    leader_epoch: int
    leader: int  # broker id, -1 for none
    leader_address: tuple[str, int] | None  # the leader's host and data port for the partition
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    min_insync_replicas: int
    replica_lag_time_max_ms: int
    leader_port: int | None = None  # the leader's front-end port, named to clients in error 23

    def body(self, topic: str, partition: int) -> dict[str, Any]:
        return {"topic": topic, "partition": partition, "role": self.role, "leader_epoch": self.leader_epoch,
                "leader": self.leader,
                "leader_address": list(self.leader_address) if self.leader_address else None,
                "replicas": list(self.replicas), "isr": list(self.isr),
                "min_insync_replicas": self.min_insync_replicas,
                "replica_lag_time_max_ms": self.replica_lag_time_max_ms, "leader_port": self.leader_port}


# send_control(slot, op, body) -> whether the slot's process could take it now
SendControl = Callable[[int, str, dict[str, Any]], bool]


class Leadership:
    """Replicated partitions' states, and the roles they give the slots (module docstring)."""

    def __init__(self, config: BrokerConfig, slots: int, *, send_control: SendControl,
                 assigned: Callable[[int], set[tuple[str, int]]], topic: Callable[[str], Topic | None],
                 is_serving: Callable[[int], bool],
                 cluster: Callable[[], ClusterSnapshot | None]) -> None:
        self._config = config
        self._slots = slots
        self._send_control = send_control
        self._assigned = assigned
        self._topic = topic
        self._is_serving = is_serving
        self._cluster = cluster
        self._states: dict[tuple[str, int], PartitionState] = {}
        self._sent: list[dict[tuple[str, int], Role]] = [{} for _ in range(slots)]  # taken or in flight
        self._in_flight: dict[str, tuple[int, tuple[str, int], Role]] = {}  # control id -> what it carried
        self._ids = itertools.count(1)
        self._dirty = True
        self._last_cluster: object = None
        self._resend_at: float | None = None  # monotonic: a refused role is sent again then
        self._offline: frozenset[tuple[str, int]] = frozenset()  # replicas reported offline

    # --- states ------------------------------------------------------------------------------

    def on_state(self, topic: str, partition: int, state: PartitionState | None) -> None:
        """A partition state as ZooKeeper holds it now (None: no state node).  A state naming a
        topic id other than the one of the topic stored here under that name is ignored: it is
        a new topic of the same name, deleted and created again, that this broker has not taken
        yet (it drops the old topic, then watches the new one's states afresh)."""
        key = (topic, partition)
        held = self._topic(topic) if state is not None else None
        if state is not None and held is not None and state.of_other_topic(held.topic_id):
            logger.info("[arbiter] ignored the state of %s-%d (leader %d, leader epoch %d): it is of topic "
                        "id %s, the topic stored here has topic id %s", topic, partition, state.leader,
                        state.leader_epoch, state.topic_id, held.topic_id)
            return
        if state is None:
            self._states.pop(key, None)
        elif self._states.get(key) != state:
            self._states[key] = state
        else:
            return
        self._dirty = True

    def state(self, topic: str, partition: int) -> PartitionState | None:
        return self._states.get((topic, partition))

    def forget_topic(self, topic: str) -> None:
        """The topic is gone (deleted, or to be taken again as a new topic of the same name): its
        states, and the roles its partitions were sent, which a new incarnation must get anew."""
        for key in [k for k in self._states if k[0] == topic]:
            del self._states[key]
        for sent in self._sent:
            for key in [k for k in sent if k[0] == topic]:
                del sent[key]
        self._dirty = True

    def has_states(self, topic: Topic) -> bool:
        """Whether every partition of ``topic`` has a state with a leader (a new topic is ready)."""
        return all((s := self._states.get((topic.name, p))) is not None and s.has_leader
                   for p in range(topic.partitions))

    def released(self, topic: str, partition: int) -> bool:
        """Whether this broker's replica of the partition is no longer needed by its state: it is
        neither the leader nor in the ISR (a replica moved away is removed only then)."""
        state = self._states.get((topic, partition))
        broker_id = self._config.broker_id
        return state is not None and state.leader != broker_id and broker_id not in state.isr

    def leader_location(self, topic: str, partition: int) -> LeaderLocation | None:
        """The partition's leader and where it serves the partition; None while it has no leader
        or its registration is not seen."""
        state = self._states.get((topic, partition))
        if state is None or not state.has_leader:
            return None
        if state.leader == self._config.broker_id:
            config = self._config
            return LeaderLocation(config.broker_id, config.host, config.port,
                                  config.fetch_port + owner_slot(topic, partition, config.workers))
        cluster = self._cluster()
        broker = cluster.brokers.get(state.leader) if cluster is not None else None
        if broker is None or not broker.data_ports:
            return None
        return LeaderLocation(broker.broker_id, broker.host, broker.port,
                              broker.data_ports[owner_slot(topic, partition, len(broker.data_ports))])

    def not_here(self, topic: Topic, partition: int) -> NotLeaderOrFollowerError:
        """The error for a request about a replicated partition this broker does not store."""
        leader = self.describe_leader(topic.name, partition)
        return NotLeaderOrFollowerError(f"broker {self._config.broker_id} holds no replica of "
                                        f"{topic.name}-{partition}; {leader}")

    def describe_leader(self, topic: str, partition: int) -> str:
        state = self._states.get((topic, partition))
        where = self.leader_location(topic, partition)
        if state is None or not state.has_leader:
            return "it has no leader now (retry after refreshing metadata)"
        if where is None:
            return f"the leader is broker {state.leader} (leader epoch {state.leader_epoch})"
        return (f"the leader is broker {where.broker_id} at {where.host}:{where.port} "
                f"(leader epoch {state.leader_epoch})")

    # --- roles -------------------------------------------------------------------------------

    def set_offline(self, offline: Mapping[str, tuple[int, ...]]) -> None:
        """The replicas this broker's registration reports offline now (topic -> partitions).
        Their followers get no leader address, so a worker on probation after a crash loop
        neither fetches nor rejoins the ISR (which the controller, seeing them offline, would
        only shrink again) until they are reported back."""
        keys = frozenset((topic, p) for topic, partitions in offline.items() for p in partitions)
        if keys != self._offline:
            self._offline = keys
            self._dirty = True

    def role(self, topic: Topic, partition: int) -> Role | None:
        """The role the partition's replica here has now; None while its state is unknown."""
        state = self._states.get((topic.name, partition))
        if state is None:
            return None
        min_isr = topic.config.get("min_insync_replicas", self._config.log.min_insync_replicas)
        # The assignment, and while a reassignment ends the leader and in-sync replicas it dropped
        # (they keep the partition until one of the new replicas is in sync: the controller keeps
        # such a leader on), so that they may go on leading or following.
        assigned = topic.replicas.get(partition, ())
        replicas = tuple(dict.fromkeys((*assigned, *(b for b in (state.leader, *state.isr) if b >= 0))))
        lag = self._config.replica_lag_time_max_ms
        if state.leader == self._config.broker_id:
            return Role("leader", state.leader_epoch, state.leader, None, replicas, state.isr, min_isr, lag)
        where = self.leader_location(topic.name, partition)
        address = (where.host, where.fetch_port) if where is not None else None
        if (topic.name, partition) in self._offline:
            address = None  # reported offline: it waits (set_offline)
        return Role("follower", state.leader_epoch, state.leader, address, replicas, state.isr, min_isr, lag,
                    where.port if where is not None else None)

    def sync(self, now: float) -> None:
        """Send every serving slot the roles it lacks (cheap when nothing changed)."""
        cluster = self._cluster()
        if cluster is not self._last_cluster:  # a leader's registration may have changed
            self._last_cluster = cluster
            self._dirty = True
        if self._resend_at is not None and now >= self._resend_at:
            self._resend_at = None
            self._dirty = True
        if not self._dirty:
            return
        self._dirty = False
        for slot in range(self._slots):
            if not self._is_serving(slot):
                continue
            sent, assigned = self._sent[slot], self._assigned(slot)
            for key in [k for k in sent if k not in assigned]:  # removed (a replica moved away)
                del sent[key]
            for key in sorted(assigned):
                topic = self._topic(key[0])
                if topic is None or not topic.replicated or topic.deleting:
                    continue
                role = self.role(topic, key[1])
                if role is None or sent.get(key) == role:
                    continue
                control_id = f"{ROLE_ID_PREFIX}{next(self._ids)}"
                if not self._send_control(slot, "replica_role", {"id": control_id, **role.body(*key)}):
                    self._dirty = True  # again on the next turn
                    continue
                sent[key] = role
                self._in_flight[control_id] = (slot, key, role)
                logger.info("[arbiter] %s-%d: %s in leader epoch %d (leader %d, isr %s) -> slot %d", key[0],
                            key[1], role.role, role.leader_epoch, role.leader, list(role.isr), slot)

    def mark_dirty(self) -> None:
        """Something roles depend on changed (a slot became ready, the topics changed)."""
        self._dirty = True

    def slot_down(self, slot: int) -> None:
        self._sent[slot] = {}
        for control_id in [i for i, (s, _, _) in self._in_flight.items() if s == slot]:
            del self._in_flight[control_id]
        self._dirty = True

    @staticmethod
    def owns(control_id: object) -> bool:
        return isinstance(control_id, str) and control_id.startswith(ROLE_ID_PREFIX)

    def acked(self, slot: int, control_id: str, error: object, now: float) -> None:
        """A worker's ack of a ``replica_role``: a refused role is sent again after
        :data:`RESEND_AFTER_S` (or at the next change), unless a newer one went since."""
        entry = self._in_flight.pop(control_id, None)
        if entry is None or error is None:
            return
        _, key, role = entry
        logger.warning("[arbiter] slot %d refused the %s role of %s-%d in leader epoch %d: %s; sent again "
                       "in %g s", slot, role.role, key[0], key[1], role.leader_epoch, error, RESEND_AFTER_S)
        if self._sent[slot].get(key) == role:
            del self._sent[slot][key]
            if self._resend_at is None:
                self._resend_at = now + RESEND_AFTER_S
