"""The faults the chaos suite injects into a :class:`~chaos.cluster.ChaosCluster` (Jepsen's
nemeses): each kind is a :class:`Nemesis` whose :meth:`~Nemesis.inject` makes one fault and
returns its :class:`Fault`, and whose :meth:`~Nemesis.heal` undoes it.

=================  ================================================  ==================================
name               inject                                            heal
=================  ================================================  ==================================
``kill``           kill -9 a broker (arbiter and workers), the       start it again on its data, wait
                   leader of a random partition preferred            until it serves
``pause``          SIGSTOP a broker (leader preferred)               SIGCONT, no earlier than the
                                                                     ZooKeeper session timeout + 1 s
                                                                     after the stop
``isolate-leader`` take a leader's link down: cut off from           bring the link up
                   ZooKeeper, its followers and the clients
``split``          majority/minority: one or two brokers and at      delete the split's nftables
                   most one ZooKeeper server cut off from the rest   tables
                   (nftables DROP: connects hang, as Jepsen's;
                   clients in the root namespace reach both sides)
``zk-kill``        kill -9 one ZooKeeper server                      start it again, wait until it
                                                                     serves in the quorum
``worker-kill``    kill -9 one worker process of a random broker     wait until the broker's arbiter
                                                                     has a new worker serving
``clock``          jump the faketime broker's wall clock by          offset back to +0
                   ±[60, 3600] s (monotonic clocks untouched)
``disk-full``      fill a broker's data tmpfs                        remove the filler; wait until
                                                                     it serves (started again if it
                                                                     exited)
=================  ================================================  ==================================

A fault's ``start`` is the wall time its injection began, ``end`` the wall time its healing
completed (so the interval covers the recovery too); ``target`` names the hosts hit (``b2``,
``zk1``; a split ``minority|majority``, e.g. ``b1,zk3|b2,b3,zk1,zk2``).  Every choice comes from
the ``rng`` given, so a seeded campaign replays the same targets for the same cluster state.
Faults never overlap (the schedule's promise), so a nemesis may assume every host is reachable
and every process runs when it injects.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from chaos.cluster import ChaosCluster, process_state

__all__ = ["NEMESES", "ClockJump", "DiskFull", "Fault", "IsolateLeader", "Kill", "Nemesis", "Pause", "Split",
           "WorkerKill", "ZkKill"]

logger = logging.getLogger(__name__)

CLOCK_JUMP_S = (60.0, 3600.0)  # |offset| of a clock jump, seconds
_SERVING_TIMEOUT_S = 120.0  # a restarted broker on two busy cores can take a while


@dataclass
class Fault:
    """One injected fault (module docstring); JSON-able with ``dataclasses.asdict``."""

    nemesis: str
    target: str
    start: float
    end: float | None = None
    detail: str = ""
    #: True once :meth:`Nemesis.heal` completed (False: the heal raised, ``end`` stays None)
    healed: bool = False


class Nemesis:
    """Base of the fault kinds: ``name`` is the kind's key in :data:`NEMESES`."""

    name: ClassVar[str] = ""

    def unavailable(self, cluster: ChaosCluster) -> str | None:
        """Why this kind cannot hit ``cluster`` (the clock needs a faketime broker), or None."""
        return None

    def inject(self, cluster: ChaosCluster, rng: random.Random, topics: Sequence[str]) -> Fault:
        raise NotImplementedError

    def heal(self, cluster: ChaosCluster, fault: Fault) -> None:
        raise NotImplementedError

    def _fault(self, target: str, start: float, detail: str) -> Fault:
        logger.info("[nemesis] %s on %s: %s", self.name, target, detail)
        return Fault(self.name, target, start, None, detail)

    def _healed(self, fault: Fault) -> None:
        fault.end = time.time()
        fault.healed = True
        logger.info("[nemesis] %s on %s healed after %.1f s", self.name, fault.target,
                    fault.end - fault.start)


def _broker_of(target: str) -> int:
    return int(target.removeprefix("b"))


