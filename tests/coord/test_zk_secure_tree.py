"""``hpbroker zookeeper secure``: an existing tree made without credentials gets the cluster's,
the groups' and the private ACLs (and the open ACL back with ``--unsecure``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from harness import credentials_file, protected_znodes
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from hpbroker.coord.groups import ConsumerRegistration, GroupRegistry
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.producer_ids import ZkBlockStore
from hpbroker.coord.registry import BrokerRegistration, BrokerRegistry, TopicRegistration, TopicRegistry
from hpbroker.coord.session import Session
from hpbroker.coord.zk_security import (
    ZkCredentials,
    cluster_acl,
    get_or_create_token_key,
    group_acl,
    group_credentials,
    member_acl,
    private_acl,
    world_writable,
)

pytestmark = pytest.mark.zookeeper

PATHS = ZkPaths()
CLUSTER = ZkCredentials("hpbroker", "cluster-password")


def secure(zk_connect: str, credentials, *args: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "HPBROKER_ZOOKEEPER_CREDENTIALS_FILE": str(credentials)}
    return subprocess.run([sys.executable, "-m", "hpbroker.cli", "zookeeper", "secure", "--zookeeper",
                           zk_connect, *args], capture_output=True, text=True, timeout=60, env=environment)


def test_secure_sets_every_nodes_acl_and_unsecure_opens_them_again(zookeeper, chroot, zk_connect, tmp_path):
    old = Session(zk_connect, session_timeout_s=5.0).start()  # a cluster from before ACLs
    try:
        BrokerRegistry(old, PATHS).register(BrokerRegistration(0, "127.0.0.1", 9092, (9093,), {"t": (0,)}))
        TopicRegistry(old, PATHS).publish(TopicRegistration("t", 1, {}, created_by=0))
        ZkBlockStore(old.client, PATHS.producer_id_block).allocate(0, 1000)
        group = GroupRegistry(old, "app", PATHS, timeout_s=10)
        group.register(ConsumerRegistration("m0", ("t",)))
        assert group.claim("t", 0, "m0") and group.commit({("t", 0): 3}, "m0") == set()
        credentials = credentials_file(tmp_path, f"{CLUSTER.user}:{CLUSTER.password}")

        planned = secure(zk_connect, credentials, "--dry-run")
        assert planned.returncode == 0, planned.stderr
        assert f"would set the ACL of {PATHS.offset('app', 't', 0)}" in planned.stdout
        assert world_writable(old.client.get_acls(PATHS.topic("t"))[0])  # a dry run changes nothing

        done = secure(zk_connect, credentials)
        assert done.returncode == 0, done.stdout + done.stderr
        admin = Session(zk_connect, session_timeout_s=5.0, credentials=CLUSTER).start()
        try:
            key = get_or_create_token_key(admin, PATHS)
            for path, acl in protected_znodes(admin.client).items():
                if path == PATHS.token_key:
                    assert acl == private_acl(CLUSTER)
                elif path.startswith(PATHS.group("app")):
                    assert sorted(acl) == sorted(group_acl(key, "app", CLUSTER)), path
                else:
                    assert sorted(acl) == sorted(cluster_acl(CLUSTER)), path
            outside = KazooClient(zookeeper.connect_string, auth_data=[CLUSTER.auth_data])
            outside.start(timeout=10)
            try:
                assert sorted(outside.get_acls(chroot)[0]) == sorted(cluster_acl(CLUSTER))  # the chroot
            finally:
                outside.stop()
                outside.close()
            again = secure(zk_connect, credentials)  # a fresh token key: only the groups' ACLs change
            assert again.returncode == 0, again.stdout + again.stderr
            assert f"replaced the token key {PATHS.token_key} with a fresh one" in again.stdout
            assert "group's ZooKeeper credentials change" in again.stdout
            changed = [line.removeprefix("set the ACL of ") for line in again.stdout.splitlines()
                       if line.startswith("set the ACL of ")]
            assert changed and all(path.startswith(PATHS.group("app")) for path in changed), changed
            assert get_or_create_token_key(admin, PATHS) != key
            key = get_or_create_token_key(admin, PATHS)

            # the old session, without credentials, can no longer write; the group's members can
            with pytest.raises(NoAuthError):
                old.client.set(PATHS.offset("app", "t", 0), b'{"version":1,"offset":0}')
            issued = group_credentials(key, "app", CLUSTER)
            member_session = Session(zk_connect, session_timeout_s=5.0, auth=[issued.credentials],
                                     acl=member_acl(issued.acl_ids)).start()
            try:
                member = GroupRegistry(member_session, "app", PATHS, timeout_s=10)
                member.write_offsets({("t", 1): 7}, force=True)  # under the secured offsets/t
                assert member.committed("t", 1) == 7
            finally:
                member_session.close()

            opened = secure(zk_connect, credentials, "--unsecure")
            assert opened.returncode == 0, opened.stderr
            assert admin.client.exists(PATHS.token_key) is None  # deleted, never opened
            assert world_writable(old.client.get_acls(PATHS.offset("app", "t", 0))[0])
            old.client.set(PATHS.topic("t"), old.client.get(PATHS.topic("t"))[0])
        finally:
            admin.close()
    finally:
        old.close()


def test_secure_needs_the_credentials(zk_connect):
    environment = {k: v for k, v in os.environ.items() if k != "HPBROKER_ZOOKEEPER_CREDENTIALS_FILE"}
    done = subprocess.run([sys.executable, "-m", "hpbroker.cli", "zookeeper", "secure", "--zookeeper",
                           zk_connect], capture_output=True, text=True, timeout=60, env=environment)
    assert done.returncode == 1 and "--zookeeper-credentials-file" in done.stderr, done.stderr


def test_secure_makes_an_open_acls_node_private_and_the_brokers_watch_applies_it(sessions):
    import queue

    from hpbroker.coord.acl_store import encode_acls, watch_acls
    from hpbroker.coord.zk_migration import secure_tree
    from hpbroker.security.acls import AclEntry

    alice = AclEntry("alice", "produce", "topic", "literal", "orders")
    old = sessions()  # `hpbroker acls add` as it once ran: without credentials, an open node
    old.client.create(PATHS.acls, encode_acls([alice]), makepath=True)
    broker = sessions(credentials=CLUSTER)
    seen: queue.Queue = queue.Queue()
    watch = watch_acls(broker, seen.put, PATHS)
    try:
        assert seen.get(timeout=10) == []  # open to the world: not trusted
        report = secure_tree(sessions(credentials=CLUSTER), PATHS)
        assert PATHS.acls in report.changed
        assert any("hpbroker acls list" in note for note in report.notes)
        assert seen.get(timeout=10) == [alice]  # private now: the watch read it again
        assert broker.client.get_acls(PATHS.acls)[0] == private_acl(CLUSTER)
    finally:
        watch.cancel()
