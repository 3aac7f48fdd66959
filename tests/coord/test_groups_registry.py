"""The consumer, ownership and offset registries of a group against a real ZooKeeper."""

from __future__ import annotations

import json
import threading

import pytest
from harness import wait_until

from hpbroker.coord.groups import (
    CommittedOffset,
    ConsumerRegistration,
    GroupRegistry,
    PartitionOwner,
    list_groups,
)
from hpbroker.coord.registry import TopicRegistration, TopicRegistry
from hpbroker.errors import CoordinationError

pytestmark = pytest.mark.zookeeper


def member(session, consumer_id: str, *topics: str) -> GroupRegistry:
    registry = GroupRegistry(session, "g")
    registry.register(ConsumerRegistration(consumer_id, topics or ("orders",), "host-a", 4242))
    return registry


def test_a_member_registers_an_ephemeral_node_with_its_subscription(sessions, zk):
    session = sessions()
    member(session, "c-1", "orders", "logs")
    data, stat = zk.client.get("/hpbroker/consumers/g/ids/c-1")
    assert stat.ephemeralOwner == session.session_id
    document = json.loads(data)
    assert {k: document[k] for k in ("version", "consumer_id", "topics", "host", "pid")} == \
        {"version": 1, "consumer_id": "c-1", "topics": ["logs", "orders"], "host": "host-a", "pid": 4242}
    reader = GroupRegistry(zk, "g")
    assert reader.members() == {"c-1": ConsumerRegistration("c-1", ("logs", "orders"), "host-a", 4242)}
    assert reader.is_registered("c-1") is False  # not in the reader's session
    assert GroupRegistry(session, "g").is_registered("c-1") is True
    session.close()
    assert reader.member_ids() == []


def test_a_member_is_registered_again_after_its_session_expires(sessions, zk, expire_session):
    session = sessions(session_timeout_s=2.0)
    member(session, "c-1")
    expire_session(session)
    reader = GroupRegistry(zk, "g")
    wait_until(lambda: reader.member_ids() == ["c-1"], 10, what="the registration to come back")
    assert zk.client.exists("/hpbroker/consumers/g/ids/c-1").ephemeralOwner == session.session_id


def test_watch_members_reports_joins_and_leaves(sessions, zk):
    seen, changed = [], threading.Event()

    def on_members(ids):
        seen.append(ids)
        changed.set()

    watch = GroupRegistry(zk, "g").watch_members(on_members)
    assert seen == [[]]
    first = sessions()
    member(first, "c-1")
    wait_until(lambda: seen[-1] == ["c-1"], 10, what="the join")
    first.close()
    wait_until(lambda: seen[-1] == [], 10, what="the leave")
    watch.cancel()


def test_ownership_is_exclusive_and_only_the_owner_releases(sessions, zk):
    a, b = sessions(), sessions()
    owner_a, owner_b = GroupRegistry(a, "g"), GroupRegistry(b, "g")
    assert owner_a.claim("orders", 3, "c-a") is True
    assert owner_a.claim("orders", 3, "c-a") is True, "claiming again in the same session is fine"
    assert owner_b.claim("orders", 3, "c-b") is False
    assert owner_b.claim("orders", 3, "c-a") is False, "same id, another session: not ours"
    assert owner_b.owner("orders", 3) == PartitionOwner("c-a", a.session_id)
    stat = zk.client.exists("/hpbroker/consumers/g/owners/orders/3")
    assert stat.ephemeralOwner == a.session_id
    assert owner_b.release("orders", 3, "c-a") is False
    assert owner_a.release("orders", 3, "c-b") is False
    assert owner_a.release("orders", 3, "c-a") is True
    assert owner_b.claim("orders", 3, "c-b") is True
    assert GroupRegistry(zk, "g").owners() == {("orders", 3): PartitionOwner("c-b", b.session_id)}


