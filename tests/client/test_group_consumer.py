"""Consumers in a group, in this process: settings, where a new group starts, commits (manual,
automatic, on close, on release), a restarted group resuming, a lost session, the lease."""

from __future__ import annotations

import threading
import time

import pytest
from group_harness import create_topic, expire, produce, unique_name, wait_topic_registered
from harness import wait_until

from hpbroker import Consumer, TopicPartition
from hpbroker.coord.groups import GroupRegistry
from hpbroker.errors import CoordinationError, InvalidConfigError

pytestmark = pytest.mark.zookeeper
pytest_plugins = ["group_fixtures"]  # group_cluster, group_zk

SETTINGS = {"session_timeout_ms": 3000, "fetch_max_wait_ms": 100, "rebalance_backoff_ms": 50,
            "auto_offset_reset": "earliest"}


@pytest.fixture
def topic(group_cluster, group_zk):
    """A fresh 4-partition topic with 10 records per partition, in the topic registry."""
    name = unique_name("t")
    create_topic(group_cluster.port, name, 4)
    wait_topic_registered(GroupRegistry(group_zk, "any"), name, 4)
    produce(group_cluster.bootstrap, name, 4, 10)
    return name


@pytest.fixture
def consumers(group_cluster):
    """``make(group, topic, **settings)`` -> a group member; every one closed at the end."""
    made: list[Consumer] = []

    def make(group: str, topic: str, **settings) -> Consumer:
        consumer = Consumer(group_cluster.bootstrap, group=group, topics=[topic],
                            zookeeper=group_cluster.zk_connect, **{**SETTINGS, **settings})
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        consumer.close()


def poll_until(consumer: Consumer, done, timeout_s: float = 20.0) -> list:
    """Poll, collecting records, until ``done(records)``."""
    records: list = []
    deadline = time.monotonic() + timeout_s
    while not done(records):
        assert time.monotonic() < deadline, f"got {len(records)} records: {sorted(records)[-5:]}"
        for batch in consumer.poll(timeout_ms=100).values():
            records.extend((r.partition, r.offset) for r in batch)
    return records


def offsets_by_partition(records) -> dict[int, list[int]]:
    found: dict[int, list[int]] = {}
    for partition, offset in records:
        found.setdefault(partition, []).append(offset)
    return found


# --- settings ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("settings", "complaint"), [
    ({"group": "g", "zookeeper": "127.0.0.1:1"}, "needs group=, topics= and zookeeper=; missing: topics"),
    ({"group": "g", "topics": [], "zookeeper": "127.0.0.1:1"}, "topics must be a non-empty list"),
    ({"group": "g/x", "topics": ["t"], "zookeeper": "127.0.0.1:1"}, "consumer group id"),
    ({"group": "g", "topics": ["t"], "zookeeper": "127.0.0.1:zk"}, "not a number"),
    ({"group": "g", "topics": ["t"], "zookeeper": "127.0.0.1:1", "session_timeout_ms": 0},
     "session_timeout_ms"),
    ({"group": "g", "topics": ["t"], "zookeeper": "127.0.0.1:1", "enable_auto_commit": "yes"},
     "enable_auto_commit"),
    ({"topics": ["t"]}, "unknown consumer settings \\['topics'\\]"),
])
def test_group_settings_are_checked_before_anything_connects(settings, complaint):
    with pytest.raises(InvalidConfigError, match=complaint):
        Consumer("127.0.0.1:1", **settings)


def test_an_unreachable_zookeeper_fails_the_constructor_in_bounded_time(group_cluster):
    started = time.monotonic()
    with pytest.raises(CoordinationError, match="cannot reach ZooKeeper at 127.0.0.1:1 within 1 s"):
        Consumer(group_cluster.bootstrap, group="g", topics=["t"], zookeeper="127.0.0.1:1",
                 session_timeout_ms=1000)
    assert time.monotonic() - started < 10


def test_assign_is_refused_in_a_group_and_group_calls_without_one(consumers, group_cluster, topic):
    member = consumers(unique_name("g"), topic)
    with pytest.raises(RuntimeError, match="assign\\(\\) is refused in a consumer group"):
        member.assign([TopicPartition(topic, 0)])
    with Consumer(group_cluster.bootstrap) as plain:
        with pytest.raises(RuntimeError, match="commit\\(\\) needs a consumer group"):
            plain.commit()
        with pytest.raises(RuntimeError, match="committed\\(\\) needs a consumer group"):
            plain.committed(TopicPartition(topic, 0))


# --- where a group starts ----------------------------------------------------------------------


