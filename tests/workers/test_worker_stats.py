"""What a worker measures and publishes in its stats file (hpbroker.workers.stats): exact counts of
requests, records and bytes in and out, errors by code, latencies and flush times."""

from __future__ import annotations

import errno
import os

from harness import wait_until
from worker_harness import TcpClient, fetch_request, make_batch, produce_request

from hpbroker.errors import StorageError
from hpbroker.metrics import Histogram
from hpbroker.protocol import ApiKey
from hpbroker.workers.heartbeat import heartbeat_path
from hpbroker.workers.stats import read_stats, stats_path, write_stats


def stats_when(arbiter, predicate, what: str) -> dict:
    def ready():
        stats = read_stats(arbiter.run_dir, 0)
        return stats if stats is not None and predicate(stats) else None
    return wait_until(ready, 10, what=what)


def partition_stats(stats: dict, topic: str, partition: int) -> dict:
    return next(p for p in stats["partitions"] if (p["topic"], p["partition"]) == (topic, partition))


def test_records_and_bytes_in_and_out_are_counted_exactly(start_worker, arbiter):
    worker = start_worker(metrics_port=9, log={"flush_fsync": True})
    batches = [make_batch(f"b{i}", count=5 + i) for i in range(4)]  # 5 + 6 + 7 + 8 = 26 records
    for batch in batches:
        assert arbiter.call(0, produce_request("orders", 1, batch))[0].error_code == 0
    _header, relayed = arbiter.call(0, fetch_request("orders", 1, 0, max_bytes=1 << 20))  # everything
    assert len(relayed.payload) == sum(map(len, batches))
    client = TcpClient(worker.port)
    client.send(fetch_request("orders", 1, 7), 1)  # offset 7 is in the second batch: 6 + 7 + 8 records
    header, tcp = client.response(ApiKey.FETCH)
    client.close()
    assert header.error_code == 0 and len(tcp.payload) == sum(map(len, batches[1:]))

    stats = stats_when(arbiter, lambda s: partition_stats(s, "orders", 1)["fetched_records"] == 26 + 21,
                       "the fetches in the stats file")
    counted = partition_stats(stats, "orders", 1)
    stored = sum(map(len, batches))
    assert counted == {"topic": "orders", "partition": 1, "produced_records": 26, "produced_bytes": stored,
                       "duplicate_records": 0, "fetched_records": 47,
                       "fetched_bytes": stored + len(tcp.payload),
                       "flushes": 4, "flushed_bytes": stored, "log_start_offset": 0, "high_watermark": 26,
                       "size_bytes": stored, "segments": 1, "damaged_ranges": 0, "damaged_records": 0,
                       "writes_refused": 0}
    assert partition_stats(stats, "orders", 0)["produced_records"] == 0
    requests = {(api_key, transport): n for api_key, transport, n in stats["requests"]}
    assert requests == {(ApiKey.PRODUCE, "zmq"): 4, (ApiKey.FETCH, "zmq"): 1, (ApiKey.FETCH, "tcp"): 1}
    assert Histogram.from_json(stats["produce_latency"]).count == 4
    fetches = {(t, parked): Histogram.from_json(h).count for t, parked, h in stats["fetch_latency"]}
    assert fetches == {("zmq", False): 1, ("zmq", True): 0, ("tcp", False): 1, ("tcp", True): 0}
    flushes = Histogram.from_json(stats["flush_duration"])
    syncs = Histogram.from_json(stats["fsync_duration"])
    assert flushes.count == syncs.count == 4 and flushes.sum >= syncs.sum > 0
    assert stats["errors"] == [] and stats["pid"] == worker.pid and stats["connections"] == 0
    assert stats["cpu_seconds"] > 0 and stats["resident_bytes"] > 0


def test_errors_are_counted_by_request_and_code_and_a_long_poll_is_measured_as_parked(start_worker, arbiter):
    start_worker(metrics_port=9)
    assert arbiter.call(0, produce_request("orders", 7, make_batch("x")))[0].error_code == 6
    assert arbiter.call(0, produce_request("orders", 0, b"not a batch"))[0].error_code != 0
    assert arbiter.call(0, fetch_request("orders", 0, 99))[0].error_code == 5  # out of range
    header, body = arbiter.call(0, fetch_request("orders", 0, 0, max_wait_ms=300))  # waits, then empty
    assert header.error_code == 0 and not body.payload
    stats = stats_when(arbiter, lambda s: s["errors"] and Histogram.from_json(
        next(h for t, parked, h in s["fetch_latency"] if (t, parked) == ("zmq", True))).count == 1,
        "the long poll in the stats file")
    errors = {(api_key, code): n for api_key, code, n in stats["errors"]}
    assert errors[ApiKey.PRODUCE, 6] == 1 and errors[ApiKey.FETCH, 5] == 1
    assert sum(errors.values()) == 3
    parked = next(Histogram.from_json(h) for t, p, h in stats["fetch_latency"] if (t, p) == ("zmq", True))
    assert parked.sum >= 0.3


