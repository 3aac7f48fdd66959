"""A follower whose leader cannot give it a range intact: the leader's segment bytes, below its
flushed end, damaged after they were written, so what the leader sends fails the follower's CRC
check.  Real worker processes (brokers 0 and 1); the test plays the controller."""

from __future__ import annotations

import os
import time

from replication_harness import TOPIC, segment_bytes, wait_until
from worker_harness import make_batch, produce_request

from hpbroker.protocol import ApiKey
from hpbroker.workers.exporter import _Role
from hpbroker.workers.stats import read_stats


def _entry(broker) -> dict | None:
    stats = read_stats(broker.run_dir, 0)
    return stats and next((p for p in stats["partitions"] if p["topic"] == TOPIC), None)


def _fetches_served(leader) -> int:
    stats = read_stats(leader.run_dir, 0) or {"requests": []}
    return sum(count for api_key, _transport, count in stats["requests"] if api_key == ApiKey.FETCH)


def _roles(leader, follower, epoch: int) -> None:
    for broker, role in ((leader, "leader"), (follower, "follower")):
        ack = broker.role(TOPIC, 0, role, epoch=epoch, leader=0, leader_address=leader.address,
                          replicas=[0, 1], isr=[0])
        assert ack["error"] is None, ack


def test_a_damaged_range_at_the_leader_is_logged_once_backed_off_counted_failed_and_retried_on_a_new_epoch(
        brokers, capfd):
    leader, follower = brokers(2, metrics_port=2)  # the workers write their stats files
    ack = leader.role(TOPIC, 0, "leader", epoch=1, leader=0, leader_address=leader.address,
                      replicas=[0, 1], isr=[0])
    assert ack["error"] is None, ack
    for i in range(3):
        header, response = leader.call(produce_request(TOPIC, 0, make_batch(f"b{i}"), acks=1))
        assert (header.error_code, response.base_offset) == (0, 3 * i)
    directory = leader.worker.directory(TOPIC, 0)
    (name,) = [n for n in os.listdir(directory) if n.endswith(".log")]
    path = os.path.join(directory, name)
    intact = segment_bytes(directory)
    position = len(intact) - 5  # a record value byte of the last batch, far below the flushed end
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(bytes([intact[position] ^ 0xFF]))

    follower.role(TOPIC, 0, "follower", epoch=1, leader=0, leader_address=leader.address,
                  replicas=[0, 1], isr=[0])
    entry = wait_until(lambda: (e := _entry(follower)) and e.get("fetch_failed") == 1 and e,
                       what="the partition counted failed in the follower's stats")
    assert (entry["role"], entry["failed_offset"], entry["high_watermark"]) == ("follower", 0, 0)
    assert _Role.parse(entry).fetch_failed == 1  # what hpbroker_replica_fetch_failed_partitions sums
    served = _fetches_served(leader)
    time.sleep(3.0)  # backoff 0.1, 0.2, 0.4, 0.8, 1.6 s ...: a handful of fetches, not a hot loop
    wait_until(lambda: _fetches_served(leader) >= served, what="fresh stats")
    assert _fetches_served(leader) - served <= 8
    assert _entry(follower)["fetch_failed"] == 1

    with open(path, "r+b") as f:  # the leader's bytes repaired; a new epoch retries at once
        f.seek(position)
        f.write(bytes([intact[position]]))
    _roles(leader, follower, epoch=2)
    wait_until(lambda: segment_bytes(follower.worker.directory(TOPIC, 0)) == intact,
               what="the follower's segments equal to the leader's")
    wait_until(lambda: (e := _entry(follower)) and e.get("fetch_failed") == 0,
               what="the partition no longer counted failed")
    errors = [line for line in capfd.readouterr().err.splitlines()
              if "cannot replicate offset 0 from its leader, broker 0 (leader epoch 1)" in line]
    assert len(errors) == 1, errors
    assert "ERROR" in errors[0] and f"{TOPIC}-0" in errors[0] and "CRC" in errors[0].upper()
