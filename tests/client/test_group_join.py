"""Joining a consumer group: the constructor either returns a member of the group or raises a
CoordinationError (an AuthorizationError when ZooKeeper's ACLs refuse it), never one of
ZooKeeper's client errors, and leaves nothing running."""

from __future__ import annotations

import threading
import time

import pytest
from group_harness import unique_name

from hpbroker import Consumer
from hpbroker.coord.paths import ZkPaths
from hpbroker.errors import AuthorizationError, HPBrokerError

pytestmark = pytest.mark.zookeeper
pytest_plugins = ["group_fixtures"]  # group_cluster, group_zk


def test_a_member_whose_registration_zookeeper_refuses_fails_with_an_authorization_error(group_cluster,
                                                                                           group_zk):
    """Connected, then refused: the group's node admits no new children (its ACL is read-only),
    so the registration fails after the session was established."""
    from kazoo.security import READ_ACL_UNSAFE

    group = unique_name("g")
    group_zk.client.ensure_path(ZkPaths().consumers)
    group_zk.client.create(f"{ZkPaths().consumers}/{group}", b"", acl=READ_ACL_UNSAFE)
    threads_before = set(threading.enumerate())
    started = time.monotonic()
    with pytest.raises(HPBrokerError) as raised:
        Consumer(group_cluster.bootstrap, group=group, topics=["t"], zookeeper=group_cluster.zk_connect,
                 session_timeout_ms=3000)
    assert isinstance(raised.value, AuthorizationError), repr(raised.value)
    assert f"[group {group} " in str(raised.value) and "cannot join the group" in str(raised.value)
    assert "ZooKeeper refused registering" in str(raised.value)
    assert time.monotonic() - started < 10
    deadline = time.monotonic() + 10  # kazoo's threads end once its session is closed
    while {t for t in threading.enumerate() if t.is_alive()} - threads_before:
        assert time.monotonic() < deadline, f"left running: {set(threading.enumerate()) - threads_before}"
        time.sleep(0.05)
