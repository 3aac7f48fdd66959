"""The arbiter with real processes: boot, routing, respawn after kill -9, silent and failing
workers, graceful stop.  The workers are the stand-in of standin_broker.py.  Slots that crash in a
loop or cannot boot: test_slot_crashloop.py."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import time

import pytest
from harness import Client, pid_alive, start_standin, wait_until

from hpbroker import protocol
from hpbroker.workers.ownership import owner_slot


def create(client, name, partitions, configs=()):
    header, _ = client.request(protocol.CreateTopicRequest(name, partitions, list(configs)))
    assert header.error_code == 0, header
    return header


def produce(client, topic, partition, acks=1):
    return client.request(protocol.ProduceRequest(topic, partition, acks=acks, payload=b"batch"))


def read_data_port(port):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        return connection.makefile("rb").readline().decode().split()


def test_boot_serves_every_slot_and_routes_each_partition_to_its_owner(standin):
    broker, config, client = standin(workers=3)
    broker.wait_for_log(r"all 3 workers serving")
    create(client, "orders", 7)
    pids = broker.worker_pids()
    for partition in range(7):
        header, response = produce(client, "orders", partition)
        owner = owner_slot("orders", partition, 3)
        assert (header.error_code, response.base_offset, response.log_start_offset) == (0, owner, pids[owner])
        header, response = client.request(protocol.FetchRequest("orders", partition, 0))
        assert (header.error_code, response.high_watermark) == (0, owner)
    header, response = client.request(protocol.ListOffsetsRequest("orders", 3))
    assert (header.error_code, response.offset) == (0, owner_slot("orders", 3, 3))
    for slot in range(3):  # each slot's data port is served by that slot's worker
        assert read_data_port(config["fetch_port"] + slot) == [f"slot={slot}", f"pid={pids[slot]}"]


def test_killed_worker_is_reaped_and_respawned_into_its_slot(standin):
    broker, config, client = standin(workers=2)
    broker.wait_for_log(r"all 2 workers serving")
    create(client, "orders", 2)
    partition = next(p for p in range(2) if owner_slot("orders", p, 2) == 1)
    old_pid = broker.worker_pids()[1]
    os.kill(old_pid, signal.SIGKILL)
    outcomes = set()

    def served_by_new_process():
        header, response = produce(client, "orders", partition)
        outcomes.add(header.error_code)
        return header.error_code == 0 and response.log_start_offset != old_pid and response.log_start_offset

    new_pid = wait_until(served_by_new_process, what="the respawned worker to answer")
    assert outcomes <= {0, 15}
    assert not pid_alive(old_pid)
    assert broker.worker_pids()[1] == new_pid
    broker.wait_for_log(rf"worker slot=1 pid={old_pid} died \(signal SIGKILL\)")
    broker.wait_for_log(rf"worker slot=1 pid={new_pid} serving")
    assert read_data_port(config["fetch_port"] + 1) == ["slot=1", f"pid={new_pid}"]
    header, response = produce(client, "orders", 1 - partition)  # the other slot never stopped
    assert header.error_code == 0 and response.log_start_offset == broker.worker_pids()[0]


def test_a_reaped_slot_s_stale_temporary_files_are_removed(standin):
    broker, _config, _client = standin(workers=2)
    broker.wait_for_log(r"all 2 workers serving")
    run_dir = re.search(r"run dir (\S+)", broker.log())[1]
    old_pid = broker.worker_pids()[1]
    stale = [f"worker-1.stats.json.{old_pid}.tmp", "worker-1.stats.json.tmp", f"worker-1.json.{old_pid}.tmp"]
    for name in stale:  # what a worker killed while writing its files leaves
        with open(os.path.join(run_dir, name), "w") as f:
            f.write('{"slot": 1, "pi')
    kept = os.path.join(run_dir, "worker-10.stats.json.tmp")  # another slot's
    open(kept, "w").close()
    os.kill(old_pid, signal.SIGKILL)
    broker.wait_for_log(r"worker slot=1 pid=\d+ serving", count=2)
    assert not set(stale) & set(os.listdir(run_dir))
    assert os.path.exists(kept)


def _listening_inodes(port: int) -> set[str]:
    """Inodes of the TCP sockets listening on ``port`` (from /proc/net/tcp and tcp6)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                    inodes.add(fields[9])
    return inodes


