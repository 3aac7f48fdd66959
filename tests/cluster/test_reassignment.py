"""Moving replicas under load: ``hpbroker partitions reassign`` moves a partition from brokers
{0, 1} to {1, 2} (broker 2 new to it) while an acks=all producer runs; nothing acknowledged is
lost, broker 2 ends with the same bytes, broker 0's copy is deleted."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from harness import wait_until

from hpbroker import protocol
from hpbroker.client import Consumer, Producer, TopicPartition

pytestmark = pytest.mark.zookeeper


def _log_bytes(directory):
    return b"".join(p.read_bytes() for p in sorted(directory.glob("*.log")))


def test_a_reassignment_under_load_moves_a_partition_to_a_new_broker_with_nothing_lost(cluster):
    for broker_id in (0, 1, 2):
        cluster.start(broker_id)
    create = protocol.CreateTopicRequest("moving", 1, [protocol.TopicConfigEntry("min_insync_replicas", "2")],
                                         replication_factor=2)
    header, _ = cluster.client(0).request(create, timeout_s=40)
    assert header.error_code == 0, header.error_message
    metadata = cluster.wait_for_leaders("moving", 1, via=0, isr_size=2)
    before = metadata.partitions[0].replicas
    target = [b for b in (0, 1, 2) if b not in before] + [b for b in before][:1]
    dropped = next(b for b in before if b not in target)

    acknowledged: list[tuple[int, bytes]] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def produce():
        try:
            with Producer(cluster.bootstrap(), acks="all", audit_topic=None, request_timeout_ms=3000,
                          delivery_timeout_ms=60_000, linger_ms=2) as producer:
                i = 0
                while not stop.is_set() and i < 30_000:
                    values = [b"r%d" % j for j in range(i, i + 20)]
                    futures = [(producer.send_future("moving", value), value) for value in values]
                    i += 20
                    for future, value in futures:
                        acknowledged.append((future.result(60).offset, value))
        except BaseException as e:
            failures.append(e)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(acknowledged) >= 500 or failures, 60, what="records before the move")
        command = [sys.executable, "-m", "hpbroker.cli", "partitions", "reassign", "moving", "--replicas",
                   f"0={','.join(map(str, target))}", "--timeout", "120", "--zookeeper", cluster.connect]
        done = subprocess.run(command, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "waiting for the new replicas to join the ISR" in done.stdout or "done" in done.stdout
        wanted = f"moving: done; replicas 0={','.join(map(str, target))}"
        assert done.stdout.strip().endswith(wanted), done.stdout
        count = len(acknowledged)
        wait_until(lambda: len(acknowledged) >= count + 200 or failures, 60, what="records after the move")
    finally:
        stop.set()
        thread.join(120)
    assert not failures, failures
    for via in (0, 1, 2):
        moved = cluster.wait_for_leaders("moving", 1, via=via, isr_size=2).partitions[0]
        assert sorted(moved.replicas) == sorted(target) and sorted(moved.isr) == sorted(target)
    # the dropped broker deletes its copy; the new one holds the leader's bytes
    wait_until(lambda: not (cluster.tmp_path / f"data-{dropped}" / "moving-0").exists(), 30,
               what=f"broker {dropped} to delete its replica")
    leader = cluster.metadata(0, "moving").partitions[0].leader
    follower = next(b for b in target if b != leader)
    directories = [cluster.tmp_path / f"data-{b}" / "moving-0" for b in (leader, follower)]
    wait_until(lambda: _log_bytes(directories[0]) == _log_bytes(directories[1]), 30,
               what="the new replica to hold the leader's bytes")
    with Consumer(cluster.bootstrap(), consumer_timeout_ms=3000) as consumer:
        tp = TopicPartition("moving", 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        stored = {}
        end = max(o for o, _ in acknowledged)
        while not stored or max(stored) < end:
            batch = [(r.offset, r.value) for r in consumer]
            assert batch, f"nothing more to read at {max(stored, default=-1)}, acknowledged up to {end}"
            stored.update(batch)
    missing = [(o, v) for o, v in acknowledged if stored.get(o) != v]
    assert not missing, f"{len(missing)} acknowledged records lost: {missing[:5]}"


def test_a_reassignment_to_a_broker_that_is_not_alive_is_refused(cluster):
    cluster.start(0)
    cluster.start(1)
    header, _ = cluster.client(0).request(protocol.CreateTopicRequest("stays", 1, [], replication_factor=2),
                                          timeout_s=40)
    assert header.error_code == 0, header.error_message
    cluster.wait_for_leaders("stays", 1, via=0, isr_size=2)
    command = [sys.executable, "-m", "hpbroker.cli", "partitions", "reassign", "stays", "--replicas", "0=0,7",
               "--zookeeper", cluster.connect]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "brokers [7] are not alive" in done.stderr, done.stderr
