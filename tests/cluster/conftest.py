"""A replicated cluster for the tests: several real brokers on loopback, each with its own data
directory and ports, all registered in one real ZooKeeper (a chroot per test)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from harness import BrokerProcess, Client, free_ports, start_broker, wait_until
from kazoo.client import KazooClient

from hpbroker import protocol


class Cluster:
    """Brokers 0..n-1 started with :meth:`start`; each keeps its port and data directory across
    restarts."""

    def __init__(self, tmp_path: Path, connect: str, settings: dict[str, object]) -> None:
        self.tmp_path = tmp_path
        self.connect = connect
        self.settings = settings
        self.processes: dict[int, BrokerProcess] = {}
        self.ports: dict[int, int] = {}
        self._clients: dict[int, Client] = {}
        self._starts = 0

    def start(self, broker_id: int, *, workers: int = 2) -> BrokerProcess:
        config = self.tmp_path / f"broker-{broker_id}.toml"
        lines = [f"broker_id = {broker_id}", f'zookeeper = "{self.connect}"']
        lines += [f"{key} = {str(value).lower() if isinstance(value, bool) else value}"
                  for key, value in self.settings.items()]
        config.write_text("[broker]\n" + "\n".join(lines) + "\n")
        if broker_id not in self.ports:
            self.ports[broker_id] = free_ports(workers + 1)
        self._starts += 1
        process, _ = start_broker(self.tmp_path / f"data-{broker_id}",
                                  self.tmp_path / f"broker-{broker_id}-{self._starts}.log",
                                  workers=workers, port=self.ports[broker_id], config=config)
        self.processes[broker_id] = process
        return process

    def kill(self, broker_id: int, signum: int = signal.SIGKILL) -> None:
        """Kill the broker's arbiter and its workers at once (a machine gone)."""
        process = self.processes.pop(broker_id)
        for pid in process.worker_pids().values():
            try:
                import os

                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        process.process.send_signal(signum)
        process.wait_exit(20)
        process.stop()
        client = self._clients.pop(broker_id, None)
        if client is not None:
            client.close()

    def stop(self, broker_id: int) -> int | None:
        client = self._clients.pop(broker_id, None)
        if client is not None:
            client.close()
        return self.processes.pop(broker_id).stop()

    def client(self, broker_id: int) -> Client:
        if broker_id not in self._clients:
            self._clients[broker_id] = Client(self.ports[broker_id])
        return self._clients[broker_id]

    def bootstrap(self, *broker_ids: int) -> str:
        ids = broker_ids or tuple(sorted(self.processes))
        return ",".join(f"127.0.0.1:{self.ports[b]}" for b in ids)

    def metadata(self, broker_id: int, topic: str) -> protocol.TopicMetadata:
        header, response = self.client(broker_id).request(protocol.MetadataRequest([topic]))
        assert header.error_code == 0
        return response.topics[0]

    def wait_for_leaders(self, topic: str, partitions: int, *, via: int, timeout_s: float = 30.0,
                         isr_size: int | None = None) -> protocol.TopicMetadata:
        def ready():
            metadata = self.metadata(via, topic)
            if metadata.error_code or len(metadata.partitions) != partitions:
                return None
            if all(p.error_code == 0 and p.leader >= 0 and (isr_size is None or len(p.isr) == isr_size)
                   for p in metadata.partitions):
                return metadata
            return None
        return wait_until(ready, timeout_s, interval_s=0.1, what=f"leaders of every partition of {topic}")

    def create_topic(self, topic: str, partitions: int, replication_factor: int, *, via: int,
                     configs: dict[str, str] | None = None) -> None:
        """Create a replicated topic through broker ``via`` (answered once every partition has a leader)."""
        entries = [protocol.TopicConfigEntry(k, v) for k, v in (configs or {}).items()]
        header, _ = self.client(via).request(protocol.CreateTopicRequest(
            topic, partitions, entries, replication_factor=replication_factor), timeout_s=40)
        assert header.error_code == 0, header.error_message

    def controller(self) -> int | None:
        """The broker id of the active controller, read from ZooKeeper (None when there is none)."""
        from hpbroker.coord.controller import read_controller
        from hpbroker.coord.paths import ZkPaths

        zk = KazooClient(self.connect)
        zk.start(timeout=10)
        try:
            found = read_controller(zk, ZkPaths())
        finally:
            zk.stop()
            zk.close()
        return None if found is None else found[0]

    def partition_dir(self, broker_id: int, topic: str, partition: int) -> Path:
        return self.tmp_path / f"data-{broker_id}" / f"{topic}-{partition}"

    def segment_bytes(self, broker_id: int, topic: str, partition: int) -> bytes:
        """The partition's segment files (``*.log``) on the broker, concatenated in offset order."""
        directory = self.partition_dir(broker_id, topic, partition)
        return b"".join(path.read_bytes() for path in sorted(directory.glob("*.log")))

    def epoch_checkpoint(self, broker_id: int, topic: str, partition: int) -> str:
        """The text of the partition's ``leader-epoch-checkpoint`` file on the broker ("" when absent)."""
        path = self.partition_dir(broker_id, topic, partition) / "leader-epoch-checkpoint"
        return path.read_text() if path.exists() else ""

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        failures = []
        for broker_id, process in list(self.processes.items()):
            code = process.stop()
            if code != 0:
                failures.append(f"broker {broker_id} exited {code}:\n{process.log()[-3000:]}")
        self.processes.clear()
        assert not failures, "\n".join(failures)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        item.cluster_test_failed = True


def _show_broker_logs(tmp_path: Path) -> None:
    """After a failure: each broker log's warnings and errors, in the test's report (teardown output)."""
    for log in sorted(tmp_path.glob("broker-*.log")):
        lines = [line for line in log.read_text(errors="replace").splitlines()
                 if " WARNING " in line or " ERROR " in line]
        print(f"--- {log.name}: {len(lines)} warnings and errors, the last 40:")
        print("\n".join(lines[-40:]))


@pytest.fixture
def cluster(request, tmp_path, zookeeper, chroot):
    """A :class:`Cluster` (no broker started yet); every broker is stopped at the end and must exit 0."""
    made = Cluster(tmp_path, zookeeper.connect_string + chroot,
                   {"zookeeper_session_timeout_ms": 4000, "replica_lag_time_max_ms": 3000})
    try:
        yield made
    finally:
        if getattr(request.node, "cluster_test_failed", False):
            _show_broker_logs(tmp_path)
        made.close()