def test_a_lone_member_owns_every_partition_and_a_new_group_starts_at_the_earliest(consumers, group_zk,
                                                                                    topic):
    group = unique_name("g")
    member = consumers(group, topic)
    records = poll_until(member, lambda r: len(r) >= 40)
    assert offsets_by_partition(records) == {p: list(range(10)) for p in range(4)}, "in order, once each"
    assert member.assignment() == {TopicPartition(topic, p) for p in range(4)}
    owners = GroupRegistry(group_zk, group).owners()
    assert sorted(owners) == [(topic, p) for p in range(4)]
    assert {o.consumer_id for o in owners.values()} == {member._group.consumer_id}


def test_a_new_group_with_latest_reads_only_what_comes_after_it_joined(consumers, group_cluster, topic):
    member = consumers(unique_name("g"), topic, auto_offset_reset="latest")
    poll_until(member, lambda r: len(member.assignment()) == 4 and all(
        member.position(tp) == 10 for tp in member.assignment()))
    produce(group_cluster.bootstrap, topic, 4, 5, start=10)
    records = poll_until(member, lambda r: len(r) >= 20)
    assert offsets_by_partition(records) == {p: list(range(10, 15)) for p in range(4)}


# --- commits -----------------------------------------------------------------------------------


def test_positions_are_committed_automatically_at_the_interval(consumers, group_zk, topic):
    group = unique_name("g")
    member = consumers(group, topic, auto_commit_interval_ms=200)
    poll_until(member, lambda r: len(r) >= 40)
    registry = GroupRegistry(group_zk, group)
    wait_until(lambda: (member.poll(timeout_ms=50) == {}
                        and {tp: o.offset for tp, o in registry.committed_offsets().items()}
                        == {(topic, p): 10 for p in range(4)}), 10, what="the automatic commit")
    assert member.committed(TopicPartition(topic, 2)) == 10


