"""Partition state nodes: their JSON and its refusals, their paths, and in a real ZooKeeper the
conditional writes (the znode version, the controller epoch's version) and the watch that
delivers creations, changes and deletions."""

from __future__ import annotations

import json
import queue

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpbroker.coord.partition_state import (
    PartitionState,
    PartitionStateWatch,
    create_states,
    decode_state,
    encode_state,
    read_state,
    update_state,
)
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.registry import TopicRegistration, TopicRegistry
from hpbroker.errors import CoordinationError, InvalidPartitionsError

STATE = PartitionState(leader=1, leader_epoch=3, isr=(1, 2, 0), controller_epoch=7)


def test_replication_paths_match_the_documented_layout():
    paths = ZkPaths()
    assert paths.controller == "/hpbroker/controller"
    assert paths.controller_epoch == "/hpbroker/controller_epoch"
    assert paths.topic_partitions("orders") == "/hpbroker/brokers/topics/orders/partitions"
    assert paths.topic_partition("orders", 3) == "/hpbroker/brokers/topics/orders/partitions/3"
    assert paths.partition_state("orders", 3) == "/hpbroker/brokers/topics/orders/partitions/3/state"
    assert ZkPaths("/").partition_state("t", 0) == "/brokers/topics/t/partitions/0/state"
    assert ZkPaths("/").controller == "/controller"
    with pytest.raises(InvalidPartitionsError):
        paths.partition_state("orders", -1)


def test_state_json_is_the_documented_one():
    assert json.loads(encode_state(STATE)) == {"version": 1, "leader": 1, "leader_epoch": 3, "isr": [1, 2, 0],
                                               "controller_epoch": 7}
    assert decode_state(encode_state(STATE)) == STATE


def test_state_without_leader_round_trips_and_keeps_the_last_isr():
    offline = PartitionState(leader=-1, leader_epoch=4, isr=[2], controller_epoch=1)
    assert offline.isr == (2,) and not offline.has_leader
    assert decode_state(encode_state(offline)) == offline
    assert PartitionState(-1, 0, (), 0).isr == ()


def test_state_readers_ignore_unknown_fields_and_refuse_unknown_versions():
    document = json.loads(encode_state(STATE))
    assert decode_state(json.dumps({**document, "leader_recovery_state": 0}).encode()) == STATE
    with pytest.raises(CoordinationError, match="format version 2"):
        decode_state(json.dumps({**document, "version": 2}).encode())
    with pytest.raises(CoordinationError, match="format version None"):
        decode_state(json.dumps({k: v for k, v in document.items() if k != "version"}).encode())


@pytest.mark.parametrize("change", [
    {"leader": -2}, {"leader": "1"}, {"leader": True}, {"leader": 1.0}, {"leader": 2**31},
    {"leader_epoch": -1}, {"leader_epoch": None}, {"controller_epoch": -1}, {"controller_epoch": "7"},
    {"isr": [1, 1]}, {"isr": [-1]}, {"isr": "1,2"}, {"isr": [1, "2"]}, {"isr": {"1": 2}}, {"isr": [False]},
])
def test_state_with_a_bad_field_is_refused(change):
    document = {**json.loads(encode_state(STATE)), **change}
    with pytest.raises(CoordinationError, match="partition state"):
        decode_state(json.dumps(document).encode())


broker_ids = st.integers(0, 2**31 - 1)


@given(st.one_of(st.just(-1), broker_ids), st.integers(0, 2**31 - 1),
       st.lists(broker_ids, unique=True, max_size=8), st.integers(0, 2**31 - 1))
def test_any_state_round_trips(leader, leader_epoch, isr, controller_epoch):
    state = PartitionState(leader, leader_epoch, isr, controller_epoch)
    assert decode_state(encode_state(state)) == state


@pytest.mark.parametrize("data", [b"", b"\xff", b"[]", b'{"version": 1}', b'{"version": 1, "leader": 1}'])
def test_malformed_state_data_is_a_coordination_error(data):
    with pytest.raises(CoordinationError, match="partition state"):
        decode_state(data)


@pytest.mark.parametrize("fields", [(-2, 0, (), 0), (0, -1, (0,), 0), (0, 0, (0, 0), 0), (0, 0, (0,), -1),
                                    (0, 0, 5, 0)])
def test_bad_state_is_refused_on_construction(fields):
    with pytest.raises(ValueError):
        PartitionState(*fields)


# --- in ZooKeeper ---------------------------------------------------------------------------------

needs_zookeeper = pytest.mark.zookeeper
PATHS = ZkPaths()


