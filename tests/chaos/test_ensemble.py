"""The chaos suite's ZooKeeper ensemble: three servers in namespaces of their own form a quorum,
keep serving with two after one is killed -9, take the killed one back, and leave no process
behind."""

from __future__ import annotations

import uuid

import pytest
from chaos_probe import can_connect

from chaos import netns
from chaos.zookeeper import Ensemble
from hpbroker.coord.server import find_java, zookeeper_classpath
from hpbroker.errors import CoordinationError

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]


def _refusal() -> str | None:
    reason = netns.unavailable()
    if reason is not None:
        return f"network namespaces cannot be used here: {reason}"
    try:
        find_java()
        zookeeper_classpath()
    except CoordinationError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory):
    reason = _refusal()
    if reason is not None:
        pytest.skip(reason)
    with netns.Network() as network, Ensemble(network, tmp_path_factory.mktemp("ensemble")) as made:
        made.start(timeout_s=120)
        yield made


def _write_and_read(connect: str) -> bytes:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=connect, timeout=10.0)
    client.start(timeout=30)
    try:
        path = f"/chaos-test-{uuid.uuid4().hex[:8]}"
        client.create(path, b"value")
        value, _ = client.get(path)
        client.delete(path)
        return value
    finally:
        client.stop()
        client.close()


def test_three_servers_in_their_namespaces_form_one_quorum(ensemble):
    hosts = [ensemble.hosts[i] for i in (1, 2, 3)]
    assert [h.name for h in hosts] == ["zk1", "zk2", "zk3"]
    assert ensemble.connect_string == ",".join(f"{h.address}:2181" for h in hosts)
    assert ensemble.alive() == [1, 2, 3]
    modes = sorted(ensemble.mode(i) for i in (1, 2, 3))
    assert modes == ["follower", "follower", "leader"]
    assert (ensemble.server_dir(2) / "data" / "myid").read_text().strip() == "2"
    assert "server.3=" + hosts[2].address + ":2888:3888" in (ensemble.server_dir(1) / "zoo.cfg").read_text()
    # Each server listens on its own address only: not on the others', not on loopback of the root.
    assert can_connect(None, hosts[0].address, 2181)
    assert not can_connect(hosts[0], "127.0.0.1", 2181, timeout_s=1.0)
    assert _write_and_read(ensemble.connect_string) == b"value"


def test_the_ensemble_serves_with_two_after_its_leader_is_killed_and_takes_it_back(ensemble):
    leader = next(i for i in (1, 2, 3) if ensemble.mode(i) == "leader")
    pid = ensemble.pid(leader)
    ensemble.kill(leader)
    assert ensemble.alive() == sorted({1, 2, 3} - {leader})
    assert ensemble.mode(leader) is None
    ensemble.wait_quorum(timeout_s=120)  # a new leader among the two
    assert _write_and_read(ensemble.connect_string) == b"value"
    ensemble.restart(leader, timeout_s=120)
    assert ensemble.pid(leader) != pid and ensemble.alive() == [1, 2, 3]
    assert ensemble.mode(leader) in ("leader", "follower")
    assert _write_and_read(ensemble.connect_string) == b"value"


def test_close_kills_every_server_by_pid(tmp_path):
    reason = _refusal()
    if reason is not None:
        pytest.skip(reason)
    import os

    with netns.Network() as network:
        made = Ensemble(network, tmp_path, size=3)
        made.start(timeout_s=120)
        pids = [made.pid(i) for i in (1, 2, 3)]
        made.close()
        for pid in pids:
            assert not os.path.exists(f"/proc/{pid}"), f"ZooKeeper pid {pid} still there"
        assert made.alive() == []