def _serving_brokers(cluster: ChaosCluster) -> list[int]:
    paused = set(cluster.paused())
    return [b for b in cluster.alive() if b not in paused]


def pick_leader(cluster: ChaosCluster, rng: random.Random, topics: Sequence[str]) -> tuple[int, str]:
    """(broker id, why): the leader of a random partition of a random topic, else (no topic, no
    answer, no leader) a random running broker."""
    running = _serving_brokers(cluster)
    if not running:
        raise RuntimeError("no broker is running")
    if topics:
        topic = rng.choice(sorted(topics))
        try:
            leaders = cluster.leaders(topic)
        except RuntimeError:
            leaders = {}
        if leaders:
            partition = rng.choice(sorted(leaders))
            if leaders[partition] in running:
                return leaders[partition], f"leader of {topic}-{partition}"
    return rng.choice(running), "a random broker (no leader known)"


class Kill(Nemesis):
    name = "kill"

    def inject(self, cluster: ChaosCluster, rng: random.Random, topics: Sequence[str]) -> Fault:
        start = time.time()
        broker_id, why = pick_leader(cluster, rng, topics)
        pids = [cluster.pid(broker_id), *cluster.worker_pids(broker_id)]
        cluster.kill(broker_id)
        return self._fault(f"b{broker_id}", start, f"kill -9 broker {broker_id} ({why}; pids {pids})")

    def heal(self, cluster: ChaosCluster, fault: Fault) -> None:
        broker_id = _broker_of(fault.target)
        cluster.start(broker_id)
        cluster.wait_serving(broker_id, _SERVING_TIMEOUT_S)
        self._healed(fault)


class Pause(Nemesis):
    name = "pause"

    def inject(self, cluster: ChaosCluster, rng: random.Random, topics: Sequence[str]) -> Fault:
        start = time.time()
        broker_id, why = pick_leader(cluster, rng, topics)
        cluster.pause(broker_id)
        return self._fault(f"b{broker_id}", start, f"SIGSTOP broker {broker_id} ({why})")

    def heal(self, cluster: ChaosCluster, fault: Fault) -> None:
        # Longer than the session timeout, whatever the hold: its ZooKeeper session must expire.
        until = fault.start + cluster.session_timeout_ms / 1000 + 1.0
        while (left := until - time.time()) > 0:
            time.sleep(min(left, 0.5))
        cluster.resume(_broker_of(fault.target))
        self._healed(fault)


class IsolateLeader(Nemesis):
    name = "isolate-leader"

    def inject(self, cluster: ChaosCluster, rng: random.Random, topics: Sequence[str]) -> Fault:
        start = time.time()
        broker_id, why = pick_leader(cluster, rng, topics)
        cluster.network.cut(f"b{broker_id}")
        return self._fault(f"b{broker_id}", start, f"link of broker {broker_id} down ({why})")

    def heal(self, cluster: ChaosCluster, fault: Fault) -> None:
        cluster.network.heal(fault.target)
        self._healed(fault)


