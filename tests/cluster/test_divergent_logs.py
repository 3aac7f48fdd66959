"""Divergent logs on a real cluster (KIP-101/KIP-320): a leader takes acks=1 records that no
follower fetched, and dies before its ISR shrinks; a follower becomes leader in the next epoch and
takes other records at the same offsets.  When the old leader returns it follows, finds that its
last epoch ends earlier at the new leader, truncates its extra records, and catches up: afterwards
every replica's segment files are byte-identical and the leader-epoch checkpoints agree.

The acks=1 records written only on the old leader are gone, as docs/REPLICATION.md says: acks=1
promises only the leader's flush, which does not survive a change of leader before the followers
fetched the records.  Every acks=all record is kept."""

from __future__ import annotations

import os
import signal
import time

import pytest
from harness import wait_until

from hpbroker import protocol, records
from hpbroker.errors import NotEnoughReplicasError, NotLeaderOrFollowerError, PartitionNotAvailableError

pytestmark = pytest.mark.zookeeper

TOPIC = "diverge"
# Retried while a leader moves: its worker has no role yet, or the ISR it knows is short.
_RETRIABLE = {NotLeaderOrFollowerError.code, NotEnoughReplicasError.code, PartitionNotAvailableError.code}


def make_batch(tag: str, count: int = 3) -> bytes:
    return records.build_batch([f"{tag}/{i}/".encode() for i in range(count)], producer="cluster-tests")


def produce(cluster, broker_id: int, tag: str, *, acks: int, timeout_s: float = 30.0) -> int:
    """Produce one batch to ``broker_id`` (retrying while a leadership change settles); its base offset."""
    def attempt():
        request = protocol.ProduceRequest(TOPIC, 0, acks=acks, timeout_ms=10_000, payload=make_batch(tag))
        header, response = cluster.client(broker_id).request(request, timeout_s=20)
        if header.error_code in _RETRIABLE:
            return None
        assert header.error_code == 0, header
        return response.base_offset + 1  # wait_until wants a true value: offset 0 is one
    what = f"{tag!r} acknowledged by broker {broker_id}"
    return wait_until(attempt, timeout_s, interval_s=0.1, what=what) - 1


def signal_workers(cluster, broker_ids, signum: int) -> None:
    """SIGSTOP / SIGCONT the worker processes (only) of these brokers: their arbiters keep their
    ZooKeeper sessions, so the controller still counts them alive and in the ISR."""
    for broker_id in broker_ids:
        for pid in cluster.processes[broker_id].worker_pids().values():
            os.kill(pid, signum)


def test_a_returning_leader_truncates_what_the_new_leader_never_had_and_ends_byte_identical(cluster):
    # The followers are paused for a few seconds below; the leader must not drop them from the ISR
    # meanwhile (then the controller could not elect them).
    cluster.settings["replica_lag_time_max_ms"] = 20_000
    for broker_id in (0, 1, 2):
        cluster.start(broker_id)
    cluster.create_topic(TOPIC, 1, 3, via=0, configs={"min_insync_replicas": "2"})
    partition = cluster.wait_for_leaders(TOPIC, 1, via=0, isr_size=3).partitions[0]
    old, epoch = partition.leader, partition.leader_epoch
    followers = [b for b in (0, 1, 2) if b != old]

    assert produce(cluster, old, "committed", acks=-1) == 0
    wait_until(lambda: all(cluster.segment_bytes(f, TOPIC, 0) == cluster.segment_bytes(old, TOPIC, 0)
                           for f in followers), 30, interval_s=0.1, what="the followers caught up")

    signal_workers(cluster, followers, signal.SIGSTOP)
    try:
        # A replica fetch parked at the leader when the followers stopped is answered (empty) after
        # replica_fetch_wait_max_ms (500); only then may records come, or they would reach a
        # follower's socket and be appended when it resumes.
        time.sleep(1.5)
        lost = [produce(cluster, old, f"lost{k}", acks=1, timeout_s=10) for k in range(2)]
        assert lost == [3, 6]  # flushed on the old leader alone: acknowledged
        assert b"lost1/2/" in cluster.segment_bytes(old, TOPIC, 0)
        assert len(cluster.metadata(followers[0], TOPIC).partitions[0].isr) == 3, \
            "the ISR shrank while the followers were paused: the test cannot make divergent logs"
        cluster.kill(old)
    finally:
        signal_workers(cluster, followers, signal.SIGCONT)

    new = wait_until(lambda: (m := cluster.metadata(followers[0], TOPIC).partitions[0]).leader in followers
                     and m.leader_epoch > epoch and m, 40, interval_s=0.1, what="a new leader from the ISR")
    assert all(b"lost" not in cluster.segment_bytes(f, TOPIC, 0) for f in followers), \
        "a follower got the acks=1 records after all: the logs did not diverge"
    kept = [produce(cluster, new.leader, f"epoch{new.leader_epoch}-{k}", acks=-1) for k in range(3)]
    assert kept == [3, 6, 9]  # the same offsets as the old leader's acks=1 records

    cluster.start(old)
    cluster.processes[old].wait_for_log(rf"\[{TOPIC}-0 worker=\d+\] diverges from the leader", 60)
    # back in the ISR; with auto_leader_rebalance it then leads again (the preferred replica)
    settled = wait_until(lambda: (m := cluster.metadata(followers[0], TOPIC).partitions[0]).leader == old
                         and len(m.isr) == 3 and m, 60, interval_s=0.1,
                         what="the old leader back in the ISR and leading again")
    assert settled.leader_epoch > new.leader_epoch
    assert produce(cluster, old, "final", acks=-1) == 12

    def identical():
        logs = [cluster.segment_bytes(b, TOPIC, 0) for b in (0, 1, 2)]
        return b"final/2/" in logs[0] and logs[0] == logs[1] == logs[2] and logs[0]
    stored = wait_until(identical, 30, interval_s=0.1, what="byte-identical segments on every replica")
    assert b"lost" not in stored, "an acks=1 record of the deposed leader survived on the replicas"
    for tag in ("committed", "epoch1-0", "epoch1-2", "final"):
        assert f"{tag}/0/".encode() in stored, tag
    checkpoints = [cluster.epoch_checkpoint(b, TOPIC, 0) for b in (0, 1, 2)]
    assert checkpoints[0] == checkpoints[1] == checkpoints[2], checkpoints
    entries = [tuple(map(int, line.split())) for line in checkpoints[0].splitlines()[2:]]
    assert entries[0] == (epoch, 0) and (new.leader_epoch, 3) in entries, entries
    assert entries[-1] == (settled.leader_epoch, 12), entries
