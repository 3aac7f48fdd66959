"""The columnar decoder (hpbroker._columnar) against the reference decoder (hpbroker.records), and
its Arrow arrays (hpbroker.spark.columns).  No Spark, no broker."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpbroker.errors import CorruptRecordError
from hpbroker.records import CODEC_LZ4, CODEC_NONE, build_batch, crc32c, decode_records
from hpbroker.spark.columns import COLUMNS, RECORD_FIELDS, ColumnBuilder, arrow_schema, record_batch

ALL = [name for name, _ in RECORD_FIELDS]


def _stamped(batch: bytes, base_offset: int) -> bytes:
    return base_offset.to_bytes(8, "little") + batch[8:]


def _log(batches: list[tuple[list, dict]]) -> bytes:
    """Batches back to back with consecutive offsets, as a segment holds them."""
    out, offset = b"", 0
    for values, kwargs in batches:
        out += _stamped(build_batch(values, **kwargs), offset)
        offset += len(values)
    return out


def _rows(buf: bytes, start: int = 0, end: int = 2**63 - 1, columns=COLUMNS, **builder_kwargs) -> list[dict]:
    builder = ColumnBuilder(columns, **builder_kwargs)
    schema = arrow_schema(["topic", "partition", *columns])
    position, batches = 0, []
    while position < len(buf):
        position = builder.add(buf, position, start, end)
        batches.append(record_batch(builder.take(), "orders", 7, schema))
    for batch in batches:
        batch.validate(full=True)
    return [row for batch in batches for row in batch.to_pylist()]


def _expected(buf: bytes, start: int = 0, end: int = 2**63 - 1) -> list[dict]:
    return [{"topic": "orders", "partition": 7, "offset": r.offset, "timestamp": r.timestamp,
             "producer": r.producer, "key": r.key, "value": r.value,
             "headers": [{"key": k, "value": v} for k, v in r.headers]}
            for r in decode_records(buf) if start <= r.offset < end]


def _millis(rows: list[dict]) -> list[dict]:
    for row in rows:
        if "timestamp" in row:
            row["timestamp"] = round(row["timestamp"].timestamp() * 1000)
    return rows


record_strategy = st.tuples(
    st.one_of(st.none(), st.binary(max_size=40)),  # key
    st.one_of(st.none(), st.binary(max_size=300)),  # value
    st.integers(0, 2**41),  # timestamp
    st.lists(st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=10))), max_size=3),
)
batch_strategy = st.tuples(st.lists(record_strategy, min_size=1, max_size=25), st.text(max_size=12),
                           st.sampled_from([CODEC_NONE, CODEC_LZ4]))


@settings(max_examples=150, deadline=None)
@given(batches=st.lists(batch_strategy, min_size=1, max_size=5), bounds=st.tuples(st.integers(0, 130),
                                                                                  st.integers(0, 130)),
       max_records=st.integers(1, 40), columns=st.sets(st.sampled_from(COLUMNS), min_size=1))
def test_columns_hold_exactly_what_the_reference_decoder_decodes_in_the_range(batches, bounds, max_records,
                                                                              columns):
    buf = _log([([r[1] for r in records], {"keys": [r[0] for r in records],
                                           "timestamps": [r[2] for r in records],
                                           "headers": [r[3] for r in records], "producer": producer,
                                           "compression": codec})
                for records, producer, codec in batches])
    start, end = min(bounds), max(bounds)
    wanted = tuple(name for name in COLUMNS if name in columns)
    expected = [{k: v for k, v in row.items() if k in ("topic", "partition", *wanted)}
                for row in _expected(buf, start, end)]
    assert _millis(_rows(buf, start, end, wanted, max_records=max_records)) == expected


def test_a_range_may_start_and_end_inside_batches():
    buf = _log([([b"a", b"b", b"c"], {"timestamps": 5}),
                ([b"d", b"e"], {"timestamps": 6, "compression": CODEC_LZ4}),
                ([b"f", b"g", b"h"], {"timestamps": 7})])
    assert [row["value"] for row in _rows(buf, 1, 7)] == [b"b", b"c", b"d", b"e", b"f", b"g"]
    assert [row["offset"] for row in _rows(buf, 4, 5)] == [4]
    assert _rows(buf, 8, 20) == [] and _rows(buf, 3, 3) == []


def test_nulls_empty_values_and_headers_keep_their_places():
    buf = _stamped(build_batch([None, b"", b"v"], keys=[b"", None, b"k"], timestamps=[9, 8, 10],
                               headers=[[("h", None), ("i", b"")], [], [("j", b"x")]], producer="p"), 40)
    rows = _millis(_rows(buf))
    assert [(r["offset"], r["key"], r["value"], r["timestamp"]) for r in rows] == [
        (40, b"", None, 9), (41, None, b"", 8), (42, b"k", b"v", 10)]
    assert [r["headers"] for r in rows] == [[{"key": "h", "value": None}, {"key": "i", "value": b""}], [],
                                            [{"key": "j", "value": b"x"}]]


def test_timestamps_come_out_as_utc_microseconds_exact_to_the_ms():
    buf = build_batch([b"x"], timestamps=1_700_000_000_123)
    batch = record_batch(_take(buf, ["timestamp"]), "t", 0, arrow_schema(["timestamp"]))
    assert batch.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert batch.column(0).cast(pa.int64()).to_pylist() == [1_700_000_000_123_000]


def _take(buf: bytes, columns) -> dict:
    builder = ColumnBuilder(columns)
    builder.add(buf)
    return builder.take()


def test_a_builder_fills_only_the_columns_asked_for():
    taken = _take(build_batch([b"v"], keys=[b"k"]), ["producer", "timestamp"])
    assert taken["columns"] == ("timestamp", "producer")
    assert {"offset", "key_data", "value_data", "headers_offsets"}.isdisjoint(taken)
    with pytest.raises(ValueError, match="unknown columns"):
        ColumnBuilder(["offset", "colour"])


def test_the_builder_stops_at_a_batch_boundary_once_full():
    buf = _log([([b"a"] * 3, {}), ([b"b"] * 3, {}), ([b"c"] * 3, {})])
    first_end = len(_stamped(build_batch([b"a"] * 3), 0))
    builder = ColumnBuilder(["offset"], max_records=4)
    position = builder.add(buf)
    assert builder.count == 6 and builder.full and position == 2 * first_end
    assert builder.add(buf, position) == position, "a full builder takes nothing more"
    builder.take()
    assert builder.add(buf, position) == len(buf) and builder.count == 3 and builder.next_offset == 9


def test_producer_names_count_toward_the_byte_bound():
    """Empty values under a long producer name: only the name's bytes can fill the builder."""
    name = "p" * 200
    buf = _log([([b""] * 10, {"producer": name}), ([b""] * 10, {"producer": name})])
    builder = ColumnBuilder(["producer"], max_bytes=1000)
    assert builder.add(buf) == len(_stamped(build_batch([b""] * 10, producer=name), 0))
    assert builder.count == 10 and builder.data_bytes == 10 * len(name) and builder.full


