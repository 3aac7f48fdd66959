"""``hpbroker groups list|describe|reset-offsets`` against a real ZooKeeper and a real broker."""

from __future__ import annotations

import subprocess
import sys

import pytest
from group_harness import create_topic, produce, unique_name, wait_topic_registered

from hpbroker import Consumer
from hpbroker.coord.groups import GroupRegistry

pytestmark = pytest.mark.zookeeper
pytest_plugins = ["group_fixtures"]  # group_cluster, group_zk


def groups(cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpbroker.cli", "groups", *args, "--zookeeper",
                           cluster.zk_connect, "--bootstrap", cluster.bootstrap],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def consumed_group(group_cluster, group_zk):
    """A stopped group that consumed 6 of the 10 records of each of 2 partitions and committed."""
    topic, group = unique_name("t"), unique_name("g")
    create_topic(group_cluster.port, topic, 2)
    wait_topic_registered(GroupRegistry(group_zk, group), topic, 2)
    produce(group_cluster.bootstrap, topic, 2, 10)
    with Consumer(group_cluster.bootstrap, group=group, topics=[topic], zookeeper=group_cluster.zk_connect,
                  auto_offset_reset="earliest", session_timeout_ms=3000,
                  enable_auto_commit=False) as consumer:
        seen: dict[int, int] = {}
        for _ in range(200):
            for batch in consumer.poll(timeout_ms=100).values():
                for record in batch:
                    seen[record.partition] = seen.get(record.partition, 0) + 1
            if sum(seen.values()) >= 20:
                break
        for tp in consumer.assignment():
            consumer.seek(tp, 6)
        consumer.commit()
    return topic, group


def test_list_and_describe_show_committed_offsets_and_lag(group_cluster, consumed_group):
    topic, group = consumed_group
    listed = groups(group_cluster, "list")
    assert listed.returncode == 0 and group in listed.stdout.split(), listed.stderr
    described = groups(group_cluster, "describe", group)
    assert described.returncode == 0, described.stderr
    assert f"group {group}: 0 live members" in described.stdout
    rows = [line.split() for line in described.stdout.splitlines() if line.startswith(topic)]
    assert rows == [[topic, "0", "-", "6", "10", "4"], [topic, "1", "-", "6", "10", "4"]]


def test_reset_offsets_shows_a_plan_and_writes_it_only_with_execute(group_cluster, group_zk, consumed_group):
    topic, group = consumed_group
    registry = GroupRegistry(group_zk, group)
    plan = groups(group_cluster, "reset-offsets", group, "--topic", topic, "--to-earliest")
    assert plan.returncode == 0 and "a plan only" in plan.stdout, plan.stderr
    assert {tp: c.offset for tp, c in registry.committed_offsets().items()} == {(topic, 0): 6, (topic, 1): 6}
    done = groups(group_cluster, "reset-offsets", group, "--topic", topic, "--partition", "1",
                  "--to-offset", "2", "--execute")
    assert done.returncode == 0, done.stderr
    assert {tp: c.offset for tp, c in registry.committed_offsets().items()} == {(topic, 0): 6, (topic, 1): 2}
    latest = groups(group_cluster, "reset-offsets", group, "--topic", topic, "--to-latest", "--execute")
    assert latest.returncode == 0, latest.stderr
    committed = {tp: c.offset for tp, c in registry.committed_offsets().items()}
    assert committed == {(topic, 0): 10, (topic, 1): 10}


def test_reset_offsets_of_a_live_group_is_refused(group_cluster, consumed_group):
    topic, group = consumed_group
    with Consumer(group_cluster.bootstrap, group=group, topics=[topic], zookeeper=group_cluster.zk_connect,
                  session_timeout_ms=3000) as consumer:
        consumer.poll(timeout_ms=200)
        refused = groups(group_cluster, "reset-offsets", group, "--topic", topic, "--to-earliest",
                         "--execute")
    assert refused.returncode == 1 and "live members" in refused.stderr, refused.stderr
