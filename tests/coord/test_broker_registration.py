"""A real ``hpbroker serve`` configured with ZooKeeper: it registers itself, keeps its registration
and the topic registry in step with its topics, and leaves when it stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from harness import Client, free_ports, pid_alive, start_broker, wait_until

from hpbroker import protocol
from hpbroker.broker.config import BrokerConfig
from hpbroker.coord.registry import BrokerRegistry, TopicRegistration, TopicRegistry
from hpbroker.errors import InvalidConfigError

pytestmark = pytest.mark.zookeeper


def write_config(path, connect: str, **settings) -> None:
    settings = {"zookeeper": f'"{connect}"', "zookeeper_session_timeout_ms": 4000, **settings}
    path.write_text("[broker]\n" + "".join(f"{key} = {value}\n" for key, value in settings.items()))


def test_broker_registers_and_publishes_topic_changes(tmp_path, zk_connect, zk):
    write_config(tmp_path / "broker.toml", zk_connect, broker_id=3)
    broker, port = start_broker(tmp_path / "data", tmp_path / "broker.log", config=tmp_path / "broker.toml")
    client = Client(port)
    try:
        brokers, topics = BrokerRegistry(zk), TopicRegistry(zk)
        registration = wait_until(lambda: brokers.get(3), 10, what="the broker's registration")
        assert (registration.host, registration.port, registration.data_ports) == \
            ("127.0.0.1", port, (port + 1, port + 2))
        assert registration.topics == {}

        header, _ = client.request(protocol.CreateTopicRequest(
            "orders", 3, [protocol.TopicConfigEntry("retention_ms", "60000")]))
        assert header.error_code == 0
        wait_until(lambda: brokers.get(3).topics == {"orders": (0, 1, 2)}, 10, what="orders registered")
        assert topics.get("orders") == TopicRegistration("orders", 3, {"retention_ms": 60000}, created_by=3)

        header, _ = client.request(protocol.DeleteTopicRequest("orders"))
        assert header.error_code == 0
        wait_until(lambda: brokers.get(3).topics == {} and topics.names() == [], 10, what="orders gone")
    finally:
        client.close()
        status = broker.stop()
    assert status == 0, broker.log()
    assert BrokerRegistry(zk).ids() == []  # the session closed with the broker
    assert "[zookeeper] registered broker 3" in broker.log()


def test_broker_restarted_after_kill_takes_over_its_stale_registration(tmp_path, zk_connect, zk):
    write_config(tmp_path / "broker.toml", zk_connect)
    first, port = start_broker(tmp_path / "data", tmp_path / "first.log", config=tmp_path / "broker.toml")
    old_owner = wait_until(lambda: zk.client.exists("/hpbroker/brokers/ids/0"), 10).ephemeralOwner
    first.process.kill()  # its session lives on in ZooKeeper for the session timeout
    first.wait_exit()
    first.stop()
    pids = first.worker_pids().values()
    wait_until(lambda: not any(pid_alive(pid) for pid in pids), 10, what="the orphaned workers to exit")
    second, _ = start_broker(tmp_path / "data", tmp_path / "second.log", port=port,
                             config=tmp_path / "broker.toml")
    try:
        assert zk.client.exists("/hpbroker/brokers/ids/0").ephemeralOwner not in (0, old_owner)
    finally:
        assert second.stop() == 0, second.log()


def test_worker_respawned_beside_the_zookeeper_client_serves_and_registration_stays(tmp_path, zk_connect, zk):
    write_config(tmp_path / "broker.toml", zk_connect)
    broker, port = start_broker(tmp_path / "data", tmp_path / "broker.log", config=tmp_path / "broker.toml")
    client = Client(port)
    try:
        assert client.request(protocol.CreateTopicRequest("orders", 2))[0].error_code == 0
        wait_until(lambda: BrokerRegistry(zk).get(0).topics == {"orders": (0, 1)}, 10, what="registered")
        session_owner = zk.client.exists("/hpbroker/brokers/ids/0").ephemeralOwner
        os.kill(broker.worker_pids()[0], signal.SIGKILL)  # forked again while kazoo's threads run
        broker.wait_for_log(r"worker slot=0 pid=\d+ serving", count=2)
        header, metadata = client.request(protocol.MetadataRequest(["orders"]))
        assert [p.error_code for p in metadata.topics[0].partitions] == [0, 0]
        assert zk.client.exists("/hpbroker/brokers/ids/0").ephemeralOwner == session_owner
        assert client.request(protocol.DeleteTopicRequest("orders"))[0].error_code == 0
        wait_until(lambda: BrokerRegistry(zk).get(0).topics == {}, 10, what="orders unregistered")
    finally:
        client.close()
        status = broker.stop()
    assert status == 0, broker.log()


def test_broker_that_cannot_reach_zookeeper_does_not_start(tmp_path):
    closed = free_ports(1)
    write_config(tmp_path / "broker.toml", f"127.0.0.1:{closed}", zookeeper_session_timeout_ms=1000)
    port = free_ports(3)
    result = subprocess.run(
        [sys.executable, "-m", "hpbroker.cli", "serve", "--port", str(port), "--fetch-port", str(port + 1),
         "--workers", "2", "--data-dir", str(tmp_path / "data"), "--config", str(tmp_path / "broker.toml")],
        capture_output=True, text=True, timeout=30)
    assert result.returncode == 1, result.stderr
    assert f"cannot join ZooKeeper: [zookeeper] cannot reach ZooKeeper at 127.0.0.1:{closed} within 1 s" \
        in result.stderr


@pytest.mark.parametrize(("settings", "complaint"), [
    ({"zookeeper": "zk1:none"}, "zookeeper: connect string 'zk1:none'"),
    ({"zookeeper": "zk1:2181", "zookeeper_session_timeout_ms": 10}, "zookeeper_session_timeout_ms"),
])
def test_invalid_zookeeper_settings_are_config_errors(settings, complaint):
    with pytest.raises(InvalidConfigError, match=complaint):
        BrokerConfig(**settings)


def test_zookeeper_settings_come_from_the_environment():
    config = BrokerConfig.load(environ={"HPBROKER_ZOOKEEPER": "zk1:2181,zk2:2181/hpb",
                                        "HPBROKER_ZOOKEEPER_SESSION_TIMEOUT_MS": "9000"})
    assert (config.zookeeper, config.zookeeper_session_timeout_ms) == ("zk1:2181,zk2:2181/hpb", 9000)
    assert BrokerConfig().zookeeper == ""  # standalone unless configured



def test_altered_settings_reach_the_topic_registry(tmp_path, zk_connect, zk):
    write_config(tmp_path / "broker.toml", zk_connect, broker_id=4)
    broker, port = start_broker(tmp_path / "data", tmp_path / "broker.log", config=tmp_path / "broker.toml")
    client = Client(port)
    try:
        topics = TopicRegistry(zk)
        header, _ = client.request(protocol.CreateTopicRequest(
            "orders", 2, [protocol.TopicConfigEntry("retention_ms", "60000")]))
        assert header.error_code == 0
        wait_until(lambda: topics.get("orders") is not None, 10, what="orders published")
        changes = [protocol.TopicConfigEntry("retention_ms", ""), protocol.TopicConfigEntry("flush_ms", "3")]
        header, _ = client.request(protocol.AlterTopicConfigRequest("orders", changes))
        assert header.error_code == 0, header
        wanted = TopicRegistration("orders", 2, {"flush_ms": 3}, created_by=4)
        wait_until(lambda: topics.get("orders") == wanted, 10, what="the new settings published")
    finally:
        client.close()
        assert broker.stop() == 0, broker.log()
