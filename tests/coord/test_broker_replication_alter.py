"""Altering a replicated topic's settings through a broker's replication agent against a real
ZooKeeper: the request's changes are applied to the settings the topic's node holds when they
are written, so alters through one broker or several never undo each other, and a change that
does not apply is refused."""

from __future__ import annotations

import pytest
from harness import wait_until
from test_controller import PATHS, FakeBrokers, create_topic

from hpbroker.coord.broker_replication import BrokerReplication, Done
from hpbroker.coord.registry import TopicRegistry
from hpbroker.errors import InvalidConfigError

pytestmark = pytest.mark.zookeeper


_finished: dict[int, Done] = {}  # request id -> its Done, as taken from any agent


def done(replication: BrokerReplication, request_id: int) -> Done:
    """Wait for the agent's Done of ``request_id`` (the ones of other requests are kept)."""
    def arrived() -> bool:
        _finished.update((e.request_id, e) for e in replication.take_events() if isinstance(e, Done))
        return request_id in _finished
    wait_until(arrived, 20, what=f"request {request_id} to be done")
    return _finished.pop(request_id)


def test_alters_through_two_brokers_and_in_quick_succession_all_land(zk, agent):  # noqa: F811
    FakeBrokers(zk).up(1, 2)
    create_topic(zk, "settings", {0: [1, 2]})
    first, second = agent(1), agent(2)
    first.alter_topic(1, "settings", {"retention_ms": 60000})
    first.alter_topic(2, "settings", {"segment_bytes": 1048576})  # queued before the first is written
    second.alter_topic(3, "settings", {"min_insync_replicas": 2})
    assert [done(first, 1).error, done(first, 2).error, done(second, 3).error] == [None, None, None]
    assert dict(TopicRegistry(zk).get("settings").config) == {
        "retention_ms": 60000, "segment_bytes": 1048576, "min_insync_replicas": 2}

    second.alter_topic(4, "settings", {"retention_ms": None, "segment_bytes": ""})  # removed
    assert done(second, 4).error is None
    assert dict(TopicRegistry(zk).get("settings").config) == {"min_insync_replicas": 2}


def test_a_change_that_does_not_apply_is_refused_and_nothing_is_written(zk, agent):  # noqa: F811
    FakeBrokers(zk).up(1)
    create_topic(zk, "settings", {0: [1]})
    replication = agent(1)
    replication.alter_topic(1, "settings", {"retention_ms": 60000})
    assert done(replication, 1).error is None
    _, before = zk.client.get(PATHS.topic("settings"))
    replication.alter_topic(2, "settings", {"no_such_setting": 1})
    error = done(replication, 2).error
    assert isinstance(error, InvalidConfigError) and "no_such_setting" in error.message
    _, after = zk.client.get(PATHS.topic("settings"))
    assert after.version == before.version
    assert dict(TopicRegistry(zk).get("settings").config) == {"retention_ms": 60000}