def fail_reading_slices() -> None:
    """In the worker: reading a fetch response's slice for the ZeroMQ path fails, like a disk."""
    import hpbroker.workers.worker as worker_module

    def pread_full(*_args):
        raise OSError(errno.EIO, "Input/output error")

    worker_module.pread_full = pread_full


def test_a_fetch_whose_slice_cannot_be_read_counts_as_its_error_not_as_records_handed_out(start_worker,
                                                                                         arbiter):
    start_worker(metrics_port=9, child_setup=fail_reading_slices)
    assert arbiter.call(0, produce_request("orders", 0, make_batch("x", count=4)))[0].error_code == 0
    header, body = arbiter.call(0, fetch_request("orders", 0, 0))
    assert header.error_code == StorageError.code and not body.payload
    stats = stats_when(arbiter, lambda s: s["errors"], "the error in the stats file")
    assert stats["errors"] == [[ApiKey.FETCH, StorageError.code, 1]]
    counted = partition_stats(stats, "orders", 0)
    assert (counted["fetched_records"], counted["fetched_bytes"], counted["produced_records"]) == (0, 0, 4)
    fetches = {(t, parked): Histogram.from_json(h).count for t, parked, h in stats["fetch_latency"]}
    assert fetches[("zmq", False)] == 1


def test_every_data_sync_is_measured_without_flush_fsync_too(start_worker, arbiter):
    start_worker(metrics_port=9, log={"flush_fsync": False, "segment_bytes": 512})
    batches = [make_batch(f"r{i}", count=7) for i in range(4)]
    assert all(300 < len(batch) <= 512 for batch in batches)  # each after the first rolls the segment
    for batch in batches:
        assert arbiter.call(0, produce_request("orders", 0, batch))[0].error_code == 0
    stats = stats_when(arbiter, lambda s: partition_stats(s, "orders", 0)["segments"] == 4, "the rolls")
    assert Histogram.from_json(stats["flush_duration"]).count == 4  # the flushes, none synced
    syncs = Histogram.from_json(stats["fsync_duration"])
    assert syncs.count == 3 and syncs.sum > 0  # each roll synced what the flush before it wrote


def test_no_stats_file_without_metrics(start_worker, arbiter):
    start_worker()
    arbiter.call(0, produce_request("orders", 0, make_batch("x")))
    assert os.path.exists(os.path.join(arbiter.run_dir, "worker-0.json"))
    assert not os.path.exists(stats_path(arbiter.run_dir, 0))


def test_a_temporary_file_left_by_a_killed_writer_is_replaced_by_the_next_write(run_dir):
    path = stats_path(run_dir, 3)
    with open(f"{path}.tmp", "w") as f:
        f.write('{"version": 1, "slot": 3, "pi')  # a worker killed while writing
    write_stats(run_dir, 3, {"version": 1, "slot": 3})
    assert sorted(os.listdir(run_dir)) == ["worker-3.stats.json"]
    assert read_stats(run_dir, 3) == {"version": 1, "slot": 3}


def test_a_stats_file_that_cannot_be_written_is_logged_as_such_and_the_heartbeat_goes_on(start_worker,
                                                                                        arbiter, capfd):
    os.mkdir(stats_path(arbiter.run_dir, 0))  # replacing it fails
    start_worker(metrics_port=9)
    err: list[str] = []

    def logged() -> str:
        err.append(capfd.readouterr().err)
        return "".join(err)

    wait_until(lambda: "cannot write the stats file" in logged(), 10, what="the failure logged")
    for _ in range(3):  # heartbeats go on, each failing to write the stats
        beat = os.stat(heartbeat_path(arbiter.run_dir, 0)).st_mtime_ns
        wait_until(lambda beat=beat: os.stat(heartbeat_path(arbiter.run_dir, 0)).st_mtime_ns > beat, 10,
                   what="another heartbeat")
    log = logged()
    assert "cannot write the heartbeat" not in log
    assert log.count("cannot write the stats file") == 1  # once, not every heartbeat
