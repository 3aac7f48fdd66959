"""A crash-looping worker slot takes down only its own partitions: it is held back and retried
with backoff while every other slot keeps serving, and the log, the metrics and the systemd
status say so.  The backoff rule alone, the arbiter with stand-in workers (boot failures, deaths
right after ready, every slot failing), and a real ``hpbroker serve`` whose worker is killed with
SIGKILL each time it is forked."""

from __future__ import annotations

import re
import socket
import sys
import time

import pytest
from harness import BROKER_TEST_ENV, BrokerProcess, Client, SlotKiller, free_ports, start_standin, wait_until
from scrape import get, scrape

from hpbroker import protocol
from hpbroker.records import build_batch, decode_records
from hpbroker.workers.ownership import owner_slot
from hpbroker.workers.slots import (
    BACKOFF_INITIAL_S,
    BACKOFF_MAX_S,
    BACKOFF_RESET_S,
    RESTART_LIMIT,
    Slot,
    SlotState,
)

# --- the backoff rule ---------------------------------------------------------------------------


def test_backoff_starts_at_one_second_doubles_and_is_bounded():
    slot = Slot(0)
    delays = []
    for i in range(10):
        slot.forked(100 + i, float(i))
        slot.reaped(float(i), count_death=True)
        delays.append(slot.hold_back(float(i), "died"))
        assert slot.state is SlotState.BACKOFF and not slot.alive and slot.crash_looping
        assert slot.retry_at == i + delays[-1]
    assert BACKOFF_INITIAL_S == 1.0 and BACKOFF_MAX_S == 60.0
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60, 60]
    assert slot.backoffs == 10


def test_a_retried_slot_serves_at_once_and_settles_after_serving_long_enough():
    slot = Slot(1)
    slot.hold_back(0.0, "failed to boot (exit status 3)")
    assert "crash-looping (failed to boot (exit status 3)); it is retried in 0.5 s" in slot.condition(0.5)
    slot.forked(42, 1.0)
    assert slot.crash_looping and "retried now" in slot.condition(1.0)
    slot.became_ready(2.0)
    assert slot.serving and not slot.crash_looping and slot.backoff_s == 1.0
    assert not slot.settled(2.0 + BACKOFF_RESET_S - 0.1), "still on probation"
    assert slot.settled(2.0 + BACKOFF_RESET_S) and slot.backoff_s == 0 and slot.condition(99.0) == "serving"


# --- stand-in workers ---------------------------------------------------------------------------


def _partitions_of(topic: str, partitions: int, slot: int, slots: int) -> list[int]:
    return [p for p in range(partitions) if owner_slot(topic, p, slots) == slot]


def test_a_slot_dying_in_a_loop_is_held_back_while_the_other_slot_serves(standin):
    broker, _, client = standin(workers=2, modes={"0": "crash_after_ready"}, admin_timeout_ms=300)
    broker.wait_for_log(rf"worker slot=0 is crash-looping \(died {RESTART_LIMIT + 1} times within 60 s, "
                        r"last by exit status 1\): its \d+ partitions are unavailable \(error 15\) and it is "
                        r"retried in 1 s", timeout_s=15)
    broker.wait_for_log(r"worker slot=0: retrying after a 1 s backoff", timeout_s=10)
    broker.wait_for_log(rf"worker slot=0 is crash-looping \(died {RESTART_LIMIT + 2} times within 60 s, "
                        r"last by exit status 1\): .* retried in 2 s", timeout_s=10)
    assert broker.process.poll() is None, "one slot must not stop the broker"
    header, _ = client.request(protocol.CreateTopicRequest("orders", 4))
    assert header.error_code in (0, 12)  # 12: slot 0 could not confirm; the topic exists either way
    mine, theirs = _partitions_of("orders", 4, 0, 2), _partitions_of("orders", 4, 1, 2)

    def refused():
        header, _ = client.request(protocol.ProduceRequest("orders", mine[0], payload=b"batch"))
        return header if header.error_code == 15 and "crash-looping" in header.error_message else None

    header = wait_until(refused, timeout_s=20, what="error 15 naming the crash loop")
    assert re.search(r"its worker \(slot 0\) is crash-looping \(.*\); (it is retried in [\d.]+ s "
                     r"\(backoff \d+ s, doubling up to 60 s\)|retried now)", header.error_message), header
    for partition in theirs:
        header, response = client.request(protocol.ProduceRequest("orders", partition, payload=b"batch"))
        assert header.error_code == 0 and response.base_offset == 1
    assert "stopping the broker" not in broker.log()
    assert broker.stop() == 0, broker.log()


