"""The broker's Prometheus endpoint (``hpbroker serve --metrics-port``), scraped while records flow
through a real broker: exact counts in and out, latencies, flushes, restarts, errors, and a bad
request that changes nothing."""

from __future__ import annotations

import os
import signal
import struct
import sys

import pytest
from harness import BROKER_TEST_ENV, BrokerProcess, Client, free_ports, wait_until
from scrape import get, scrape

from hpbroker import Consumer, Producer, TopicPartition, protocol
from hpbroker.workers.ownership import owner_slot

WORKERS = 2
TOPIC = "metered"
PER_PARTITION = 500
VALUE = b"v" * 100


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """A broker with 2 workers and its metrics on the port after its data ports; a topic of 2
    partitions with PER_PARTITION records each, all consumed over the data ports and once more
    over ZeroMQ."""
    root = tmp_path_factory.mktemp("metrics")
    port = free_ports(WORKERS + 2)
    metrics_port = port + WORKERS + 1
    argv = [sys.executable, "-m", "hpbroker.cli", "serve", "--port", str(port), "--fetch-port", str(port + 1),
            "--workers", str(WORKERS), "--data-dir", str(root / "data"), "--host", "127.0.0.1",
            "--metrics-port", str(metrics_port)]
    process = BrokerProcess(argv, root / "broker.log", BROKER_TEST_ENV)
    client = Client(port)
    try:
        process.wait_for_log(rf"all {WORKERS} workers serving", timeout_s=20)
        header, _ = client.request(protocol.CreateTopicRequest(TOPIC, 2))
        assert header.error_code == 0, header
        yield process, client, port, metrics_port, root / "data"
    finally:
        client.close()
        status = process.stop()
        assert status == 0, process.log()


@pytest.fixture(scope="module")
def flowed(broker):
    """Produce, consume over the data ports, fetch over ZeroMQ; what the test can know exactly."""
    _process, client, port, metrics_port, data_dir = broker
    bootstrap = f"127.0.0.1:{port}"
    with Producer(bootstrap, linger_ms=5) as producer:
        for _ in range(PER_PARTITION):
            for partition in (0, 1):
                producer.send(TOPIC, VALUE, partition=partition)
        producer.flush()
    sizes = {p: os.path.getsize(data_dir / f"{TOPIC}-{p}" / "00000000000000000000.log") for p in (0, 1)}
    with Consumer(bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=1000) as consumer:
        consumer.assign([TopicPartition(TOPIC, p) for p in (0, 1)])
        consumed = sum(1 for _ in consumer)
        connected = scrape(metrics_port).total("hpbroker_data_port_connections")
    assert consumed == 2 * PER_PARTITION
    zmq_bytes = {}
    for partition in (0, 1):
        header, response = client.request(protocol.FetchRequest(TOPIC, partition, 0, max_bytes=1 << 20))
        assert header.error_code == 0
        zmq_bytes[partition] = len(response.payload)
    return {"sizes": sizes, "zmq_bytes": zmq_bytes, "connections_while_consuming": connected}


def settled(metrics_port: int, predicate, what: str):
    """The first scrape that satisfies ``predicate`` (the workers report every heartbeat)."""
    def satisfied():
        metrics = scrape(metrics_port)
        return metrics if predicate(metrics) else None
    return wait_until(satisfied, 10, what=what)


def test_records_and_bytes_in_and_out_match_what_flowed_exactly(broker, flowed):
    *_, metrics_port, _data_dir = broker
    sizes = flowed["sizes"]
    metrics = settled(metrics_port, lambda s: s.total("hpbroker_fetched_records_total") == 4 * PER_PARTITION,
                      "the fetches counted")
    for p in (0, 1):
        labels = {"topic": TOPIC, "partition": p}
        assert metrics.value("hpbroker_produced_records_total", **labels) == PER_PARTITION
        assert metrics.value("hpbroker_produced_bytes_total", **labels) == sizes[p]
        assert metrics.value("hpbroker_fetched_records_total", **labels) == 2 * PER_PARTITION
        assert flowed["zmq_bytes"][p] == sizes[p]
        assert metrics.value("hpbroker_fetched_bytes_total", **labels) == 2 * sizes[p]
        assert metrics.value("hpbroker_log_high_watermark", **labels) == PER_PARTITION
        assert metrics.value("hpbroker_log_start_offset", **labels) == 0
        assert metrics.value("hpbroker_log_size_bytes", **labels) == sizes[p]
        assert metrics.value("hpbroker_log_segments", **labels) == 1
        assert metrics.value("hpbroker_log_flushed_bytes_total", **labels) == sizes[p]
        assert metrics.value("hpbroker_log_flushes_total", **labels) > 0
    assert metrics.value("hpbroker_workers", state="serving") == WORKERS
    assert metrics.value("hpbroker_broker_info", broker_id=0, version="0.1.0") == 1
    assert flowed["connections_while_consuming"] >= 1
    assert metrics.value("hpbroker_frontend_connections") >= 1  # the test's own client


