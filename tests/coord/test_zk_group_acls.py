"""Consumer groups under ZooKeeper ACLs: a broker issues a group's credentials and creates its
node; a member with them registers, owns and commits; a process without them, or with another
group's, cannot write the group's offsets or ownership."""

from __future__ import annotations

import time

import pytest
from harness import protected_znodes, wait_until
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from hpbroker.coord.groups import ConsumerRegistration, GroupRegistry
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.session import Session
from hpbroker.coord.zk_security import (
    GroupCredentials,
    ZkCredentials,
    get_or_create_token_key,
    group_acl,
    group_credentials,
    issue_group_credentials,
    member_acl,
    world_writable,
)
from hpbroker.errors import AuthorizationError

pytestmark = pytest.mark.zookeeper

PATHS = ZkPaths()
CLUSTER = ZkCredentials("hpbroker", "cluster-password")
DEADLINE_S = 20.0


@pytest.fixture
def open_session(zk_connect):
    """``open(**options)`` -> a started Session in this test's chroot; all closed at the end."""
    opened: list[Session] = []

    def make(**options) -> Session:
        session = Session(zk_connect, session_timeout_s=5.0, **options).start()
        opened.append(session)
        return session

    yield make
    for session in opened:
        session.close()


@pytest.fixture
def broker(open_session):
    """The broker's session (the cluster's credentials, which also make the chroot) and its key."""
    session = open_session(credentials=CLUSTER)
    return session, get_or_create_token_key(session, PATHS)


def issue(broker, group: str) -> GroupCredentials:
    """What the broker does for a GroupCredentialsRequest: the credentials, and the group's node
    made without waiting (waited for here)."""
    session, key = broker
    issued = issue_group_credentials(session, PATHS, key, group, CLUSTER)
    wait_until(lambda: session.client.exists(PATHS.group(group)) is not None, DEADLINE_S,
               what=f"the broker to create group {group}'s node")
    return issued


def member_session(open_session, issued: GroupCredentials) -> Session:
    return open_session(auth=[issued.credentials], acl=member_acl(issued.acl_ids))


def test_group_credentials_are_the_same_from_every_broker_and_differ_per_group():
    key = bytes(range(32))
    one, again = group_credentials(key, "orders-app", CLUSTER), group_credentials(key, "orders-app", CLUSTER)
    assert one == again
    assert one.zookeeper_user.startswith("group-") and len(one.zookeeper_user) == len("group-") + 24
    assert one.acl_ids[0] == CLUSTER.id and one.acl_ids[1] == one.credentials.id
    other = group_credentials(key, "billing", CLUSTER)
    assert other.zookeeper_password != one.zookeeper_password
    assert group_credentials(bytes(32), "orders-app", CLUSTER).zookeeper_password != one.zookeeper_password
    assert one.zookeeper_password not in repr(one)


def test_a_member_with_the_groups_credentials_owns_and_commits(broker, open_session):
    issued = issue(broker, "app")
    member = GroupRegistry(member_session(open_session, issued), "app", PATHS, timeout_s=10)
    member.register(member_registration("m1"))
    assert member.claim("orders", 0, "m1")
    assert member.commit({("orders", 0): 42}, "m1") == set()
    assert member.committed("orders", 0) == 42
    # every node of the group carries the group's ACL: nothing is world-writable
    for path, acl in protected_znodes(broker[0].client, PATHS.group("app")).items():
        assert sorted(acl) == sorted(member_acl(issued.acl_ids)), path


def test_a_member_cannot_change_the_acl_of_its_groups_nodes(broker, open_session):
    """The group's id may read, write, create and delete, but not ADMIN: a member cannot lock the
    cluster out of its group, or open the group's nodes to the world; the cluster can."""
    issued = issue(broker, "app")
    session = member_session(open_session, issued)
    member = GroupRegistry(session, "app", PATHS, timeout_s=10)
    member.register(member_registration("m1"))
    assert member.claim("orders", 0, "m1")
    assert member.commit({("orders", 0): 42}, "m1") == set()
    for path in (PATHS.group("app"), PATHS.offset("app", "orders", 0)):
        with pytest.raises(NoAuthError):
            session.client.set_acls(path, OPEN_ACL_UNSAFE)
        with pytest.raises(NoAuthError):
            session.client.set_acls(path, member_acl(issued.acl_ids)[1:])  # without the cluster
    admin = broker[0].client
    assert sorted(admin.get_acls(PATHS.group("app"))[0]) == sorted(member_acl(issued.acl_ids))
    admin.set_acls(PATHS.group("app"), member_acl(issued.acl_ids))  # the cluster keeps ADMIN


