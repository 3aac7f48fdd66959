"""The file-descriptor budget (pure logic) and TopicAdmin's check against it."""

from __future__ import annotations

import pytest

from hpbroker.broker.descriptors import DescriptorBudget, partition_descriptors
from hpbroker.broker.topics import Topic, TopicStore
from hpbroker.errors import InvalidPartitionsError
from hpbroker.workers.admin import TopicAdmin
from hpbroker.workers.ownership import owner_slot


def test_a_partition_holds_its_lock_and_three_files_a_segment():
    assert partition_descriptors(1) == 4
    assert partition_descriptors(0) == 4  # never fewer than one segment
    assert partition_descriptors(10) == 13, "a closed segment holds its .log only"


@pytest.mark.parametrize(("limit", "max_connections", "reserve", "per_worker"), [
    (65536, 1024, 1088, 16112),  # deploy/hpbroker.service's LimitNOFILE
    (1024, 1024, 512, 128),  # a common default: half kept, never all of it
    (256, 16, 80, 44),
    (256, 1024, 128, 32),
])
def test_the_budget_keeps_connections_and_sockets_out_of_the_partitions_share(limit, max_connections,
                                                                              reserve, per_worker):
    budget = DescriptorBudget(limit, max_connections)
    assert budget.reserve == reserve
    assert budget.partitions_per_worker == per_worker
    budget.check("t", per_worker, 0, per_worker, 1)  # exactly full is fine
    with pytest.raises(InvalidPartitionsError) as refused:
        budget.check("t", 4 * (per_worker + 1), 2, per_worker + 1, 4)
    message = refused.value.message
    assert f"worker slot 2 (of 4) would hold {per_worker + 1} partitions" in message
    assert f"needs at least {4 * (per_worker + 1) + reserve} descriptors" in message
    assert f"limit (RLIMIT_NOFILE) is {limit}" in message
    assert "LimitNOFILE=" in message and "ulimit -n" in message
    assert refused.value.code == 14


def _admin(tmp_path, slots):
    return TopicAdmin(TopicStore(tmp_path), slots, send_control=lambda *a: True, reply=lambda *a: None,
                      is_serving=lambda slot: True, timeout_s=10)


@pytest.mark.parametrize("slots", [1, 3, 7])
def test_partitions_per_slot_follows_the_ownership_rule(tmp_path, slots):
    admin = _admin(tmp_path, slots)
    admin.create(None, "orders", 10, (), now=0)
    admin.create(None, "x", 2, (), now=0)
    extra = Topic("wide", 23)
    expected = [0] * slots
    for name, partitions in (("orders", 10), ("x", 2), ("wide", 23)):
        for p in range(partitions):
            expected[owner_slot(name, p, slots)] += 1
    assert admin.partitions_per_slot(extra) == expected


@pytest.fixture
def limit_256(monkeypatch):
    """The workers' soft RLIMIT_NOFILE read as 256: 32 partitions a worker (1024 connections)."""
    monkeypatch.setattr(DescriptorBudget, "current",
                        classmethod(lambda cls, max_connections: cls(256, max_connections)))
    return DescriptorBudget(256, 1024).partitions_per_worker


def test_create_refuses_a_topic_beyond_the_budget_and_saves_nothing(tmp_path, limit_256):
    slots, per_worker = 3, limit_256
    admin = _admin(tmp_path, slots)
    with pytest.raises(InvalidPartitionsError, match="RLIMIT_NOFILE"):
        admin.create(None, "huge", slots * (per_worker + 1), (), now=0)
    assert "huge" not in TopicStore(tmp_path)
    admin.create(None, "fits", slots * per_worker, (), now=0)
    with pytest.raises(InvalidPartitionsError, match="would hold"):
        admin.create(None, "one-more", 1, (), now=0)
    assert [t.name for t in TopicStore(tmp_path).topics()] == ["fits"]


def test_a_slot_already_over_the_budget_does_not_refuse_a_topic_that_lands_elsewhere(tmp_path, limit_256):
    store = TopicStore(tmp_path)
    on_slot_0 = [f"o{i}" for i in range(1000) if owner_slot(f"o{i}", 0, 2) == 0]
    for name in on_slot_0[: limit_256 + 1]:  # saved under a higher limit: slot 0 holds 33 of 32
        store.create(name, 1, {})
    admin = _admin(tmp_path, 2)
    elsewhere = next(f"t{i}" for i in range(1000) if owner_slot(f"t{i}", 0, 2) == 1)
    admin.create(None, elsewhere, 1, (), now=0)  # lands on slot 1, which has room
    assert elsewhere in TopicStore(tmp_path)
    with pytest.raises(InvalidPartitionsError, match="worker slot 0 "):
        admin.create(None, on_slot_0[limit_256 + 1], 1, (), now=0)
