"""A crash-looping worker slot's replicas stay reported offline while its retried worker is on
probation: leadership stays with the replica it moved to, the broker stays out of the ISR and
counts them in hpbroker_offline_replicas, and a death during the probation changes none of it.
Only once the retried worker has served BACKOFF_RESET_S without dying are they reported back:
they catch up, rejoin the ISR and lead again if preferred.  Every acknowledged record is read
back at the offset it was acknowledged with."""

from __future__ import annotations

import os
import signal
import time

import pytest
from harness import SlotKiller, free_ports, read_partition, wait_until
from scrape import scrape

from hpbroker.client import Producer
from hpbroker.workers.ownership import owner_slot
from hpbroker.workers.slots import BACKOFF_RESET_S, RESTART_LIMIT

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]

TOPIC = "probation"
WORKERS = 2
WATCH_S = 8.0  # how long each check of the probation watches the cluster


def _produce(bootstrap: str, first: int, count: int) -> dict[int, bytes]:
    """``count`` records, acks=all; offset -> value."""
    with Producer(bootstrap, acks="all", request_timeout_ms=5000, delivery_timeout_ms=60_000,
                  audit_topic=None) as producer:
        futures = [(b"record %d" % i, producer.send_future(TOPIC, b"record %d" % i, partition=0))
                   for i in range(first, first + count)]
        return {future.result(60).offset: value for value, future in futures}


def test_a_retried_slot_reports_its_replicas_back_only_after_its_probation(cluster):
    metrics_ports = {}
    for broker_id in (0, 1, 2):
        metrics_ports[broker_id] = cluster.settings["metrics_port"] = free_ports(1)
        cluster.start(broker_id, workers=WORKERS)
    del cluster.settings["metrics_port"]
    cluster.create_topic(TOPIC, 1, 3, via=0, configs={"min_insync_replicas": "2"})
    first = cluster.wait_for_leaders(TOPIC, 1, via=0, isr_size=3).partitions[0]
    victim, preferred = first.leader, first.replicas[0]
    others = [b for b in (0, 1, 2) if b != victim]
    watcher, bootstrap = others[0], cluster.bootstrap(*others)
    broker, slot = cluster.processes[victim], owner_slot(TOPIC, 0, WORKERS)
    acknowledged = _produce(bootstrap, 0, 100)

    def partition():
        return cluster.metadata(watcher, TOPIC).partitions[0]

    def offline_replicas() -> float | None:
        return scrape(metrics_ports[victim]).value("hpbroker_offline_replicas")

    assert offline_replicas() == 0
    killer = SlotKiller(broker, slot, RESTART_LIMIT + 1, timeout_s=60)  # crash-looping at the last death
    killer.start()
    killer.join(90)
    assert len(killer.killed) == RESTART_LIMIT + 1
    broker.wait_for_log(rf"worker slot={slot} is crash-looping", timeout_s=30)
    moved = wait_until(lambda: (p := partition()).leader not in (-1, victim) and victim not in p.isr and p,
                       30, interval_s=0.05, what="a new leader without the crash-looping broker")
    acknowledged |= _produce(bootstrap, 100, 100)

    def watch_probation(retried: str) -> None:
        """For WATCH_S after the retried worker serves: still offline, out of the ISR, not leading."""
        broker.wait_for_log(rf"worker slot={slot} pid={retried} serving", timeout_s=30)
        deadline = time.monotonic() + WATCH_S
        while time.monotonic() < deadline:
            state = partition()
            assert state.leader == moved.leader and victim not in state.isr, \
                f"the replica on probation came back: leader {state.leader}, isr {state.isr}"
            assert "reporting replicas online again" not in broker.log()
            assert offline_replicas() == 1
            time.sleep(0.2)

    # the retried worker serves: on probation, its replica stays offline
    retried = wait_until(lambda: (pid := broker.worker_pids()[slot]) not in killer.killed and pid, 30,
                         what="the retried worker")
    watch_probation(retried)
    # it dies during the probation: held back again, and nothing moves
    os.kill(retried, signal.SIGKILL)
    broker.wait_for_log(rf"worker slot={slot} is crash-looping", timeout_s=30, count=2)
    assert partition().leader == moved.leader
    again = wait_until(lambda: (pid := broker.worker_pids()[slot]) != retried and pid, 30,
                       what="the worker retried again")
    watch_probation(again)
    acknowledged |= _produce(bootstrap, 200, 100)

    # served BACKOFF_RESET_S without dying: reported back, catches up, rejoins, leads again if preferred
    broker.wait_for_log("reporting replicas online again", timeout_s=BACKOFF_RESET_S + 30)
    wait_until(lambda: victim in partition().isr, 60, interval_s=0.1, what="the replica back in the ISR")
    assert offline_replicas() == 0
    if victim == preferred:
        wait_until(lambda: partition().leader == victim, 30, interval_s=0.1,
                   what="leadership back on the preferred replica")
    acknowledged |= _produce(cluster.bootstrap(), 300, 100)

    read = read_partition(cluster.bootstrap(), TOPIC, 0, max(acknowledged) + 1)
    lost = {o: v for o, v in acknowledged.items() if read.get(o) != v}
    assert not lost, f"{len(lost)} acknowledged records lost or moved, e.g. {sorted(lost.items())[:5]}"
