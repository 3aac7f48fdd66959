"""A leader whose worker slot crash-loops hands its partitions over: the broker reports those
replicas offline in its registration (the broker itself stays up and registered), the controller
elects another in-sync replica and drops the broker from the ISR, and acks=all producers go on
with the new leader within seconds.  When the slot's retried worker has served its probation
(BACKOFF_RESET_S) the broker reports the replicas back, they catch up as followers, rejoin the
ISR and get their preferred leadership back.  Every
acknowledged record is read back at the offset it was acknowledged with."""

from __future__ import annotations

import threading
import time

import pytest
from harness import SlotKiller, read_partition, wait_until

from hpbroker.client import Producer
from hpbroker.workers.ownership import owner_slot
from hpbroker.workers.slots import BACKOFF_RESET_S, RESTART_LIMIT

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]

TOPIC = "crashloop"
WORKERS = 2
KILLS = RESTART_LIMIT + 3  # six deaths in a row (crash-looping), then two of its retries


def test_a_leader_whose_worker_slot_crash_loops_hands_over_and_rejoins(cluster):
    for broker_id in (0, 1, 2):
        cluster.start(broker_id, workers=WORKERS)
    cluster.create_topic(TOPIC, 1, 3, via=0, configs={"min_insync_replicas": "2"})
    first = cluster.wait_for_leaders(TOPIC, 1, via=0, isr_size=3).partitions[0]
    victim, preferred = first.leader, first.replicas[0]
    others = [b for b in (0, 1, 2) if b != victim]
    watcher = others[0]

    acknowledged: dict[int, bytes] = {}
    acked_at: list[float] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def produce() -> None:
        try:
            settings = {"acks": "all", "request_timeout_ms": 3000, "delivery_timeout_ms": 120_000,
                        "linger_ms": 2, "audit_topic": None, "name": "crashloop"}
            with Producer(cluster.bootstrap(*others), **settings) as producer:
                sent = 0
                while not stop.is_set() and sent < 100_000:  # about 400 a second at most
                    futures = [(i, producer.send_future(TOPIC, b"record %d" % i, partition=0))
                               for i in range(sent, sent + 20)]
                    sent += 20
                    for i, future in futures:
                        metadata = future.result(120)
                        acknowledged[metadata.offset] = b"record %d" % i
                        acked_at.append(time.monotonic())
                    time.sleep(0.05)
        except BaseException as e:  # reported by the test
            failures.append(e)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    wait_until(lambda: len(acknowledged) >= 200 or failures, 60, what="the first acknowledged records")
    assert not failures, failures

    broker = cluster.processes[victim]
    killer = SlotKiller(broker, owner_slot(TOPIC, 0, WORKERS), KILLS, timeout_s=90)
    killer.start()
    try:
        wait_until(lambda: "is crash-looping" in broker.log(), 30, what="the slot crash-looping")
        looping_at = time.monotonic()

        def moved():
            state = cluster.metadata(watcher, TOPIC).partitions[0]
            return state.leader not in (-1, victim) and victim not in state.isr and state

        moved_state = wait_until(moved, 30, interval_s=0.05,
                                 what="a new leader without the crash-looping broker")
        elected_s = time.monotonic() - looping_at
        acked_before = len(acked_at)
        wait_until(lambda: len(acked_at) > acked_before + 20 or failures, 30,
                   what="acks=all writes acknowledged by the new leader")
        resumed_s = acked_at[acked_before] - looping_at
        print(f"crash-looping -> new leader {moved_state.leader} elected in {elected_s:.2f} s, "
              f"acks=all writes acknowledged again after {resumed_s:.2f} s")
        assert resumed_s < 10, f"producers waited {resumed_s:.1f} s for the new leader"
        assert cluster.processes[victim].process.poll() is None, "the broker itself stays up"
        assert "reporting replicas offline" in broker.log()
    finally:
        killer.join(120)
    assert len(killer.killed) == KILLS

    # the slot serves again, and after its probation its replica catches up, rejoins the ISR, and
    # leads again if preferred
    wait_until(lambda: victim in cluster.metadata(watcher, TOPIC).partitions[0].isr, BACKOFF_RESET_S + 60,
               interval_s=0.1,
               what="the recovered replica back in the ISR")
    assert "reporting replicas online again" in broker.log()
    if victim == preferred:
        wait_until(lambda: cluster.metadata(watcher, TOPIC).partitions[0].leader == victim, 30,
                   interval_s=0.1, what="leadership back on the preferred replica")
    settled = len(acked_at)
    wait_until(lambda: len(acked_at) > settled + 20 or failures, 30,
               what="acknowledged writes after the rejoin")
    stop.set()
    producer.join(150)
    assert not failures, failures

    read = read_partition(cluster.bootstrap(*others), TOPIC, 0, max(acknowledged) + 1)
    lost = {o: v for o, v in acknowledged.items() if read.get(o) != v}
    assert not lost, f"{len(lost)} acknowledged records lost or moved, e.g. {sorted(lost.items())[:5]}"
