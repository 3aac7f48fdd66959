"""The broker tells systemd how it is doing: sd_notify datagrams on ``$NOTIFY_SOCKET``, unit
tests of the notifier and a real ``hpbroker serve`` talking to a socket bound here."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest
from harness import BROKER_TEST_ENV, BrokerProcess, Client, free_ports

from hpbroker import protocol
from hpbroker.records import build_batch, decode_records
from hpbroker.workers import notify
from hpbroker.workers.notify import ServiceNotifier

WORKERS = 2
SENDERS: list[int] = []  # the pid of every datagram's sender, as the kernel tells it (SO_PASSCRED)
_UCRED = struct.Struct("iII")  # pid, uid, gid


@pytest.fixture
def notify_socket(tmp_path):
    """A Unix datagram socket bound in tmp_path, as systemd's would be, told each sender's pid."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    path = tmp_path / "notify.sock"
    sock.bind(str(path))
    SENDERS.clear()
    try:
        yield sock, str(path)
    finally:
        sock.close()


def receive(sock: socket.socket, timeout_s: float) -> dict[str, str] | None:
    """The next datagram's assignments, or None if none came within ``timeout_s``."""
    sock.settimeout(timeout_s)
    try:
        data, ancillary, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(_UCRED.size))
    except TimeoutError:
        return None
    for level, kind, value in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            SENDERS.append(_UCRED.unpack(value[: _UCRED.size])[0])
    return dict(line.split("=", 1) for line in data.decode().splitlines())


def fill(path: str) -> socket.socket:
    """A socket that has filled the receive queue of ``path`` (the manager not reading)."""
    flood = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        while True:
            flood.sendto(b"X=1", socket.MSG_DONTWAIT, path)
    except BlockingIOError:
        return flood


def receive_until(sock: socket.socket, key: str, timeout_s: float = 30.0) -> list[dict[str, str]]:
    """Every datagram up to and including the first that sets ``key``."""
    deadline = time.monotonic() + timeout_s
    messages = []
    while time.monotonic() < deadline:
        message = receive(sock, max(0.01, deadline - time.monotonic()))
        if message is not None:
            messages.append(message)
            if key in message:
                return messages
    raise AssertionError(f"no {key} within {timeout_s} s; got {messages}")


# --- the notifier alone -----------------------------------------------------------------------------


def test_notifier_sends_assignments_to_a_path_socket(notify_socket):
    sock, path = notify_socket
    notifier = ServiceNotifier({"NOTIFY_SOCKET": path})
    assert notifier.enabled and notifier.watchdog_interval_s is None
    notifier.ready("serving 3 partitions\nsecond line")
    assert receive(sock, 1) == {"READY": "1", "STATUS": "serving 3 partitions second line"}
    notifier.stopping("stopping (SIGTERM)")
    assert receive(sock, 1) == {"STOPPING": "1", "STATUS": "stopping (SIGTERM)"}
    notifier.close()


def test_notifier_reaches_an_abstract_socket():
    name = f"hpbroker-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        notifier = ServiceNotifier({"NOTIFY_SOCKET": "@" + name})
        notifier.status("recovering")
        assert receive(sock, 1) == {"STATUS": "recovering"}
        notifier.close()


def test_notifier_without_a_socket_does_nothing_and_a_dead_socket_does_not_raise(tmp_path):
    silent = ServiceNotifier({})
    assert not silent.enabled and silent.send(READY="1") is False
    gone = ServiceNotifier({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens.sock")})
    assert gone.send(READY="1") is False
    assert gone.send(STATUS="again") is False
    gone.close()


def test_watchdog_pings_at_half_the_interval_for_this_process_only(notify_socket):
    sock, path = notify_socket
    notifier = ServiceNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000",
                                "WATCHDOG_PID": str(os.getpid())})
    assert notifier.watchdog_interval_s == 1.0
    notifier.ready("serving")
    assert receive(sock, 1)["READY"] == "1"
    notifier.ping_if_due(100.0)
    notifier.ping_if_due(100.5)  # not due yet
    notifier.ping_if_due(101.0)
    received = [receive(sock, 1), receive(sock, 1), receive(sock, 0.1)]
    assert received == [{"WATCHDOG": "1"}, {"WATCHDOG": "1"}, None]
    other = ServiceNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"})
    assert other.watchdog_interval_s is None
    assert ServiceNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "soon"}).watchdog_interval_s is None


