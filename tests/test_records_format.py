"""The record batch format: golden bytes, round trips, and every way a batch can be refused."""

from __future__ import annotations

import contextlib
import struct

import doc_tables
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpbroker import _core
from hpbroker.errors import CorruptRecordError, InvalidRecordError, RecordTooLargeError
from hpbroker.records import (
    CODEC_LZ4,
    CODEC_NONE,
    HEADER_SIZE,
    BatchBuilder,
    build_batch,
    codec_for_name,
    crc32c,
    decode_records,
    iter_records,
    read_header,
    scan_batches,
    stamp_batch,
    validate_batches,
)

CODECS = pytest.mark.parametrize("codec", [CODEC_NONE, CODEC_LZ4], ids=["none", "lz4"])

GOLDEN_HEX = (
    "0000000000000000"  # base_offset 0
    "45000000"  # batch_length 69
    "00000000"  # leader_epoch 0
    "538dbaa8"  # crc 0xa8ba8d53
    "01"  # magic 1
    "00"  # attributes: no compression
    "06"  # producer name length 6
    "00"  # reserved
    "01000000"  # last_offset_delta 1
    "02000000"  # record_count 2
    "0068e5cf8b010000"  # first_timestamp 1700000000000
    "0568e5cf8b010000"  # max_timestamp 1700000000005
    "2a00000000000000"  # base_sequence 42
    "676f6c64656e"  # "golden"
    "0c" "00" "00" "02" "6b" "03" "7631" "01" "01" "68" "02" "78"  # record 0
    "05" "0a" "01" "00" "00" "00"  # record 1: ts delta 5 (zigzag 10), offset delta 1, null key/value
)


def _golden_batch() -> bytes:
    return build_batch(
        [b"v1", None],
        keys=[b"k", None],
        timestamps=[1_700_000_000_000, 1_700_000_000_005],
        headers=[[("h", b"x")], None],
        producer="golden",
        base_sequence=42,
    )


def _encode_by_hand() -> bytes:
    """The golden batch written field by field from docs/FORMAT.md, independently of _core."""
    record0 = bytes([0x00, 0x00, 0x02]) + b"k" + bytes([0x03]) + b"v1" + bytes([0x01, 0x01]) + b"h"
    record0 += bytes([0x02]) + b"x"
    record1 = bytes([0x0A, 0x01, 0x00, 0x00, 0x00])
    records = bytes([len(record0)]) + record0 + bytes([len(record1)]) + record1
    after_crc = struct.pack("<BBBBiiqqq", 1, 0, 6, 0, 1, 2, 1_700_000_000_000, 1_700_000_000_005, 42)
    after_crc += b"golden" + records
    crc = crc32c(after_crc)
    batch_length = 4 + 4 + len(after_crc)
    return struct.pack("<qiiI", 0, batch_length, 0, crc) + after_crc


def test_golden_bytes_match_the_documented_layout():
    batch = _golden_batch()
    assert batch.hex() == GOLDEN_HEX
    assert batch == _encode_by_hand()
    assert read_header(batch).crc == 0xA8BA8D53


def test_golden_batch_decodes_to_its_records():
    first, second = decode_records(_golden_batch())
    assert (first.offset, first.timestamp, first.key, first.value) == (0, 1_700_000_000_000, b"k", b"v1")
    assert first.headers == (("h", b"x"),)
    assert (first.producer, first.sequence) == ("golden", 42)
    assert (second.offset, second.timestamp, second.key, second.value) == (1, 1_700_000_000_005, None, None)
    assert second.headers == () and second.sequence == 43


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"123456789", 0xE3069283),
        (bytes(32), 0x8A9136AA),
        (b"\xff" * 32, 0x62A8AB43),
        (bytes(range(32)), 0x46DD794E),
        (b"", 0),
    ],
)
def test_crc32c_matches_published_check_values(data, expected):
    assert crc32c(data) == expected
    assert _core._crc32c_table(data) == expected


@given(st.binary(max_size=3000), st.integers(0, 3000))
def test_crc32c_hardware_and_table_paths_agree_and_chain(data, cut):
    cut = min(cut, len(data))
    assert crc32c(data) == _core._crc32c_table(data)
    assert crc32c(data[cut:], crc32c(data[:cut])) == crc32c(data)


@pytest.mark.parametrize("size", [767, 768, 769, 24_575, 24_576, 24_577, 100_003, 1 << 20])
@pytest.mark.parametrize("skew", [0, 3])
def test_crc32c_long_buffer_paths_agree_with_the_table(size, skew):
    import os

    data = memoryview(os.urandom(size + skew))[skew:]  # unaligned start when skew > 0
    assert crc32c(data) == _core._crc32c_table(data)
    half = size // 2
    assert crc32c(data[half:], crc32c(data[:half])) == crc32c(data)


