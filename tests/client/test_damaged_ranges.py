"""Damage to records that reached the disk, with real broker processes: a flipped byte below the
recovery point and a segment file missing from the middle of a partition cost only their own
records.  Every valid batch after them is served, a fetch that reaches them gets error 18 naming
where reading goes on, a consumer stops there by default or skips on request, and no offset is
ever handed out twice."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from harness import free_ports, start_broker, wait_until
from scrape import scrape

from hpbroker import Consumer, TopicPartition, protocol
from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.errors import DamagedRangeError
from hpbroker.records import build_batch, scan_batches

TOPIC = "damaged"
TP = TopicPartition(TOPIC, 0)
RECORDS_PER_BATCH = 100


class Broker:
    """One broker of the test's own, restartable on the same ports and data directory."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.data_dir = tmp_path / "data"
        self.starts = 0
        port = free_ports(3)
        self.metrics_port = port + 2
        self.config = tmp_path / "broker.toml"
        self.config.write_text(f"[broker]\nmetrics_port = {self.metrics_port}\n")
        self.process, self.port = start_broker(self.data_dir, self._log_path(), workers=1, port=port,
                                               config=self.config)

    def _log_path(self) -> Path:
        self.starts += 1
        return self.tmp_path / f"broker-{self.starts}.log"

    def restart(self) -> None:
        self.process, _ = start_broker(self.data_dir, self._log_path(), workers=1, port=self.port,
                                       config=self.config)

    def raw_fetch(self, offset: int):
        """A FetchRequest over ZeroMQ: (header, response), errors not raised."""
        connection = BrokerConnection(BrokerAddress("127.0.0.1", self.port))
        try:
            response = connection.wait_for(connection.send(protocol.FetchRequest(TOPIC, 0, offset)), 10.0)
            return response.header, response.body
        finally:
            connection.close()

    def damaged_gauges(self) -> tuple[float | None, float | None]:
        """``hpbroker_log_damaged_ranges`` and ``_records`` of the partition, once reported."""
        labels = {"topic": TOPIC, "partition": 0}

        def reported():
            metrics = scrape(self.metrics_port)
            ranges = metrics.value("hpbroker_log_damaged_ranges", **labels)
            return ranges is not None and ranges > 0 and (ranges, metrics.value(
                "hpbroker_log_damaged_records", **labels))
        return wait_until(reported, timeout_s=20, what="the damaged-range gauges")

    def kill_9(self) -> None:
        """An unclean stop: the workers and the arbiter killed, nothing closed."""
        for pid in [*self.process.worker_pids().values(), self.process.process.pid]:
            os.kill(pid, signal.SIGKILL)
        self.process.process.wait(timeout=10)
        self.process.stop()

    def call(self, message: protocol.Message):
        connection = BrokerConnection(BrokerAddress("127.0.0.1", self.port))
        try:
            return connection.call(message)
        finally:
            connection.close()

    def produce(self, first_batch: int, batches: int) -> list[int]:
        """Produce ``batches`` acknowledged batches; the base offset of each."""
        offsets = []
        for b in range(first_batch, first_batch + batches):
            values = [b"batch%d-record%d" % (b, i) for i in range(RECORDS_PER_BATCH)]
            response = self.call(protocol.ProduceRequest(TOPIC, 0, payload=build_batch(values)))
            offsets.append(response.base_offset)
        return offsets

    @property
    def partition_dir(self) -> Path:
        return self.data_dir / f"{TOPIC}-0"


@pytest.fixture
def broker(tmp_path):
    broker = Broker(tmp_path)
    try:
        yield broker
    finally:
        broker.process.stop()


def consume_all(port: int, end: int, **settings) -> tuple[list, list[DamagedRangeError]]:
    """Every record up to offset ``end`` from the start; the DamagedRangeErrors met on the way
    (each raised once: with ``skip_damaged_ranges`` none is)."""
    records, errors = [], []
    with Consumer(f"127.0.0.1:{port}", auto_offset_reset="earliest", fetch_max_wait_ms=100,
                  **settings) as consumer:
        consumer.assign([TP])
        for _ in range(400):
            if consumer.position(TP) >= end:
                break
            try:
                for batch in consumer.poll(timeout_ms=500).values():
                    records.extend(batch)
            except DamagedRangeError as e:
                errors.append(e)
                if len(errors) > 3:
                    break
        skipped = consumer.damaged_records_skipped
    return records, errors, skipped