def test_ownership_is_not_restored_after_a_session_expiry(sessions, zk, expire_session):
    session = sessions(session_timeout_s=2.0)
    registry = member(session, "c-1")
    assert registry.claim("orders", 0, "c-1")
    expire_session(session)
    reader = GroupRegistry(zk, "g")
    wait_until(lambda: reader.member_ids() == ["c-1"], 10, what="the registration to come back")
    assert reader.owners() == {}, "an expired member must claim again, after everyone saw it leave"


def test_the_owner_commits_and_anyone_reads_committed_offsets(sessions, zk):
    session = sessions()
    registry = GroupRegistry(session, "g")
    assert registry.committed("orders", 0) is None
    for p in (0, 1):
        assert registry.claim("orders", p, "c-1")
    assert registry.commit({("orders", 0): 10, ("orders", 1): 20}, "c-1") == set()
    assert registry.commit({("orders", 0): 11}, "c-1") == set()
    reader = GroupRegistry(zk, "g")
    assert reader.committed("orders", 0) == 11
    offsets = reader.committed_offsets()
    assert {tp: o.offset for tp, o in offsets.items()} == {("orders", 0): 11, ("orders", 1): 20}
    assert offsets[("orders", 1)] == CommittedOffset(20, "c-1")
    data, stat = zk.client.get("/hpbroker/consumers/g/offsets/orders/1")
    assert stat.ephemeralOwner == 0, "offsets are persistent"
    assert json.loads(data)["offset"] == 20
    session.close()
    assert reader.committed("orders", 0) == 11, "offsets outlive their writer"


def test_a_commit_for_a_partition_owned_by_someone_else_is_refused(sessions):
    a, b = sessions(), sessions()
    owner, other = GroupRegistry(a, "g"), GroupRegistry(b, "g")
    assert owner.claim("orders", 0, "c-a")
    assert owner.claim("orders", 1, "c-a")
    owner.commit({("orders", 0): 5}, "c-a")
    assert other.commit({("orders", 0): 99, ("orders", 2): 7}, "c-b") == {("orders", 0), ("orders", 2)}
    assert other.commit({("orders", 1): 99}, "c-a") == {("orders", 1)}, "the id alone is not ownership"
    assert other.committed("orders", 0) == 5
    assert other.committed("orders", 2) is None


def test_offsets_are_written_for_a_stopped_group_but_not_under_a_live_owner(sessions, zk):
    tool = GroupRegistry(zk, "g")
    tool.write_offsets({("orders", 0): 100, ("orders", 1): 200})
    assert tool.committed_offsets() == {("orders", 0): CommittedOffset(100),
                                        ("orders", 1): CommittedOffset(200)}
    assert tool.owners() == {}, "the transaction's own ownership node is gone again"

    live = sessions()
    registry = member(live, "c-1")
    with pytest.raises(CoordinationError, match="has 1 live members \\(c-1\\): stop them"):
        tool.write_offsets({("orders", 0): 0})
    assert registry.claim("orders", 1, "c-1")
    with pytest.raises(CoordinationError, match="owned by a live member: orders-1"):
        tool.write_offsets({("orders", 0): 1, ("orders", 1): 2}, force=True)
    offsets = {tp: o.offset for tp, o in tool.committed_offsets().items()}
    assert offsets == {("orders", 0): 1, ("orders", 1): 200}


def test_groups_are_listed_and_partition_counts_come_from_the_topic_registry(sessions, zk):
    assert list_groups(zk) == []
    member(sessions(), "c-1")
    GroupRegistry(zk, "other").write_offsets({("logs", 0): 1})
    assert list_groups(zk) == ["g", "other"]
    TopicRegistry(zk).publish(TopicRegistration("orders", 12, {}, created_by=0))
    assert GroupRegistry(zk, "g").partition_counts(["orders", "missing"]) == {"orders": 12}


def test_calls_are_bounded_when_zookeeper_does_not_answer(sessions, zk):
    registry = GroupRegistry(sessions(), "g", timeout_s=0.000001)
    with pytest.raises(CoordinationError, match="no answer from ZooKeeper within"):
        for _ in range(50):  # one of these is certainly slower than a microsecond
            registry.committed_offsets([("orders", p) for p in range(20)])
