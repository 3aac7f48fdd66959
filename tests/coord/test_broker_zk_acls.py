"""A real ``hpbroker serve`` with ``zookeeper_credentials_file``: every node it creates (its
registration, topics, partition states, the controller's nodes, producer-id blocks, the token key,
the chroot) carries the cluster ACL; a process without the credentials writes none of them."""

from __future__ import annotations

import pytest
from harness import Client, credentials_file, protected_znodes, start_broker, wait_until
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from hpbroker import protocol
from hpbroker.coord.partition_state import read_state
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.session import Session
from hpbroker.coord.zk_security import ZkCredentials, cluster_acl

pytestmark = pytest.mark.zookeeper

PATHS = ZkPaths()
CLUSTER = ZkCredentials("hpbroker", "cluster-password")


def test_a_broker_with_credentials_protects_every_node_it_creates(tmp_path, zookeeper, chroot, zk_connect):
    credentials = credentials_file(tmp_path, f"{CLUSTER.user}:{CLUSTER.password}")
    (tmp_path / "broker.toml").write_text(
        f'[broker]\nzookeeper = "{zk_connect}"\nzookeeper_session_timeout_ms = 4000\n'
        f'zookeeper_credentials_file = "{credentials}"\n')
    broker, port = start_broker(tmp_path / "data", tmp_path / "broker.log", config=tmp_path / "broker.toml")
    client = Client(port)
    admin = plain = None
    try:
        header, _ = client.request(protocol.CreateTopicRequest("orders", 2, [], replication_factor=1))
        assert header.error_code == 0, header
        header, _ = client.request(protocol.CreateTopicRequest("logs", 1))
        assert header.error_code == 0, header
        header, _ = client.request(protocol.InitProducerIdRequest())
        assert header.error_code == 0, header
        admin = Session(zk_connect, session_timeout_s=5.0, credentials=CLUSTER).start()
        wait_until(lambda: all(read_state(admin, PATHS, "orders", p) for p in (0, 1)), 20,
                   what="the partition states")
        wait_until(lambda: admin.client.exists(PATHS.topic("logs")), 20, what="the topic node of logs")
        nodes = protected_znodes(admin.client)
        for expected in (PATHS.broker(0), PATHS.topic("orders"), PATHS.partition_state("orders", 1),
                         PATHS.controller, PATHS.controller_epoch, PATHS.producer_id_block):
            assert expected in nodes, list(nodes)
        for path, acl in nodes.items():
            if path not in (PATHS.token_key, PATHS.acls):
                assert sorted(acl) == sorted(cluster_acl(CLUSTER)), path
        outside = KazooClient(zookeeper.connect_string, auth_data=[CLUSTER.auth_data])
        outside.start(timeout=10)
        try:
            assert sorted(outside.get_acls(chroot)[0]) == sorted(cluster_acl(CLUSTER))
        finally:
            outside.stop()
            outside.close()

        plain = KazooClient(zk_connect)
        plain.start(timeout=10)
        assert plain.get(PATHS.topic("orders"))[0]  # anyone reads
        for attempt in (lambda: plain.set(PATHS.topic("orders"), b"{}"),
                        lambda: plain.delete(PATHS.topic("logs")),
                        lambda: plain.set(PATHS.partition_state("orders", 0), b"{}"),
                        lambda: plain.delete(PATHS.broker(0)),
                        lambda: plain.create(PATHS.broker(5), b"{}", ephemeral=True),
                        lambda: plain.set(PATHS.producer_id_block, b"{}")):
            with pytest.raises(NoAuthError):
                attempt()
    finally:
        for zk_client in (plain,):
            if zk_client is not None:
                zk_client.stop()
                zk_client.close()
        if admin is not None:
            admin.close()
        client.close()
        status = broker.stop()
    assert status == 0, broker.log()