class Split(Nemesis):
    name = "split"

    def inject(self, cluster: ChaosCluster, rng: random.Random, topics: Sequence[str]) -> Fault:
        start = time.time()
        brokers = [f"b{b}" for b in cluster.broker_ids]
        assert cluster.ensemble is not None
        servers = [f"zk{i}" for i in sorted(cluster.ensemble.hosts)]
        if len(brokers) < 2:
            raise RuntimeError("a split needs at least two brokers")
        minority = rng.sample(brokers, rng.randint(1, min(2, len(brokers) - 1)))
        minority += rng.sample(servers, rng.randint(0, min(1, (len(servers) - 1) // 2)))
        minority.sort()
        majority = sorted(h for h in brokers + servers if h not in minority)
        cluster.network.split([minority, majority])
        return self._fault(f"{','.join(minority)}|{','.join(majority)}", start,
                           f"minority {minority} cut off from majority {majority}")

    def heal(self, cluster: ChaosCluster, fault: Fault) -> None:
        cluster.network.join()
        self._healed(fault)


class ZkKill(Nemesis):
    name = "zk-kill"

    def inject(self, cluster: ChaosCluster, rng: random.Random, topics: Sequence[str]) -> Fault:
        start = time.time()
        assert cluster.ensemble is not None
        server = rng.choice(cluster.ensemble.alive())
        pid = cluster.ensemble.pid(server)
        cluster.ensemble.kill(server)
        return self._fault(f"zk{server}", start, f"kill -9 ZooKeeper server {server} (pid {pid})")

    def heal(self, cluster: ChaosCluster, fault: Fault) -> None:
        assert cluster.ensemble is not None
        cluster.ensemble.restart(int(fault.target.removeprefix("zk")))
        self._healed(fault)


class WorkerKill(Nemesis):
    name = "worker-kill"

    def inject(self, cluster: ChaosCluster, rng: random.Random, topics: Sequence[str]) -> Fault:
        start = time.time()
        brokers = [b for b in _serving_brokers(cluster) if cluster.worker_pids(b)]
        if not brokers:
            raise RuntimeError("no running broker has a worker")
        broker_id = rng.choice(brokers)
        pid = rng.choice(cluster.worker_pids(broker_id))
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while process_state(pid) not in (None, "Z", "X") and time.monotonic() < deadline:
            time.sleep(0.02)
        return self._fault(f"b{broker_id}", start, f"kill -9 worker pid {pid} of broker {broker_id}")

    def heal(self, cluster: ChaosCluster, fault: Fault) -> None:
        cluster.wait_serving(_broker_of(fault.target), _SERVING_TIMEOUT_S)
        self._healed(fault)


class ClockJump(Nemesis):
    name = "clock"

    def unavailable(self, cluster: ChaosCluster) -> str | None:
        if cluster.faketime_broker is None:
            return "the cluster has no faketime broker (ChaosCluster(faketime_broker=...))"
        return None

    def inject(self, cluster: ChaosCluster, rng: random.Random, topics: Sequence[str]) -> Fault:
        reason = self.unavailable(cluster)
        if reason is not None:
            raise RuntimeError(f"clock: {reason}")
        start = time.time()
        broker_id = cluster.faketime_broker
        assert broker_id is not None
        offset = round(rng.choice((-1, 1)) * rng.uniform(*CLOCK_JUMP_S))
        cluster.set_clock_offset(broker_id, offset)
        return self._fault(f"b{broker_id}", start, f"wall clock of broker {broker_id} {offset:+d} s")

    def heal(self, cluster: ChaosCluster, fault: Fault) -> None:
        cluster.set_clock_offset(_broker_of(fault.target), 0)
        self._healed(fault)


class DiskFull(Nemesis):
    name = "disk-full"

    def inject(self, cluster: ChaosCluster, rng: random.Random, topics: Sequence[str]) -> Fault:
        start = time.time()
        broker_id = rng.choice(_serving_brokers(cluster))
        filled = cluster.fill_disk(broker_id)
        return self._fault(f"b{broker_id}", start,
                           f"data disk of broker {broker_id} filled ({filled} bytes of filler)")

    def heal(self, cluster: ChaosCluster, fault: Fault) -> None:
        broker_id = _broker_of(fault.target)
        cluster.free_disk(broker_id)
        if broker_id not in cluster.alive():
            logger.warning("[nemesis] broker %d exited while its disk was full: started again", broker_id)
            fault.detail += "; the broker exited while its disk was full and was started again"
            cluster.start(broker_id)
        cluster.wait_serving(broker_id, _SERVING_TIMEOUT_S)
        self._healed(fault)


#: Every kind by name, in the order a schedule's first pass takes them.
NEMESES: dict[str, type[Nemesis]] = {kind.name: kind for kind in (
    Kill, Pause, IsolateLeader, Split, ZkKill, WorkerKill, ClockJump, DiskFull)}