def test_a_corrupt_batch_is_refused_naming_its_position_and_base_offset():
    good = _stamped(build_batch([b"a", b"b"]), 5)
    bad = bytearray(_stamped(build_batch([b"c"]), 7))
    bad[-2] ^= 0x01
    builder = ColumnBuilder(["value"])
    with pytest.raises(CorruptRecordError,
                       match=f"batch at position {len(good)} \\(base offset 7\\): CRC mismatch"):
        builder.add(good + bytes(bad))
    assert builder.count == 2, "the batches before it are kept"
    builder.take()
    builder.add(bytes(bad), verify_crc=False)  # the fetcher checked the CRCs already: not again
    assert builder.take()["count"] == 1


def test_a_batch_whose_records_do_not_decode_leaves_nothing_behind():
    batch = bytearray(_stamped(build_batch([b"x", b"y"], headers=[[("h", b"1")], []], timestamps=1_000), 3))
    struct.pack_into("<ii", batch, 24, 2, 3)  # last_offset_delta, record_count: one record more than held
    struct.pack_into("<I", batch, 16, crc32c(bytes(batch[20:])))
    good = _stamped(build_batch([b"a"]), 2)
    builder = ColumnBuilder()
    with pytest.raises(CorruptRecordError, match="base offset 3.*length runs past"):
        builder.add(good + bytes(batch))
    taken = builder.take()
    assert taken["count"] == 1 and taken["header_count"] == 0
    rows = record_batch(taken, "t", 0, arrow_schema(ALL)).to_pylist()
    assert [(r["offset"], r["value"], r["headers"]) for r in rows] == [(2, b"a", [])]


def test_a_batch_cut_off_is_refused():
    buf = build_batch([b"x" * 100])
    with pytest.raises(CorruptRecordError, match="cut off after"):
        ColumnBuilder().add(buf[:-10])
    with pytest.raises(CorruptRecordError, match="needs 56 bytes"):
        ColumnBuilder().add(buf[:30])


def test_a_producer_name_that_is_not_utf8_is_replaced_as_the_reference_decoder_does():
    batch = bytearray(build_batch([b"v"], producer="ab"))
    batch[56] = 0xFF
    struct.pack_into("<I", batch, 16, crc32c(bytes(batch[20:])))
    (row,) = _rows(bytes(batch), columns=["producer"])
    assert row["producer"] == decode_records(bytes(batch))[0].producer == "\ufffdb"


def test_nothing_taken_is_an_empty_batch_of_the_schema():
    batch = record_batch(ColumnBuilder().take(), "t", 1, arrow_schema(ALL))
    batch.validate(full=True)
    assert batch.num_rows == 0 and batch.schema == arrow_schema(ALL)
