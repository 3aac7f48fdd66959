"""Moving a replicated topic's replicas to other brokers (``hpbroker partitions reassign``): how an
operator adds a machine, or empties one.

Kafka's ZooKeeper-era procedure, driven from the caller's process through the topic's node (every
broker follows the node: ``hpbroker.workers.frontend.Frontend.adopt_topics``; the controller
follows it too, ``hpbroker.coord.controller``)::

    1. replicas := target + (current - target)     the new brokers open the partition and follow
                                                   its leader; the leader counts them as replicas
    2. wait until every target broker is in the ISR
    3. replicas := target                          (one transaction with a check that each state
                                                   is still the one seen in step 2) the controller
                                                   elects a leader among the target (if the leader
                                                   moved away) and drops the old brokers from the
                                                   ISR; they delete their copies once the state no
                                                   longer names them
    4. wait until the leader and the whole ISR are target brokers

Each step is a conditional write of the topic node (a concurrent change of settings is kept), and
every step can be repeated: a reassignment interrupted anywhere (the tool killed, ZooKeeper
unreachable) is finished by running it again with the same target; until then the partition
merely has more replicas than asked for.  Nothing acknowledged is lost on the way: records are
committed only once every ISR member has them, and the old replicas leave only after the new
ones have joined the ISR.

Use it from one process at a time per topic.  :class:`Reassignment` takes a kazoo client or a
:class:`~hpbroker.coord.session.Session`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError, RolledBackError, RuntimeInconsistency

from hpbroker.coord.partition_state import PartitionState, read_state
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.registry import TopicRegistration, decode_topic, encode_topic
from hpbroker.coord.session import Session
from hpbroker.errors import (
    InvalidReplicationFactorError,
    InvalidRequestError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)

__all__ = ["Reassignment", "parse_targets"]

logger = logging.getLogger(__name__)

POLL_S = 0.2


def parse_targets(text: str) -> dict[int, tuple[int, ...]]:
    """``"0=1,2,3;1=2,3,1"`` -> {0: (1, 2, 3), 1: (2, 3, 1)}: each partition's target replicas,
    the preferred leader first.  InvalidRequestError for anything else."""
    targets: dict[int, tuple[int, ...]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        number, sep, brokers = part.partition("=")
        try:
            if not sep:
                raise ValueError("no '='")
            partition = int(number, 10)
            ids = tuple(int(b, 10) for b in brokers.split(","))
        except ValueError as e:
            raise InvalidRequestError(f"{part!r} is not PARTITION=BROKER,BROKER,...: {e}") from None
        if partition in targets:
            raise InvalidRequestError(f"partition {partition} is given twice")
        targets[partition] = ids
    if not targets:
        raise InvalidRequestError("no partition to move: give PARTITION=BROKER,BROKER,...[;...]")
    return targets


class Reassignment:
    """Moves the replicas of one replicated topic's partitions (module docstring)."""

    def __init__(self, client: KazooClient | Session, paths: ZkPaths, topic: str,
                 targets: Mapping[int, Sequence[int]], *,
                 progress: Callable[[str], None] = logger.info) -> None:
        self._client = client.client if isinstance(client, Session) else client
        self.paths = paths
        self.topic = topic
        self._progress = progress
        self.targets = {p: tuple(r) for p, r in targets.items()}
        registration, _ = self._read_topic()
        self._check(registration)

    def _check(self, registration: TopicRegistration) -> None:
        """Refuse a target that names an unknown partition, a broker twice or a broker that is not
        alive (a new replica must be able to catch up)."""
        if not registration.replicas:
            raise InvalidRequestError(f"topic {self.topic!r} is not replicated: it has no replicas to move")
        live = self._live_brokers()
        for partition, target in sorted(self.targets.items()):
            if partition not in registration.replicas:
                raise UnknownTopicOrPartitionError(f"topic {self.topic!r} has no partition {partition} "
                                                   f"(it has 0..{registration.partitions - 1})")
            if not target or len(set(target)) != len(target):
                raise InvalidReplicationFactorError(
                    f"partition {partition}: the target replicas {list(target)} must name distinct brokers")
            absent = [b for b in target if b not in live and b not in registration.replicas[partition]]
            if absent:
                raise InvalidReplicationFactorError(
                    f"partition {partition}: brokers {absent} are not alive (live brokers: {sorted(live)})")

    # --- the steps ---------------------------------------------------------------------------

    def run(self, timeout_s: float) -> None:
        """Steps 1 to 4 for every partition; RequestTimedOutError (naming what it waited for) when
        they take longer than ``timeout_s``: run it again to go on."""
        deadline = time.monotonic() + timeout_s
        self._write(lambda current, target: (*target, *(b for b in current if b not in target)))
        while True:
            seen = self._wait(deadline, "the new replicas to join the ISR", self._caught_up)
            # Only while every state still is the one seen caught up (one transaction): a new
            # replica dropping out of the ISR meanwhile must not leave the partition to replicas
            # that have none of its records.
            if self._write(lambda current, target: target, states=seen):
                break
            self._progress(f"{self.topic}: an ISR changed meanwhile; checking again")
        self._wait(deadline, "the leaders and ISRs to leave the old replicas", self._settled)
        self._progress(f"{self.topic}: done; replicas " + ", ".join(
            f"{p}={','.join(map(str, t))}" for p, t in sorted(self.targets.items())))

    def _write(self, replicas_of: Callable[[tuple[int, ...], tuple[int, ...]], tuple[int, ...]], *,
               states: Mapping[int, int] | None = None) -> bool:
        """Rewrite the topic node's replicas; with ``states`` (partition -> state node version),
        in one transaction that also checks those versions: False, nothing written, when one of
        them changed."""
        while True:
            registration, version = self._read_topic()
            replicas = dict(registration.replicas)
            for partition, target in self.targets.items():
                replicas[partition] = tuple(replicas_of(registration.replicas[partition], target))
            if replicas == dict(registration.replicas):
                return True
            data = encode_topic(dataclasses.replace(registration, replicas=replicas))
            path = self.paths.topic(self.topic)
            if states is None:
                try:
                    self._client.set(path, data, version=version)
                except BadVersionError:
                    continue  # changed meanwhile (settings): apply to the new node
                except NoNodeError:
                    raise UnknownTopicOrPartitionError(f"topic {self.topic!r} was deleted") from None
            else:
                txn = self._client.transaction()
                for partition, state_version in sorted(states.items()):
                    txn.check(self.paths.partition_state(self.topic, partition), state_version)
                txn.set_data(path, data, version=version)
                results = txn.commit()
                failed = [r for r in results if isinstance(r, Exception)
                          and not isinstance(r, (RolledBackError, RuntimeInconsistency))]
                if failed:
                    if isinstance(results[-1], BadVersionError) and len(failed) == 1:
                        continue  # only the topic node changed (settings): apply to the new one
                    if isinstance(results[-1], NoNodeError):
                        raise UnknownTopicOrPartitionError(f"topic {self.topic!r} was deleted")
                    return False
            self._progress(f"{self.topic}: replicas " + ", ".join(
                f"{p}={','.join(map(str, replicas[p]))}" for p in sorted(self.targets)))
            return True

    def _wait(self, deadline: float, what: str,
              done: Callable[[int, PartitionState], str | None]) -> dict[int, int]:
        """Poll the states until ``done`` says nothing is pending; the versions of the states that
        satisfied it."""
        last = ""
        while True:
            pending, versions = [], {}
            for partition in sorted(self.targets):
                found = read_state(self._client, self.paths, self.topic, partition)
                waiting = (f"partition {partition} has no state yet" if found is None
                           else done(partition, found[0]))
                if waiting:
                    pending.append(waiting)
                elif found is not None:
                    versions[partition] = found[1]
            if not pending:
                return versions
            report = f"{self.topic}: waiting for {what}: " + "; ".join(pending)
            if report != last:
                self._progress(report)
                last = report
            if time.monotonic() >= deadline:
                raise RequestTimedOutError(f"{report} (run the reassignment again to go on)")
            time.sleep(POLL_S)

    def _caught_up(self, partition: int, state: PartitionState) -> str | None:
        missing = [b for b in self.targets[partition] if b not in state.isr]
        return f"partition {partition}: {missing} not in the ISR {list(state.isr)}" if missing else None

    def _settled(self, partition: int, state: PartitionState) -> str | None:
        target = self.targets[partition]
        if state.leader not in target or any(b not in target for b in state.isr):
            return f"partition {partition}: leader {state.leader}, ISR {list(state.isr)}"
        return None

    # --- ZooKeeper -------------------------------------------------------------------------------

    def _read_topic(self) -> tuple[TopicRegistration, int]:
        try:
            data, stat = self._client.get(self.paths.topic(self.topic))
        except NoNodeError:
            raise UnknownTopicOrPartitionError(
                f"topic {self.topic!r} does not exist in the cluster") from None
        return decode_topic(self.topic, data), stat.version

    def _live_brokers(self) -> set[int]:
        try:
            return {ZkPaths.broker_id_of(child) for child in self._client.get_children(self.paths.broker_ids)}
        except NoNodeError:
            return set()