def _socket_inodes_of(pid: int) -> set[str]:
    inodes = set()
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def test_a_respawned_worker_holds_none_of_the_arbiters_sockets(standin):
    """Forked while the arbiter's ZeroMQ context runs, the worker closes what it inherited: a worker
    outliving a killed arbiter must not keep the front-end port bound."""
    broker, config, client = standin(workers=2)
    broker.wait_for_log(r"all 2 workers serving")
    old_pid = broker.worker_pids()[1]
    os.kill(old_pid, signal.SIGKILL)
    new_pid = wait_until(lambda: broker.worker_pids()[1] != old_pid and broker.worker_pids()[1],
                         what="the respawn")
    broker.wait_for_log(rf"worker slot=1 pid={new_pid} serving")
    front_end = _listening_inodes(config["port"])
    assert front_end and front_end <= _socket_inodes_of(broker.process.pid), "the arbiter listens"
    held = _socket_inodes_of(new_pid)
    assert not front_end & held, "the respawned worker holds the front-end's listening socket"
    assert _listening_inodes(config["fetch_port"] + 1) <= held, "it keeps its own data port"
    assert not _listening_inodes(config["fetch_port"]) & held, "and not the other slot's"


def test_worker_that_stops_heartbeating_is_aborted_and_respawned(standin):
    broker, _, client = standin(workers=2, modes={"0": "silent_once"}, timeout_ms=400)
    broker.wait_for_log(r"all 2 workers serving")
    silent_pid = broker.worker_pids()[0]
    broker.wait_for_log(rf"worker slot=0 pid={silent_pid} no heartbeat for [\d.]+ s: SIGABRT", timeout_s=5)
    broker.wait_for_log(r"worker slot=0 pid=\d+ serving", count=2, timeout_s=5)
    assert broker.worker_pids()[0] != silent_pid
    assert not pid_alive(silent_pid)
    header, _ = client.request(protocol.MetadataRequest([]))
    assert header.error_code == 0


def test_worker_not_ready_within_the_boot_timeout_is_aborted_and_respawned(standin):
    broker, _, _ = standin(workers=2, modes={"1": "never_ready_once"}, worker_boot_timeout_ms=300)
    broker.wait_for_log(r"worker slot=0 pid=\d+ serving")
    stuck = broker.worker_pids()[1]
    broker.wait_for_log(rf"worker slot=1 pid={stuck} not ready within 300 ms: SIGABRT", timeout_s=5)
    broker.wait_for_log(r"all 2 workers serving", timeout_s=5)
    assert broker.worker_pids()[1] != stuck and not pid_alive(stuck)


def test_worker_ignoring_sigabrt_gets_sigkill_after_the_grace(standin):
    broker, _, _ = standin(workers=1, modes={"0": "stubborn_once"}, timeout_ms=300)
    broker.wait_for_log(r"all 1 workers serving")
    stubborn = broker.worker_pids()[0]
    broker.wait_for_log(rf"worker slot=0 pid={stubborn} no heartbeat for [\d.]+ s: SIGABRT", timeout_s=5)
    broker.wait_for_log(rf"worker slot=0 pid={stubborn} still running: SIGKILL", timeout_s=5)
    broker.wait_for_log(rf"worker slot=0 pid={stubborn} died \(signal SIGKILL\)", timeout_s=5)
    broker.wait_for_log(r"worker slot=0 pid=\d+ serving", count=2, timeout_s=5)


def test_worker_ignoring_sigterm_is_killed_at_the_graceful_deadline(standin):
    broker, _, _ = standin(workers=2, modes={"1": "ignore_term"}, graceful_timeout_ms=700)
    broker.wait_for_log(r"all 2 workers serving")
    pids = broker.worker_pids()
    started = time.monotonic()
    broker.process.send_signal(signal.SIGTERM)
    assert broker.wait_exit(timeout_s=10) == 0
    assert 0.6 < time.monotonic() - started < 5
    broker.wait_for_log(r"workers still running after 700 ms: SIGKILL")
    broker.wait_for_log(rf"worker slot=1 pid={pids[1]} exited \(signal SIGKILL\)")
    assert not any(pid_alive(pid) for pid in pids.values())


def test_broker_whose_ports_are_taken_exits_with_an_error(standin):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        broker, _, _ = standin(workers=1, port=taken)
        assert broker.wait_exit(timeout_s=10) != 0
        assert "cannot bind" in broker.log() and "Address already in use" in broker.log()
        assert not any(pid_alive(pid) for pid in broker.worker_pids().values())
        broker, _, _ = standin(workers=1, fetch_port=taken)
        assert broker.wait_exit(timeout_s=10) != 0
        assert f"cannot listen on data port 127.0.0.1:{taken}" in broker.log()
        assert "forked worker" not in broker.log()


