"""The partitioning rule of docs/CLIENT.md: pinned values another client must reproduce, and the
compiled send path choosing exactly what the rule says (no broker needed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpbroker.client._accumulator import RecordAccumulator
from hpbroker.client.partitioner import ROUND_ROBIN, STICKY, partition_for_key, partitioner_kind
from hpbroker.records import crc32c


class FixedTopics(RecordAccumulator):
    """An accumulator that knows every topic has ``count`` partitions (no broker)."""

    def __init__(self, count: int, **options) -> None:
        super().__init__("test", **options)
        self.count = count

    def _topic_partition_count(self, topic: str) -> int:
        return self.count


def placed(accumulator: RecordAccumulator) -> list[tuple[int, int]]:
    """(partition, record count) of every batch, in the order drain returns them."""
    ready, _ = accumulator.drain(float("inf"), 1 << 30)
    return [(queue.partition, sum(b.record_count for b in batches)) for queue, batches in ready]


@pytest.mark.parametrize(("key", "count", "partition"), [
    (b"123456789", 12, 3),  # CRC32C 0xE3069283 = 3808858755
    (b"123456789", 7, 2),
    (b"user-42", 12, 2),  # CRC32C 0x3191250E = 831595790
    (b"orders", 10, 6),  # CRC32C 0x09A7C08A = 161988746
    (b"", 12, 0),  # an empty key is a key, with CRC 0
    (b"anything", 1, 0),
])
def test_pinned_key_partitions(key, count, partition):
    assert partition_for_key(key, count) == partition


@given(st.binary(max_size=300), st.integers(1, 10_000))
def test_partition_is_crc32c_of_the_key_modulo_the_count(key, count):
    assert partition_for_key(key, count) == crc32c(key) % count
    assert partition_for_key(bytearray(key), count) == partition_for_key(memoryview(key), count)


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="not str"):
        partition_for_key("k", 3)
    with pytest.raises(ValueError, match=r"partition count 0 must be in \[1, "):
        partition_for_key(b"k", 0)
    with pytest.raises(ValueError, match="unknown partitioner 'hash'"):
        partitioner_kind("hash")


def test_the_send_path_places_keyed_records_by_the_rule():
    accumulator = FixedTopics(7)
    keys = [b"key-%d" % i for i in range(200)]
    for key in keys:
        accumulator.send("t", b"v", key)
    expected = {}
    for key in keys:
        expected[partition_for_key(key, 7)] = expected.get(partition_for_key(key, 7), 0) + 1
    assert dict(placed(accumulator)) == expected


def test_sticky_fills_a_batch_then_moves_to_the_next_partition():
    accumulator = FixedTopics(3, batch_bytes=1024, partitioner=partitioner_kind(STICKY))
    for _ in range(60):  # about 8 records of 106 bytes per 1 KiB batch
        accumulator.send("t", bytes(100))
    ready, _ = accumulator.drain(float("inf"), 1 << 30)
    batches = sorted((b.batch_id, q.partition) for q, bs in ready for b in bs)
    order = [partition for _, partition in batches]
    assert all(b == (a + 1) % 3 for a, b in zip(order, order[1:], strict=False)), order
    assert len(order) >= 7


def test_a_lingered_batch_also_moves_sticky_records_on():
    accumulator = FixedTopics(2, linger_ms=0)
    accumulator.send("t", b"a")
    first = placed(accumulator)
    accumulator.send("t", b"b")
    second = placed(accumulator)
    assert first[0][0] != second[0][0]


def test_round_robin_sends_each_keyless_record_to_the_next_partition():
    accumulator = FixedTopics(4, partitioner=partitioner_kind(ROUND_ROBIN))
    for _ in range(8):
        accumulator.send("t", b"v")
    assert sorted(placed(accumulator)) == [(0, 2), (1, 2), (2, 2), (3, 2)]


@pytest.mark.parametrize("count", [2**31, 2**32, 2**32 + 3])
def test_a_partition_count_beyond_the_wire_range_is_refused(count):
    """2**32 would be a division by zero in the unsigned 32-bit modulo."""
    with pytest.raises(ValueError, match=r"must be in \[1, 2147483647\]"):
        partition_for_key(b"k", count)


def test_the_largest_partition_count_works():
    assert partition_for_key(b"123456789", 2**31 - 1) == 0xE3069283 % (2**31 - 1)


def test_a_none_key_is_no_key_and_has_no_partition():
    """docs/CLIENT.md: a null key is no key, placed by the partitioner setting, not by the key rule."""
    with pytest.raises(TypeError, match="None is no key"):
        partition_for_key(None, 3)