def test_header_fields_are_exposed():
    batch = build_batch([b"a", b"bb", b"ccc"], timestamps=[10, 30, 20], producer="p", base_sequence=5)
    header = read_header(batch)
    assert header.record_count == 3 and header.last_offset_delta == 2
    assert (header.first_timestamp, header.max_timestamp) == (10, 30)
    assert header.size == len(batch) and header.next_offset == 3 and header.producer == "p"
    assert header.records_position == HEADER_SIZE + 1


def test_read_header_with_the_producer_name_cut_off_reports_none():
    batch = build_batch([b"x"], producer="a-long-producer-name")
    assert read_header(batch[:HEADER_SIZE]).producer is None


def test_read_header_refuses_short_and_bad_magic():
    batch = build_batch([b"x"])
    with pytest.raises(CorruptRecordError, match="needs 56 bytes"):
        read_header(batch[:30])
    broken = bytearray(batch)
    broken[20] = 9
    with pytest.raises(CorruptRecordError, match="unknown magic 9"):
        read_header(broken)


record_strategy = st.tuples(
    st.one_of(st.none(), st.binary(max_size=300)),  # key
    st.one_of(st.none(), st.binary(max_size=2000)),  # value
    st.integers(0, 2**41),  # timestamp
    st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))), max_size=3),
)


@CODECS
@settings(max_examples=150, deadline=None)
@given(records=st.lists(record_strategy, min_size=1, max_size=60), producer=st.text(max_size=20))
def test_build_then_decode_round_trips(codec, records, producer):
    keys = [r[0] for r in records]
    values = [r[1] for r in records]
    stamps = [r[2] for r in records]
    headers = [r[3] for r in records]
    batch = build_batch(values, keys=keys, timestamps=stamps, headers=headers, producer=producer,
                        compression=codec, base_sequence=1000)
    result = validate_batches(batch)
    assert result.record_count == len(records)
    decoded = decode_records(batch)
    assert [(r.key, r.value, r.timestamp, list(r.headers)) for r in decoded] == [
        (k, v, t, h) for k, v, t, h in records
    ]
    assert [r.offset for r in decoded] == list(range(len(records)))
    assert [r.sequence for r in decoded] == list(range(1000, 1000 + len(records)))
    assert {r.producer for r in decoded} == {producer}
    assert list(iter_records(batch + batch)) == decoded + decoded


@CODECS
def test_batch_builder_refuses_a_record_that_would_overflow(codec):
    builder = BatchBuilder("p", codec, max_bytes=HEADER_SIZE + 1 + 300)
    assert builder.append(b"x" * 100, timestamp=1)
    assert builder.append(b"y" * 100, timestamp=2)
    before = builder.size_in_bytes
    assert not builder.append(b"z" * 100, timestamp=3)
    assert builder.size_in_bytes == before and builder.record_count == 2
    batch = builder.build(base_sequence=7)
    assert [r.value for r in decode_records(batch)] == [b"x" * 100, b"y" * 100]
    assert builder.record_count == 0
    assert builder.append(b"z" * 1000, timestamp=3), "an empty builder takes any record"


def test_batch_builder_stamps_now_when_no_timestamp_given():
    import time

    builder = BatchBuilder()
    before = int(time.time() * 1000)
    builder.append(b"x")
    (record,) = decode_records(builder.build())
    assert before <= record.timestamp <= int(time.time() * 1000) + 1


def test_bad_builder_input_gets_clear_errors():
    with pytest.raises(TypeError, match="not str"):
        build_batch(["text"])
    with pytest.raises(ValueError, match="at least one record"):
        build_batch([])
    with pytest.raises(ValueError, match="2 timestamps for 1 values"):
        build_batch([b"x"], timestamps=[1, 2])
    with pytest.raises(ValueError, match="negative"):
        build_batch([b"x"], timestamps=-5)
    with pytest.raises(ValueError, match="at most 255"):
        BatchBuilder("x" * 256)
    with pytest.raises(ValueError, match="unknown compression codec"):
        BatchBuilder("p", 7)
    with pytest.raises(ValueError, match="empty batch"):
        BatchBuilder().build()
    with pytest.raises(ValueError, match="unknown compression"):
        codec_for_name("zstd")
    assert codec_for_name("LZ4") == CODEC_LZ4 and codec_for_name(None) == CODEC_NONE


def test_stamping_the_base_offset_keeps_the_batch_valid():
    batch = bytearray(build_batch([b"a", b"b"]))
    stamp_batch(batch, 0, 1234, leader_epoch=7)
    validate_batches(batch)
    header = read_header(batch)
    assert (header.base_offset, header.leader_epoch) == (1234, 7)
    assert [r.offset for r in decode_records(batch)] == [1234, 1235]