def test_without_credentials_a_process_cannot_write_a_groups_offsets_or_ownership(broker, open_session):
    issued = issue(broker, "app")
    member = GroupRegistry(member_session(open_session, issued), "app", PATHS, timeout_s=10)
    member.register(member_registration("m1"))
    assert member.claim("orders", 0, "m1")
    assert member.commit({("orders", 0): 42}, "m1") == set()

    outsider = open_session()  # no credentials at all: a producer, a stray script
    stranger = GroupRegistry(outsider, "app", PATHS, timeout_s=10)
    assert stranger.committed("orders", 0) == 42  # the world may read
    with pytest.raises(AuthorizationError, match="ZooKeeper refused .* without credentials"):
        stranger.write_offsets({("orders", 1): 0}, force=True)
    with pytest.raises(AuthorizationError, match="ZooKeeper refused"):
        stranger.claim("orders", 1, "intruder")
    with pytest.raises(AuthorizationError, match="ZooKeeper refused"):
        stranger.register(member_registration("intruder"))
    offset = b'{"version":1,"offset":0}'
    for attempt in (lambda: outsider.client.set(PATHS.offset("app", "orders", 0), offset),
                    lambda: outsider.client.delete(PATHS.owner("app", "orders", 0)),
                    lambda: outsider.client.create(PATHS.group("other"), b"")):
        with pytest.raises(NoAuthError):
            attempt()
    assert member.committed("orders", 0) == 42


def test_a_member_of_one_group_cannot_write_another_groups_offsets(broker, open_session):
    mine, theirs = issue(broker, "mine"), issue(broker, "theirs")
    owner = GroupRegistry(member_session(open_session, theirs), "theirs", PATHS, timeout_s=10)
    owner.register(member_registration("t1"))
    assert owner.claim("orders", 0, "t1")
    assert owner.commit({("orders", 0): 7}, "t1") == set()

    session = member_session(open_session, mine)
    GroupRegistry(session, "mine", PATHS, timeout_s=10).write_offsets({("orders", 0): 1})  # its own: fine
    # with its own credentials and its own group's ACL, in the other group
    intruder = GroupRegistry(session, "theirs", PATHS, timeout_s=10)
    with pytest.raises(AuthorizationError, match="committing orders-1 in group theirs|group theirs"):
        intruder.write_offsets({("orders", 1): 0}, force=True)
    with pytest.raises(AuthorizationError):
        intruder.claim("orders", 1, "intruder")
    with pytest.raises(NoAuthError):
        session.client.set(PATHS.offset("theirs", "orders", 0), b'{"version":1,"offset":0}')
    assert owner.committed("orders", 0) == 7


def test_a_tool_with_the_clusters_credentials_writes_offsets_members_can_then_commit(broker, open_session):
    session, key = broker
    issued = issue(broker, "app")
    tool = GroupRegistry(open_session(credentials=CLUSTER), "app", PATHS, timeout_s=10,
                         acl=group_acl(key, "app", CLUSTER))
    tool.write_offsets({("orders", 0): 5})
    member = GroupRegistry(member_session(open_session, issued), "app", PATHS, timeout_s=10)
    member.register(member_registration("m1"))
    assert member.committed("orders", 0) == 5
    assert member.claim("orders", 0, "m1")
    assert member.commit({("orders", 0): 6}, "m1") == set()  # under the tool's orders node
    assert member.committed("orders", 0) == 6


def test_a_group_node_made_before_security_gets_the_groups_acl(broker):
    session, key = broker
    session.client.create(PATHS.group("old"), b"", acl=OPEN_ACL_UNSAFE, makepath=True)
    assert world_writable(session.client.get_acls(PATHS.group("old"))[0])
    issue_group_credentials(session, PATHS, key, "old", CLUSTER)
    wait_until(lambda: sorted(session.client.get_acls(PATHS.group("old"))[0])
               == sorted(group_acl(key, "old", CLUSTER)), DEADLINE_S, what="the group's ACL to be set")


def member_registration(consumer_id: str) -> ConsumerRegistration:
    return ConsumerRegistration(consumer_id, ("orders",), "host", 1)


def test_issuing_credentials_never_waits_for_zookeeper(zookeeper, chroot, broker):
    """The broker's request loop issues the credentials while ZooKeeper is slow: the group's node
    comes later, made on kazoo's threads."""
    from zk_proxy import ZkProxy

    proxy = ZkProxy(zookeeper.port)
    slow = Session(f"127.0.0.1:{proxy.port}{chroot}", session_timeout_s=10.0, credentials=CLUSTER).start()
    try:
        key = get_or_create_token_key(slow, PATHS)
        proxy.stall(chroot + PATHS.consumers, 3.0)  # the path as the server sees it
        started = time.monotonic()
        issued = issue_group_credentials(slow, PATHS, key, "slow", CLUSTER)
        assert time.monotonic() - started < 1.0
        assert issued == group_credentials(key, "slow", CLUSTER)
        assert broker[0].client.exists(PATHS.group("slow")) is None  # not yet: the read is held up
        wait_until(lambda: broker[0].client.exists(PATHS.group("slow")) is not None, DEADLINE_S,
                   what="the group's node, once ZooKeeper answers")
        assert proxy.stalls >= 1
    finally:
        slow.close()
        proxy.close()
