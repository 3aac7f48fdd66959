"""Many partitions of one worker changing role at once (a broker died: the controller moved its
leaderships here), with real worker processes (``replication_harness``).

A new leader records its epoch in memory and writes the ``leader-epoch-checkpoint`` file later
(``PartitionLog.begin_leader_epoch(durable=False)``): before the first records of the epoch are
flushed, and for the rest a few per loop turn.  These tests check that every role is applied and
every epoch file ends up written, durably before any record of the epoch; they print how long the
worker took to apply the roles (``-s`` shows it) but assert no timing."""

from __future__ import annotations

import os
import socket
import time

from replication_harness import ReplicaBroker, wait_until
from worker_harness import make_batch, produce_request

from hpbroker.io.leader_epochs import LEADER_EPOCH_FILE_NAME
from hpbroker.workers import backend

TOPIC = "mass"
PARTITIONS = 200


def epochs_on_disk(broker: ReplicaBroker, partition: int) -> list[tuple[int, int]]:
    """The entries of the partition's leader-epoch file as it is on disk ([] without one)."""
    path = os.path.join(broker.worker.directory(TOPIC, partition), LEADER_EPOCH_FILE_NAME)
    try:
        with open(path, "rb") as f:
            lines = f.read().decode("ascii").splitlines()
    except FileNotFoundError:
        return []
    return [tuple(int(field) for field in line.split()) for line in lines[2:]]


def send_roles(broker: ReplicaBroker, role: str, *, epoch: int, leader: int,
               leader_address: list | None = None) -> float:
    """Send a role for every partition at once, without waiting; then wait for every ack (each
    without error).  Returns the seconds from the first send to the last ack: how long the
    worker's loop was busy applying them."""
    arbiter = broker.arbiter
    idents = set()
    started = time.perf_counter()
    for partition in range(PARTITIONS):
        ident = arbiter.next_correlation_id()
        idents.add(ident)
        arbiter.send_frames(0, backend.encode_control(
            "replica_role", id=ident, topic=TOPIC, partition=partition, role=role, leader_epoch=epoch,
            leader=leader, leader_address=broker.address if leader == broker.broker_id else leader_address,
            replicas=[0, 1], isr=[0, 1], min_insync_replicas=1, replica_lag_time_max_ms=30_000))
    while idents:
        _identity, message = arbiter.receive(60)
        if isinstance(message, backend.Control) and message.op == "ack":
            assert message.body["error"] is None, message.body
            idents.discard(message.body["id"])
    return time.perf_counter() - started


def test_two_hundred_partitions_made_leader_at_once_write_every_epoch_file(tmp_path):
    broker = ReplicaBroker(0, str(tmp_path), partitions=[(TOPIC, p) for p in range(PARTITIONS)],
                           log={"flush_fsync": True})
    try:
        broker.start()
        as_leader = send_roles(broker, "leader", epoch=3, leader=0)
        # A record of the new epoch, flushed at once: its epoch is on disk before it.
        header, response = broker.call(produce_request(TOPIC, 7, make_batch("first"), acks=1))
        assert (header.error_code, response.base_offset) == (0, 0), header
        assert epochs_on_disk(broker, 7) == [(3, 0)]
        # The others without a record: written by the loop, a few per turn.
        wait_until(lambda: all(epochs_on_disk(broker, p) == [(3, 0)] for p in range(PARTITIONS)),
                   timeout_s=30, what="every partition's epoch file written")
        # Then follower of broker 1, whose data port (a listener that never answers) each
        # partition connects to; then of no leader at all.
        with socket.create_server(("127.0.0.1", 0)) as leader_port:
            address = ["127.0.0.1", leader_port.getsockname()[1]]
            as_follower = send_roles(broker, "follower", epoch=4, leader=1, leader_address=address)
            without_leader = send_roles(broker, "follower", epoch=5, leader=-1)
        print(f"\n{PARTITIONS} partitions made leader at once: applied in {as_leader * 1000:.0f} ms; made "
              f"follower: {as_follower * 1000:.0f} ms; follower of no leader: {without_leader * 1000:.0f} ms")
    finally:
        broker.close()