@CODECS
def test_lz4_batches_store_the_records_compressed(codec):
    values = [b'{"path": "/index.html", "status": 200, "bytes": 5120}'] * 200
    batch = build_batch(values, compression=codec)
    header = read_header(batch)
    assert header.compression == codec
    plain_size = len(build_batch(values))
    assert (len(batch) < plain_size / 5) == (codec == CODEC_LZ4)


def test_validation_rejects_a_flipped_bit_inside_the_crc_range():
    batch = bytearray(build_batch([b"hello world"] * 3))
    batch[-3] ^= 0x01
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        validate_batches(batch)


@settings(max_examples=200, deadline=None)
@given(position=st.integers(8, 200), flip=st.integers(1, 255), codec=st.sampled_from([CODEC_NONE, CODEC_LZ4]))
def test_any_changed_byte_outside_the_stamped_fields_is_refused(position, flip, codec):
    batch = bytearray(build_batch([b"abc" * 20, b"defg" * 10], producer="pp", compression=codec))
    position %= len(batch)
    if position < 8 or 12 <= position < 16:
        return  # base_offset and leader_epoch are the broker's to stamp
    batch[position] ^= flip
    with pytest.raises((CorruptRecordError, InvalidRecordError, RecordTooLargeError)):
        validate_batches(batch)


def _recrc(batch: bytearray) -> bytearray:
    struct.pack_into("<I", batch, 16, crc32c(bytes(batch[20:])))
    return batch


@pytest.mark.parametrize(
    ("field_position", "fmt", "value", "message"),
    [
        (28, "<i", 5, "last_offset_delta 1 does not match record_count 5"),
        (21, "<B", 0x10, "unsupported attributes"),
        (23, "<B", 1, "reserved byte"),
        (40, "<q", 99, "max_timestamp 99 is below"),
        (40, "<q", 10**13, "records reach"),
    ],
)
def test_a_consistent_crc_over_an_inconsistent_header_is_invalid(field_position, fmt, value, message):
    batch = bytearray(build_batch([b"a", b"b"], timestamps=1000))
    struct.pack_into(fmt, batch, field_position, value)
    with pytest.raises(InvalidRecordError, match=message):
        validate_batches(_recrc(batch))


def test_records_that_overrun_their_section_are_invalid():
    batch = bytearray(build_batch([b"abcdef"]))
    records_start = HEADER_SIZE
    batch[records_start] = 0x7F  # record length far past the section
    with pytest.raises(InvalidRecordError, match="runs past the end"):
        validate_batches(_recrc(batch))


def test_oversize_batches_are_refused_by_size():
    batch = build_batch([b"x" * 2000])
    with pytest.raises(RecordTooLargeError, match=f"batch of {len(batch)} bytes exceeds the limit of 1000"):
        validate_batches(batch, max_batch_bytes=1000)
    validate_batches(batch, max_batch_bytes=len(batch))


def test_trailing_bytes_and_empty_buffers_are_refused():
    batch = build_batch([b"x"])
    with pytest.raises(CorruptRecordError, match="header needs 56 bytes, only 20"):
        validate_batches(batch + batch[:20])
    with pytest.raises(CorruptRecordError, match="cut off after 60 bytes"):
        validate_batches(batch + batch[:60])
    with pytest.raises(CorruptRecordError, match="empty record set"):
        validate_batches(b"")
    with pytest.raises(CorruptRecordError, match="below the minimum"):
        validate_batches(batch + bytes(20))


def test_scan_returns_the_longest_valid_prefix():
    a = build_batch([b"a"] * 3, timestamps=5)
    b = build_batch([b"b"] * 2, timestamps=9)
    buf = bytearray(a + b)
    stamp_batch(buf, len(a), 3)
    clean = scan_batches(buf, expected_offset=0)
    assert (clean.valid_bytes, clean.batch_count, clean.record_count) == (len(buf), 2, 5)
    assert (clean.next_offset, clean.max_timestamp, clean.error) == (5, 9, None)
    assert list(clean.positions) == [0, len(a)] and list(clean.sizes) == [len(a), len(b)]
    assert list(clean.base_offsets) == [0, 3] and list(clean.last_offset_deltas) == [2, 1]
    assert list(clean.max_timestamps) == [5, 9]

    torn = scan_batches(bytes(buf[:-4]), expected_offset=0)
    assert (torn.valid_bytes, torn.incomplete, torn.error_code) == (len(a), True, 2)
    zeros = scan_batches(bytes(buf) + bytes(100), expected_offset=0)
    assert (zeros.valid_bytes, zeros.incomplete) == (len(buf), False) and "below the minimum" in zeros.error
    gap = scan_batches(bytes(buf), expected_offset=1)
    assert gap.valid_bytes == 0 and "expected 1" in gap.error
    resumed = scan_batches(bytes(buf), len(a), expected_offset=3)
    assert (resumed.valid_bytes, list(resumed.positions)) == (len(b), [len(a)])


