"""The ACLs' znode against a real ZooKeeper: read, add, remove, conditional writes that survive
races, and the watch a broker keeps on it."""

from __future__ import annotations

import json
import logging
import queue
import threading

import pytest
from kazoo.security import OPEN_ACL_UNSAFE, Permissions

from hpbroker.coord.acl_store import add_acls, encode_acls, read_acls, remove_acls, watch_acls
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.zk_security import ZkCredentials, private_acl, world_writable
from hpbroker.errors import CoordinationError, InvalidConfigError
from hpbroker.security.acls import AclEntry

CLUSTER = ZkCredentials("hpbroker", "a-long-cluster-password-0123")
ALICE = AclEntry("alice", "produce", "topic", "literal", "orders")
BOB = AclEntry("bob", "consume", "topic", "prefixed", "logs.")
OPS = AclEntry("ops", "admin", "cluster", "literal", "cluster")


def test_path_is_acls_under_the_root():
    assert ZkPaths().acls == "/hpbroker/acls"
    assert ZkPaths("/").acls == "/acls"
    assert ZkPaths("/a/b").acls == "/a/b/acls"


@pytest.fixture
def owner(sessions):
    """A session with the cluster's credentials, as brokers and ``hpbroker acls`` have."""
    return sessions(credentials=CLUSTER)


def test_no_node_means_no_acls(owner):
    zk = owner
    assert read_acls(zk) == []
    assert remove_acls(zk, [ALICE]) == 0


def test_add_and_remove_count_what_changed_and_keep_each_entry_once(owner):
    zk = owner
    assert add_acls(zk, [ALICE, BOB]) == 2
    assert add_acls(zk, [ALICE, OPS]) == 1
    assert set(read_acls(zk)) == {ALICE, BOB, OPS}
    document = json.loads(zk.client.get(ZkPaths().acls)[0])
    assert document["version"] == 1
    assert document["acls"] == sorted(document["acls"], key=lambda d: json.dumps(d, sort_keys=True))
    assert {"principal": "alice", "operation": "produce", "resource_type": "topic",
            "pattern_type": "literal", "name": "orders"} in document["acls"]
    assert remove_acls(zk, [ALICE, AclEntry("carol", "describe", "topic", "literal", "*")]) == 1
    assert set(read_acls(zk)) == {BOB, OPS}


def test_another_root_has_its_own_acls(owner):
    zk = owner
    other = ZkPaths("/cluster-b")
    add_acls(zk, [ALICE], other)
    assert read_acls(zk) == []
    assert read_acls(zk, other) == [ALICE]


def test_concurrent_adds_from_several_sessions_all_land(sessions):
    writers = [sessions(credentials=CLUSTER) for _ in range(3)]
    errors: list[BaseException] = []

    def add_many(session, index: int) -> None:
        try:
            for n in range(8):
                add_acls(session, [AclEntry(f"p{index}", "describe", "topic", "literal", f"t{n}")])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=add_many, args=(s, i))
               for i, s in enumerate(writers) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert len(read_acls(writers[0])) == 3 * 8


def test_a_node_that_does_not_parse_is_refused_naming_it(owner):
    zk = owner
    zk.client.create(ZkPaths().acls, b"{not json", makepath=True)
    with pytest.raises(CoordinationError, match="znode /hpbroker/acls does not hold the ACLs' JSON"):
        read_acls(zk)
    with pytest.raises(CoordinationError, match="does not hold the ACLs' JSON"):
        add_acls(zk, [ALICE])


def test_an_entry_that_does_not_parse_is_skipped(owner):
    zk = owner
    document = {"version": 1, "acls": [ALICE.to_dict(), {**BOB.to_dict(), "operation": "teleport"}]}
    zk.client.create(ZkPaths().acls, json.dumps(document).encode(), makepath=True)
    assert read_acls(zk) == [ALICE]


def test_watch_delivers_the_entries_now_and_after_every_change(owner, sessions):
    zk = owner
    seen: queue.Queue = queue.Queue()
    watch = watch_acls(sessions(credentials=CLUSTER), seen.put)
    try:
        assert seen.get(timeout=10) == []
        add_acls(zk, [ALICE])
        assert seen.get(timeout=10) == [ALICE]
        add_acls(zk, [BOB])
        assert set(seen.get(timeout=10)) == {ALICE, BOB}
        remove_acls(zk, [ALICE, BOB])
        assert seen.get(timeout=10) == []
        zk.client.set(ZkPaths().acls, b"garbage")  # logged, the entries in force stay
        zk.client.set(ZkPaths().acls, json.dumps({"version": 1, "acls": [OPS.to_dict()]}).encode())
        assert seen.get(timeout=10) == [OPS]
        zk.client.delete(ZkPaths().acls)
        assert seen.get(timeout=10) == []
    finally:
        watch.cancel()


