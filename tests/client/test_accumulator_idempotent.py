"""The compiled accumulator with idempotence (pure logic, no broker): its batches carry the producer
identity and per-partition sequences from 0, a new identity numbers afresh, batch_bytes still
bounds every batch with the identity block counted, and nothing drains before an identity."""

from __future__ import annotations

import pytest

from hpbroker.client._accumulator import RecordAccumulator
from hpbroker.errors import RecordTooLargeError
from hpbroker.records import (
    ATTR_IDEMPOTENT,
    CODEC_LZ4,
    CODEC_NONE,
    decode_records,
    read_header,
    validate_batches,
)


class FixedTopics(RecordAccumulator):
    def __init__(self, count: int = 1, name: str = "acc", **options) -> None:
        super().__init__(name, **options)
        self.count = count

    def _topic_partition_count(self, topic: str) -> int:
        return self.count


def drain_all(accumulator: RecordAccumulator):
    return accumulator.drain(float("inf"), 1 << 30)[0]


def headers_of(payload: bytes):
    scan = validate_batches(payload)
    return scan, [read_header(payload, p) for p in scan.positions]


@pytest.mark.parametrize("codec", [CODEC_NONE, CODEC_LZ4])
def test_batches_carry_the_identity_and_each_partition_counts_from_zero(codec):
    accumulator = FixedTopics(3, "svc", codec=codec, batch_bytes=1024, idempotent=True)
    accumulator.set_producer_identity(42, 3)
    assert (accumulator.producer_id, accumulator.producer_epoch, accumulator.idempotent) == (42, 3, True)
    for i in range(600):
        accumulator.send("t", b"v%05d" % i * 8, partition=i % 3, timestamp=1_700_000_000_000 + i)
    ready = drain_all(accumulator)
    assert sorted(q.partition for q, _ in ready) == [0, 1, 2]
    for queue, batches in ready:
        payload = accumulator.build_payload(batches)
        scan, headers = headers_of(payload)
        assert scan.idempotent_batches == scan.batch_count == len(batches) > 1
        identities = {(h.producer_id, h.producer_epoch, h.attributes & ATTR_IDEMPOTENT) for h in headers}
        assert identities == {(42, 3, 8)}
        assert all(len(b"svc") + 68 == h.records_position for h in headers)
        expected, sequences = 0, []
        for header, batch in zip(headers, batches, strict=True):
            assert header.base_sequence == batch.base_sequence == expected
            assert (batch.producer_id, batch.producer_epoch) == (42, 3)
            sequences.append(header.base_sequence)
            expected += header.record_count
        assert expected == 200 and queue.next_sequence == 200
        records = decode_records(payload)
        assert [r.sequence for r in records] == list(range(200))
        assert [r.value for r in records] == [b"v%05d" % i * 8 for i in range(queue.partition, 600, 3)]
        assert {h.compression for h in headers} == {codec}


def test_a_new_identity_resets_every_partition_s_sequence():
    accumulator = FixedTopics(2, idempotent=True)
    accumulator.set_producer_identity(1, 0)
    for i in range(10):
        accumulator.send("t", b"x", partition=i % 2)
    first = dict(drain_all(accumulator))
    assert [q.next_sequence for q in first] == [5, 5]
    for batches in first.values():
        accumulator.build_payload(batches)
        accumulator.finish(batches)
    accumulator.set_producer_identity(9, 0)
    assert [q.next_sequence for q in first] == [0, 0]
    accumulator.send("t", b"y", partition=1)
    [(queue, [batch])] = drain_all(accumulator)
    payload = accumulator.build_payload([batch])
    header = read_header(payload)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (9, 0, 0)
    assert (batch.producer_id, batch.base_sequence, queue.partition) == (9, 0, 1)


def test_a_batch_keeps_the_identity_it_was_drained_with():
    """A retry resends the first bytes: building after an identity change still uses the old one."""
    accumulator = FixedTopics(idempotent=True)
    accumulator.set_producer_identity(5, 1)
    accumulator.send("t", b"a")
    [(_, batches)] = drain_all(accumulator)
    accumulator.set_producer_identity(5, 2)
    header = read_header(accumulator.build_payload(batches))
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (5, 1, 0)


def test_nothing_drains_before_an_identity_is_set():
    accumulator = FixedTopics(idempotent=True)
    accumulator.send("t", b"a")
    assert (accumulator.producer_id, accumulator.producer_epoch) == (-1, -1)
    with pytest.raises(RuntimeError, match="before set_producer_identity"):
        accumulator.drain(float("inf"), 1 << 20)
    accumulator.set_producer_identity(0, 0)
    [(_, [batch])] = drain_all(accumulator)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (0, 0, 0)


