"""Consumer groups with real processes: members killed with SIGKILL, joining, paused with SIGSTOP
past their session timeout, and ZooKeeper itself stopped and restarted.  Each member is a
``group_consumer.py`` process writing what it consumed to a file; the group is read back from
ZooKeeper."""

from __future__ import annotations

import time

import pytest
from group_harness import (
    ConsumerGroupRun,
    create_topic,
    produce,
    start_registered_broker,
    unique_name,
    wait_balanced,
    wait_topic_registered,
)
from harness import wait_until

from hpbroker.coord.groups import GroupRegistry
from hpbroker.coord.server import ZooKeeperServer
from hpbroker.coord.session import connect

pytestmark = pytest.mark.zookeeper
pytest_plugins = ["group_fixtures"]  # group_cluster, group_zk

SESSION_TIMEOUT_MS = 3000  # the members' (ConsumerGroupRun's default)
PARTITIONS = 12


def new_topic(cluster, zk_session, partitions: int = PARTITIONS) -> str:
    topic = unique_name("t")
    create_topic(cluster.port, topic, partitions)
    wait_topic_registered(GroupRegistry(zk_session, "any"), topic, partitions)
    return topic


def assert_in_order(run: ConsumerGroupRun) -> None:
    """Each member handed out each partition's records in increasing offsets (it only ever takes a
    partition up at a committed offset at or after what it handed out before)."""
    for name, member in run.members.items():
        last: dict[int, int] = {}
        for partition, offset, _ in member.records():
            assert offset > last.get(partition, -1), f"{name}: partition {partition} went back to {offset}"
            last[partition] = offset


def test_three_members_share_twelve_partitions_through_a_kill_and_a_join(group_cluster, group_zk, tmp_path):
    topic, group = new_topic(group_cluster, group_zk), unique_name("g")
    registry = GroupRegistry(group_zk, group)
    produce(group_cluster.bootstrap, topic, PARTITIONS, 30)
    run = ConsumerGroupRun(tmp_path, group_cluster.bootstrap, group_cluster.zk_connect, group, topic)
    try:
        for name in ("c0", "c1", "c2"):
            run.start(name)
        owned = wait_balanced(registry, ["c0", "c1", "c2"], PARTITIONS, topic, what="three members, 4 each",
                              run=run)
        assert {m: len(tps) for m, tps in owned.items()} == {"c0": 4, "c1": 4, "c2": 4}
        run.wait_consumed(dict.fromkeys(range(PARTITIONS), 30))

        produce(group_cluster.bootstrap, topic, PARTITIONS, 30, start=30)
        run.members["c1"].kill()  # its session lives on in ZooKeeper for the session timeout
        owned = wait_balanced(registry, ["c0", "c2"], PARTITIONS, topic,
                              timeout_s=SESSION_TIMEOUT_MS / 1000 + 30, what="the survivors, 6 each", run=run)
        assert {m: len(tps) for m, tps in owned.items()} == {"c0": 6, "c2": 6}
        produce(group_cluster.bootstrap, topic, PARTITIONS, 30, start=60)
        run.wait_consumed(dict.fromkeys(range(PARTITIONS), 90))

        run.start("c3")
        owned = wait_balanced(registry, ["c0", "c2", "c3"], PARTITIONS, topic, what="a new member in",
                              run=run)
        assert sorted(len(tps) for tps in owned.values()) == [4, 4, 4]
        produce(group_cluster.bootstrap, topic, PARTITIONS, 30, start=90)
        run.wait_consumed(dict.fromkeys(range(PARTITIONS), 120))
        assert_in_order(run)
    finally:
        statuses = run.stop_all()
    assert {name: status for name, status in statuses.items() if name != "c1"} == \
        {"c0": 0, "c2": 0, "c3": 0}, run.logs()
    assert registry.member_ids() == [] and registry.owners() == {}