@given(st.binary(max_size=400))
def test_garbage_never_crashes_the_decoders(data):
    scan = scan_batches(data)
    assert 0 <= scan.valid_bytes <= len(data)
    with contextlib.suppress(CorruptRecordError):
        decode_records(data)
    with contextlib.suppress(CorruptRecordError, InvalidRecordError, RecordTooLargeError):
        validate_batches(data)


@given(st.binary(min_size=1, max_size=300), st.integers(0, 400))
def test_random_records_sections_behind_a_valid_crc_are_refused_cleanly(section, count):
    header = struct.pack("<BBBBiiqqq", 1, 0, 0, 0, max(count, 1) - 1, max(count, 1), 0, 0, -1)
    body = header + section
    batch = struct.pack("<qiiI", 0, len(body) + 8, 0, crc32c(body)) + body
    with contextlib.suppress(CorruptRecordError, InvalidRecordError):
        validate_batches(batch)
    with contextlib.suppress(CorruptRecordError):
        decode_records(batch)


def test_records_pickle_and_compare():
    import pickle

    (record,) = decode_records(build_batch([b"v"], keys=[b"k"], timestamps=3, producer="p"))
    assert pickle.loads(pickle.dumps(record)) == record
    assert "value=b'v'" in repr(record)


def test_records_position_counts_the_stored_name_bytes_even_when_cut_off():
    batch = build_batch([b"x"], producer="producer-\u00e9")
    full = read_header(batch)
    cut = read_header(batch[:HEADER_SIZE])
    assert full.producer_length == len("producer-\u00e9".encode()) == cut.producer_length
    assert full.records_position == cut.records_position == HEADER_SIZE + full.producer_length


def test_stamping_needs_only_the_sixteen_byte_prefix():
    prefix = bytearray(build_batch([b"x"])[:16])
    stamp_batch(prefix, 0, 99)
    assert int.from_bytes(prefix[:8], "little") == 99
    with pytest.raises(ValueError, match="no batch header"):
        stamp_batch(bytearray(15), 0, 1)


def test_negative_timestamps_are_invalid():
    batch = bytearray(build_batch([b"a"], timestamps=1000))
    struct.pack_into("<qq", batch, 32, -1, -1)
    with pytest.raises(InvalidRecordError, match="first_timestamp -1 is negative"):
        validate_batches(_recrc(batch))
    # A later record reaching below zero through a negative delta is refused too.
    builder = BatchBuilder()
    builder.append(b"a", timestamp=5)
    builder.append(b"b", timestamp=0)
    late = bytearray(builder.build())
    validate_batches(late)
    record1 = HEADER_SIZE + 1 + 6  # second record: length byte, then its zigzag timestamp delta
    assert late[record1 + 1] == 9  # zigzag(-5)
    late[record1 + 1] = 11  # zigzag(-6): timestamp -1
    with pytest.raises(InvalidRecordError, match="negative timestamp -1"):
        validate_batches(_recrc(late))


@pytest.mark.parametrize("value", [5, 300_000_000, 2.5, [1, 2]])
def test_a_header_value_that_is_not_bytes_like_is_refused(value):
    """bytes(5) is five zero bytes: an int header value would be stored as that, silently."""
    with pytest.raises(TypeError, match="values must be bytes-like or None, not "):
        build_batch([b"v"], headers=[[("count", value)]])
    builder = BatchBuilder("p")
    with pytest.raises(TypeError, match="values must be bytes-like or None"):
        builder.append(b"v", headers=[("count", value)])


def test_the_documents_worked_example_is_the_golden_batch():
    assert doc_tables.hex_dumps("FORMAT.md", "## Worked example") == [_golden_batch()]


def test_the_documents_header_table_decodes_the_golden_batch():
    """Each fixed field at the position, size and type the table gives reads the known value."""
    codes = {"u8": "B", "i32": "i", "u32": "I", "i64": "q"}
    rows = doc_tables.table_rows("FORMAT.md", "## Batch", "position")
    fixed = {row[2]: (int(row[0]), int(row[1]), row[3]) for row in rows if row[1].isdigit()}
    batch = _golden_batch()
    fields = {name: struct.unpack_from("<" + codes[kind], batch, position)[0]
              for name, (position, size, kind) in fixed.items() if struct.calcsize(codes[kind]) == size}
    assert fields == {"base_offset": 0, "batch_length": 69, "leader_epoch": 0, "crc": 0xA8BA8D53, "magic": 1,
                      "attributes": 0, "producer_length": 6, "reserved": 0, "last_offset_delta": 1,
                      "record_count": 2, "first_timestamp": 1_700_000_000_000,
                      "max_timestamp": 1_700_000_000_005, "base_sequence": 42}
    assert max(position + size for position, size, _ in fixed.values()) == HEADER_SIZE
