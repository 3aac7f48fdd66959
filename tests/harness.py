"""Real broker processes for tests: free ports, a subprocess with its log, a ZeroMQ client."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import zmq

from hpbroker import protocol

STANDIN = Path(__file__).resolve().parent / "arbiter" / "standin_broker.py"


def free_ports(count: int) -> int:
    """A port P such that P .. P + count - 1 are free on 127.0.0.1 (at the time of asking)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + count > 65535:
            continue
        sockets = []
        try:
            for port in range(first, first + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no free port range found")


def wait_until(predicate, timeout_s: float = 10.0, interval_s: float = 0.02, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still "exists": look at its state.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class BrokerProcess:
    """A broker (``argv``) running as a subprocess, its stderr in ``log_path``."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str] | None = None, *,
                 nofile: tuple[int, int] | None = None) -> None:
        """``nofile``: the (soft, hard) RLIMIT_NOFILE the broker starts with (default: ours)."""
        self.log_path = log_path
        self._log_file = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        limit = None if nofile is None else partial(resource.setrlimit, resource.RLIMIT_NOFILE, nofile)
        self.process = subprocess.Popen(argv, stdout=self._log_file, stderr=subprocess.STDOUT,
                                        env={**os.environ, **(env or {})}, preexec_fn=limit)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, pattern: str, timeout_s: float = 10.0, count: int = 1) -> list[re.Match]:
        def found():
            matches = list(re.finditer(pattern, self.log()))
            if self.process.poll() is not None and len(matches) < count:
                raise AssertionError(f"broker exited with {self.process.returncode} before logging "
                                     f"{pattern!r}:\n{self.log()}")
            return matches if len(matches) >= count else None
        return wait_until(found, timeout_s, what=f"log line {pattern!r}")

    def worker_pids(self) -> dict[int, int]:
        """slot -> pid of the latest worker forked into it, from the log."""
        return {int(m[1]): int(m[2]) for m in re.finditer(r"forked worker slot=(\d+) pid=(\d+)", self.log())}

    def wait_exit(self, timeout_s: float = 10.0) -> int:
        return self.process.wait(timeout=timeout_s)

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log_file.close()
        return self.process.returncode


BROKER_TEST_ENV = {"HPBROKER_HEARTBEAT_INTERVAL_MS": "50", "HPBROKER_WORKER_TIMEOUT_MS": "3000",
                   "HPBROKER_GRACEFUL_TIMEOUT_MS": "5000"}


BROKER_START_TIMEOUT_S = 30.0  # process start, recovery, a ZooKeeper join, on a loaded 2-core machine
PORT_ATTEMPTS = 5  # start_broker's tries with fresh ports when the ones it chose were taken meanwhile


def start_broker(data_dir: Path, log_path: Path, *, workers: int = 2, port: int | None = None,
                 env: dict[str, str] | None = None, config: Path | None = None,
                 nofile: tuple[int, int] | None = None, host: str = "127.0.0.1") -> tuple[BrokerProcess, int]:
    """A real ``hpbroker serve`` on ``host``, its front-end on ``port`` (free ports if None) and
    data ports after it, once every worker serves.  Start it again with the same ``port`` and
    ``data_dir`` to restart it.  ``nofile``: its (soft, hard) file-descriptor limit.

    Ports chosen here (``port`` None) are only free when asked: until the broker binds them, any
    process may take one (another test's listener, or the local port of any outgoing connection
    on the machine).  A broker that could not bind them is started again on fresh ports.  A
    broker that does not come up is stopped (never left running) and its log is in the error."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        chosen = free_ports(workers + 1) if port is None else port
        argv = [sys.executable, "-m", "hpbroker.cli", "serve", "--port", str(chosen), "--fetch-port",
                str(chosen + 1), "--workers", str(workers), "--data-dir", str(data_dir),
                "--host", host]
        if config is not None:
            argv += ["--config", str(config)]
        process = BrokerProcess(argv, log_path, {**BROKER_TEST_ENV, **(env or {})}, nofile=nofile)
        try:
            process.wait_for_log(rf"all {workers} workers serving", timeout_s=BROKER_START_TIMEOUT_S)
        except AssertionError as e:
            status = process.stop()
            if port is None and attempt < PORT_ATTEMPTS and "Address already in use" in process.log():
                continue  # a port it was given was taken before it bound it: fresh ones
            first_line = str(e).splitlines()[0]
            raise AssertionError(f"the broker did not start ({first_line}; exit status {status}); its log:\n"
                                 f"{process.log()}") from None
        return process, chosen
    raise AssertionError("unreachable")


@dataclass
class CurveBroker:
    """A standalone broker with ``security = "curve"`` (:func:`curve_broker`); ``keydir`` holds
    every key pair (``NAME.key_secret`` and ``NAME.key``, made by ``hpbroker.security.keys``)."""

    process: BrokerProcess
    port: int
    keydir: Path
    allowlist: Path

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextlib.contextmanager
def curve_broker(root: Path, *, allowed: Iterable[str], others: Iterable[str] = (), super_users: str = "",
                 workers: int = 2) -> Iterator[CurveBroker]:
    """A real broker with ``security = "curve"``, standalone: key pairs for ``broker``,
    ``allowed`` and ``others`` in ``root/keys``, the broker and ``allowed`` on its allowlist
    (``root/allow``), ``super_users`` (comma-separated) allowed everything.  Stopped at the end,
    asserting a clean exit."""
    keydir, allowlist = root / "keys", root / "allow"
    from hpbroker.security.keys import allow_key, generate_key_pair

    allowed = ["broker", *allowed]
    for name in (*allowed, *others):
        generate_key_pair(keydir, name)
    for name in allowed:
        allow_key(keydir / f"{name}.key", allowlist)
    env = {"HPBROKER_SECURITY": "curve", "HPBROKER_SERVER_KEY_FILE": str(keydir / "broker.key_secret"),
           "HPBROKER_ALLOWLIST_DIR": str(allowlist), "HPBROKER_SUPER_USERS": super_users}
    process, port = start_broker(root / "data", root / "broker.log", workers=workers, env=env)
    try:
        yield CurveBroker(process, port, keydir, allowlist)
    finally:
        assert process.stop() == 0, process.log()


def credentials_file(directory: Path, line: str = "hpbroker:cluster-secret") -> Path:
    """A ZooKeeper credentials file (one ``user:password`` line, mode 0600) in ``directory``."""
    path = directory / "zookeeper.credentials"
    path.write_text(line + "\n")
    path.chmod(0o600)
    return path


def znodes(client, path: str = "/") -> list[str]:
    """``path`` and every znode under it, parents first (``client``: a kazoo client)."""
    found = [path]
    for child in client.get_children(path):
        found += znodes(client, ("" if path == "/" else path) + "/" + child)
    return found


def protected_znodes(client, path: str = "/") -> dict[str, list]:
    """Every znode under ``path`` (itself included) with its ACL, having asserted that none is
    world-writable (``client`` may read every ACL: the cluster's credentials)."""
    from hpbroker.coord.zk_security import world_writable

    acls = {node: client.get_acls(node)[0] for node in znodes(client, path)}
    for node, acl in acls.items():
        assert not world_writable(acl), f"{node} is world-writable: {acl}"
    return acls


def start_standin(tmp_path: Path, *, workers: int = 2, modes: dict | None = None, timeout_ms: int = 1000,
                  **config) -> tuple[BrokerProcess, dict]:
    import json

    port = free_ports(workers + 1)
    spec_config = {"port": port, "fetch_port": port + 1, "workers": workers,
                   "data_dir": str(tmp_path / "data"), "heartbeat_interval_ms": 50,
                   "worker_timeout_ms": timeout_ms, "graceful_timeout_ms": 5000, "admin_timeout_ms": 5000,
                   **config}
    spec = {"config": spec_config, "modes": modes or {}, "marker_dir": str(tmp_path)}
    log_path = next(path for n in itertools.count() if not (path := tmp_path / f"broker-{n}.log").exists())
    broker = BrokerProcess([sys.executable, str(STANDIN), json.dumps(spec)], log_path)
    return broker, spec_config


class Client:
    """A DEALER on the broker's front-end that sends requests and matches answers by correlation id."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(f"tcp://{host}:{port}")
        self._ids = itertools.count(1)
        self._early: dict[int, list[bytes]] = {}

    def send(self, message: protocol.Message) -> int:
        correlation_id = next(self._ids)
        self.socket.send_multipart(protocol.encode_request(message, correlation_id, "test"), copy=False)
        return correlation_id

    def receive(self, api_key: int, correlation_id: int, timeout_s: float = 5.0):
        deadline = time.monotonic() + timeout_s
        while correlation_id not in self._early:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not self.socket.poll(remaining_ms):
                raise TimeoutError(f"no response to correlation id {correlation_id} in {timeout_s} s")
            frames = self.socket.recv_multipart()
            self._early[int.from_bytes(frames[0][:4], "little")] = frames
        return protocol.decode_response(api_key, self._early.pop(correlation_id))

    def request(self, message: protocol.Message, timeout_s: float = 5.0):
        return self.receive(message.API_KEY, self.send(message), timeout_s)

    def silent_for(self, seconds: float) -> bool:
        return not self.socket.poll(int(seconds * 1000))

    def close(self) -> None:
        self.socket.close()
        self.context.term()


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` (from /proc), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None


class SlotKiller(threading.Thread):
    """Sends SIGKILL to each process the broker forks into ``slot``, as soon as its log names it:
    ``limit`` processes at most, for ``timeout_s`` at most, and only the broker's own children."""

    def __init__(self, broker: BrokerProcess, slot: int, limit: int, timeout_s: float) -> None:
        super().__init__(daemon=True)
        self.broker, self.slot, self.limit, self.timeout_s = broker, slot, limit, timeout_s
        self.killed: list[int] = []

    def run(self) -> None:
        seen: set[int] = set()
        deadline = time.monotonic() + self.timeout_s
        while len(self.killed) < self.limit and time.monotonic() < deadline:
            for found in re.finditer(rf"forked worker slot={self.slot} pid=(\d+)", self.broker.log()):
                pid = int(found[1])
                if pid in seen or len(self.killed) >= self.limit:
                    continue
                seen.add(pid)
                if parent_of(pid) == self.broker.process.pid:
                    os.kill(pid, signal.SIGKILL)
                    self.killed.append(pid)
            time.sleep(0.005)


def read_partition(bootstrap: str, topic: str, partition: int, end: int,
                   timeout_s: float = 60) -> dict[int, bytes]:
    """Every record of ``topic``-``partition`` below ``end`` a consumer reads from offset 0 within
    ``timeout_s``: offset -> value (fewer when the time runs out)."""
    from hpbroker.client import Consumer, TopicPartition

    with Consumer(bootstrap, consumer_timeout_ms=3000) as consumer:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        records: dict[int, bytes] = {}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(records) < end:
            for record in consumer:
                records[record.offset] = record.value
                if len(records) >= end:
                    break
        return records


# --- records through the public clients, for consumer tests ------------------------------------


def create_topic_on(connection, name: str, partitions: int) -> str:
    """Create ``name`` through a BrokerConnection; returns the name."""
    from hpbroker import protocol

    connection.call(protocol.CreateTopicRequest(name, partitions))
    return name


def produce_values(connection, topic: str, partition: int, values: list[bytes], **batch) -> int:
    """Append one batch of ``values`` through a BrokerConnection; the base offset it got."""
    from hpbroker import protocol
    from hpbroker.records import build_batch

    request = protocol.ProduceRequest(topic, partition, payload=build_batch(values, **batch))
    return connection.call(request).base_offset


def numbered_values(prefix: str, count: int, start: int = 0) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(start, start + count)]


def poll_records(consumer, count: int, timeout_s: float = 20.0) -> list:
    """``count`` records by polling ``consumer`` (fails after ``timeout_s``)."""
    records: list = []
    deadline = time.monotonic() + timeout_s
    while len(records) < count:
        assert time.monotonic() < deadline, f"got {len(records)} of {count} records"
        for batch in consumer.poll(timeout_ms=500).values():
            records.extend(batch)
    return records