@pytest.mark.parametrize(("pid", "epoch", "message"), [
    (-1, 0, "producer_id -1 must be >= 0"),
    (1, -1, r"producer_epoch -1 must be in \[0, 2\*\*31 - 1\]"),
    (1, 2**31, "producer_epoch 2147483648"),
])
def test_a_bad_identity_is_refused(pid, epoch, message):
    accumulator = FixedTopics(idempotent=True)
    with pytest.raises(ValueError, match=message):
        accumulator.set_producer_identity(pid, epoch)
    assert accumulator.producer_id == -1


def test_a_plain_accumulator_takes_no_identity_and_builds_batches_as_before():
    accumulator = FixedTopics(name="p")
    assert accumulator.header_room == 56 + 1 and not accumulator.idempotent
    with pytest.raises(RuntimeError, match="not idempotent"):
        accumulator.set_producer_identity(1, 0)
    accumulator.send("t", b"a", timestamp=5)
    [(_, [batch])] = drain_all(accumulator)
    payload = accumulator.build_payload([batch])
    header = read_header(payload)
    assert (header.idempotent, header.producer_id, header.producer_epoch) == (False, -1, -1)
    assert header.base_sequence == 0
    assert (batch.producer_id, batch.producer_epoch) == (-1, -1)
    assert payload[56:57] == b"p" and len(payload) == 56 + 1 + 7


def test_batch_bytes_counts_the_identity_block():
    accumulator = FixedTopics(name="n", batch_bytes=1024, idempotent=True)
    assert accumulator.header_room == 56 + 12 + 1
    with pytest.raises(RecordTooLargeError, match="makes a 1025-byte batch on its own"):
        accumulator.send("t", bytes(1024 - 69 - 8 + 1))  # 69 header + 8 record overhead (2-byte lengths)
    accumulator.send("t", bytes(1024 - 69 - 8))  # exactly batch_bytes
    for i in range(200):
        accumulator.send("t", bytes(i))
    accumulator.set_producer_identity(3, 0)
    [(_, batches)] = drain_all(accumulator)
    assert all(b.length <= 1024 for b in batches) and batches[0].length == 1024
    payload = accumulator.build_payload(batches)
    scan = validate_batches(payload, max_batch_bytes=1024)
    assert scan.batch_count == len(batches) and list(scan.sizes)[0] == 1024
    with pytest.raises(ValueError, match="must hold the 69-byte header"):
        FixedTopics(name="n", batch_bytes=69 + 7, idempotent=True)


def test_buffered_bytes_return_to_zero_with_the_larger_header():
    accumulator = FixedTopics(idempotent=True)
    accumulator.set_producer_identity(1, 1)
    for _ in range(50):
        accumulator.send("t", b"x" * 100)
    assert accumulator.buffered_bytes == 50 * 106
    [(_, batches)] = drain_all(accumulator)
    accumulator.build_payload(batches)
    accumulator.finish(batches)
    assert accumulator.buffered_bytes == 0 and accumulator.unfinished_batches == 0


def test_take_expired_takes_only_each_partition_s_batches_opened_by_the_cutoff():
    """Batches that waited too long for an identity leave (to be failed) oldest first; younger
    ones stay, and are drained later with sequences from 0 as if the old ones never were."""
    import time

    accumulator = FixedTopics(2, "svc", batch_bytes=1024, linger_ms=0, idempotent=True)
    accumulator.send("t", b"a" * 700, partition=0)  # batch 1 of partition 0
    accumulator.send("t", b"b" * 700, partition=0)  # does not fit: batch 1 closed, batch 2 opened
    time.sleep(0.01)
    cutoff = time.monotonic()
    time.sleep(0.01)
    accumulator.send("t", b"c" * 700, partition=0)  # batch 3, after the cutoff
    accumulator.send("t", b"d", partition=1)  # open, after the cutoff
    buffered = accumulator.buffered_bytes
    expired = accumulator.take_expired(cutoff)
    assert [(q.partition, [b.record_count for b in batches]) for q, batches in expired] == [(0, [1, 1])]
    batches = expired[0][1]
    assert all(b.base_sequence == -1 and b.producer_id == -1 and b.created_s <= cutoff for b in batches)
    assert accumulator.take_expired(cutoff) == []
    accumulator.finish(batches)
    assert accumulator.buffered_bytes < buffered and accumulator.unfinished_batches == 2
    accumulator.set_producer_identity(5, 0)
    left = drain_all(accumulator)
    assert sorted((q.partition, [(b.base_sequence, b.record_count) for b in bs]) for q, bs in left) == [
        (0, [(0, 1)]), (1, [(0, 1)])]
    queue, muted_batches = left[0]
    accumulator.send("t", b"e", partition=queue.partition)
    queue.muted = True  # a partition with a request in flight: its queued batches expire too
    assert [q.partition for q, _ in accumulator.take_expired(time.monotonic())] == [queue.partition]
