"""A group member's rebalance listener (``on_assign``, ``on_revoke``, ``on_lost``): called inside
``poll()`` on the caller's thread, revoke before partitions are given up (a commit there
counts), assign once they are taken with their positions set, and revoke (or lost) then assign
when a partition is dropped and taken back."""

from __future__ import annotations

import threading
import time

import pytest
from group_harness import create_topic, expire, produce, unique_name, wait_topic_registered

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


class Told:
    """A listener that notes each call: ``(what, partitions, the poll it came in, thread)``, and
    runs ``also[what](partitions)`` if given."""

    def __init__(self, **also) -> None:
        self.calls: list[tuple[str, set[TopicPartition], int, int]] = []
        self.polls = 0
        self.handed_out: list[int] = []  # per call: how many records poll() had handed out before
        self.records = 0
        self.also = also

    def settings(self, *kinds: str) -> dict:
        return {f"on_{kind}": self._listener(kind) for kind in kinds}

    def _listener(self, what: str):
        def listener(partitions):
            assert isinstance(partitions, set)
            self.calls.append((what, partitions, self.polls, threading.get_ident()))
            self.handed_out.append(self.records)
            if what in self.also:
                self.also[what](partitions)
        return listener

    def what(self) -> list[tuple[str, set[int]]]:
        return [(what, {tp.partition for tp in partitions}) for what, partitions, _, _ in self.calls]


@pytest.fixture
def members(group_cluster):
    made: list[Consumer] = []

    def make(group: str, topic: str, told: Told, kinds=("assign", "revoke"), **settings) -> Consumer:
        consumer = Consumer(group_cluster.bootstrap, group=group, topics=[topic],
                            zookeeper=group_cluster.zk_connect, **{**SETTINGS, **settings},
                            **told.settings(*kinds))
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        consumer.close()


def poll(consumer: Consumer, told: Told | None, timeout_ms: int = 100) -> list[tuple[int, int]]:
    if told is not None:
        told.polls += 1
    records = [(r.partition, r.offset) for batch in consumer.poll(timeout_ms).values() for r in batch]
    if told is not None:
        told.records += len(records)
    return records


def poll_until(consumer: Consumer, told: Told | None, done, timeout_s: float = 20.0) -> list:
    records: list = []
    deadline = time.monotonic() + timeout_s
    while not done(records):
        assert time.monotonic() < deadline, f"got {len(records)} records"
        records += poll(consumer, told)
    return records


def test_listeners_need_a_group_and_must_be_callables(group_cluster):
    with pytest.raises(InvalidConfigError, match="on_assign: rebalance listeners need a consumer group"):
        Consumer(group_cluster.bootstrap, on_assign=print)
    with pytest.raises(InvalidConfigError, match="on_revoke must be a callable"):
        Consumer(group_cluster.bootstrap, group="g", topics=["t"], zookeeper=group_cluster.zk_connect,
                 on_revoke="commit")


def test_on_assign_comes_inside_poll_on_the_callers_thread_with_positions_set(members, topic):
    group = unique_name("g")
    first_told = Told()
    first = members(group, topic, first_told, enable_auto_commit=False)
    poll_until(first, first_told, lambda r: len(r) >= 40)
    first.commit({TopicPartition(topic, p): 3 + p for p in range(4)})
    first.close()
    assert first_told.what() == [("assign", {0, 1, 2, 3})]

    positions = {}
    told = Told(assign=lambda partitions: positions.update({tp: second.position(tp) for tp in partitions}))
    second = members(group, topic, told)
    assert told.calls == [], "nothing before the first poll"
    records = poll_until(second, told, lambda r: len(r) >= 22)
    assert told.what() == [("assign", {0, 1, 2, 3})]
    (_, _, in_poll, thread) = told.calls[0]
    assert in_poll >= 1 and thread == threading.get_ident()
    assert positions == {TopicPartition(topic, p): 3 + p for p in range(4)}, "the committed offsets"
    assert sorted(records) == sorted((p, o) for p in range(4) for o in range(3 + p, 10))


def test_on_revoke_comes_before_the_release_so_a_commit_in_it_is_where_the_next_owner_starts(
        members, group_cluster, topic):
    group = unique_name("g")
    owned_when_revoked = []
    first_told = Told(revoke=lambda partitions: (owned_when_revoked.append(set(first.assignment())),
                                                 first.commit()))
    first = members(group, topic, first_told, consumer_id="a", enable_auto_commit=False)
    poll_until(first, first_told, lambda r: len(r) >= 40)
    second_told = Told()
    second = members(group, topic, second_told, consumer_id="b", enable_auto_commit=False)
    deadline = time.monotonic() + 20
    while len(first.assignment()) != 2 or len(second.assignment()) != 2:
        assert time.monotonic() < deadline, (first.assignment(), second.assignment())
        assert poll(first, first_told, 50) == [] and poll(second, second_told, 50) == []
    assert first_told.what() == [("assign", {0, 1, 2, 3}), ("revoke", {2, 3})]
    assert owned_when_revoked == [{TopicPartition(topic, p) for p in range(4)}], "still owned then"
    assert second_told.what() == [("assign", {2, 3})]
    produce(group_cluster.bootstrap, topic, 4, 1, start=10)
    records = poll_until(second, second_told, lambda r: len(r) >= 2)
    assert sorted(records) == [(2, 10), (3, 10)], "from what the revoke listener committed, nothing again"