def test_sigterm_stops_every_worker_and_exits_zero(standin, tmp_path):
    broker, _, client = standin(workers=3)
    broker.wait_for_log(r"all 3 workers serving")
    pids = broker.worker_pids().values()
    started = time.monotonic()
    broker.process.send_signal(signal.SIGTERM)
    assert broker.wait_exit(timeout_s=10) == 0
    assert time.monotonic() - started < 5  # graceful_timeout_ms
    assert not any(pid_alive(pid) for pid in pids)
    assert "[arbiter] stopped" in broker.log()
    run_dir = re.search(r"run dir (\S+)", broker.log())[1]
    assert run_dir == str(tmp_path / "data" / ".run"), "the default run dir is in the data dir"
    assert os.listdir(run_dir) == [], "heartbeats and the backend socket are gone"


def test_a_broker_starts_over_what_a_killed_one_left_in_its_run_dir(standin, tmp_path):
    run_dir = tmp_path / "data" / ".run"
    run_dir.mkdir(parents=True)
    for name in ("backend.sock", "worker-0.json", "worker-1.json"):
        (run_dir / name).write_text("left by a broker killed with SIGKILL")
    broker, _, client = standin(workers=2)
    broker.wait_for_log(r"all 2 workers serving")
    create(client, "orders", 2)


def test_unknown_topic_is_created_automatically_when_configured(standin, tmp_path):
    broker, _, client = standin(workers=2, auto_create_topics=True, default_partitions=3)
    broker.wait_for_log(r"all 2 workers serving")
    header, _ = produce(client, "auto", 0)
    assert header.error_code == 15  # being created: retry
    wait_until(lambda: produce(client, "auto", 0)[0].error_code == 0, what="the new topic to serve")
    assert produce(client, "auto", 3)[0].error_code == 6  # beyond default_partitions
    assert client.request(protocol.ListOffsetsRequest("other", 0))[0].error_code == 6
    _, response = client.request(protocol.MetadataRequest([]))
    assert [(t.name, len(t.partitions)) for t in response.topics] == [("auto", 3)]


def test_sighup_without_security_is_logged_and_ignored(standin):
    broker, _, client = standin(workers=1)
    broker.wait_for_log(r"all 1 workers serving")
    broker.process.send_signal(signal.SIGHUP)
    broker.wait_for_log(r"SIGHUP: security is off, nothing to reload")
    header, _ = client.request(protocol.MetadataRequest([]))
    assert header.error_code == 0 and broker.process.poll() is None


def test_topics_are_created_persisted_described_and_deleted(standin, tmp_path):
    broker, config, client = standin(workers=2)
    broker.wait_for_log(r"all 2 workers serving")
    create(client, "orders", 3, [protocol.TopicConfigEntry("retention_ms", "60000"),
                                 protocol.TopicConfigEntry("flush_fsync", "false")])
    stored = json.loads((tmp_path / "data" / "topics.json").read_text())["topics"]
    assert stored == {"orders": {"partitions": 3, "deleting": False,
                                 "config": {"retention_ms": 60000, "flush_fsync": False}}}
    produce(client, "orders", 0)
    produce(client, "orders", 0)

    def described():
        header, response = client.request(protocol.MetadataRequest([]))
        (topic,) = response.topics
        known = all(p.log_start_offset == 0 for p in topic.partitions)
        return topic if known and topic.partitions[0].high_watermark == 2 else None

    topic = wait_until(described, what="heartbeat offsets in metadata")
    assert [(c.key, c.value) for c in topic.configs] == [("flush_fsync", "false"), ("retention_ms", "60000")]
    for p, meta in enumerate(topic.partitions):
        assert (meta.partition, meta.error_code, meta.leader, meta.log_start_offset) == (p, 0, 0, 0)
        assert meta.fetch_port == config["fetch_port"] + owner_slot("orders", p, 2)
    _, response = client.request(protocol.MetadataRequest([]))
    assert response.brokers == [protocol.BrokerInfo(0, "127.0.0.1", config["port"], config["fetch_port"])]

    header, _ = client.request(protocol.DeleteTopicRequest("orders"))
    assert header.error_code == 0
    assert json.loads((tmp_path / "data" / "topics.json").read_text())["topics"] == {}
    _, response = client.request(protocol.MetadataRequest(["orders"]))
    assert [(t.name, t.error_code, t.partitions) for t in response.topics] == [("orders", 6, [])]
    assert produce(client, "orders", 0)[0].error_code == 6


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (protocol.CreateTopicRequest("bad/name", 1), 13),
        (protocol.CreateTopicRequest("..", 1), 13),
        (protocol.CreateTopicRequest("ok", 0), 14),
        (protocol.CreateTopicRequest("ok", 1, [protocol.TopicConfigEntry("segment_bytes", "1")]), 8),
        (protocol.CreateTopicRequest("ok", 1, [protocol.TopicConfigEntry("nope", "1")]), 8),
        (protocol.CreateTopicRequest("orders", 1), 11),
        (protocol.DeleteTopicRequest("ghost"), 6),
        (protocol.ProduceRequest("ghost", 0, payload=b"x"), 6),
        (protocol.ProduceRequest("orders", 2, payload=b"x"), 6),
        (protocol.FetchRequest("orders", 99, 0), 6),
        (protocol.ListOffsetsRequest("ghost", 0), 6),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, protocol.Message) else str(v),
)
def test_refused_requests_get_their_error_code(standin, request_, code):
    broker, _, client = standin(workers=1)
    broker.wait_for_log(r"all 1 workers serving")
    create(client, "orders", 2)
    header, _ = client.request(request_)
    assert header.error_code == code and header.error_message