def test_the_start_timeout_is_extended_from_the_loop_until_ready(notify_socket):
    sock, path = notify_socket
    notifier = ServiceNotifier({"NOTIFY_SOCKET": path})
    extend = {"EXTEND_TIMEOUT_USEC": str(int(notify.EXTEND_TIMEOUT_S * 1_000_000))}
    notifier.ping_if_due(100.0)
    notifier.ping_if_due(100.0 + notify.EXTEND_INTERVAL_S / 2)  # not due yet
    notifier.ping_if_due(100.0 + notify.EXTEND_INTERVAL_S)
    assert [receive(sock, 1), receive(sock, 1), receive(sock, 0.1)] == [extend, extend, None]
    assert notify.EXTEND_TIMEOUT_S > notify.EXTEND_INTERVAL_S * 2
    notifier.ready("serving")
    receive(sock, 1)
    notifier.ping_if_due(1000.0)
    assert receive(sock, 0.1) is None, "started: no more extensions"


def test_ready_and_stopping_wait_for_room_in_a_full_queue(notify_socket):
    sock, path = notify_socket
    notifier = ServiceNotifier({"NOTIFY_SOCKET": path})
    for send in (lambda: notifier.ready("serving"), lambda: notifier.stopping("stopping (SIGTERM)")):
        flood = fill(path)
        reader = threading.Timer(0.3, lambda: receive(sock, 1))  # the manager reads one, a while later
        reader.start()
        started = time.monotonic()
        try:
            assert send() is not False
        finally:
            reader.join()
            flood.close()
        assert time.monotonic() - started >= 0.25
        messages = []
        while (message := receive(sock, 0.1)) is not None:
            messages.append(message)
        assert messages[-1].get("READY", messages[-1].get("STOPPING")) == "1", messages[-3:]
    assert notifier.status("no room: dropped at once") is None


def test_a_ready_that_could_not_be_sent_is_sent_again_from_the_loop(notify_socket, monkeypatch):
    sock, path = notify_socket
    monkeypatch.setattr(notify, "BLOCKING_SEND_S", 0.1)
    notifier = ServiceNotifier({"NOTIFY_SOCKET": path})
    flood = fill(path)
    try:
        assert notifier.ready("serving") is False
        notifier.status("serving 3 partitions")
        while receive(sock, 0.1) is not None:  # the manager catches up
            pass
        notifier.ping_if_due(100.0)
        extend = {"EXTEND_TIMEOUT_USEC": str(int(notify.EXTEND_TIMEOUT_S * 1_000_000))}
        ready = {"READY": "1", "STATUS": "serving 3 partitions"}
        assert [receive(sock, 1), receive(sock, 1)] == [extend, ready], "still starting until READY=1 is sent"
        notifier.ping_if_due(200.0)
        assert receive(sock, 0.1) is None, "sent once, and started"
    finally:
        flood.close()


def test_the_variables_meant_for_the_main_process_are_not_inherited(notify_socket, monkeypatch):
    _, path = notify_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    notifier = ServiceNotifier()
    assert notifier.enabled and notifier.watchdog_interval_s == 1.0
    assert not {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"} & set(os.environ)
    child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.environ))"],
                           capture_output=True, text=True, check=True)
    assert "NOTIFY_SOCKET" not in child.stdout and "WATCHDOG" not in child.stdout
    notifier.close()


# --- a real broker -----------------------------------------------------------------------------------


def _serve(tmp_path, port: int, env: dict[str, str], log_name: str) -> BrokerProcess:
    argv = [sys.executable, "-m", "hpbroker.cli", "serve", "--port", str(port), "--fetch-port", str(port + 1),
            "--workers", str(WORKERS), "--data-dir", str(tmp_path / "data"), "--host", "127.0.0.1"]
    return BrokerProcess(argv, tmp_path / log_name, {**BROKER_TEST_ENV, **env})


