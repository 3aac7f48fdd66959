"""Consumer groups on a secured broker under ZooKeeper: a member with a key pair takes its group's
ZooKeeper credentials from the broker and creates the group's nodes with the group's ACL; a
principal without ``consume`` on the group gets none; a process without credentials cannot write
the group's offsets or ownership.  A real broker, a real ZooKeeper, real consumers."""

from __future__ import annotations

import pytest
from curve_probe import secured_broker
from harness import protected_znodes, wait_until
from kazoo.exceptions import NoAuthError
from kazoo.security import Permissions

from hpbroker import Consumer, protocol
from hpbroker.client.consumer import TopicPartition
from hpbroker.coord.acl_store import add_acls
from hpbroker.coord.groups import GroupRegistry
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.session import Session
from hpbroker.coord.zk_security import member_acl
from hpbroker.errors import AuthorizationError
from hpbroker.security.acls import AclEntry
from hpbroker.security.client import ClientSecurity

pytestmark = pytest.mark.zookeeper

PATHS = ZkPaths()


@pytest.fixture
def secured(tmp_path, zookeeper, chroot):
    """A secured broker in ``chroot`` with topic ``t`` (2 partitions) and alice allowed to consume
    it as group ``app`` (a curve_probe.SecuredBroker)."""
    with secured_broker(tmp_path, zookeeper.connect_string + chroot) as broker:
        session = broker.session
        add_acls(session, [AclEntry("alice", "create", "topic", "literal", "t"),
                           AclEntry("alice", "consume", "topic", "literal", "t"),
                           AclEntry("alice", "consume", "group", "literal", "app"),
                           AclEntry("bob", "consume", "topic", "literal", "t")])
        alice = broker.probe("alice")

        def created() -> bool:
            header, _ = alice.ask(protocol.CreateTopicRequest("t", 2))
            return header.error_code in (0, 11)  # 28 until the ACLs reach the front-end

        wait_until(created, 15, what="topic t created by alice")
        wait_until(lambda: session.client.exists(PATHS.topic("t")), 15, what="topic t in ZooKeeper")
        alice.close()
        yield broker


def security_of(keys, name: str) -> ClientSecurity:
    return ClientSecurity.from_files(keys.secrets / f"{name}.key_secret", keys.secrets / "broker.key")


def test_a_member_writes_its_group_with_the_groups_acl_and_nobody_else_can(secured):
    port, keys, connect_string, cluster = secured.port, secured.keys, secured.connect_string, secured.session
    consumer = Consumer(f"127.0.0.1:{port}", security=security_of(keys, "alice"), group="app", topics=["t"],
                        zookeeper=connect_string, session_timeout_ms=4000, enable_auto_commit=False)
    outsider = None
    try:
        both = {TopicPartition("t", 0), TopicPartition("t", 1)}

        def assigned() -> bool:
            consumer.poll(timeout_ms=100)
            return consumer.assignment() == both

        wait_until(assigned, 20, what="alice to own both partitions")
        consumer.commit({TopicPartition("t", 0): 0, TopicPartition("t", 1): 0})
        nodes = protected_znodes(cluster.client, PATHS.group("app"))
        assert PATHS.offset("app", "t", 1) in nodes and PATHS.owner("app", "t", 0) in nodes
        group_acl = sorted(nodes[PATHS.group("app")])
        for path, acl in nodes.items():
            assert sorted(acl) == group_acl, path
        assert len(group_acl) == 3  # the cluster's id, the group's id, world read
        # the group's id may not change an ACL: only the cluster's holds ADMIN
        (member_id,) = [entry.id.id for entry in group_acl if entry.id.id.startswith("group-")]
        assert [entry.perms for entry in group_acl if entry.id.id == member_id] == [Permissions.ALL
                                                                                     & ~Permissions.ADMIN]

        outsider = Session(connect_string, session_timeout_s=5.0).start()  # no credentials
        stranger = GroupRegistry(outsider, "app", PATHS, timeout_s=10)
        assert stranger.committed("t", 0) == 0
        with pytest.raises(AuthorizationError, match="ZooKeeper refused"):
            stranger.write_offsets({("t", 0): 99}, force=True)
        with pytest.raises(NoAuthError):
            outsider.client.set(PATHS.offset("app", "t", 0), b'{"version": 1, "offset": 99}')
        with pytest.raises(NoAuthError):
            outsider.client.delete(PATHS.owner("app", "t", 0))
        assert GroupRegistry(cluster, "app", PATHS).committed("t", 0) == 0
    finally:
        consumer.close()
        if outsider is not None:
            outsider.close()


def test_a_principal_without_consume_on_the_group_gets_no_credentials(secured):
    port, keys, connect_string, cluster = secured.port, secured.keys, secured.connect_string, secured.session
    with pytest.raises(AuthorizationError, match="bob"):
        Consumer(f"127.0.0.1:{port}", security=security_of(keys, "bob"), group="app", topics=["t"],
                 zookeeper=connect_string, session_timeout_ms=4000)
    assert cluster.client.exists(PATHS.consumer_ids("app")) is None


def test_a_member_with_its_groups_credentials_cannot_write_another_group(secured):
    connect_string, cluster = secured.connect_string, secured.session
    add_acls(cluster, [AclEntry("alice", "consume", "group", "literal", "other")])
    alice = secured.probe("alice")
    try:
        def issued(group: str):
            header, response = alice.ask(protocol.GroupCredentialsRequest(group))
            return response if header.error_code == 0 else None

        app = wait_until(lambda: issued("app"), 15, what="app's credentials")
        other = wait_until(lambda: issued("other"), 15, what="other's credentials")
        assert app.zookeeper_user != other.zookeeper_user
        wait_until(lambda: cluster.client.exists(PATHS.group("other")), 15, what="the group's node")
        from hpbroker.coord.zk_security import ZkCredentials

        member = Session(connect_string, session_timeout_s=5.0,
                         auth=[ZkCredentials(app.zookeeper_user, app.zookeeper_password)],
                         acl=member_acl(app.acl_ids)).start()
        try:
            with pytest.raises(AuthorizationError, match="group other"):
                GroupRegistry(member, "other", PATHS, timeout_s=10).write_offsets({("t", 0): 5})
            GroupRegistry(member, "app", PATHS, timeout_s=10).write_offsets({("t", 0): 5})
        finally:
            member.close()
    finally:
        alice.close()