def test_manual_commit_and_a_restarted_group_resumes_from_it_redelivering_the_uncommitted_tail(
        consumers, topic):
    group = unique_name("g")
    first = consumers(group, topic, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    poll_until(first, lambda r: len(r) >= 40)
    assert first.committed(tp) is None
    first.commit({tp: 4, TopicPartition(topic, 1): 10})
    assert first.committed(tp) == 4
    first.commit()  # every position: 10
    assert [first.committed(TopicPartition(topic, p)) for p in range(4)] == [10, 10, 10, 10]
    first.commit({tp: 6})  # as if only 6 records of partition 0 had been processed
    first.close()  # no automatic commit: 6 stays

    second = consumers(group, topic, enable_auto_commit=False)
    records = poll_until(second, lambda r: len(r) >= 4, timeout_s=20)
    assert offsets_by_partition(records) == {0: [6, 7, 8, 9]}, "resumes at the committed offset"
    assert second.poll(timeout_ms=300) == {}


def test_close_commits_and_the_next_member_resumes_where_it_stopped(consumers, group_cluster, topic):
    group = unique_name("g")
    first = consumers(group, topic, auto_commit_interval_ms=60_000)
    poll_until(first, lambda r: len(r) >= 40)
    first.close()
    produce(group_cluster.bootstrap, topic, 4, 3, start=10)
    second = consumers(group, topic)
    records = poll_until(second, lambda r: len(r) >= 12)
    assert offsets_by_partition(records) == {p: [10, 11, 12] for p in range(4)}


def test_offsets_written_by_a_tool_for_the_stopped_group_are_where_it_resumes(consumers, group_zk, topic):
    group = unique_name("g")
    first = consumers(group, topic)
    poll_until(first, lambda r: len(r) >= 40)
    first.close()
    GroupRegistry(group_zk, group).write_offsets({(topic, 0): 7, (topic, 3): 8})
    records = poll_until(consumers(group, topic), lambda r: len(r) >= 5)
    assert offsets_by_partition(records) == {0: [7, 8, 9], 3: [8, 9]}


def test_a_second_member_with_the_id_of_a_live_one_is_refused(consumers, topic):
    group = unique_name("g")
    consumers(group, topic, consumer_id="twin")
    with pytest.raises(CoordinationError, match="ids/twin is held by session"):
        consumers(group, topic, consumer_id="twin")


def test_a_commit_of_a_partition_not_owned_is_refused(consumers, topic):
    member = consumers(unique_name("g"), topic)
    poll_until(member, lambda r: len(member.assignment()) == 4)
    with pytest.raises(CoordinationError, match="cannot commit other-0: not owned by this consumer"):
        member.commit({TopicPartition("other", 0): 1})


def test_a_joining_member_takes_half_and_starts_where_the_first_one_committed_on_release(
        consumers, group_cluster, topic):
    group = unique_name("g")
    first = consumers(group, topic, consumer_id="a", auto_commit_interval_ms=60_000)
    before = poll_until(first, lambda r: len(r) >= 40)
    second = consumers(group, topic, consumer_id="b", auto_commit_interval_ms=60_000)
    deadline = time.monotonic() + 20
    while len(first.assignment()) != 2 or len(second.assignment()) != 2:
        assert time.monotonic() < deadline, (first.assignment(), second.assignment())
        for member in (first, second):
            for batch in member.poll(timeout_ms=50).values():
                assert batch == [], "nothing new was produced"
    assert first.assignment() == {TopicPartition(topic, 0), TopicPartition(topic, 1)}
    assert second.assignment() == {TopicPartition(topic, 2), TopicPartition(topic, 3)}
    produce(group_cluster.bootstrap, topic, 4, 2, start=10)
    after = []
    deadline = time.monotonic() + 20
    while len(after) < 8:
        assert time.monotonic() < deadline, after
        for member in (first, second):
            for batch in member.poll(timeout_ms=50).values():
                after.extend((member is first, r.partition, r.offset) for r in batch)
    assert sorted(after) == sorted([(True, p, o) for p in (0, 1) for o in (10, 11)]
                                   + [(False, p, o) for p in (2, 3) for o in (10, 11)])
    assert len(before) == 40


def test_iteration_goes_on_across_a_rebalance_and_hands_out_each_record_once(consumers, group_cluster, topic):
    group = unique_name("g")
    first = consumers(group, topic, consumer_id="a")
    seen = []
    done = threading.Event()

    def iterate():
        for record in first:  # ends on wakeup()
            seen.append((record.partition, record.offset))
        done.set()

    thread = threading.Thread(target=iterate, daemon=True)
    thread.start()
    wait_until(lambda: len(seen) >= 40, 20, what="the first records")
    second = consumers(group, topic, consumer_id="b")
    wait_until(lambda: second.poll(timeout_ms=50) == {} and len(second.assignment()) == 2, 20,
               what="the first member to let go of half its partitions")
    assert second.assignment() == {TopicPartition(topic, 2), TopicPartition(topic, 3)}
    produce(group_cluster.bootstrap, topic, 4, 3, start=10)
    others = poll_until(second, lambda r: len(r) >= 6)
    wait_until(lambda: len(seen) >= 46, 20, what="the first member's new records")
    first.wakeup()
    assert done.wait(20), "the iteration ends on wakeup()"
    assert offsets_by_partition(others) == {2: [10, 11, 12], 3: [10, 11, 12]}
    mine = offsets_by_partition(seen)
    assert mine[0] == mine[1] == list(range(13)) and mine[2] == mine[3] == list(range(10))
    assert not first.poll(timeout_ms=200)


# --- sessions and the lease --------------------------------------------------------------------


def test_an_expired_session_drops_everything_uncommitted_and_the_member_rejoins(
        consumers, zookeeper, group_zk, topic):
    group = unique_name("g")
    member = consumers(group, topic, enable_auto_commit=False)
    poll_until(member, lambda r: len(r) >= 40)
    member.commit()
    member.commit({TopicPartition(topic, 0): 3})
    old_session = member._group._session.session_id
    expire(zookeeper.connect_string, member._group._session)
    records = poll_until(member, lambda r: len(r) >= 7)
    assert member._group._session.session_id != old_session
    assert offsets_by_partition(records) == {0: list(range(3, 10))}, \
        "fetched again from the committed offset, nothing committed from the lost session"
    owners = GroupRegistry(group_zk, group).owners()
    assert {o.session_id for o in owners.values()} == {member._group._session.session_id}
    assert len(owners) == 4


def test_records_of_a_partition_lost_to_someone_else_are_not_handed_out_once_the_lease_ran_out(
        consumers, group_cluster, group_zk, topic):
    group = unique_name("g")
    member = consumers(group, topic, auto_commit_interval_ms=60_000)  # commits on release only
    poll_until(member, lambda r: len(r) >= 40)
    member.commit()
    registry = GroupRegistry(group_zk, group)
    stolen = TopicPartition(topic, 1)
    # Someone else owns partition 1 now (as after an expiry this member has not noticed yet).
    group_zk.client.delete(registry.paths.owner(group, topic, 1))
    assert registry.claim(topic, 1, "intruder")
    produce(group_cluster.bootstrap, topic, 4, 5, start=10)
    time.sleep(member._group.lease_s + 0.2)  # the lease runs out: the next handout confirms first
    records = poll_until(member, lambda r: len(r) >= 15)
    assert sorted(offsets_by_partition(records)) == [0, 2, 3], "nothing of partition 1"
    assert stolen not in member.assignment()
    assert member.poll(timeout_ms=500) == {}
    assert registry.owner(topic, 1).consumer_id == "intruder", "the member keeps away and retries"
    group_zk.client.delete(registry.paths.owner(group, topic, 1))  # the intruder leaves
    records = poll_until(member, lambda r: len(r) >= 5)
    assert offsets_by_partition(records) == {1: list(range(10, 15))}, \
        "partition 1 from its committed offset, the others from what was committed when they were released"
    assert member.poll(timeout_ms=300) == {}