def test_a_worker_failing_to_boot_is_retried_with_backoff_and_serves_once_it_can(standin, tmp_path):
    marker = tmp_path / "boot_fail-1"
    marker.touch()
    started = time.monotonic()
    broker, config, client = standin(workers=3, modes={"1": "boot_fail_while_marked"})
    broker.wait_for_log(r"worker slot=0 pid=\d+ serving")
    broker.wait_for_log(r"worker slot=2 pid=\d+ serving")
    broker.wait_for_log(r"worker slot=1 pid=\d+ failed to boot \(exit status 3\); see the worker's log")
    broker.wait_for_log(r"worker slot=1 is crash-looping \(failed to boot \(exit status 3\)\).* "
                        r"retried in 4 s", timeout_s=15)
    # Held back 1 s, then 2 s, and now 4 s: three forks, never a loop.
    assert time.monotonic() - started >= 1 + 2
    assert broker.log().count("forked worker slot=1 ") == 3
    for n in (1, 2):
        assert re.search(rf"worker slot=1 is crash-looping .* retried in {n} s", broker.log())
    assert broker.process.poll() is None
    header, _ = client.request(protocol.MetadataRequest([]))
    assert header.error_code == 0
    marker.unlink()  # the operator fixed what stopped it from booting
    broker.wait_for_log(r"all 3 workers serving", timeout_s=15)
    broker.wait_for_log(r"worker slot=1 serves again after crash-looping")
    assert broker.stop() == 0, broker.log()


# The service manager's socket, as systemd would bind it.


