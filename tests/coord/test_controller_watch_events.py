"""The controller's watcher (``Controller._on_watch``) as kazoo calls it: a node's event hands
over the matching work, and the path-less event kazoo sends every watcher when the connection is
lost or the session closed is taken quietly (the pass queued on reconnection sets the watches
again).  Pure logic: the controller is never started, its client never connects."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient
from kazoo.protocol.states import EventType, KazooState, KeeperState, WatchedEvent

from hpbroker.coord.controller import Controller
from hpbroker.coord.paths import ZkPaths

PATHS = ZkPaths()


@pytest.fixture
def controller():
    return Controller(KazooClient("127.0.0.1:1"), PATHS, 1)


@pytest.mark.parametrize("state", [KeeperState.CONNECTING, KeeperState.EXPIRED_SESSION, KeeperState.CLOSED])
def test_a_path_less_event_of_a_lost_connection_is_taken_without_error(controller, state):
    controller._on_watch(WatchedEvent(EventType.NONE, state, None))
    assert controller._events == set()
    controller._on_state(KazooState.CONNECTED)  # the reconnection queues the pass
    assert {"session re-established", "controller node changed"} <= controller._events


@pytest.mark.parametrize("path, event", [
    (PATHS.broker_ids, "brokers changed"),
    (PATHS.broker(3), "brokers changed"),
    (PATHS.topics, "topics changed"),
    (PATHS.topic("orders"), "topics changed"),
])
def test_a_nodes_event_hands_over_the_matching_work(controller, path, event):
    controller._on_watch(WatchedEvent(EventType.CHANGED, KeeperState.CONNECTED, path))
    assert controller._events == {event}
