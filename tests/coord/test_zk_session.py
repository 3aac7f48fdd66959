"""The session helper against a real ZooKeeper: bounded connect, chroot, ephemeral nodes kept
across a forced session expiry, conflicts."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from harness import wait_until
from kazoo.client import KazooClient

from hpbroker.coord.session import Session, connect
from hpbroker.errors import CoordinationError, InvalidConfigError


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens there once the probe is closed


def test_connect_to_a_closed_port_fails_within_the_timeout_and_leaves_nothing_running():
    threads_before = threading.active_count()
    started = time.monotonic()
    with pytest.raises(CoordinationError, match=r"cannot reach ZooKeeper at 127\.0\.0\.1:\d+ within 0\.5 s"):
        connect(f"127.0.0.1:{_closed_port()}", session_timeout_s=5, connect_timeout_s=0.5)
    assert time.monotonic() - started < 3
    wait_until(lambda: threading.active_count() <= threads_before, 5, what="kazoo's threads to end")


def test_a_malformed_connect_string_is_a_config_error():
    with pytest.raises(InvalidConfigError, match="not a number"):
        Session("127.0.0.1:zk")


@pytest.mark.zookeeper
def test_connect_creates_the_missing_chroot(zookeeper, chroot):
    with connect(zookeeper.connect_string + chroot + "/deeper") as session:
        assert session.client.exists("/") is not None
        session.client.create("/node", b"x")
    with connect(zookeeper.connect_string) as plain:
        assert plain.client.get(chroot + "/deeper/node")[0] == b"x"


@pytest.mark.zookeeper
def test_ephemeral_node_vanishes_when_the_session_closes(sessions, zk):
    owner = sessions()
    owner.register_ephemeral("/live/a", b"one")
    data, stat = zk.client.get("/live/a")
    assert data == b"one" and stat.ephemeralOwner == owner.session_id
    owner.close()
    assert zk.client.exists("/live/a") is None


@pytest.mark.zookeeper
def test_register_again_updates_the_data_in_place(sessions, zk):
    owner = sessions()
    owner.register_ephemeral("/live/a", b"one")
    owner.register_ephemeral("/live/a", b"two")
    data, stat = zk.client.get("/live/a")
    assert data == b"two" and stat.version == 1


@pytest.mark.zookeeper
def test_ephemeral_node_is_recreated_with_its_latest_data_after_session_expiry(sessions, zk, expire_session):
    owner = sessions()
    owner.register_ephemeral("/live/a", b"one")
    owner.register_ephemeral("/live/a", b"two")
    owner.register_ephemeral("/live/b", b"bee")
    old_session = expire_session(owner)
    assert owner.session_id != old_session

    def restored():
        found = [zk.client.exists(path) for path in ("/live/a", "/live/b")]
        return all(stat is not None and stat.ephemeralOwner == owner.session_id for stat in found)

    wait_until(restored, 10, what="both nodes re-created in the new session")
    assert zk.client.get("/live/a")[0] == b"two"
    owner.close()
    assert zk.client.exists("/live/a") is None and zk.client.exists("/live/b") is None


@pytest.mark.zookeeper
def test_unregistered_node_is_deleted_and_not_recreated(sessions, zk, expire_session):
    owner = sessions()
    owner.register_ephemeral("/live/a", b"one")
    owner.unregister_ephemeral("/live/a")
    assert zk.client.exists("/live/a") is None
    expire_session(owner)
    time.sleep(0.3)
    assert zk.client.exists("/live/a") is None


@pytest.mark.zookeeper
def test_a_node_held_by_another_live_session_is_a_conflict(sessions, zk):
    first, second = sessions(), sessions()
    first.register_ephemeral("/live/a", b"first")
    with pytest.raises(CoordinationError, match=rf"/live/a is held by session 0x{first.session_id:x}: first"):
        second.register_ephemeral("/live/a", b"second")
    assert zk.client.get("/live/a")[0] == b"first"


@pytest.mark.zookeeper
def test_takeover_replaces_a_node_its_predicate_recognises(sessions, zk):
    first, second = sessions(), sessions()
    first.register_ephemeral("/live/a", b"me, before a restart")
    second.register_ephemeral("/live/a", b"me", takeover=lambda existing: existing.startswith(b"me"))
    data, stat = zk.client.get("/live/a")
    assert data == b"me" and stat.ephemeralOwner == second.session_id


@pytest.mark.zookeeper
def test_session_reattached_by_id_sees_its_nodes(zookeeper, sessions, zk):
    owner = sessions()
    owner.register_ephemeral("/live/a", b"one")
    reattached = KazooClient(zookeeper.connect_string, client_id=owner.client.client_id)
    reattached.start(timeout=10)
    try:
        assert reattached.client_id[0] == owner.session_id
    finally:
        reattached.stop()  # closes the session: the node goes with it
        reattached.close()
    wait_until(lambda: zk.client.exists("/live/a") is None or
               zk.client.exists("/live/a").ephemeralOwner != owner.session_id, 10,
               what="the closed session's node to go")