@pytest.mark.parametrize("kinds", [("assign", "revoke"), ("assign", "revoke", "lost")])
def test_a_partition_dropped_and_taken_back_is_told_as_revoked_or_lost_then_assigned(
        members, zookeeper, topic, kinds):
    """The loss and the claim after it may come in one poll or in two (the new session and the
    claim take ZooKeeper round trips): either way nothing is handed out between them."""
    group = unique_name("g")
    told = Told()
    member = members(group, topic, told, kinds=kinds, enable_auto_commit=False)
    poll_until(member, told, lambda r: len(r) >= 40)
    member.commit({TopicPartition(topic, p): 5 for p in range(4)})
    told.calls.clear()
    told.handed_out.clear()
    expire(zookeeper.connect_string, member._group._session)
    records = poll_until(member, told, lambda r: len(r) >= 20)
    dropped = "lost" if "lost" in kinds else "revoke"
    assert told.what() == [(dropped, {0, 1, 2, 3}), ("assign", {0, 1, 2, 3})]
    assert told.handed_out[0] == told.handed_out[1], "nothing handed out between the loss and the assign"
    assert sorted(records) == sorted((p, o) for p in range(4) for o in range(5, 10)), \
        "a re-read from the committed offsets, as the assign told"


def test_what_a_listener_raises_comes_out_of_poll_once_the_rebalance_is_over(members, topic):
    failing = [True]

    def refuse(partitions):
        if failing[0]:
            failing[0] = False
            raise ValueError("no thanks")

    told = Told(assign=refuse)
    member = members(unique_name("g"), topic, told)
    with pytest.raises(ValueError, match="no thanks"):
        poll_until(member, told, lambda r: False, timeout_s=20)
    assert member.assignment() == {TopicPartition(topic, p) for p in range(4)}, "the rebalance completed"
    records = poll_until(member, told, lambda r: len(r) >= 40)
    assert len(records) == 40


def test_poll_inside_a_listener_is_refused(members, topic):
    told = Told(assign=lambda partitions: member.poll(0))
    member = members(unique_name("g"), topic, told)
    with pytest.raises(RuntimeError, match="refused inside a rebalance listener"):
        poll_until(member, told, lambda r: False, timeout_s=20)


def test_close_inside_a_listener_is_refused_and_leaves_the_consumer_working(members, topic):
    told = Told(assign=lambda partitions: member.close())
    member = members(unique_name("g"), topic, told)
    with pytest.raises(RuntimeError, match=r"close\(\) is refused inside a rebalance listener"):
        poll_until(member, told, lambda r: False, timeout_s=20)
    assert member.assignment() == {TopicPartition(topic, p) for p in range(4)}, "the rebalance completed"
    records = poll_until(member, told, lambda r: len(r) >= 40)
    assert sorted(records) == sorted((p, o) for p in range(4) for o in range(10))
    member.close()  # after the poll: closes
    with pytest.raises(RuntimeError, match="the consumer is closed"):
        member.poll(0)


def test_poll_stays_refused_in_a_listener_after_a_commit_there_told_on_lost(members, topic):
    """A listener's commit() that finds a partition no longer owned calls on_lost inside it; back
    in the outer listener, poll() is still refused."""
    outcomes: list[BaseException | None] = []
    lost = TopicPartition(topic, 0)

    def assigned(partitions):
        if outcomes:
            return
        group = member._group
        assert group.registry.release(topic, 0, group.consumer_id), "its ownership node, gone"
        for attempt in (lambda: member.commit({lost: 0}), lambda: member.poll(0)):
            try:
                attempt()
                outcomes.append(None)
            except Exception as e:
                outcomes.append(e)

    told = Told(assign=assigned)
    member = members(unique_name("g"), topic, told, kinds=("assign", "revoke", "lost"),
                     enable_auto_commit=False)
    poll_until(member, told, lambda r: len(outcomes) == 2)
    refused_commit, refused_poll = outcomes
    assert isinstance(refused_commit, CoordinationError), refused_commit
    assert told.what()[:2] == [("assign", {0, 1, 2, 3}), ("lost", {0})], "on_lost inside on_assign"
    assert isinstance(refused_poll, RuntimeError), refused_poll
    assert "refused inside a rebalance listener" in str(refused_poll)


def test_close_calls_no_listener_even_when_its_final_commit_is_refused(members, group_zk, topic):
    """close() from another thread, with auto-commit on and partition 0 no longer owned: its
    final commit of 0 is refused, and 0 is dropped untold."""
    told = Told()
    name = unique_name("g")
    member = members(name, topic, told, kinds=("assign", "revoke", "lost"),
                     auto_commit_interval_ms=600_000)
    poll_until(member, told, lambda r: len(r) >= 40)
    group = member._group
    assert group.registry.release(topic, 0, group.consumer_id)
    closing = threading.Thread(target=member.close)
    closing.start()
    closing.join(30)
    assert not closing.is_alive()
    assert told.what() == [("assign", {0, 1, 2, 3})]
    registry = GroupRegistry(group_zk, name)
    assert [registry.committed(topic, p) for p in range(4)] == [None, 10, 10, 10], "the others committed"
