"""``hpbroker acls add|list|remove`` as an operator runs it (a real subprocess) against a real
ZooKeeper: what it stores, what it prints, and its errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hpbroker.coord.acl_store import read_acls
from hpbroker.coord.session import connect
from hpbroker.coord.zk_security import ZkCredentials, world_writable
from hpbroker.security.acls import AclEntry

CLUSTER = ZkCredentials("hpbroker", "a-long-cluster-password-0123")
CREDENTIALS_VARIABLE = "HPBROKER_ZOOKEEPER_CREDENTIALS_FILE"


@pytest.fixture
def zk_connect(zookeeper, chroot) -> str:
    return zookeeper.connect_string + chroot


@pytest.fixture(autouse=True)
def cluster_credentials(tmp_path, monkeypatch) -> str:
    """The cluster's credentials file, in the environment every ``acls`` run inherits."""
    path = tmp_path / "zookeeper.credentials"
    path.write_text(f"{CLUSTER.user}:{CLUSTER.password}\n")
    path.chmod(0o600)
    monkeypatch.setenv(CREDENTIALS_VARIABLE, str(path))
    return str(path)


def acls(zk_connect: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpbroker.cli", "acls", *args, "--zookeeper", zk_connect],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def stored(zk_connect: str, **session) -> set[AclEntry]:
    with connect(zk_connect, session_timeout_s=5.0, **{"credentials": CLUSTER, **session}) as zk:
        return set(read_acls(zk))


def test_add_list_and_remove(zk_connect):
    done = acls(zk_connect, "add", "--principal", "alice", "--principal", "bob",
                "--operation", "produce,describe", "--topic", "orders")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "added 4 ACLs:"
    assert "  alice may produce on topic 'orders'" in done.stdout.splitlines()
    assert stored(zk_connect) == {AclEntry(p, o, "topic", "literal", "orders")
                                  for p in ("alice", "bob") for o in ("produce", "describe")}
    done = acls(zk_connect, "add", "-p", "*", "-o", "consume", "--topic-prefix", "public.")
    assert done.returncode == 0 and done.stdout.startswith("added 1 ACL:")
    done = acls(zk_connect, "add", "-p", "ops", "-o", "admin", "--cluster")
    assert done.returncode == 0
    again = acls(zk_connect, "add", "-p", "alice", "-o", "produce", "--topic", "orders")
    assert again.returncode == 0 and again.stdout.startswith("added 0 ACLs (1 already there):")

    listed = acls(zk_connect, "list", "--principal", "alice")
    assert listed.returncode == 0, listed.stderr
    assert [line.split() for line in listed.stdout.splitlines()] == [
        ["principal", "operation", "resource", "pattern", "name"],
        ["*", "consume", "topic", "prefixed", "public."],
        ["alice", "describe", "topic", "literal", "orders"],
        ["alice", "produce", "topic", "literal", "orders"],
    ]
    assert len(acls(zk_connect, "list").stdout.splitlines()) == 1 + 6

    removed = acls(zk_connect, "remove", "-p", "bob", "-o", "produce,describe", "--topic", "orders")
    assert removed.returncode == 0 and removed.stdout.strip() == "removed 2 ACLs"
    assert AclEntry("bob", "produce", "topic", "literal", "orders") not in stored(zk_connect)
    missing = acls(zk_connect, "remove", "-p", "bob", "-o", "produce", "--topic", "orders")
    assert missing.returncode == 1
    assert missing.stderr.strip() == "hpbroker acls remove: no such ACL: bob may produce on topic 'orders'"


def test_an_empty_cluster_lists_no_acls(zk_connect):
    listed = acls(zk_connect, "list")
    assert listed.returncode == 0 and listed.stdout.strip() == "no ACLs"


@pytest.mark.parametrize(("args", "message"), [
    (("-p", "alice", "-o", "write", "--topic", "t"), "ACL operation 'write' is not one of"),
    (("-p", "alice", "-o", "produce", "--group", "g"), "ACL operation 'produce' does not apply to a group"),
    (("-p", "alice", "-o", "produce", "--cluster"), "ACL operation 'produce' does not apply to a cluster"),
    (("-p", "a/b", "-o", "produce", "--topic", "t"), "ACL principal 'a/b' is not a key name"),
    (("-p", "alice", "-o", "produce,", "--topic", "t"), "has an empty operation"),
    (("-p", "alice", "-o", "produce", "--topic", "bad name"), "ACL topic name 'bad name' is not valid"),
])
def test_a_bad_entry_is_refused_naming_what_is_wrong_and_nothing_is_stored(zk_connect, args, message):
    done = acls(zk_connect, "add", *args)
    assert done.returncode == 1
    assert done.stderr.startswith("hpbroker acls add: invalid configuration: ")
    assert message in done.stderr
    assert stored(zk_connect) == set()


def test_a_resource_is_required_and_only_one(zk_connect):
    none = acls(zk_connect, "add", "-p", "alice", "-o", "produce")
    assert none.returncode == 2 and "one of the arguments --topic" in none.stderr
    two = acls(zk_connect, "add", "-p", "alice", "-o", "produce", "--topic", "a", "--group", "b")
    assert two.returncode == 2 and "not allowed with argument" in two.stderr


def test_with_credentials_the_node_is_the_clusters_alone(zk_connect):
    done = acls(zk_connect, "add", "-p", "alice", "-o", "consume", "--topic", "t")
    assert done.returncode == 0, done.stderr
    assert stored(zk_connect) == {AclEntry("alice", "consume", "topic", "literal", "t")}
    without = {CREDENTIALS_VARIABLE: ""}
    refused = acls(zk_connect, "list", env=without)
    assert refused.returncode == 1
    assert "ZooKeeper refused reading /hpbroker/acls without credentials" in refused.stderr
    refused = acls(zk_connect, "add", "-p", "mallory", "-o", "admin", "--cluster", env=without)
    assert refused.returncode == 1 and "--zookeeper-credentials-file" in refused.stderr


@pytest.mark.parametrize("command", ["add", "remove"])
def test_changes_without_the_clusters_credentials_are_refused_and_nothing_is_written(zk_connect, command):
    done = acls(zk_connect, command, "-p", "alice", "-o", "produce", "--topic", "orders",
                env={CREDENTIALS_VARIABLE: ""})
    assert done.returncode == 1
    assert done.stderr.startswith(f"hpbroker acls {command}: invalid configuration: ")
    assert "--zookeeper-credentials-file" in done.stderr and CREDENTIALS_VARIABLE in done.stderr
    with connect(zk_connect, session_timeout_s=5.0) as zk:
        assert zk.client.exists("/hpbroker/acls") is None  # no node open to the world


def test_the_first_add_creates_a_node_nobody_else_may_write(zk_connect):
    done = acls(zk_connect, "add", "-p", "alice", "-o", "produce", "--topic", "orders")
    assert done.returncode == 0, done.stderr
    with connect(zk_connect, session_timeout_s=5.0, credentials=CLUSTER) as zk:
        assert not world_writable(zk.client.get_acls("/hpbroker/acls")[0])