def test_latency_histograms_and_flush_times_have_counts(broker, flowed):
    *_, metrics_port, _data_dir = broker
    metrics = settled(metrics_port, lambda s: s.total("hpbroker_fetched_records_total") == 4 * PER_PARTITION,
                      "the fetches counted")
    produces = metrics.total("hpbroker_requests_total", request="produce")
    assert produces > 0
    assert metrics.total("hpbroker_produce_latency_seconds_count") == produces  # acks=1: each answered
    assert metrics.total("hpbroker_fetch_latency_seconds_count", transport="tcp") > 0
    assert metrics.total("hpbroker_fetch_latency_seconds_count", transport="zmq") >= 2
    assert metrics.total("hpbroker_produce_latency_seconds_sum") > 0
    for slot in range(WORKERS):  # every topic's partitions (the producers' _audit topic too)
        flushes = sum(value for labels, value in metrics.series("hpbroker_log_flushes_total").items()
                      if owner_slot(dict(labels)["topic"], int(dict(labels)["partition"]), WORKERS) == slot)
        assert metrics.value("hpbroker_flush_duration_seconds_count", worker=slot) == flushes
        assert metrics.value("hpbroker_fsync_duration_seconds_count", worker=slot) == flushes  # flush_fsync
    assert metrics.total("hpbroker_fsync_duration_seconds_sum") > 0
    assert metrics.types["hpbroker_produce_latency_seconds"] == "histogram"


def test_errors_are_counted_by_code_where_they_are_answered(broker, flowed):
    _process, client, _port, metrics_port, _data_dir = broker
    header, _ = client.request(protocol.ProduceRequest("no-such-topic", 0, payload=b""))
    assert header.error_code == 6  # answered by the front-end
    header, _ = client.request(protocol.FetchRequest(TOPIC, 1, 10 * PER_PARTITION, max_wait_ms=0))
    assert header.error_code == 5  # answered by the worker: offset out of range
    slot = owner_slot(TOPIC, 1, WORKERS)
    metrics = settled(metrics_port, lambda s: s.total("hpbroker_request_errors_total", code=5) >= 1,
                      "the worker's error counted")
    assert metrics.value("hpbroker_frontend_request_errors_total", request="produce", code=6,
                         error="UnknownTopicOrPartitionError") >= 1
    assert metrics.value("hpbroker_request_errors_total", worker=slot, request="fetch", code=5,
                         error="OffsetOutOfRangeError") == 1


def test_requests_with_unknown_api_keys_are_counted_in_one_series(broker, flowed):
    _process, client, _port, metrics_port, _data_dir = broker
    invented = range(1000, 1040)
    for api_key in invented:
        head = bytearray(protocol.encode_request(protocol.DeleteTopicRequest("t"), api_key)[0])
        struct.pack_into("<H", head, 0, api_key)
        client.socket.send(bytes(head))
    for api_key in invented:  # each answered, with error 9 (UnsupportedVersionError)
        frames = client.socket.recv_multipart() if client.socket.poll(5000) else None
        assert frames is not None, f"no answer to api key {api_key}"
    series = scrape(metrics_port).series("hpbroker_frontend_request_errors_total")
    unknown = {labels: value for labels, value in series.items() if dict(labels)["request"] not in
               {"produce", "fetch", "list_offsets", "metadata", "create_topic", "delete_topic",
                "alter_topic_config"}}
    assert len(unknown) == 1, unknown
    (labels, count), = unknown.items()
    assert dict(labels)["request"] == "unknown" and count == len(invented)


def test_the_process_start_time_is_the_arbiter_s_as_the_kernel_recorded_it(broker):
    process, *_, metrics_port, _data_dir = broker
    with open(f"/proc/{process.process.pid}/stat") as f:  # the arbiter: the process the test started
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
    with open("/proc/stat") as f:
        boot_time_s = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    expected = boot_time_s + start_ticks / os.sysconf("SC_CLK_TCK")
    assert scrape(metrics_port).value("process_start_time_seconds") == pytest.approx(expected, abs=1e-6)


def test_a_bad_path_is_404_and_the_broker_goes_on(broker, flowed):
    _process, client, _port, metrics_port, _data_dir = broker
    for path in ("/nope", "/metrics/x", "/../"):
        assert get(metrics_port, path)[0] == 404
    assert get(metrics_port, "/healthz")[:3:2] == (200, "2 of 2 workers serving\n")
    header, _ = client.request(protocol.ProduceRequest(TOPIC, 0, payload=b""))
    assert header.error_code != 15  # a worker answers (an empty produce is its error to give)
    assert scrape(metrics_port).value("hpbroker_workers", state="serving") == WORKERS


def test_kill_9_of_a_worker_counts_a_restart_and_its_counters_start_again(broker, flowed):
    process, _client, _port, metrics_port, _data_dir = broker
    slot = owner_slot(TOPIC, 0, WORKERS)
    before = settled(metrics_port, lambda s: s.value("hpbroker_produced_records_total", topic=TOPIC,
                                                     partition=0) == PER_PARTITION, "the produces counted")
    assert before.value("hpbroker_worker_restarts_total", worker=slot) == 0
    started = before.value("hpbroker_worker_start_time_seconds", worker=slot)
    victim = process.worker_pids()[slot]
    os.kill(victim, signal.SIGKILL)
    after = settled(metrics_port, lambda s: s.value("hpbroker_worker_restarts_total", worker=slot) == 1
                    and s.value("hpbroker_worker_serving", worker=slot) == 1
                    and s.value("hpbroker_log_high_watermark", topic=TOPIC, partition=0) is not None,
                    "the slot restarted and serving")
    assert process.worker_pids()[slot] != victim
    assert after.value("hpbroker_worker_start_time_seconds", worker=slot) > started
    assert after.value("hpbroker_produced_records_total", topic=TOPIC, partition=0) == 0  # a reset
    assert after.value("hpbroker_log_high_watermark", topic=TOPIC, partition=0) == PER_PARTITION  # kept
    assert after.value("hpbroker_worker_restarts_total", worker=1 - slot) == 0