def values_of(batches: range) -> list[bytes]:
    return [b"batch%d-record%d" % (b, i) for b in batches for i in range(RECORDS_PER_BATCH)]


def test_a_flipped_byte_below_the_recovery_point_costs_only_its_batch(broker):
    broker.call(protocol.CreateTopicRequest(TOPIC, 1))
    broker.produce(0, 30)
    broker.process.stop()  # a clean stop: the recovery point is the log end, 3,000
    broker.restart()
    broker.produce(30, 10)
    broker.kill_9()  # then an unclean stop: the next open recovers the active segment in full
    segment = broker.partition_dir / "00000000000000000000.log"
    data = segment.read_bytes()
    scan = scan_batches(data)
    victim = 12  # offsets 1200..1299, far below the recovery point
    position = scan.positions[victim] + scan.sizes[victim] - 5
    with open(segment, "r+b") as f:
        f.seek(position)
        f.write(bytes([data[position] ^ 0xFF]))

    broker.restart()
    log = broker.process.log()
    assert "ERROR" in log and "damaged range" in log
    assert f"{segment}: offsets [1200, 1300) at positions [{scan.positions[victim]}, " in log
    assert segment.stat().st_size == len(data), "no byte that reached the disk is cut"
    assert broker.produce(40, 1) == [4000], "the log end did not move back: no offset reused"
    assert broker.damaged_gauges() == (1, 100)
    header, response = broker.raw_fetch(1250)
    assert (header.error_code, response.high_watermark, response.log_start_offset) == (18, 4100, 0)
    assert bytes(response.payload) == protocol.DAMAGED_RANGE_PAYLOAD.pack(1300)

    records, errors, _ = consume_all(broker.port, 4100)
    assert [r.offset for r in records] == list(range(1200)), "by default a consumer stops at the damage"
    assert errors and (errors[0].first_offset, errors[0].next_offset, errors[0].code) == (1200, 1300, 18)
    assert "positions" in errors[0].message and str(segment) in errors[0].message

    records, errors, skipped = consume_all(broker.port, 4100, skip_damaged_ranges=True)
    assert not errors and skipped == 100
    assert [r.offset for r in records] == [*range(1200), *range(1300, 4100)]
    assert [r.value for r in records] == values_of(range(12)) + values_of(range(13, 41))


def test_a_segment_missing_from_the_middle_is_a_gap_and_later_segments_stay(broker):
    broker.call(protocol.CreateTopicRequest(TOPIC, 1, [protocol.TopicConfigEntry("segment_bytes", "8192")]))
    broker.produce(0, 40)
    broker.process.stop()
    names = sorted(n for n in os.listdir(broker.partition_dir) if n.endswith(".log"))
    assert len(names) >= 4
    missing = int(names[1][:20])
    after = int(names[2][:20])
    for suffix in (".log", ".index", ".timeindex"):
        os.unlink(broker.partition_dir / f"{missing:020d}{suffix}")

    broker.restart()
    assert sorted(n for n in os.listdir(broker.partition_dir) if n.endswith(".log")) == \
        [n for n in names if n != names[1]], "no later segment is deleted"
    assert f"offsets [{missing}, {after})" in broker.process.log()
    assert broker.produce(40, 1) == [4000], "offsets after the gap are never handed out again"
    assert broker.damaged_gauges() == (1, after - missing)

    records, errors, _ = consume_all(broker.port, 4100)
    assert [r.offset for r in records] == list(range(missing))
    assert errors and (errors[0].first_offset, errors[0].next_offset) == (missing, after)

    records, errors, skipped = consume_all(broker.port, 4100, skip_damaged_ranges=True)
    assert not errors and skipped == after - missing
    assert [r.offset for r in records] == [*range(missing), *range(after, 4100)]