def test_a_member_paused_past_its_session_timeout_hands_out_nothing_it_lost(group_cluster, group_zk,
                                                                           tmp_path):
    topic, group = new_topic(group_cluster, group_zk), unique_name("g")
    registry = GroupRegistry(group_zk, group)
    end = 100
    run = ConsumerGroupRun(tmp_path, group_cluster.bootstrap, group_cluster.zk_connect, group, topic,
                           max_partition_fetch_bytes=64)
    try:
        slow = run.start("c0", delay_ms=10)  # owns partitions 0-3; far behind when paused
        run.start("c1")
        run.start("c2")
        wait_balanced(registry, ["c0", "c1", "c2"], PARTITIONS, topic, run=run)
        for batch in range(end // 10):  # batches of 10 records: small fetches keep the next one buffered
            produce(group_cluster.bootstrap, topic, PARTITIONS, 10, start=batch * 10)
        wait_until(lambda: len(slow.records()) >= 30, 30, what="the slow member to get going")
        slow.pause()
        paused_at = len(slow.records())
        behind = {p: max((o for q, o, _ in slow.records() if q == p), default=-1) for p in range(4)}
        assert min(behind.values()) < end - 20, f"the paused member must still have records to go: {behind}"

        wait_balanced(registry, ["c1", "c2"], PARTITIONS, topic, timeout_s=SESSION_TIMEOUT_MS / 1000 + 30,
                      what="the others to take over the paused member's partitions", run=run)
        run.wait_consumed(dict.fromkeys(range(PARTITIONS), end))
        wait_until(lambda: all(o.offset == end for o in registry.committed_offsets().values())
                   and len(registry.committed_offsets()) == PARTITIONS, 20, what="the others' commits")
        assert len(slow.records()) == paused_at

        resumed_at = time.monotonic()
        slow.resume()
        wait_balanced(registry, ["c0", "c1", "c2"], PARTITIONS, topic, timeout_s=30,
                      what="the resumed member back in the group", run=run)
        produce(group_cluster.bootstrap, topic, PARTITIONS, 10, start=end)
        run.wait_consumed(dict.fromkeys(range(PARTITIONS), end + 10))
    finally:
        statuses = run.stop_all()
    stale = [(p, o) for p, o, received in slow.records() if received > resumed_at and o < end]
    assert stale == [], "records of partitions the paused member had lost were handed out after SIGCONT"
    assert any(received > resumed_at for _, _, received in slow.records()), "it consumed again"
    assert "ZooKeeper session expired" in slow.log() or "lost t" in slow.log(), slow.log()
    assert_in_order(run)
    assert statuses == {"c0": 0, "c1": 0, "c2": 0}, run.logs()


def test_zookeeper_stopped_and_restarted_under_a_consuming_group(tmp_path):
    zookeeper = ZooKeeperServer(tmp_path / "zk").start()
    partitions = 6
    broker = None
    run = None
    try:
        zk_connect = zookeeper.connect_string + "/restart"
        broker, port = start_registered_broker(tmp_path, zk_connect)
        bootstrap = f"127.0.0.1:{port}"
        with connect(zk_connect, session_timeout_s=5.0) as zk:
            create_topic(port, "orders", partitions)
            wait_topic_registered(GroupRegistry(zk, "g"), "orders", partitions)
        produce(bootstrap, "orders", partitions, 30)
        run = ConsumerGroupRun(tmp_path, bootstrap, zk_connect, "g", "orders")
        for name in ("c0", "c1"):
            run.start(name)
        run.wait_consumed(dict.fromkeys(range(partitions), 30))
        # Both members in the group before ZooKeeper goes: the first one alone can consume
        # everything while the second is still starting, and a member that cannot reach ZooKeeper
        # within its timeout when it is made fails to start (CoordinationError) rather than join.
        with connect(zk_connect, session_timeout_s=5.0) as zk:
            wait_balanced(GroupRegistry(zk, "g"), ["c0", "c1"], partitions, "orders",
                          what="both members in the group before ZooKeeper stops", run=run)

        lease_s = SESSION_TIMEOUT_MS / 1000 / 3
        # A record a member took just before its lease ran out may be noted as received a little
        # later by a process the busy machine did not schedule: checked only from this margin on.
        margin_s = 1.5
        zookeeper.stop()
        stopped_at = time.monotonic()
        time.sleep(lease_s + margin_s)  # every lease has run out
        produce(bootstrap, "orders", partitions, 30, start=30)  # the broker goes on without ZooKeeper
        time.sleep(SESSION_TIMEOUT_MS / 1000)  # down for longer than the members' session timeout
        restarting_at = time.monotonic()  # from here on the members may reconnect at any moment
        zookeeper = ZooKeeperServer(tmp_path / "zk", port=zookeeper.port).start()  # same data
        produce(bootstrap, "orders", partitions, 30, start=60)
        run.wait_consumed(dict.fromkeys(range(partitions), 90))
        with connect(zk_connect, session_timeout_s=5.0) as zk:
            owned = wait_balanced(GroupRegistry(zk, "g"), ["c0", "c1"], partitions, "orders", run=run)
        assert sorted(len(tps) for tps in owned.values()) == [3, 3]
        during = [(name, p, o, round(received - stopped_at, 3)) for name, m in run.members.items()
                  for p, o, received in m.records()
                  if stopped_at + lease_s + margin_s < received < restarting_at]
        assert during == [], (f"records handed out while the members could not reach ZooKeeper (s after "
                              f"the stop; restarted {restarting_at - stopped_at:.3f} s after it)")
        assert_in_order(run)
    finally:
        statuses = run.stop_all() if run is not None else {}
        if broker is not None:
            broker.stop()
        zookeeper.stop()
    assert statuses == {"c0": 0, "c1": 0}, run.logs()
