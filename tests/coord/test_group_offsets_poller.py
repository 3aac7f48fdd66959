"""GroupOffsetsPoller: every group's committed offsets of the broker's topics, read off the caller's
thread for the lag metrics."""

from __future__ import annotations

import pytest
from harness import wait_until

from hpbroker.coord.groups import GroupRegistry
from hpbroker.coord.lag import GroupOffsetsPoller
from hpbroker.errors import CoordinationError

pytestmark = pytest.mark.zookeeper


def test_a_round_reads_every_group_s_offsets_of_the_wanted_topics_only(zk):
    GroupRegistry(zk, "audit").write_offsets({("orders", 0): 5, ("orders", 1): 7, ("logs", 0): 1})
    GroupRegistry(zk, "billing").write_offsets({("orders", 1): 3})
    GroupRegistry(zk, "other").write_offsets({("logs", 0): 9})
    poller = GroupOffsetsPoller(zk, interval_s=60)
    assert poller.read(frozenset({"orders", "missing"})) == {
        ("audit", "orders", 0): 5, ("audit", "orders", 1): 7, ("billing", "orders", 1): 3}
    assert poller.read(frozenset()) == {}


def test_no_groups_at_all_is_an_empty_round(zk):
    assert GroupOffsetsPoller(zk, interval_s=60).read(frozenset({"orders"})) == {}


def test_the_thread_keeps_a_fresh_snapshot_and_follows_the_topics(zk):
    registry = GroupRegistry(zk, "audit")
    registry.write_offsets({("orders", 0): 5, ("logs", 0): 2})
    poller = GroupOffsetsPoller(zk, interval_s=0.05)
    poller.topics = frozenset({"orders"})
    poller.start()
    try:
        wait_until(lambda: poller.snapshot and poller.snapshot.offsets == {("audit", "orders", 0): 5},
                   what="the first snapshot")
        registry.write_offsets({("orders", 0): 8})
        poller.topics = frozenset({"orders", "logs"})
        wait_until(lambda: poller.snapshot.offsets == {("audit", "orders", 0): 8, ("audit", "logs", 0): 2},
                   what="the new offset and topic")
    finally:
        poller.close()
    poller.close()


def test_a_round_is_bounded_by_its_timeout(sessions, zk):
    for g in range(20):
        GroupRegistry(zk, f"g{g}").write_offsets({("orders", p): p for p in range(10)})
    poller = GroupOffsetsPoller(sessions(), interval_s=60, timeout_s=0.000001)
    with pytest.raises(CoordinationError, match="no answer from ZooKeeper within"):
        poller.read(frozenset({"orders"}))
