"""The local stack (``hpbroker up``) as a real process tree: a managed ZooKeeper and a broker,
both answering, both gone after SIGTERM; and the managed server on its own."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys

import pytest
from harness import BrokerProcess, Client, free_ports, pid_alive, wait_until

from hpbroker import protocol
from hpbroker.coord.registry import BrokerRegistry, TopicRegistration, TopicRegistry
from hpbroker.coord.server import ZooKeeperServer
from hpbroker.coord.session import connect

pytestmark = pytest.mark.zookeeper

_UP = re.compile(r"zookeeper  (?P<zk>\S+) \((?:pid (?P<zk_pid>\d+)|external).*\n"
                 r"  broker (?P<id>\d+) +tcp://127\.0\.0\.1:(?P<port>\d+) .*\(pid (?P<broker_pid>\d+);")


def start_stack(tmp_path, *args: str, env: dict[str, str] | None = None) -> tuple[BrokerProcess, re.Match]:
    port = free_ports(3)
    argv = [sys.executable, "-m", "hpbroker.stack", "--data-dir", str(tmp_path / "stack"),
            "--port", str(port), "--fetch-port", str(port + 1), "--workers", "2", "--host", "127.0.0.1",
            *args]
    env = {"HPBROKER_HEARTBEAT_INTERVAL_MS": "50", "HPBROKER_GRACEFUL_TIMEOUT_MS": "5000", **(env or {})}
    stack = BrokerProcess(argv, tmp_path / "stack.log", env)
    stack.wait_for_log(r"Ctrl-C or SIGTERM stops both", timeout_s=40)
    up = _UP.search(stack.log())
    assert up is not None and int(up["port"]) == port, stack.log()
    return stack, up


def metadata_answers(port: int) -> bool:
    client = Client(port)
    try:
        header, response = client.request(protocol.MetadataRequest([]))
        return header.error_code == 0 and response.brokers[0].port == port
    finally:
        client.close()


def environment(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(entry.decode().partition("=")[::2] for entry in f.read().split(b"\0") if entry)


def test_stack_runs_zookeeper_and_a_registered_broker_until_sigterm(tmp_path):
    # As a service manager would start it: the variables are the stack's, not its children's.
    manager = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "30000000"}
    stack, up = start_stack(tmp_path, "--zookeeper-port", "0", env=manager)
    zk_pid, broker_pid, port = int(up["zk_pid"]), int(up["broker_pid"]), int(up["port"])
    try:
        assert set(manager) <= set(environment(stack.process.pid))
        for child in (zk_pid, broker_pid):
            assert not set(manager) & set(environment(child)), child
        with connect(up["zk"]) as session:
            assert session.client.server_version()[:2] >= (3, 5)
            assert BrokerRegistry(session).get(0).port == port
            assert metadata_answers(port)
        stack.process.send_signal(signal.SIGTERM)
        assert stack.wait_exit(30) == 0, stack.log()
    finally:
        stack.stop()
    assert not pid_alive(zk_pid) and not pid_alive(broker_pid)
    log = stack.log()
    assert log.index("[arbiter] stopped") < log.index("stopped (exit status")  # the broker, then ZooKeeper
    assert (tmp_path / "stack" / "zookeeper" / "zookeeper.log").is_file()
    assert (tmp_path / "stack" / "broker").is_dir()


def test_stack_joins_an_existing_ensemble(tmp_path, zk_connect, zk):
    stack, up = start_stack(tmp_path, "--zookeeper", zk_connect)
    try:
        assert up["zk"] == zk_connect and up["zk_pid"] is None
        assert BrokerRegistry(zk).get(0).port == int(up["port"])
        stack.process.send_signal(signal.SIGINT)  # as Ctrl-C would
        assert stack.wait_exit(30) == 0, stack.log()
    finally:
        stack.stop()
    assert not pid_alive(int(up["broker_pid"]))
    assert BrokerRegistry(zk).ids() == []


def test_stack_refuses_an_invalid_setting_before_starting_anything(tmp_path):
    result = subprocess.run([sys.executable, "-m", "hpbroker.stack", "--data-dir", str(tmp_path),
                             "--zookeeper", "zk1:port"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "invalid configuration" in result.stderr
    assert not (tmp_path / "zookeeper").exists()


def test_managed_server_keeps_its_data_across_a_restart_and_frees_its_port(tmp_path):
    server = ZooKeeperServer(tmp_path / "zk").start()
    try:
        with connect(server.connect_string) as session:
            TopicRegistry(session).publish(TopicRegistration("orders", 2, {}, created_by=0))
    finally:
        server.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
    again = ZooKeeperServer(tmp_path / "zk", port=server.port)
    with again, connect(again.connect_string) as session:
        assert TopicRegistry(session).names() == ["orders"]
    wait_until(lambda: again.process is None, 1)