def test_produce_with_acks_0_gets_no_response_even_on_error(standin):
    broker, _, client = standin(workers=1)
    broker.wait_for_log(r"all 1 workers serving")
    client.send(protocol.ProduceRequest("ghost", 0, acks=0, payload=b"x"))
    assert client.silent_for(0.3)


def test_garbage_gets_error_responses_or_is_dropped_and_the_broker_keeps_serving(standin):
    broker, _, client = standin(workers=1)
    broker.wait_for_log(r"all 1 workers serving")
    client.socket.send_multipart([b"\x01"])  # no header: nobody to answer
    client.socket.send_multipart([b"a", b"b", b"c"])  # three frames: not a message
    assert client.silent_for(0.3)
    head = protocol.encode_request(protocol.MetadataRequest([]), 41, "x")[0]
    client.socket.send_multipart([head[:-3]])  # header parses, body truncated
    header, _ = client.receive(protocol.ApiKey.METADATA, 41)
    assert header.error_code == 10 and "truncated" in header.error_message
    unknown = (77).to_bytes(2, "little") + head[2:]
    client.socket.send_multipart([unknown])
    raw = client.socket.recv_multipart() if client.socket.poll(5000) else None
    assert raw is not None
    header, _ = protocol.decode_response(protocol.ApiKey.CREATE_TOPIC, raw)
    assert (header.correlation_id, header.error_code) == (41, 9)
    version = head[:2] + (3).to_bytes(2, "little") + head[4:]
    client.socket.send_multipart([version])
    header, _ = client.receive(protocol.ApiKey.METADATA, 41)
    assert header.error_code == 9 and "version 3" in header.error_message
    header, _ = client.request(protocol.MetadataRequest([]))
    assert header.error_code == 0
    assert "whose header does not parse" in broker.log()


def test_create_not_acknowledged_in_time_is_answered_with_a_timeout(standin):
    broker, _, client = standin(workers=1, modes={"0": "no_acks"}, admin_timeout_ms=500)
    broker.wait_for_log(r"all 1 workers serving")
    header, _ = client.request(protocol.CreateTopicRequest("orders", 1))
    assert header.error_code == 12 and "waiting for worker slots [0]" in header.error_message
    _, response = client.request(protocol.MetadataRequest(["orders"]))
    assert response.topics[0].error_code == 0  # the topic exists; its partition comes up later


def test_topics_survive_a_restart_and_workers_get_them_at_boot(tmp_path):
    broker, config = start_standin(tmp_path, workers=2)
    client = Client(config["port"])
    try:
        broker.wait_for_log(r"all 2 workers serving")
        create(client, "orders", 4)
    finally:
        client.close()
        assert broker.stop() == 0
    broker, config = start_standin(tmp_path, workers=2)
    client = Client(config["port"])
    try:
        broker.wait_for_log(r"all 2 workers serving")
        assert "forked worker slot=0 pid=" in broker.log() and "with 2 partitions" in broker.log()
        for partition in range(4):
            assert produce(client, "orders", partition)[0].error_code == 0
    finally:
        client.close()
        broker.stop()


def test_second_broker_on_the_same_data_dir_refuses_to_start(standin, tmp_path):
    broker, _, _ = standin(workers=1)
    broker.wait_for_log(r"all 1 workers serving")
    (tmp_path / "second").mkdir()
    second, _ = start_standin(tmp_path / "second", workers=1, data_dir=str(tmp_path / "data"))
    assert second.wait_exit(timeout_s=10) != 0
    assert "cannot start" in second.log() and "already open" in second.log()
    second.stop()
