"""A follower whose own log fails while it applies a fetch response (a truncation that reads a
damaged local segment) does not blame its leader: the error is this replica's (logged as such,
the partition's storage-error path, an ordinary retry), not "cannot replicate offset X from its
leader" with the partition counted as failed to fetch.  Only bytes from the leader that fail this
replica's checks are the leader's range's fault (tests/workers/test_replication_damaged_range.py).

The follower runs in this process (a worker's Replication over a real partition log, driven as
the worker's loop drives it); its leader is a real worker process."""

from __future__ import annotations

import logging
import time

from replication_harness import TOPIC
from worker_harness import make_batch

from hpbroker.errors import DamagedRangeError
from hpbroker.io.config import LogConfig
from hpbroker.workers.backend import PartitionSpec
from hpbroker.workers.partitions import Flusher, PartitionSet
from hpbroker.workers.replication import Replication


def test_a_damaged_local_segment_met_while_truncating_is_this_replicas_error_not_the_leaders(
        brokers, tmp_path, monkeypatch, caplog):
    (leader,) = brokers(1)
    ack = leader.role(TOPIC, 0, "leader", epoch=2, leader=0, leader_address=leader.address, replicas=[0, 1],
                      isr=[0])
    assert ack["error"] is None, ack
    partitions = PartitionSet(str(tmp_path / "follower"), LogConfig(), Flusher())
    partition = partitions.open(PartitionSpec(TOPIC, 0, replicated=True))
    log = partition.log
    log.begin_leader_epoch(1)  # records of an older leader epoch the new leader lacks: it must truncate
    log.append(make_batch("a"), leader_epoch=1)
    log.flush()
    truncations = []

    def damaged(offset: int) -> int:
        truncations.append(offset)
        raise DamagedRangeError(f"[{TOPIC}-0] offset {offset} lies in a damaged range of this log", 0, 3)
    monkeypatch.setattr(log, "truncate_to", damaged)

    replication = Replication(1, partitions, lambda op, **body: None)
    caplog.set_level(logging.DEBUG, logger="hpbroker.workers.replication")
    try:
        assert replication.apply_role({"topic": TOPIC, "partition": 0, "role": "follower", "leader_epoch": 2,
                                       "leader": 0, "leader_address": leader.address, "replicas": [0, 1],
                                       "isr": [0]}) == []
        follower = partition.replica
        deadline = time.monotonic() + 30
        while not truncations or follower.in_flight:  # the loop: until the truncation was tried
            assert time.monotonic() < deadline, "the follower never tried to truncate"
            for fetcher in replication.fetchers():
                replication.process(fetcher)
            replication.tick(time.monotonic())
            time.sleep(0.005)
        assert follower.stats()["fetch_failed"] == 0, "the leader's range counted as failed"
        assert "cannot replicate offset" not in caplog.text
        assert "this replica's log" in caplog.text and "lies in a damaged range of this log" in caplog.text
    finally:
        for fetcher in replication.fetchers():
            fetcher.close()
        partitions.close_all()