@pytest.fixture
def notify_socket(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify.sock"
    sock.bind(str(path))
    try:
        yield sock, str(path)
    finally:
        sock.close()


def receive_until(sock: socket.socket, predicate, timeout_s: float = 30.0) -> list[dict[str, str]]:
    """Every datagram up to and including the first for which ``predicate`` holds."""
    deadline = time.monotonic() + timeout_s
    messages = []
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            data = sock.recv(4096)
        except TimeoutError:
            break
        messages.append(dict(line.split("=", 1) for line in data.decode().splitlines()))
        if predicate(messages[-1]):
            return messages
    raise AssertionError(f"no such datagram within {timeout_s} s; got {messages}")


def drain(sock: socket.socket, quiet_s: float = 0.5) -> list[dict[str, str]]:
    """Every datagram received until none came for ``quiet_s``."""
    messages = []
    sock.settimeout(quiet_s)
    while True:
        try:
            data = sock.recv(4096)
        except TimeoutError:
            return messages
        messages.append(dict(line.split("=", 1) for line in data.decode().splitlines()))


def test_every_slot_crash_looping_keeps_the_broker_up_and_says_it_is_unavailable(tmp_path, notify_socket,
                                                                                 monkeypatch):
    sock, path = notify_socket
    for slot in (0, 1):
        (tmp_path / f"boot_fail-{slot}").touch()
    metrics_port = free_ports(1)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    broker, config = start_standin(tmp_path, workers=2, modes={"0": "boot_fail_while_marked",
                                                               "1": "boot_fail_while_marked"},
                                   metrics_port=metrics_port, admin_timeout_ms=300)
    client = Client(config["port"])
    try:
        ready = receive_until(sock, lambda m: "READY" in m)[-1]
        assert ready["STATUS"] == ("unavailable: worker slots 0, 1 are crash-looping: their partitions "
                                   "are unavailable and they are retried with backoff; 0 of 2 workers "
                                   "serving"), ready
        broker.wait_for_log(r"every worker slot is crash-looping: no partition is served; the broker "
                            r"stays up")
        header, _ = client.request(protocol.CreateTopicRequest("orders", 2))
        assert header.error_code == 12 and "waiting for worker slots" in header.error_message
        header, response = client.request(protocol.MetadataRequest(["orders"]))
        assert header.error_code == 0
        assert [p.error_code for p in response.topics[0].partitions] == [15, 15]
        status, _, text = get(metrics_port, "/healthz")
        assert status == 503
        assert text == "0 of 2 workers serving; crash-looping, retried with backoff: slot 0, 1\n"
        metrics = scrape(metrics_port)
        assert [metrics.value("hpbroker_worker_crashloop", worker=s) for s in (0, 1)] == [1, 1]
        assert metrics.value("hpbroker_workers", state="serving") == 0
        assert broker.process.poll() is None
        for slot in (0, 1):
            (tmp_path / f"boot_fail-{slot}").unlink()
        serving = receive_until(sock, lambda m: m.get("STATUS", "").startswith("serving"), timeout_s=20)[-1]
        assert serving["STATUS"] == f"serving 2 partitions on port {config['port']} with 2 workers"
        header, _ = client.request(protocol.ProduceRequest("orders", 0, payload=b"batch"))
        assert header.error_code == 0
        assert get(metrics_port, "/healthz")[0] == 200
    finally:
        client.close()
        assert broker.stop() == 0, broker.log()


# --- a real broker --------------------------------------------------------------------------------

TOPIC = "events"
PARTITIONS = 4
WORKERS = 2
VICTIM = 1  # the slot whose worker is killed each time it is forked
KILLS = RESTART_LIMIT + 3  # six deaths in a row, then two of its retries: held back 1, 2, then 4 s


class Ledger:
    """What was produced to a partition: acknowledged (must be kept, in order), refused by the
    front-end before any worker saw it (must not be there), or unknown (the worker died with the
    request: either)."""

    def __init__(self) -> None:
        self.acked: list[bytes] = []
        self.refused: set[bytes] = set()
        self.unknown: set[bytes] = set()

    def check(self, stored: list[bytes]) -> None:
        assert [v for v in stored if v in self.acked] == self.acked, "an acknowledged record was lost"
        assert not self.refused & set(stored), "a refused record was stored"
        assert set(stored) <= set(self.acked) | self.unknown


def produce(client: Client, partition: int, value: bytes, ledger: Ledger):
    batch = build_batch([value], producer="crashloop-test")
    header, _ = client.request(protocol.ProduceRequest(TOPIC, partition, payload=batch), timeout_s=10)
    if header.error_code == 0:
        ledger.acked.append(value)
    elif header.error_code == 15 and "crash-looping" in header.error_message:
        ledger.refused.add(value)
    else:
        ledger.unknown.add(value)
    return header


def fetch_values(client: Client, partition: int) -> list[bytes]:
    values, offset = [], 0
    while True:
        header, response = client.request(protocol.FetchRequest(TOPIC, partition, offset, max_wait_ms=0))
        assert header.error_code == 0, header
        records = decode_records(bytes(response.payload))
        if not records:
            return values
        values += [r.value for r in records if r.offset >= offset]
        offset = records[-1].offset + 1


@pytest.mark.slow
def test_a_crash_looping_slot_takes_down_only_its_own_partitions(tmp_path, notify_socket):
    sock, path = notify_socket
    port = free_ports(WORKERS + 2)
    metrics_port = port + WORKERS + 1
    argv = [sys.executable, "-m", "hpbroker.cli", "serve", "--port", str(port), "--fetch-port", str(port + 1),
            "--workers", str(WORKERS), "--data-dir", str(tmp_path / "data"), "--host", "127.0.0.1",
            "--metrics-port", str(metrics_port)]
    broker = BrokerProcess(argv, tmp_path / "broker.log", {**BROKER_TEST_ENV, "NOTIFY_SOCKET": path})
    client = Client(port)
    killer = SlotKiller(broker, VICTIM, KILLS, timeout_s=60)
    try:
        receive_until(sock, lambda m: "READY" in m)
        header, _ = client.request(protocol.CreateTopicRequest(TOPIC, PARTITIONS), timeout_s=20)
        assert header.error_code == 0, header
        victims = _partitions_of(TOPIC, PARTITIONS, VICTIM, WORKERS)
        others = _partitions_of(TOPIC, PARTITIONS, 1 - VICTIM, WORKERS)
        assert victims and others
        ledgers = {p: Ledger() for p in range(PARTITIONS)}
        for p in range(PARTITIONS):
            assert produce(client, p, f"before-{p}".encode(), ledgers[p]).error_code == 0

        killer.start()
        sent = iter(range(1_000_000))

        def refused_while_the_others_serve():
            for p in others:  # never interrupted
                header = produce(client, p, f"during-{next(sent)}".encode(), ledgers[p])
                assert header.error_code == 0, header
                assert fetch_values(client, p)[-1] == ledgers[p].acked[-1]
            header = produce(client, victims[0], f"during-{next(sent)}".encode(), ledgers[victims[0]])
            return header if header.error_code == 15 and "crash-looping" in header.error_message else None

        header = wait_until(refused_while_the_others_serve, timeout_s=60, interval_s=0.01,
                            what="error 15 naming the crash loop")
        assert f"its worker (slot {VICTIM}) is crash-looping (" in header.error_message, header.error_message
        assert re.search(r"retried in [\d.]+ s \(backoff \d+ s, doubling up to 60 s\)|retried now",
                         header.error_message), header.error_message
        broker.wait_for_log(rf"worker slot={VICTIM} is crash-looping \(died {RESTART_LIMIT + 1} times "
                            r"within 60 s, last by signal SIGKILL\): its \d+ partitions are unavailable "
                            r"\(error 15\) and it is retried in 1 s")

        def reported():
            metrics = scrape(metrics_port)
            looping = [metrics.value("hpbroker_worker_crashloop", worker=s) for s in range(WORKERS)]
            return metrics if looping[VICTIM] == 1 and looping[1 - VICTIM] == 0 else None

        metrics = wait_until(reported, timeout_s=30, what="the crash loop in the metrics")
        assert metrics.value("hpbroker_worker_backoffs_total", worker=VICTIM) >= 1
        assert metrics.value("hpbroker_worker_backoff_seconds", worker=VICTIM) >= 1
        assert metrics.value("hpbroker_worker_backoffs_total", worker=1 - VICTIM) == 0
        def unhealthy():
            status, _, text = get(metrics_port, "/healthz")
            return text if status == 503 and "crash-looping" in text else None

        health = wait_until(unhealthy, timeout_s=30, what="/healthz to report the crash loop")
        assert health == f"1 of {WORKERS} workers serving; crash-looping, retried with backoff: " \
                         f"slot {VICTIM}\n"
        status = receive_until(sock, lambda m: "crash-looping" in m.get("STATUS", ""))[-1]["STATUS"]
        assert status.startswith(f"degraded: worker slot {VICTIM} is crash-looping (")
        assert "its partitions are unavailable and it is retried with backoff" in status
        assert status.endswith(f"1 of {WORKERS} workers serving")

        killer.join(timeout=90)
        assert not killer.is_alive() and len(killer.killed) == KILLS, killer.killed
        assert broker.process.poll() is None, "one slot must not stop the broker"

        # The killing has stopped: its next retry (after at most 4 s) serves again.
        for p in victims:
            def served(p=p):
                return produce(client, p, f"after-{next(sent)}".encode(), ledgers[p]).error_code == 0

            wait_until(served, timeout_s=30, interval_s=0.05, what=f"partition {p} to serve again")
        for p in range(PARTITIONS):
            ledgers[p].check(fetch_values(client, p))
            assert ledgers[p].acked[0] == f"before-{p}".encode()
        broker.wait_for_log(rf"worker slot={VICTIM} serves again after crash-looping")
        broker.wait_for_log(r"retried in 4 s")
        header, response = client.request(protocol.MetadataRequest([TOPIC]))
        assert [p.error_code for p in response.topics[0].partitions] == [0] * PARTITIONS
        metrics = scrape(metrics_port)
        assert metrics.value("hpbroker_worker_crashloop", worker=VICTIM) == 0
        assert metrics.value("hpbroker_worker_serving", worker=VICTIM) == 1
        assert metrics.value("hpbroker_worker_backoff_seconds", worker=VICTIM) == 4, "kept until it settles"
        assert get(metrics_port, "/healthz")[:3:2] == (200, f"{WORKERS} of {WORKERS} workers serving\n")
        statuses = [m["STATUS"] for m in drain(sock) if "STATUS" in m]
        assert statuses[-1] == f"serving {PARTITIONS} partitions on port {port} with {WORKERS} workers", \
            statuses
    finally:
        killer.join(timeout=90)
        client.close()
        assert broker.stop() == 0, broker.log()
