"""The local stack (``hpbroker up``) as a real process tree: a managed ZooKeeper and a broker,
both answering, both gone after SIGTERM; a managed ZooKeeper killed and started again while the
broker keeps serving; and the managed server on its own."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from harness import BrokerProcess, Client, free_ports, pid_alive, wait_until

from hpbroker import Consumer, TopicPartition, protocol
from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.coord.registry import BrokerRegistry, TopicRegistration, TopicRegistry
from hpbroker.coord.server import ZooKeeperServer
from hpbroker.coord.session import connect
from hpbroker.records import build_batch

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


class PortHolder:
    """Holds a loopback port with a listening socket that closes every connection at once, so a
    server started on it fails to bind (its clients see the connection dropped)."""

    def __init__(self, port: int, timeout_s: float = 10.0) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT, not a listener
        wait_until(lambda: self._bind(port), timeout_s, what=f"port {port} free")
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._refuse, daemon=True)
        self._thread.start()

    def _bind(self, port: int) -> bool:
        try:
            self.sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False

    def _refuse(self) -> None:
        while not self._closed.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                self.sock.accept()[0].close()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        self.sock.close()


def produce(connection: BrokerConnection, topic: str, values: list[bytes]) -> int:
    return connection.call(protocol.ProduceRequest(topic, 0, payload=build_batch(values))).base_offset


def fetch_all(bootstrap: str, topic: str, count: int) -> list[bytes]:
    """The first ``count`` values of partition 0, through the data port (fails after 20 s)."""
    values: list[bytes] = []
    deadline = time.monotonic() + 20
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=200) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        while len(values) < count:
            assert time.monotonic() < deadline, f"fetched {len(values)} of {count} records"
            for records in consumer.poll(timeout_ms=500).values():
                values.extend(record.value for record in records)
    return values


def test_broker_keeps_serving_while_the_stack_starts_its_killed_zookeeper_again(tmp_path):
    stack, up = start_stack(tmp_path, "--zookeeper-port", "0")
    zk_pid, broker_pid, port = int(up["zk_pid"]), int(up["broker_pid"]), int(up["port"])
    zk_port = int(up["zk"].rpartition(":")[2])
    bootstrap = f"127.0.0.1:{port}"
    connection = BrokerConnection(BrokerAddress("127.0.0.1", port))
    holder = None
    try:
        connection.call(protocol.CreateTopicRequest("orders", 1))
        expected = [f"before-{i}".encode() for i in range(10)]
        assert produce(connection, "orders", expected) == 0

        os.kill(zk_pid, signal.SIGKILL)
        # Keep ZooKeeper down for as long as the checks below take: its next start cannot bind.
        holder = PortHolder(zk_port)
        stack.wait_for_log(r"ZooKeeper pid \d+ on \S+ exited by itself \(killed by SIGKILL\)", timeout_s=10)
        stack.wait_for_log(r"ZooKeeper attempt 1 to start again failed", timeout_s=60)
        for round_ in range(5):  # produce and fetch while no ZooKeeper serves
            batch = [f"down-{round_}-{i}".encode() for i in range(10)]
            assert produce(connection, "orders", batch) == len(expected)
            expected += batch
            assert fetch_all(bootstrap, "orders", len(expected)) == expected
        assert metadata_answers(port)
        connection.call(protocol.CreateTopicRequest("created-while-down", 1))  # published later
        assert produce(connection, "created-while-down", [b"x"]) == 0
        assert stack.process.poll() is None and pid_alive(broker_pid)
        holder.close()
        holder = None

        stack.wait_for_log(rf"ZooKeeper serves again on 127\.0\.0\.1:{zk_port}, pid \d+", timeout_s=90)
        stack.wait_for_log(r"broker 0 is registered in ZooKeeper again", timeout_s=30)
        new_pid = int(re.search(r"ZooKeeper serves again on \S+, pid (\d+)", stack.log())[1])
        assert new_pid != zk_pid and pid_alive(new_pid)
        with connect(up["zk"]) as session:
            assert BrokerRegistry(session).get(0).port == port
            # The same data (the topic is still there), and the topic created meanwhile published.
            wait_until(lambda: TopicRegistry(session).names() == ["created-while-down", "orders"], 30)
        batch = [f"after-{i}".encode() for i in range(10)]
        assert produce(connection, "orders", batch) == len(expected)
        assert fetch_all(bootstrap, "orders", len(expected) + 10) == expected + batch
        assert pid_alive(broker_pid)

        stack.process.send_signal(signal.SIGTERM)
        assert stack.wait_exit(30) == 0, stack.log()
        assert not pid_alive(new_pid) and not pid_alive(broker_pid)
    finally:
        if holder is not None:
            holder.close()
        connection.close()
        stack.stop()


def test_the_announcement_ends_with_commands_that_work_as_pasted(tmp_path):
    metrics_port = free_ports(1)
    stack, up = start_stack(tmp_path, "--metrics-port", str(metrics_port))
    try:
        announcement = stack.log()[up.start():]
        tail = announcement[announcement.index("Try, in another terminal:\n"):].splitlines()[1:]
        commands = [line.strip() for line in tail if line.startswith("  ")]
        assert len(commands) == 5, announcement
        bootstrap = f"--bootstrap 127.0.0.1:{up['port']}"
        assert all(bootstrap in command for command in commands[:4]), commands
        outputs = []
        for command in commands:  # pasted into a shell, in the directory the stack was started from
            result = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True,
                                    timeout=120)
            assert result.returncode == 0, (command, result.stdout, result.stderr)
            outputs.append(result.stdout.decode())
        assert sorted(line.partition(" key=")[2] for line in outputs[2].splitlines()) == \
            ["alice hello", "bob world"]
        assert f"http://127.0.0.1:{metrics_port}/metrics" in commands[4]
        assert "hpbroker_produced_records_total" in outputs[4]
    finally:
        stack.stop()
