"""``hpbroker topics create --replication-factor``, ``topics describe`` (leader, replicas, ISR as
kafka-topics prints them) and ``hpbroker cluster`` (brokers and controller from ZooKeeper), run as
a user runs them: real broker, real ZooKeeper, the command as a process."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

from kazoo.client import KazooClient

from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.registry import BrokerRegistration, encode_broker


def hpbroker(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpbroker.cli", *args], capture_output=True, text=True,
                          timeout=timeout_s)


def partition_lines(output: str, topic: str) -> list[dict[str, str]]:
    """The ``Name: value`` pairs of each partition line of ``topic``."""
    rows = []
    for line in output.splitlines():
        if line.startswith(f"\tTopic: {topic}\t"):
            rows.append(dict(field.split(": ", 1) for field in line.strip("\t").split("\t")))
    return rows


def test_describe_of_an_unreplicated_topic_shows_its_broker_as_leader_replicas_and_isr(broker, topic_name):
    _process, port = broker
    bootstrap = f"127.0.0.1:{port}"
    created = hpbroker("topics", "create", topic_name, "-p", "2", "-c", "retention_ms=3600000",
                       "--bootstrap", bootstrap)
    assert created.returncode == 0, created.stderr
    described = hpbroker("topics", "describe", topic_name, "--bootstrap", bootstrap)
    assert described.returncode == 0, described.stderr
    first = described.stdout.splitlines()[0]
    assert first == (f"Topic: {topic_name}\tPartitionCount: 2\tReplicationFactor: 1\t"
                     "Configs: retention_ms=3600000")
    rows = partition_lines(described.stdout, topic_name)
    assert [row["Partition"] for row in rows] == ["0", "1"]
    for row in rows:
        assert row["Leader"] == row["Replicas"] == row["Isr"] == "0"  # the standalone broker's id
        assert row["Status"] == "serving" and row["DataPort"].startswith("127.0.0.1:")
    every = hpbroker("topics", "describe", "--bootstrap", bootstrap)  # no name: every topic
    assert every.returncode == 0, every.stderr
    assert partition_lines(every.stdout, topic_name) == rows


def test_a_replication_factor_above_1_on_a_standalone_broker_is_refused_clearly(broker, topic_name):
    _process, port = broker
    bootstrap = f"127.0.0.1:{port}"
    refused = hpbroker("topics", "create", topic_name, "-p", "1", "--replication-factor", "2",
                       "--bootstrap", bootstrap)
    assert refused.returncode == 1
    assert "(InvalidReplicationFactorError, error 26)" in refused.stderr, refused.stderr
    assert refused.stderr.startswith("hpbroker topics: invalid replication factor: ")
    assert topic_name not in hpbroker("topics", "list", "--bootstrap", bootstrap).stdout.split()
    one = hpbroker("topics", "create", topic_name, "-p", "1", "--replication-factor", "1",
                   "--bootstrap", bootstrap)
    assert one.returncode == 0, one.stderr
    assert "replication factor 1" in one.stdout
    zero = hpbroker("topics", "create", topic_name + "z", "-p", "1", "-r", "0", "--bootstrap", bootstrap)
    assert zero.returncode == 1 and "error 26" in zero.stderr


_chroots = itertools.count()


def test_cluster_lists_the_live_brokers_and_the_controller(zookeeper):
    chroot = f"/cluster-cli-{next(_chroots)}"
    paths = ZkPaths()
    root = KazooClient(zookeeper.connect_string)
    root.start(timeout=30)
    root.ensure_path(chroot)
    root.stop()
    root.close()
    client = KazooClient(zookeeper.connect_string + chroot)
    client.start(timeout=30)
    try:
        connect = zookeeper.connect_string + chroot
        empty = hpbroker("cluster", "--zookeeper", connect)
        assert empty.returncode == 0, empty.stderr
        assert empty.stdout.splitlines()[:2] == ["controller: none", "0 live brokers"]
        for broker_id, port in ((0, 9092), (2, 9192), (1, 9292)):
            client.create(paths.broker(broker_id), encode_broker(BrokerRegistration(
                broker_id, "127.0.0.1", port, (port + 1, port + 2))), ephemeral=True, makepath=True)
        controller = {"version": 1, "broker_id": 2, "timestamp_ms": 1}
        client.create(paths.controller, json.dumps(controller).encode(), ephemeral=True)
        client.create(paths.controller_epoch, json.dumps({"version": 1, "epoch": 7}).encode())
        listed = hpbroker("cluster", "--zookeeper", connect)
    finally:
        client.stop()
        client.close()
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[:2] == ["controller: broker 2 (controller epoch 7)", "3 live brokers"]
    assert [line.split() for line in lines[3:]] == [["0", "127.0.0.1", "9092", "9093,9094"],
                                                     ["1", "127.0.0.1", "9292", "9293,9294"],
                                                     ["*", "2", "127.0.0.1", "9192", "9193,9194"]]


def test_cluster_names_an_unreachable_zookeeper():
    unreachable = hpbroker("cluster", "--zookeeper", "127.0.0.1:1", timeout_s=120)
    assert unreachable.returncode == 1
    last = unreachable.stderr.splitlines()[-1]  # kazoo logs its attempts before
    assert last.startswith("hpbroker cluster: ") and "127.0.0.1:1" in last and "CoordinationError" in last
