"""The ACLs' znode against a real ZooKeeper: read, add, remove, conditional writes that survive
races, and the watch a broker keeps on it."""

from __future__ import annotations

import json
import queue
import threading

import pytest

from hpbroker.coord.acl_store import add_acls, read_acls, remove_acls, watch_acls
from hpbroker.coord.paths import ZkPaths
from hpbroker.errors import CoordinationError
from hpbroker.security.acls import AclEntry

ALICE = AclEntry("alice", "produce", "topic", "literal", "orders")
BOB = AclEntry("bob", "consume", "topic", "prefixed", "logs.")
OPS = AclEntry("ops", "admin", "cluster", "literal", "cluster")


def test_path_is_acls_under_the_root():
    assert ZkPaths().acls == "/hpbroker/acls"
    assert ZkPaths("/").acls == "/acls"
    assert ZkPaths("/a/b").acls == "/a/b/acls"


def test_no_node_means_no_acls(zk):
    assert read_acls(zk) == []
    assert remove_acls(zk, [ALICE]) == 0


def test_add_and_remove_count_what_changed_and_keep_each_entry_once(zk):
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


def test_another_root_has_its_own_acls(zk):
    other = ZkPaths("/cluster-b")
    add_acls(zk, [ALICE], other)
    assert read_acls(zk) == []
    assert read_acls(zk, other) == [ALICE]


def test_concurrent_adds_from_several_sessions_all_land(sessions):
    writers = [sessions() for _ in range(3)]
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


def test_a_node_that_does_not_parse_is_refused_naming_it(zk):
    zk.client.create(ZkPaths().acls, b"{not json", makepath=True)
    with pytest.raises(CoordinationError, match="znode /hpbroker/acls does not hold the ACLs' JSON"):
        read_acls(zk)
    with pytest.raises(CoordinationError, match="does not hold the ACLs' JSON"):
        add_acls(zk, [ALICE])


def test_an_entry_that_does_not_parse_is_skipped(zk):
    document = {"version": 1, "acls": [ALICE.to_dict(), {**BOB.to_dict(), "operation": "teleport"}]}
    zk.client.create(ZkPaths().acls, json.dumps(document).encode(), makepath=True)
    assert read_acls(zk) == [ALICE]


def test_watch_delivers_the_entries_now_and_after_every_change(zk, sessions):
    seen: queue.Queue = queue.Queue()
    watch = watch_acls(sessions(), seen.put)
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
    from kazoo.security import Permissions

    from hpbroker.coord.zk_security import ZkCredentials
    from hpbroker.errors import AuthorizationError

    cluster = ZkCredentials("hpbroker", "s3cret")
    owner = sessions(credentials=cluster)
    assert add_acls(owner, [ALICE]) == 1
    acl, _ = owner.client.get_acls(ZkPaths().acls)
    assert [(entry.id.scheme, entry.id.id, entry.perms) for entry in acl] == \
        [("digest", cluster.id, Permissions.ALL)]
    stranger = sessions()
    with pytest.raises(AuthorizationError, match="refused reading /hpbroker/acls without credentials"):
        read_acls(stranger)
    with pytest.raises(AuthorizationError, match="ZooKeeper refused changing /hpbroker/acls"):
        add_acls(stranger, [OPS])
    assert read_acls(owner) == [ALICE]