def test_with_the_clusters_credentials_the_node_is_private_to_them(sessions):
    from hpbroker.errors import AuthorizationError

    cluster = CLUSTER
    owner = sessions(credentials=cluster)
    assert add_acls(owner, [ALICE]) == 1
    acl, _ = owner.client.get_acls(ZkPaths().acls)
    assert [(entry.id.scheme, entry.id.id, entry.perms) for entry in acl] == \
        [("digest", cluster.id, Permissions.ALL)]
    stranger = sessions()
    with pytest.raises(AuthorizationError, match="refused reading /hpbroker/acls without credentials"):
        read_acls(stranger)
    with pytest.raises(InvalidConfigError, match="needs the cluster's ZooKeeper credentials"):
        add_acls(stranger, [OPS])
    other = sessions(credentials=ZkCredentials("other", "another-long-password-0123"))
    with pytest.raises(AuthorizationError, match="ZooKeeper refused changing /hpbroker/acls as 'other'"):
        add_acls(other, [OPS])
    assert read_acls(owner) == [ALICE]


def test_changes_without_the_clusters_credentials_are_refused_and_create_nothing(zk):
    for change in (add_acls, remove_acls):
        with pytest.raises(InvalidConfigError, match="--zookeeper-credentials-file"):
            change(zk, [ALICE])
    assert zk.client.exists(ZkPaths().acls) is None


def test_the_watch_creates_a_missing_node_private_to_the_cluster(owner):
    seen: queue.Queue = queue.Queue()
    watch = watch_acls(owner, seen.put)
    try:
        assert seen.get(timeout=10) == []
        acl, _ = owner.client.get_acls(ZkPaths().acls)
        assert acl == private_acl(CLUSTER)
    finally:
        watch.cancel()


@pytest.mark.parametrize("planted_acl", ["world", "another id"])
def test_the_watch_ignores_a_node_others_may_write_until_it_is_made_private(
        zk, sessions, caplog, planted_acl):
    from kazoo.security import make_digest_acl

    acl = (list(OPEN_ACL_UNSAFE) if planted_acl == "world" else
           [*private_acl(CLUSTER), make_digest_acl("mallory", "pw", write=True)])
    mallory = AclEntry("mallory", "admin", "cluster", "literal", "cluster")
    zk.client.ensure_path(ZkPaths().root)
    zk.client.create(ZkPaths().acls, encode_acls([mallory]), acl=acl)  # planted before ACLs were on
    broker = sessions(credentials=CLUSTER)
    seen: queue.Queue = queue.Queue()
    with caplog.at_level(logging.WARNING, logger="hpbroker.coord.acl_store"):
        watch = watch_acls(broker, seen.put)
        try:
            assert seen.get(timeout=10) == []  # fail closed: super users only
            critical = [r for r in caplog.records if r.levelno == logging.CRITICAL]
            assert len(critical) == 1 and "zookeeper secure" in critical[0].getMessage()
            # changed again while still open: still nothing, and no second CRITICAL
            data, stat = broker.client.get(ZkPaths().acls)
            broker.client.set(ZkPaths().acls, encode_acls([mallory, ALICE]), version=stat.version)
            assert seen.get(timeout=10) == []
            assert len([r for r in caplog.records if r.levelno == logging.CRITICAL]) == 1
            # what `hpbroker zookeeper secure` does: the private ACL, then the data written back
            _, acl_stat = broker.client.get_acls(ZkPaths().acls)
            broker.client.set_acls(ZkPaths().acls, private_acl(CLUSTER), version=acl_stat.aversion)
            data, stat = broker.client.get(ZkPaths().acls)
            broker.client.set(ZkPaths().acls, data, version=stat.version)
            assert set(seen.get(timeout=10)) == {mallory, ALICE}
        finally:
            watch.cancel()
    assert not world_writable(broker.client.get_acls(ZkPaths().acls)[0])


def test_the_watch_without_credentials_trusts_no_node_anyone_may_write(zk, sessions):
    zk.client.create(ZkPaths().acls, encode_acls([ALICE]), makepath=True)
    seen: queue.Queue = queue.Queue()
    watch = watch_acls(sessions(), seen.put)
    try:
        assert seen.get(timeout=10) == []
    finally:
        watch.cancel()
