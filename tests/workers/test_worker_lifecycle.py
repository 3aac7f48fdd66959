"""A worker's life: control messages, a graceful stop, crashes, boot failures, a lost parent."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import zmq
from worker_harness import (
    REPO_ROOT,
    TIMEOUT_S,
    WorkerProcess,
    batch_values,
    fetch_request,
    make_batch,
    produce_request,
    read_log_values,
    values_of,
)

from hpbroker.io import _writer
from hpbroker.protocol import EARLIEST_TIMESTAMP, ApiKey, ListOffsetsRequest
from hpbroker.workers import backend, heartbeat
from hpbroker.workers.backend import EXIT_OK


def test_control_open_then_delete_a_topic(start_worker, arbiter):
    worker = start_worker()
    spec = {"topic": "events", "partition": 4, "config": {"segment_bytes": 4096}}
    assert arbiter.control(0, "open", partitions=[spec]) == {"id": 1, "error": None}
    for i in range(20):  # ~450 bytes per batch: rolls segments of 4096 bytes
        assert arbiter.call(0, produce_request("events", 4, make_batch(f"e{i}", count=10)))[0].error_code == 0
    directory = worker.directory("events", 4)
    assert len([name for name in os.listdir(directory) if name.endswith(".log")]) > 1
    assert arbiter.control(0, "open", partitions=[spec])["error"] is None  # already open: fine

    bad = arbiter.control(0, "open", partitions=[{"topic": "events", "partition": 5,
                                                  "config": {"segment_bytes": 1}}])
    assert "segment_bytes" in bad["error"]
    assert arbiter.control(0, "delete", topic="events")["error"] is None
    assert not os.path.exists(directory)
    assert sorted(os.listdir(worker.config.data_dir)) == ["orders-0", "orders-1"]
    header, _response = arbiter.call(0, produce_request("events", 4, make_batch("late")))
    assert header.error_code == 6
    assert arbiter.call(0, produce_request("orders", 0, make_batch("other topic")))[0].error_code == 0


def test_deleting_a_topic_answers_its_waiting_requests(start_worker, arbiter):
    start_worker(log={"flush_messages": 1_000_000, "flush_ms": 600_000})
    produce_id = arbiter.relay(0, produce_request("orders", 0, make_batch("doomed")))
    fetch_id = arbiter.relay(0, fetch_request("orders", 1, 0, max_wait_ms=10_000))
    assert arbiter.nothing_within(0.2)
    ident = arbiter.next_correlation_id()
    arbiter.send_frames(0, backend.encode_control("delete", id=ident, topic="orders"))
    answers = {}
    for _ in range(2):
        header, _response = arbiter.any_response({produce_id: ApiKey.PRODUCE, fetch_id: ApiKey.FETCH})
        answers[header.correlation_id] = header.error_code
    assert answers == {produce_id: 6, fetch_id: 6}
    assert arbiter.expect_control("ack") == {"id": ident, "error": None}


def test_sigterm_answers_flushes_closes_cleanly_and_exits_0(start_worker, arbiter):
    worker = start_worker(log={"flush_messages": 1_000_000, "flush_ms": 600_000, "flush_fsync": True})
    acked = [arbiter.call(0, produce_request("orders", 1, make_batch("early"), timeout_ms=100))]
    assert acked[0][0].error_code == 12  # never flushed in time: not acknowledged (yet)
    waiting = [arbiter.relay(0, produce_request("orders", p, make_batch(f"w{p}"))) for p in (0, 1)]
    parked = arbiter.relay(0, fetch_request("orders", 0, 0, max_wait_ms=60_000))
    assert arbiter.nothing_within(0.2)
    worker.signal(signal.SIGTERM)
    answers = {}
    for _ in range(3):
        kinds = {waiting[0]: ApiKey.PRODUCE, waiting[1]: ApiKey.PRODUCE, parked: ApiKey.FETCH}
        header, response = arbiter.any_response(kinds)
        answers[header.correlation_id] = (header.error_code, response)
    assert worker.wait() == EXIT_OK
    assert answers[waiting[0]][0] == 0 and answers[waiting[0]][1].base_offset == 0
    assert answers[waiting[1]][0] == 0 and answers[waiting[1]][1].base_offset == 3  # after "early"
    assert answers[parked][0] == 0  # answered with what there was when it stopped
    for partition in (0, 1):
        directory = worker.directory("orders", partition)
        assert "clean-shutdown" in os.listdir(directory)
    values = [v for _offset, v in read_log_values(worker.directory("orders", 1))]
    assert values == batch_values(make_batch("early")) + batch_values(make_batch("w1"))


def test_kill_9_loses_no_acknowledged_record(start_worker, arbiter):
    worker = start_worker(log={"flush_messages": 5, "flush_ms": 2, "flush_fsync": True})
    acked: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
    in_flight: dict[int, tuple[int, bytes]] = {}
    sent = 0
    killed_at = time.monotonic() + 0.5
    while time.monotonic() < killed_at:  # keep about 40 produces in flight, note every ack
        while len(in_flight) < 40:
            batch = make_batch(f"k{sent}", count=2)
            in_flight[arbiter.relay(0, produce_request("orders", sent % 2, batch))] = (sent % 2, batch)
            sent += 1
        header, response = arbiter.response(ApiKey.PRODUCE)
        assert header.error_code == 0
        partition, batch = in_flight.pop(header.correlation_id)
        acked[partition].append((response.base_offset, batch))
    worker.signal(signal.SIGKILL)
    assert worker.wait() == -signal.SIGKILL
    while not arbiter.nothing_within(0.3):  # acks the worker sent before it died count too
        header, response = arbiter.response(ApiKey.PRODUCE)
        assert header.error_code == 0
        partition, batch = in_flight.pop(header.correlation_id)
        acked[partition].append((response.base_offset, batch))
    assert sum(len(a) for a in acked.values()) > 20
    stored = {}
    for partition in (0, 1):
        stored[partition] = dict(read_log_values(worker.directory("orders", partition)))
        for base_offset, batch in acked[partition]:
            values = batch_values(batch)
            assert [stored[partition].get(base_offset + i) for i in range(len(values))] == values
        assert sorted(stored[partition]) == list(range(len(stored[partition])))  # in order, no gap
    worker2 = start_worker()  # a respawned worker recovers the same directories and serves them
    _header, response = arbiter.call(0, fetch_request("orders", 0, 0, max_bytes=1 << 24))
    assert response.high_watermark == len(stored[0])
    assert values_of(response.payload) == [stored[0][offset] for offset in range(len(stored[0]))]
    worker2.signal(signal.SIGTERM)
    assert worker2.wait() == EXIT_OK


def test_a_partition_that_cannot_be_opened_is_answered_with_an_error_and_the_worker_serves_the_rest(
        arbiter, data_dir):
    # Another process holds orders-1's directory lock (one forked from here would inherit it).
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from hpbroker.io import PartitionLog; "
         "log = PartitionLog(sys.argv[1]); print('held', flush=True); sys.stdin.read()",
         os.path.join(data_dir, "orders-1")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO_ROOT)
    assert holder.stdout.readline() == b"held\n"
    worker = WorkerProcess(arbiter, data_dir)
    try:
        worker.start()  # says ready
        header, _ = arbiter.call(0, produce_request("orders", 1, make_batch("locked")))
        assert header.error_code == 7
        assert "orders-1 could not be opened" in header.error_message
        assert "already open for writing" in header.error_message
        assert arbiter.call(0, produce_request("orders", 0, make_batch("fine")))[0].error_code == 0
        holder.kill()  # the kernel releases its lock
        holder.wait(timeout=TIMEOUT_S)
        # A later open of the partition (the arbiter reconciling) opens it now that it can.
        assert arbiter.control(0, "open", partitions=[{"topic": "orders", "partition": 1}])["error"] is None
        assert arbiter.call(0, produce_request("orders", 1, make_batch("now")))[0].error_code == 0
        worker.signal(signal.SIGTERM)
        assert worker.wait() == EXIT_OK
    finally:
        worker.close()
        holder.kill()
        holder.wait()


def test_sigquit_exits_at_once_without_flushing(start_worker, arbiter):
    worker = start_worker(log={"flush_messages": 1_000_000, "flush_ms": 600_000})
    arbiter.relay(0, produce_request("orders", 0, make_batch("unflushed")))
    assert arbiter.nothing_within(0.2)
    worker.signal(signal.SIGQUIT)
    assert worker.wait() == EXIT_OK
    assert arbiter.nothing_within(0.1)  # the waiting produce was never acknowledged
    assert "clean-shutdown" not in os.listdir(worker.directory("orders", 0))
    assert read_log_values(worker.directory("orders", 0)) == []


def test_a_worker_exits_when_its_parent_dies(arbiter, data_dir):
    worker = WorkerProcess(arbiter, data_dir)
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:  # an arbiter stand-in: forks the worker, waits until it booted, reports, dies
        try:
            os.close(read_end)
            worker.start(wait_ready=False)
            deadline = time.monotonic() + TIMEOUT_S
            while not (heartbeat.read_heartbeat(arbiter.run_dir, 0)[1] or {}).get("ready"):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            os.write(write_end, str(worker.pid).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    worker_pid = int(os.read(read_end, 32) or 0)
    os.close(read_end)
    os.waitpid(middle, 0)
    try:
        assert arbiter.expect_control("ready")["pid"] == worker_pid
        deadline = time.monotonic() + TIMEOUT_S
        while _alive(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker_pid)
    finally:
        if worker_pid and _alive(worker_pid):
            os.kill(worker_pid, signal.SIGKILL)
        worker.listener.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_standalone_entry_point_serves_and_stops_on_sigterm(arbiter, data_dir):
    command = [sys.executable, "-m", "hpbroker.workers.worker", "--slot", "0", "--backend", arbiter.address,
               "--run-dir", arbiter.run_dir, "--data-dir", data_dir, "--fetch-port", str(_free_port()),
               "orders:0"]
    process = subprocess.Popen(command, cwd=REPO_ROOT, stderr=subprocess.PIPE,
                               env={**os.environ, "HPBROKER_PORT": "1"})
    try:
        assert arbiter.expect_control("ready", timeout_s=30)["pid"] == process.pid
        assert arbiter.call(0, produce_request("orders", 0, make_batch("cli")))[0].error_code == 0
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == EXIT_OK
    finally:
        process.kill()
        process.wait()
        process.stderr.close()
    assert "clean-shutdown" in os.listdir(os.path.join(data_dir, "orders-0"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_router_hands_a_respawned_workers_identity_over(start_worker, arbiter):
    first = start_worker()
    first.signal(signal.SIGKILL)
    first.wait()
    start_worker()  # same slot, same identity: ROUTER_HANDOVER routes to the new one
    header, _response = arbiter.call(0, produce_request("orders", 0, make_batch("after")))
    assert header.error_code == 0
    assert zmq.zmq_version_info() >= (4, 1)


def test_sigint_stops_gracefully_unless_it_was_ignored_at_start(start_worker, arbiter):
    worker = start_worker()
    worker.signal(signal.SIGINT)
    assert worker.wait() == EXIT_OK
    assert "clean-shutdown" in os.listdir(worker.directory("orders", 0))

    ignoring = start_worker(child_setup=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    ignoring.signal(signal.SIGINT)
    assert arbiter.call(0, produce_request("orders", 0, make_batch("still here")))[0].error_code == 0
    ignoring.signal(signal.SIGTERM)
    assert ignoring.wait() == EXIT_OK


def test_retention_runs_periodically_and_moves_the_log_start_offset(start_worker, arbiter):
    start_worker(log={"segment_bytes": 1024, "retention_bytes": 2048, "file_delete_delay_ms": 0,
                      "flush_fsync": True}, retention_check_interval_ms=200)
    for i in range(30):  # ~450 bytes each: a dozen segments
        assert arbiter.call(0, produce_request("orders", 0, make_batch(f"r{i}", count=10)))[0].error_code == 0
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        _header, earliest = arbiter.call(0, ListOffsetsRequest("orders", 0, EARLIEST_TIMESTAMP))
        if earliest.offset > 200 or time.monotonic() > deadline:  # a pass may run between produces
            break
        time.sleep(0.05)
    assert earliest.offset > 200  # all but the last few kilobytes are gone
    header, response = arbiter.call(0, fetch_request("orders", 0, 0))
    assert header.error_code == 5 and response.log_start_offset == earliest.offset
    _header, response = arbiter.call(0, fetch_request("orders", 0, earliest.offset))
    assert values_of(response.payload)[0] == f"r{earliest.offset // 10}/0/".encode().ljust(32, b".")


def _fail_writes_after_the_first_flush() -> None:
    """The disk goes away after the first flush (the first produce's): from then on the segment's
    descriptor refuses writes (EBADF), so the next flush fails."""

    def on_disk_call(operation: str, fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if operation == "fdatasync" and path.endswith(".log"):
            read_only = os.open(path, os.O_RDONLY)
            os.dup2(read_only, fd)
            os.close(read_only)

    _writer.set_trace(on_disk_call)


def test_a_disk_error_refuses_produce_and_keeps_serving_what_was_acknowledged(start_worker, arbiter):
    start_worker(log={"flush_fsync": True}, partitions=[("orders", 0)],
                 child_setup=_fail_writes_after_the_first_flush)
    header, response = arbiter.call(0, produce_request("orders", 0, make_batch("kept")))
    assert (header.error_code, response.base_offset) == (0, 0)
    header, _response = arbiter.call(0, produce_request("orders", 0, make_batch("lost")))
    assert header.error_code == 7 and "refuses writes" in header.error_message
    header, _response = arbiter.call(0, produce_request("orders", 0, make_batch("after")))
    assert header.error_code == 7  # the descriptor stays read-only: writes cannot resume
    header, response = arbiter.call(0, fetch_request("orders", 0, 0))
    assert (header.error_code, response.high_watermark) == (0, 3)
    assert [value[:7] for value in values_of(response.payload)] == [b"kept/0/", b"kept/1/", b"kept/2/"]
    header, response = arbiter.call(0, ListOffsetsRequest("orders", 0, -1))
    assert (header.error_code, response.offset) == (0, 3)
