"""The fetcher's decoding in the compiled core, and the fetcher against a real broker's data port."""

from __future__ import annotations

import pickle

import pytest

from hpbroker.errors import CorruptRecordError
from hpbroker.records import build_batch, decode_records


def _stamped(batch: bytes, base_offset: int) -> bytes:
    return base_offset.to_bytes(8, "little") + batch[8:]


def test_decoded_records_carry_topic_and_partition():
    batch = _stamped(build_batch([b"a", b"b"], keys=[b"k", None], timestamps=7, producer="p"), 40)
    first, second = decode_records(batch, topic="orders", partition=3)
    assert (first.topic, first.partition, first.offset) == ("orders", 3, 40)
    assert (first.key, first.value) == (b"k", b"a")
    assert (second.topic, second.partition, second.offset, second.producer) == ("orders", 3, 41, "p")
    assert "topic='orders', partition=3, offset=40" in repr(first)


def test_records_decoded_without_a_topic_say_so():
    (record,) = decode_records(build_batch([b"v"]))
    assert record.topic is None and record.partition == -1
    assert "topic" not in repr(record)


def test_min_offset_leaves_out_the_records_before_it_across_batches():
    buf = _stamped(build_batch([b"0", b"1", b"2"]), 10) + _stamped(build_batch([b"3", b"4"]), 13)
    assert [r.offset for r in decode_records(buf, min_offset=11)] == [11, 12, 13, 14]
    assert [r.offset for r in decode_records(buf, min_offset=13)] == [13, 14]
    assert decode_records(buf, min_offset=15) == []
    assert [r.value for r in decode_records(buf)] == [b"0", b"1", b"2", b"3", b"4"]


def test_records_left_out_by_min_offset_are_still_checked():
    batch = bytearray(_stamped(build_batch([b"skipped", b"kept"]), 0))
    batch[batch.index(b"skipped")] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        decode_records(bytes(batch), min_offset=1)


def test_records_with_topic_pickle_and_compare_by_where_they_came_from():
    batch = build_batch([b"v"], timestamps=5)
    (tagged,) = decode_records(batch, topic="t", partition=1)
    (other,) = decode_records(batch, topic="t", partition=2)
    assert pickle.loads(pickle.dumps(tagged)) == tagged
    assert pickle.loads(pickle.dumps(tagged)).partition == 1
    assert tagged != other
