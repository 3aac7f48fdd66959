"""The cluster's ZooKeeper credentials file, and the CLI tools that write ZooKeeper with it
(``--zookeeper-credentials-file`` / ``HPBROKER_ZOOKEEPER_CREDENTIALS_FILE``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hpbroker.coord.groups import ConsumerRegistration, GroupRegistry
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.session import Session
from hpbroker.coord.zk_security import (
    ZkCredentials,
    get_or_create_token_key,
    group_acl,
    issue_group_credentials,
    load_credentials,
    member_acl,
    world_writable,
)
from hpbroker.errors import InvalidConfigError

PATHS = ZkPaths()
CLUSTER = ZkCredentials("hpbroker", "cluster-password")


def test_load_credentials_reads_one_line_user_colon_password(tmp_path):
    path = tmp_path / "zk.credentials"
    path.write_text("hpbroker:pa:ss word\n")
    path.chmod(0o600)
    assert load_credentials(path) == ZkCredentials("hpbroker", "pa:ss word")


@pytest.mark.parametrize("content, message", [
    ("", "empty"),
    ("\n\n", "empty"),
    ("hpbroker\n", "no ':'"),
    (":password\n", "must be non-empty"),
    ("hpbroker:\n", "password must be non-empty"),
    ("a b:password\n", "without ':' or spaces"),
    ("one:x\ntwo:y\n", "2 lines"),
    ("x" * 5000, "larger than"),
])
def test_load_credentials_says_what_is_wrong_with_the_file(tmp_path, content, message):
    path = tmp_path / "zk.credentials"
    path.write_text(content)
    with pytest.raises(InvalidConfigError, match=message) as raised:
        load_credentials(path)
    assert str(path) in str(raised.value)


def test_load_credentials_of_a_missing_or_binary_file(tmp_path):
    with pytest.raises(InvalidConfigError, match="no such file"):
        load_credentials(tmp_path / "missing")
    (tmp_path / "binary").write_bytes(b"\xff\xfe:\x00")
    with pytest.raises(InvalidConfigError, match="not UTF-8"):
        load_credentials(tmp_path / "binary")


def test_a_credentials_file_others_may_read_is_warned_about(tmp_path, caplog):
    path = tmp_path / "zk.credentials"
    path.write_text("hpbroker:secret\n")
    path.chmod(0o644)
    with caplog.at_level("WARNING"):
        load_credentials(path)
    assert "readable by others" in caplog.text and "secret" not in caplog.text


def test_a_short_password_is_warned_about_without_showing_it(tmp_path, caplog):
    path = tmp_path / "zk.credentials"
    path.write_text("hpbroker:short-Pa55word1\n")  # 15 characters
    path.chmod(0o600)
    with caplog.at_level("WARNING", logger="hpbroker.coord.zk_security"):
        load_credentials(path)
    assert "15 characters, fewer than 20" in caplog.text and "openssl rand -base64 32" in caplog.text
    assert "short-Pa55word1" not in caplog.text
    caplog.clear()
    path.write_text("hpbroker:" + "x" * 20 + "\n")
    with caplog.at_level("WARNING", logger="hpbroker.coord.zk_security"):
        load_credentials(path)
    assert caplog.text == ""


@pytest.mark.zookeeper
def test_zookeeper_shows_the_clusters_digest_hash_only_to_a_session_with_admin(sessions):
    """What docs/SECURITY.md says of the digest id (sha1 of user:password): this ZooKeeper (3.6
    and later) answers getACL with ``user:x`` to a session without ADMIN on the node; older ones
    show the hash to anyone who may read the node."""
    from hpbroker.coord.zk_security import cluster_acl

    cluster = sessions(credentials=CLUSTER)
    cluster.client.create("/registered", b"", acl=cluster_acl(CLUSTER))
    ids = lambda session: [(e.id.scheme, e.id.id) for e in session.client.get_acls("/registered")[0]]  # noqa: E731
    assert ("digest", CLUSTER.id) in ids(cluster)
    assert ("digest", f"{CLUSTER.user}:x") in ids(sessions())  # no credentials: the hash withheld


@pytest.mark.zookeeper
def test_groups_reset_offsets_needs_the_clusters_credentials_and_keeps_the_group_writable(
        zk_connect, tmp_path):
    broker = Session(zk_connect, session_timeout_s=5.0, credentials=CLUSTER).start()
    member_session = None
    try:
        key = get_or_create_token_key(broker, PATHS)
        issued = issue_group_credentials(broker, PATHS, key, "app", CLUSTER)
        reset = ["groups", "reset-offsets", "app", "--topic", "orders", "--partition", "0",
                 "--to-offset", "5", "--execute", "--zookeeper", zk_connect, "--bootstrap", "127.0.0.1:1"]
        environment = {k: v for k, v in os.environ.items() if k != "HPBROKER_ZOOKEEPER_CREDENTIALS_FILE"}
        refused = subprocess.run([sys.executable, "-m", "hpbroker.cli", *reset], capture_output=True,
                                 text=True, timeout=60, env=environment)
        assert refused.returncode != 0
        assert "ZooKeeper refused" in refused.stderr, refused.stderr
        assert "without credentials" in refused.stderr, refused.stderr

        credentials_file = tmp_path / "zk.credentials"
        credentials_file.write_text(f"{CLUSTER.user}:{CLUSTER.password}\n")
        credentials_file.chmod(0o600)
        with_file = {**environment, "HPBROKER_ZOOKEEPER_CREDENTIALS_FILE": str(credentials_file)}
        written = subprocess.run([sys.executable, "-m", "hpbroker.cli", *reset], capture_output=True,
                                 text=True, timeout=60, env=with_file)
        assert written.returncode == 0, written.stderr
        for path in (PATHS.group_offsets("app"), PATHS.offsets("app", "orders"),
                     PATHS.offset("app", "orders", 0)):
            acl = broker.client.get_acls(path)[0]
            assert sorted(acl) == sorted(group_acl(key, "app", CLUSTER)) and not world_writable(acl), path

        # a member then commits under the nodes the tool made
        member_session = Session(zk_connect, session_timeout_s=5.0, auth=[issued.credentials],
                                 acl=member_acl(issued.acl_ids)).start()
        member = GroupRegistry(member_session, "app", PATHS, timeout_s=10)
        member.register(ConsumerRegistration("m1", ("orders",)))
        assert member.committed("orders", 0) == 5
        assert member.claim("orders", 0, "m1") and member.commit({("orders", 0): 9}, "m1") == set()

        bad = subprocess.run([sys.executable, "-m", "hpbroker.cli", *reset, "--zookeeper-credentials-file",
                              str(tmp_path / "missing")], capture_output=True, text=True, timeout=60,
                             env=environment)
        assert bad.returncode != 0 and "no such file" in bad.stderr, bad.stderr
    finally:
        if member_session is not None:
            member_session.close()
        broker.close()
