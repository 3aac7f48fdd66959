"""Watches are set again off kazoo's callback thread: a watch whose re-read keeps failing (every
read of its node costs the connection, through a proxy that cuts it) never holds up the events
of the client's other watches, and it recovers once its node can be read again, also when its
reads keep failing while the connection holds."""

from __future__ import annotations

import queue
import threading
import time

import pytest
from harness import wait_until
from kazoo.client import KazooClient
from zk_proxy import ZkProxy

from hpbroker.coord import watches
from hpbroker.coord.session import connect
from hpbroker.coord.watches import watch_children, watch_data

pytestmark = pytest.mark.zookeeper


@pytest.fixture
def proxied(zookeeper, chroot):
    """(a session reaching this test's chroot through a ZkProxy, the proxy, an admin client)."""
    proxy = ZkProxy(zookeeper.port)
    admin = KazooClient(zookeeper.connect_string)
    admin.start(timeout=10)
    admin.ensure_path(chroot)
    admin.chroot = chroot
    session = connect(f"127.0.0.1:{proxy.port}{chroot}", session_timeout_s=10.0)
    try:
        yield session, proxy, admin
    finally:
        session.close()
        proxy.close()
        admin.stop()
        admin.close()


def test_a_watch_whose_reads_keep_failing_does_not_delay_the_others(proxied, chroot):
    session, proxy, admin = proxied
    admin.create("/a", b"0")
    admin.create("/b", b"0")
    seen_a: queue.Queue = queue.Queue()
    seen_b: queue.Queue = queue.Queue()
    watch_a = watch_data(session.client, "/a", lambda data, stat: seen_a.put(data))
    watch_data(session.client, "/b", lambda data, stat: seen_b.put(data))
    assert seen_a.get(timeout=5) == b"0" and seen_b.get(timeout=5) == b"0"

    proxy.poison(chroot + "/a")
    admin.set("/a", b"1")  # the watch on /a fires; reading /a now costs the connection, every time
    # kazoo's own DataWatch would now be sleeping in a retry on its callback thread, each pause
    # about twice the last: after seven failures the next read is seconds away.
    wait_until(lambda: proxy.cuts >= 7, 60, what="seven failed reads of /a")
    wait_until(lambda: session.client.connected, 10, what="the client connected again")
    admin.set("/b", b"marker")  # once delivered, the watch on /b is set in this connection
    assert seen_b.get(timeout=30) == b"marker"

    sent = time.monotonic()
    admin.set("/b", b"1")
    assert seen_b.get(timeout=10) == b"1"
    assert time.monotonic() - sent < 5.0, "the change of /b waited behind the failing watch on /a"

    proxy.cure(chroot + "/a")
    assert seen_a.get(timeout=15) == b"1"  # the failing watch recovers on its own
    admin.set("/a", b"2")
    assert seen_a.get(timeout=10) == b"2"
    watch_a.cancel()


def test_a_watch_started_while_zookeeper_cannot_be_reached_starts_when_it_can(proxied, chroot):
    session, proxy, admin = proxied
    admin.create("/c", b"0")
    seen: queue.Queue = queue.Queue()
    proxy.poison(chroot + "/c")
    made: queue.Queue = queue.Queue()
    def start() -> None:
        made.put(watch_data(session.client, "/c", lambda data, stat: seen.put(data)))

    threading.Thread(target=start, daemon=True).start()
    watch = made.get(timeout=15)  # returns, though the node cannot be read
    assert seen.empty()  # not read yet: the first call comes once the node can be read
    proxy.cure(chroot + "/c")
    assert seen.get(timeout=15) == b"0"
    admin.set("/c", b"1")
    assert seen.get(timeout=10) == b"1"
    watch.cancel()


def test_a_children_watch_follows_deletion_and_re_creation_of_its_parent(sessions, zk):
    seen: queue.Queue = queue.Queue()
    watch = watch_children(zk.client, "/parent", seen.put)
    assert seen.get(timeout=5) == []
    zk.client.create("/parent/x")
    assert seen.get(timeout=10) == ["x"]
    zk.client.delete("/parent", recursive=True)
    assert seen.get(timeout=10) == []
    zk.client.create("/parent/y", makepath=True)
    assert seen.get(timeout=10) == ["y"]
    watch.cancel()


def test_a_watch_whose_reads_keep_timing_out_while_connected_never_gives_up(proxied, chroot, monkeypatch):
    """A slow ZooKeeper: every read of /d is answered after the read's time limit, the connection
    staying up throughout.  Past ``_READ_ATTEMPTS`` failures the watch keeps trying (its back-off
    capped), so the change is delivered once reads are answered in time, with no reconnection and
    no further change of the node to prompt it."""
    session, proxy, admin = proxied
    monkeypatch.setattr(watches, "_READ_TIMEOUT_S", 0.3)
    # Reads at least 1 s apart, each held 0.8 s: the pings queued behind them are answered in time.
    monkeypatch.setattr(watches, "_FIRST_DELAY_S", 1.0)
    admin.create("/d", b"0")
    seen: queue.Queue = queue.Queue()
    watch = watch_data(session.client, "/d", lambda data, stat: seen.put(data))
    assert seen.get(timeout=5) == b"0"
    states: list[str] = []
    session.client.add_listener(states.append)

    proxy.stall(chroot + "/d", 0.8)
    admin.set("/d", b"1")  # the watch fires; each read of /d is answered too late
    wait_until(lambda: proxy.stalls >= watches._READ_ATTEMPTS + 1, 120,
               what=f"more than {watches._READ_ATTEMPTS} timed-out reads of /d")
    assert seen.empty()
    proxy.cure(chroot + "/d")
    assert seen.get(timeout=watches._STREAK_MAX_DELAY_S + 20) == b"1"
    assert states == [], "the connection dropped: the test proves nothing"
    session.client.remove_listener(states.append)
    watch.cancel()