def _topic(zk, name="orders", partitions=2):
    replicas = {p: (1, 2, 0) for p in range(partitions)}
    TopicRegistry(zk).publish(TopicRegistration(name, partitions, {}, created_by=1, replicas=replicas))


def _elect(zk) -> int:
    """Set /controller_epoch as an elected controller would; returns the node's version."""
    client = zk.client
    if client.exists(PATHS.controller_epoch) is None:
        client.create(PATHS.controller_epoch, b'{"version":1,"epoch":1}', makepath=True)
        return 0
    data, stat = client.get(PATHS.controller_epoch)
    epoch = json.loads(data)["epoch"] + 1
    return client.set(PATHS.controller_epoch, json.dumps({"version": 1, "epoch": epoch}).encode(),
                      version=stat.version).version


@needs_zookeeper
def test_created_states_are_read_back_with_their_versions(zk):
    _topic(zk)
    version = _elect(zk)
    other = PartitionState(2, 0, (2, 0, 1), 1)
    assert create_states(zk, PATHS, "orders", {0: STATE, 1: other}, controller_epoch_version=version)
    assert read_state(zk.client, PATHS, "orders", 0) == (STATE, 0)
    assert read_state(zk, PATHS, "orders", 1) == (other, 0)
    assert read_state(zk, PATHS, "orders", 2) is None


@needs_zookeeper
def test_create_states_leaves_existing_nodes_as_they_are(zk):
    _topic(zk, partitions=3)
    assert create_states(zk, PATHS, "orders", {1: STATE})  # no controller check asked for
    fresh = PartitionState(0, 0, (0,), 2)
    assert create_states(zk, PATHS, "orders", {0: fresh, 1: fresh, 2: fresh})
    assert [read_state(zk, PATHS, "orders", p)[0] for p in range(3)] == [fresh, STATE, fresh]


@needs_zookeeper
def test_create_states_is_refused_after_another_controller_was_elected(zk):
    _topic(zk)
    deposed = _elect(zk)
    _elect(zk)
    assert create_states(zk, PATHS, "orders", {0: STATE, 1: STATE}, controller_epoch_version=deposed) is False
    assert read_state(zk, PATHS, "orders", 0) is None and read_state(zk, PATHS, "orders", 1) is None


@needs_zookeeper
def test_create_states_of_a_topic_without_its_node_is_a_coordination_error(zk):
    with pytest.raises(CoordinationError, match="has no node"):
        create_states(zk, PATHS, "ghost", {0: STATE})
    assert zk.client.exists(PATHS.topic("ghost")) is None


@needs_zookeeper
def test_update_is_conditional_on_the_version_read(zk):
    _topic(zk)
    create_states(zk, PATHS, "orders", {0: STATE})
    _, version = read_state(zk, PATHS, "orders", 0)
    shrunk = PartitionState(1, 3, (1, 2), 7)
    assert update_state(zk, PATHS, "orders", 0, shrunk, expected_version=version) == version + 1
    assert update_state(zk, PATHS, "orders", 0, STATE, expected_version=version) is None  # stale read
    assert read_state(zk, PATHS, "orders", 0) == (shrunk, version + 1)
    assert update_state(zk, PATHS, "orders", 1, STATE, expected_version=0) is None  # no such node


@needs_zookeeper
def test_controller_write_is_refused_once_the_controller_epoch_changed(zk):
    _topic(zk)
    mine = _elect(zk)
    create_states(zk, PATHS, "orders", {0: STATE}, controller_epoch_version=mine)
    moved = PartitionState(2, 4, (2, 0), 7)
    assert update_state(zk, PATHS, "orders", 0, moved, expected_version=0, controller_epoch_version=mine) == 1
    _elect(zk)  # another controller: /controller_epoch has a new version
    again = PartitionState(0, 5, (0,), 7)
    assert update_state(zk, PATHS, "orders", 0, again, expected_version=1,
                        controller_epoch_version=mine) is None
    assert read_state(zk, PATHS, "orders", 0) == (moved, 1)


@needs_zookeeper
def test_controller_write_with_a_stale_state_version_is_refused(zk):
    _topic(zk)
    mine = _elect(zk)
    create_states(zk, PATHS, "orders", {0: STATE}, controller_epoch_version=mine)
    shrunk = PartitionState(1, 3, (1,), 7)
    assert update_state(zk, PATHS, "orders", 0, shrunk, expected_version=0) == 1  # a leader's ISR shrink
    moved = PartitionState(2, 4, (2,), 7)
    assert update_state(zk, PATHS, "orders", 0, moved, expected_version=0,
                        controller_epoch_version=mine) is None
    assert update_state(zk, PATHS, "orders", 0, moved, expected_version=1, controller_epoch_version=mine) == 2


