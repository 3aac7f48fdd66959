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

:meth:`Nemesis.verify`, called right after the injection, checks cheaply that the fault took
effect and returns the evidence (kept in ``Fault.evidence``), or raises :class:`NemesisError`:

=================  ==========================================================================
``kill``           every pid of the broker (arbiter and workers) gone
``pause``          every pid of the broker in state ``T`` (stopped)
``isolate-leader`` the host's veth down (``/sys/class/net/<veth>/operstate``)
``split``          the nftables table present in every namespace of the split
``zk-kill``        the server's pid gone and the ensemble no longer lists it alive
``worker-kill``    the worker's pid gone
``clock``          the faketime file holds the offset, and the broker's arbiter runs with
                   libfaketime preloaded on that file (``/proc/<pid>/environ``)
``disk-full``      less than a page free on the broker's data tmpfs
=================  ==========================================================================

A fault's ``start`` is the wall time its injection began (after any metadata asked to pick
its target), ``end`` the wall time its healing
completed (so the interval covers the recovery too); ``target`` names the hosts hit (``b2``,
``zk1``; a split ``minority|majority``, e.g. ``b1,zk3|b2,b3,zk1,zk2``).  Every choice comes from
the ``rng`` given, so a seeded campaign replays the same targets for the same cluster state.
Steps never overlap (the schedule's promise), and a step heals and waits for the cluster to be
back at full ISR before the next one starts; the two faults of a mixed step overlap on purpose,
the second told to ``avoid`` the first one's target, so two faults never hit one broker.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from chaos.cluster import ChaosCluster, process_state

__all__ = ["NEMESES", "ClockJump", "DiskFull", "Fault", "IsolateLeader", "Kill", "Nemesis", "NemesisError",
           "Pause", "Split", "WorkerKill", "ZkKill"]

logger = logging.getLogger(__name__)

CLOCK_JUMP_S = (60.0, 3600.0)  # |offset| of a clock jump, seconds
_SERVING_TIMEOUT_S = 120.0  # a restarted broker on two busy cores can take a while
_SIGNAL_TAKES_S = 5.0  # how long a signalled process may take to show its new state


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
    #: the processes the fault hit (kill, pause, zk-kill, worker-kill)
    pids: list[int] = field(default_factory=list)
    #: what :meth:`Nemesis.verify` saw ("" until verified; "NOT VERIFIED: ..." when it failed)
    evidence: str = ""
    #: the schedule's step number (1-based; 0 outside a campaign), and the step's name when it
    #: is mixed (``kill+split``: both faults of the step carry it; the report attributes by it)
    step: int = 0
    mixed: str = ""
    #: seconds from the end of the step's heal until every partition was led with a full ISR
    #: again (None: not measured, or not back within the bound)
    recovered_s: float | None = None


class NemesisError(RuntimeError):
    """A fault that did not take effect (:meth:`Nemesis.verify`); the message says what was seen."""


class Nemesis:
    """Base of the fault kinds: ``name`` is the kind's key in :data:`NEMESES`."""

    name: ClassVar[str] = ""

    def unavailable(self, cluster: ChaosCluster) -> str | None:
        """Why this kind cannot hit ``cluster`` (the clock needs a faketime broker), or None."""
        return None

    def inject(self, cluster: ChaosCluster, rng: random.Random, topics: Sequence[str],
               avoid: Collection[str] = ()) -> Fault:
        """One fault; ``avoid``: hosts (``b2``) another fault of a mixed step holds, not to be
        picked (ignored by the kinds that hit the whole cluster: split, zk-kill)."""
        raise NotImplementedError

    def heal(self, cluster: ChaosCluster, fault: Fault) -> None:
        raise NotImplementedError

    def verify(self, cluster: ChaosCluster, fault: Fault) -> str:
        """Check right after :meth:`inject` that ``fault`` took effect (module docstring): the
        evidence, also kept in ``fault.evidence``; NemesisError (and ``evidence`` saying so) if not."""
        try:
            evidence = self._verify(cluster, fault)
        except NemesisError as e:
            fault.evidence = f"NOT VERIFIED: {e}"
            raise
        fault.evidence = evidence
        return evidence

    def _verify(self, cluster: ChaosCluster, fault: Fault) -> str:
        raise NotImplementedError

    def _fault(self, target: str, start: float, detail: str, pids: Sequence[int] = ()) -> Fault:
        logger.info("[nemesis] %s on %s: %s", self.name, target, detail)
        return Fault(self.name, target, start, None, detail, pids=[int(p) for p in pids])

    def _healed(self, fault: Fault) -> None:
        fault.end = time.time()
        fault.healed = True
        logger.info("[nemesis] %s on %s healed after %.1f s", self.name, fault.target,
                    fault.end - fault.start)


def _gone(pids: Sequence[int]) -> str:
    alive = [pid for pid in pids if process_state(pid) not in (None, "Z", "X")]
    if not pids or alive:
        raise NemesisError(f"pids {alive or '(none recorded)'} still running")
    return f"pids {list(pids)} gone"


def _broker_of(target: str) -> int:
    return int(target.removeprefix("b"))


def _serving_brokers(cluster: ChaosCluster, avoid: Collection[str] = ()) -> list[int]:
    paused = set(cluster.paused())
    return [b for b in cluster.alive() if b not in paused and f"b{b}" not in avoid]


def pick_leader(cluster: ChaosCluster, rng: random.Random, topics: Sequence[str],
                avoid: Collection[str] = ()) -> tuple[int, str]:
    """(broker id, why): the leader of a random partition of a random topic, else (no topic, no
    answer, no leader) a random running broker; never one of ``avoid``."""
    running = _serving_brokers(cluster, avoid)
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

    def inject(self, cluster: ChaosCluster, rng: random.Random, topics: Sequence[str],
               avoid: Collection[str] = ()) -> Fault:
        broker_id, why = pick_leader(cluster, rng, topics, avoid)
        pids = [cluster.pid(broker_id), *cluster.worker_pids(broker_id)]
        start = time.time()  # after the metadata asked to pick the target: the fault starts here
        cluster.kill(broker_id)
        return self._fault(f"b{broker_id}", start, f"kill -9 broker {broker_id} ({why}; pids {pids})", pids)

    def _verify(self, cluster: ChaosCluster, fault: Fault) -> str:
        return _gone(fault.pids)

    def heal(self, cluster: ChaosCluster, fault: Fault) -> None:
        broker_id = _broker_of(fault.target)
        cluster.start(broker_id)
        cluster.wait_serving(broker_id, _SERVING_TIMEOUT_S)
        self._healed(fault)


class Pause(Nemesis):
    name = "pause"

    def inject(self, cluster: ChaosCluster, rng: random.Random, topics: Sequence[str],
               avoid: Collection[str] = ()) -> Fault:
        broker_id, why = pick_leader(cluster, rng, topics, avoid)
        start = time.time()
        cluster.pause(broker_id)
        return self._fault(f"b{broker_id}", start, f"SIGSTOP broker {broker_id} ({why})",
                           cluster.paused_pids(broker_id))

    def _verify(self, cluster: ChaosCluster, fault: Fault) -> str:
        # a process running on another core acts on SIGSTOP when next scheduled: give it a moment
        deadline = time.monotonic() + _SIGNAL_TAKES_S
        while True:
            states = {pid: process_state(pid) for pid in fault.pids}
            if states and all(state in ("T", "t") for state in states.values()):
                return f"pids {fault.pids} in state T"
            if not states or time.monotonic() > deadline:
                raise NemesisError(f"not every pid stopped {_SIGNAL_TAKES_S:g} s after SIGSTOP: states "
                                   f"{states or '(no pid recorded)'}")
            time.sleep(0.01)

    def heal(self, cluster: ChaosCluster, fault: Fault) -> None:
        # Longer than the session timeout, whatever the hold: its ZooKeeper session must expire.
        until = fault.start + cluster.session_timeout_ms / 1000 + 1.0
        while (left := until - time.time()) > 0:
            time.sleep(min(left, 0.5))
        cluster.resume(_broker_of(fault.target))
        self._healed(fault)


class IsolateLeader(Nemesis):
    name = "isolate-leader"

    def inject(self, cluster: ChaosCluster, rng: random.Random, topics: Sequence[str],
               avoid: Collection[str] = ()) -> Fault:
        broker_id, why = pick_leader(cluster, rng, topics, avoid)
        start = time.time()
        cluster.network.cut(f"b{broker_id}")
        return self._fault(f"b{broker_id}", start, f"link of broker {broker_id} down ({why})")

    def _verify(self, cluster: ChaosCluster, fault: Fault) -> str:
        veth = cluster.network.hosts[fault.target].veth
        state = Path(f"/sys/class/net/{veth}/operstate").read_text().strip()
        if state != "down":
            raise NemesisError(f"link {veth} of {fault.target} is {state!r}, not down")
        return f"link {veth} down"

    def heal(self, cluster: ChaosCluster, fault: Fault) -> None:
        cluster.network.heal(fault.target)
        self._healed(fault)


class Split(Nemesis):
    name = "split"

    def inject(self, cluster: ChaosCluster, rng: random.Random, topics: Sequence[str],
               avoid: Collection[str] = ()) -> Fault:
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

    def _verify(self, cluster: ChaosCluster, fault: Fault) -> str:
        try:
            return cluster.network.verify_split()
        except RuntimeError as e:
            raise NemesisError(str(e)) from e

    def heal(self, cluster: ChaosCluster, fault: Fault) -> None:
        cluster.network.join()
        self._healed(fault)


class ZkKill(Nemesis):
    name = "zk-kill"

    def inject(self, cluster: ChaosCluster, rng: random.Random, topics: Sequence[str],
               avoid: Collection[str] = ()) -> Fault:
        start = time.time()
        assert cluster.ensemble is not None
        server = rng.choice(cluster.ensemble.alive())
        pid = cluster.ensemble.pid(server)
        cluster.ensemble.kill(server)
        return self._fault(f"zk{server}", start, f"kill -9 ZooKeeper server {server} (pid {pid})",
                           [pid] if pid is not None else ())

    def _verify(self, cluster: ChaosCluster, fault: Fault) -> str:
        assert cluster.ensemble is not None
        server = int(fault.target.removeprefix("zk"))
        if server in cluster.ensemble.alive():
            raise NemesisError(f"ZooKeeper server {server} still listed alive")
        return _gone(fault.pids) + f"; server {server} not alive"

    def heal(self, cluster: ChaosCluster, fault: Fault) -> None:
        assert cluster.ensemble is not None
        cluster.ensemble.restart(int(fault.target.removeprefix("zk")))
        self._healed(fault)


class WorkerKill(Nemesis):
    name = "worker-kill"

    def inject(self, cluster: ChaosCluster, rng: random.Random, topics: Sequence[str],
               avoid: Collection[str] = ()) -> Fault:
        start = time.time()
        brokers = [b for b in _serving_brokers(cluster, avoid) if cluster.slot_pids(b)]
        if not brokers:
            raise RuntimeError("no running broker has a worker")
        broker_id = rng.choice(brokers)
        pid = rng.choice(cluster.slot_pids(broker_id))  # a worker, not any child of the arbiter
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while process_state(pid) not in (None, "Z", "X") and time.monotonic() < deadline:
            time.sleep(0.02)
        return self._fault(f"b{broker_id}", start, f"kill -9 worker pid {pid} of broker {broker_id}", [pid])

    def _verify(self, cluster: ChaosCluster, fault: Fault) -> str:
        return _gone(fault.pids)

    def heal(self, cluster: ChaosCluster, fault: Fault) -> None:
        cluster.wait_serving(_broker_of(fault.target), _SERVING_TIMEOUT_S)
        self._healed(fault)


class ClockJump(Nemesis):
    name = "clock"

    def unavailable(self, cluster: ChaosCluster) -> str | None:
        if cluster.faketime_broker is None:
            return "the cluster has no faketime broker (ChaosCluster(faketime_broker=...))"
        return None

    def inject(self, cluster: ChaosCluster, rng: random.Random, topics: Sequence[str],
               avoid: Collection[str] = ()) -> Fault:
        reason = self.unavailable(cluster)
        if reason is not None:
            raise RuntimeError(f"clock: {reason}")
        start = time.time()
        broker_id = cluster.faketime_broker
        assert broker_id is not None
        if f"b{broker_id}" in avoid or broker_id not in _serving_brokers(cluster):
            raise NemesisError(f"clock: the faketime broker {broker_id} is held by another fault")
        offset = round(rng.choice((-1, 1)) * rng.uniform(*CLOCK_JUMP_S))
        cluster.set_clock_offset(broker_id, offset)
        return self._fault(f"b{broker_id}", start, f"wall clock of broker {broker_id} {offset:+d} s")

    def _verify(self, cluster: ChaosCluster, fault: Fault) -> str:
        broker_id = _broker_of(fault.target)
        path = cluster.faketime_path(broker_id)
        written = path.read_text().strip()
        expected = fault.detail.split(" ")[-2]  # "... broker N +123 s"
        if written != expected:
            raise NemesisError(f"{path} holds {written!r}, not {expected!r}")
        pid = cluster.pid(broker_id)
        try:
            environ = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0")
                           if "=" in item)
        except OSError as e:
            raise NemesisError(f"broker {broker_id}'s arbiter (pid {pid}) cannot be read: {e!r}") from e
        if "libfaketime" not in environ.get("LD_PRELOAD", "") or \
                environ.get("FAKETIME_TIMESTAMP_FILE") != str(path) or "FAKETIME" in environ:
            raise NemesisError(f"broker {broker_id} (pid {pid}) does not run under libfaketime on {path}: "
                               f"LD_PRELOAD={environ.get('LD_PRELOAD')!r}, "
                               f"FAKETIME_TIMESTAMP_FILE={environ.get('FAKETIME_TIMESTAMP_FILE')!r}, "
                               f"FAKETIME={environ.get('FAKETIME')!r}")
        return f"{path} holds {written}; pid {pid} preloads libfaketime on it"

    def heal(self, cluster: ChaosCluster, fault: Fault) -> None:
        cluster.set_clock_offset(_broker_of(fault.target), 0)
        self._healed(fault)


class DiskFull(Nemesis):
    name = "disk-full"

    def inject(self, cluster: ChaosCluster, rng: random.Random, topics: Sequence[str],
               avoid: Collection[str] = ()) -> Fault:
        start = time.time()
        broker_id = rng.choice(_serving_brokers(cluster, avoid))
        filled = cluster.fill_disk(broker_id)
        return self._fault(f"b{broker_id}", start,
                           f"data disk of broker {broker_id} filled ({filled} bytes of filler)")

    def _verify(self, cluster: ChaosCluster, fault: Fault) -> str:
        free = cluster.disk_free_bytes(_broker_of(fault.target))
        if free >= 4096:
            raise NemesisError(f"{free} bytes still free on {fault.target}'s data disk")
        return f"{free} bytes free"

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