def _metadata_all_serving(client: Client, topic: str, partitions: int) -> bool:
    header, response = client.request(protocol.MetadataRequest([topic]))
    assert header.error_code == 0
    (described,) = response.topics
    return len(described.partitions) == partitions and all(p.error_code == 0 for p in described.partitions)


@pytest.mark.slow
def test_ready_comes_once_every_partition_is_recovered_and_stopping_on_sigterm(tmp_path, notify_socket):
    sock, path = notify_socket
    port = free_ports(WORKERS + 1)
    first = _serve(tmp_path, port, {}, "first.log")
    client = Client(port)
    try:
        first.wait_for_log(rf"all {WORKERS} workers serving", timeout_s=20)
        header, _ = client.request(protocol.CreateTopicRequest("audit", 4), timeout_s=20)
        assert header.error_code == 0
        for partition in range(4):
            batch = build_batch([f"record-{partition}".encode()], producer="notify-test")
            header, _ = client.request(protocol.ProduceRequest("audit", partition, payload=batch),
                                       timeout_s=10)
            assert header.error_code == 0, header
    finally:
        assert first.stop() == 0, first.log()

    broker = _serve(tmp_path, port, {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"}, "second.log")
    try:
        messages = receive_until(sock, "READY")
        assert any("EXTEND_TIMEOUT_USEC" in m for m in messages[:-1]), messages
        # Checked at once: by READY every partition is recovered and served.
        assert _metadata_all_serving(client, "audit", 4)
        for partition in range(4):
            header, response = client.request(protocol.FetchRequest("audit", partition, 0, max_wait_ms=0))
            assert header.error_code == 0, header
            values = [r.value for r in decode_records(bytes(response.payload))]
            assert values == [f"record-{partition}".encode()]
        assert any(m.get("STATUS", "").startswith("recovering partitions") for m in messages[:-1])
        assert messages[-1]["STATUS"] == f"serving 4 partitions on port {port} with {WORKERS} workers"
        batch = build_batch([b"after ready"], producer="notify-test")
        header, response = client.request(protocol.ProduceRequest("audit", 0, payload=batch), timeout_s=10)
        assert header.error_code == 0 and response.base_offset == 1

        pings = [m for m in receive_until(sock, "WATCHDOG", timeout_s=2) if "WATCHDOG" in m]
        pings += [m for m in receive_until(sock, "WATCHDOG", timeout_s=2) if "WATCHDOG" in m]
        assert pings == [{"WATCHDOG": "1"}] * 2

        broker.process.send_signal(signal.SIGTERM)
        stopping = receive_until(sock, "STOPPING", timeout_s=10)[-1]
        assert stopping["STOPPING"] == "1" and stopping["STATUS"].startswith("stopping (SIGTERM)")
        assert broker.wait_exit(15) == 0, broker.log()
        # Only the arbiter notifies (NotifyAccess=main): its workers never, not even inherited.
        assert set(SENDERS) == {broker.process.pid}, (SENDERS, broker.process.pid)
    finally:
        client.close()
        broker.stop()


@pytest.mark.slow
def test_a_respawned_worker_is_reported_in_the_status(tmp_path, notify_socket):
    sock, path = notify_socket
    port = free_ports(WORKERS + 1)
    broker = _serve(tmp_path, port, {"NOTIFY_SOCKET": path}, "broker.log")
    try:
        receive_until(sock, "READY")
        broker.wait_for_log(rf"all {WORKERS} workers serving", timeout_s=10)
        victim = broker.worker_pids()[1]
        os.kill(victim, signal.SIGKILL)
        statuses = [m["STATUS"] for m in receive_until(sock, "STATUS", timeout_s=10)]
        assert statuses[-1].startswith("worker slot 1 died (signal SIGKILL); respawned as pid"), statuses
        serving = receive_until(sock, "STATUS", timeout_s=20)[-1]
        assert serving == {"STATUS": f"serving 0 partitions on port {port} with {WORKERS} workers"}
        assert set(SENDERS) == {broker.process.pid}, (SENDERS, broker.process.pid)
    finally:
        assert broker.stop() == 0, broker.log()