@needs_zookeeper
def test_undecodable_state_node_is_a_coordination_error_naming_it(zk):
    _topic(zk)
    zk.client.create(PATHS.partition_state("orders", 0), b"{oops", makepath=True)
    with pytest.raises(CoordinationError, match="partitions/0/state"):
        read_state(zk, PATHS, "orders", 0)


@needs_zookeeper
def test_removing_a_topic_removes_its_partition_states(zk):
    _topic(zk)
    create_states(zk, PATHS, "orders", {0: STATE, 1: STATE})
    assert TopicRegistry(zk).remove("orders")
    assert zk.client.exists(PATHS.topic("orders")) is None


@needs_zookeeper
def test_watch_delivers_creation_change_and_deletion(sessions, zk):
    _topic(zk)
    seen: queue.Queue = queue.Queue()
    watch = PartitionStateWatch(sessions(), PATHS, lambda *event: seen.put(event))
    watch.watch("orders", 0)
    assert seen.get(timeout=10) == ("orders", 0, None, -1)  # called before watch() returns
    watch.watch("orders", 0)  # already watched: nothing new
    create_states(zk, PATHS, "orders", {0: STATE})
    assert seen.get(timeout=10) == ("orders", 0, STATE, 0)
    shrunk = PartitionState(1, 3, (1,), 7)
    update_state(zk, PATHS, "orders", 0, shrunk, expected_version=0)
    assert seen.get(timeout=10) == ("orders", 0, shrunk, 1)
    zk.client.set(PATHS.partition_state("orders", 0), b"not json")
    assert seen.get(timeout=10) == ("orders", 0, None, 2)  # undecodable: no state, the node's version
    zk.client.delete(PATHS.partition_state("orders", 0))
    assert seen.get(timeout=10) == ("orders", 0, None, -1)
    assert seen.empty()
    watch.close()


@needs_zookeeper
def test_watch_goes_on_after_its_session_expires(sessions, zk, expire_session):
    _topic(zk)
    owner = sessions()
    seen: queue.Queue = queue.Queue()
    watch = PartitionStateWatch(owner, PATHS, lambda *event: seen.put(event))
    watch.watch("orders", 0)
    assert seen.get(timeout=10) == ("orders", 0, None, -1)
    expire_session(owner)
    create_states(zk, PATHS, "orders", {0: STATE})
    while (event := seen.get(timeout=10)) != ("orders", 0, STATE, 0):
        assert event == ("orders", 0, None, -1)  # the state read again in the new session
    watch.close()


@needs_zookeeper
def test_unwatched_topic_gets_no_more_callbacks(sessions, zk):
    """Notifications of one session are delivered in order, one at a time: a later event seen by
    a watch on the same session shows that an earlier one was not delivered."""
    _topic(zk, "orders")
    _topic(zk, "logs", partitions=1)
    owner = sessions()
    seen: queue.Queue = queue.Queue()
    watch = PartitionStateWatch(owner, PATHS, lambda *event: seen.put(event))
    for topic, partition in [("orders", 0), ("orders", 1), ("logs", 0)]:
        watch.watch(topic, partition)
    assert watch.watched() == [("logs", 0), ("orders", 0), ("orders", 1)]
    assert [seen.get(timeout=10) for _ in range(3)] == [("orders", 0, None, -1), ("orders", 1, None, -1),
                                                        ("logs", 0, None, -1)]
    watch.unwatch_topic("orders")
    assert watch.watched() == [("logs", 0)]
    create_states(zk, PATHS, "orders", {0: STATE, 1: STATE})
    create_states(zk, PATHS, "logs", {0: STATE})
    assert seen.get(timeout=10) == ("logs", 0, STATE, 0)
    watch.watch("orders", 1)  # watched again: the current state at once
    assert seen.get(timeout=10) == ("orders", 1, STATE, 0)

    watch.close()
    watch.watch("orders", 0)  # closed: ignored
    assert watch.watched() == []
    sentinel: queue.Queue = queue.Queue()
    PartitionStateWatch(owner, PATHS, lambda *event: sentinel.put(event)).watch("logs", 0)
    assert sentinel.get(timeout=10) == ("logs", 0, STATE, 0)
    update_state(zk, PATHS, "orders", 1, STATE, expected_version=0)
    update_state(zk, PATHS, "logs", 0, STATE, expected_version=0)
    assert sentinel.get(timeout=10) == ("logs", 0, STATE, 1)
    assert seen.empty()
