"""Idempotent batches (attributes bit 3, the producer identity block): round trips through every
reader, each way the format refuses one (with its error code), and non-idempotent batches left
byte for byte as they were."""

from __future__ import annotations

import contextlib
import struct

import doc_tables
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpbroker import _columnar, _core
from hpbroker.errors import CorruptRecordError, InvalidRecordError
from hpbroker.records import (
    ATTR_IDEMPOTENT,
    CODEC_LZ4,
    CODEC_NONE,
    HEADER_SIZE,
    NO_PRODUCER_ID,
    PRODUCER_IDENTITY_SIZE,
    BatchBuilder,
    build_batch,
    crc32c,
    decode_records,
    iter_records,
    read_header,
    scan_batches,
    stamp_batch,
    validate_batches,
)

CODECS = pytest.mark.parametrize("codec", [CODEC_NONE, CODEC_LZ4], ids=["none", "lz4"])
PID, EPOCH = 4_000_000_123, 7


def _idempotent(values, *, codec=CODEC_NONE, base_sequence=0, producer="svc", pid=PID, epoch=EPOCH, **kw):
    return build_batch(values, producer=producer, producer_id=pid, producer_epoch=epoch,
                       base_sequence=base_sequence, compression=codec, **kw)


def _recrc(batch: bytearray) -> bytes:
    struct.pack_into("<I", batch, 16, crc32c(bytes(batch[20:])))
    return bytes(batch)


def _values(n: int) -> list[bytes]:
    return [b"value-%d " % i * 20 for i in range(n)]


def test_constants_are_those_of_the_format():
    assert (ATTR_IDEMPOTENT, PRODUCER_IDENTITY_SIZE, NO_PRODUCER_ID) == (0x08, 12, -1)
    assert (_core.ATTR_IDEMPOTENT, _core.PRODUCER_IDENTITY_SIZE, _core.NO_PRODUCER_ID) == (0x08, 12, -1)


@CODECS
def test_an_idempotent_batch_round_trips_through_header_scan_and_decoding(codec):
    values = _values(40)
    keys = [None if i % 3 else b"k%d" % i for i in range(40)]
    headers = [[("h", b"%d" % i)] if i % 7 == 0 else None for i in range(40)]
    batch = _idempotent(values, keys=keys, headers=headers, codec=codec, base_sequence=1000,
                        timestamps=[1_700_000_000_000 + i for i in range(40)])
    header = read_header(batch)
    assert header.idempotent and header.attributes == ATTR_IDEMPOTENT | codec
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (PID, EPOCH, 1000)
    assert header.header_size == HEADER_SIZE + PRODUCER_IDENTITY_SIZE == 68
    assert header.records_position == 68 + len("svc") and header.producer == "svc"
    assert struct.unpack_from("<qi", batch, 56) == (PID, EPOCH) and batch[68:71] == b"svc"

    scan = validate_batches(batch)
    assert (scan.batch_count, scan.record_count, scan.idempotent_batches) == (1, 40, 1)
    assert list(scan.producer_ids) == [PID] and list(scan.producer_epochs) == [EPOCH]
    assert list(scan.base_sequences) == [1000]

    records = decode_records(batch, topic="t", partition=3)
    assert [(r.key, r.value, r.headers) for r in records] == [
        (k, v, tuple(h or ())) for k, v, h in zip(keys, values, headers, strict=True)]
    assert [r.sequence for r in records] == list(range(1000, 1040))
    assert {r.producer for r in records} == {"svc"}
    assert list(iter_records(batch)) == decode_records(batch)


@CODECS
def test_idempotent_and_plain_batches_mix_in_one_buffer(codec):
    plain = build_batch([b"a", b"b"], producer="old", base_sequence=5, compression=codec)
    idem = _idempotent([b"c", b"d", b"e"], codec=codec, base_sequence=2)
    buf = bytearray(plain + idem + plain)
    stamp_batch(buf, len(plain), 2)
    stamp_batch(buf, len(plain) + len(idem), 5)
    scan = scan_batches(buf, expected_offset=0, deep=True)
    assert scan.error is None and scan.batch_count == 3 and scan.idempotent_batches == 1
    assert list(scan.producer_ids) == [NO_PRODUCER_ID, PID, NO_PRODUCER_ID]
    assert list(scan.producer_epochs) == [NO_PRODUCER_ID, EPOCH, NO_PRODUCER_ID]
    assert list(scan.base_sequences) == [5, 2, 5]
    records = decode_records(buf)
    assert [(r.offset, r.value, r.producer, r.sequence) for r in records] == [
        (0, b"a", "old", 5), (1, b"b", "old", 6), (2, b"c", "svc", 2), (3, b"d", "svc", 3),
        (4, b"e", "svc", 4), (5, b"a", "old", 5), (6, b"b", "old", 6)]


@CODECS
def test_the_columnar_decoder_reads_idempotent_batches(codec):
    plain = build_batch([b"p0"], keys=[b"k"], producer="plain", timestamps=10, compression=codec)
    idem = _idempotent([b"i0", None, b"i2"], keys=[None, b"k1", None], codec=codec, timestamps=20,
                       headers=[None, [("x", b"y")], None])
    buf = bytearray(plain + idem)
    stamp_batch(buf, len(plain), 1)
    builder = _columnar.ColumnBuilder()
    assert builder.add(bytes(buf)) == len(buf)
    columns = builder.take()
    offsets = struct.unpack(f"<{builder.count or 4}q", bytes(columns["offset"]))
    assert list(offsets) == [0, 1, 2, 3]

    def strings(name):
        bounds = struct.unpack(f"<{5}i", bytes(columns[name + "_offsets"]))
        data = bytes(columns[name + "_data"])
        return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]

    assert strings("producer") == [b"plain", b"svc", b"svc", b"svc"]
    assert strings("value") == [b"p0", b"i0", b"", b"i2"]
    assert strings("key") == [b"k", b"", b"k1", b""]


def test_the_columnar_decoder_refuses_an_identity_block_that_overruns_the_batch():
    batch = bytearray(build_batch([b"x"], timestamps=1))  # 63 bytes: too short for a name at 68
    batch[21] |= ATTR_IDEMPOTENT
    with pytest.raises(CorruptRecordError, match="after a 68-byte header overruns a batch of 63 bytes"):
        _columnar.ColumnBuilder().add(_recrc(batch))


def test_a_batch_builder_makes_idempotent_batches_with_room_for_the_block():
    builder = BatchBuilder("p", max_bytes=200, producer_id=1, producer_epoch=0)
    assert builder.size_in_bytes == 68 + 1
    while builder.append(b"x" * 20):
        pass
    assert builder.size_in_bytes <= 200
    count = builder.record_count
    batch = builder.build(base_sequence=9)
    assert len(batch) <= 200
    header = validate_batches(batch)
    assert (header.record_count, list(header.base_sequences), list(header.producer_ids)) == (count, [9], [1])
    # reusable: the next batch keeps the identity
    builder.append(b"y")
    assert read_header(builder.build(base_sequence=9 + count)).producer_id == 1


def test_batches_without_an_identity_are_unchanged():
    plain = build_batch([b"a"], producer="p", base_sequence=-1, timestamps=5)
    same = build_batch([b"a"], producer="p", base_sequence=-1, timestamps=5, producer_id=-1,
                       producer_epoch=-1)
    assert plain == same and plain[21] == 0 and plain[56:57] == b"p" and len(plain) == 56 + 1 + 7
    header = read_header(plain)
    assert (header.idempotent, header.producer_id, header.producer_epoch) == (False, -1, -1)
    assert header.header_size == 56
    scan = validate_batches(plain)
    assert (list(scan.producer_ids), list(scan.producer_epochs), scan.idempotent_batches) == ([-1], [-1], 0)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"producer_id": -2, "producer_epoch": 0}, "producer_id -2 must be >= 0"),
    ({"producer_id": 1, "producer_epoch": -1}, r"producer_epoch -1 must be in \[0, 2\*\*31 - 1\]"),
    ({"producer_id": 1, "producer_epoch": 2**31}, "producer_epoch 2147483648 must be in"),
    ({"producer_id": -1, "producer_epoch": 3}, "producer_epoch 3 without a producer_id"),
    ({"producer_id": 1, "producer_epoch": 0, "base_sequence": -1}, "base_sequence -1 of an idempotent batch"),
    ({"producer_id": 1, "producer_epoch": 0, "base_sequence": 2**63 - 1}, "last sequence at most 2"),
])
def test_building_refuses_an_identity_or_sequence_the_format_refuses(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_batch([b"a", b"b"], **kwargs)


def test_a_builder_that_refuses_the_sequence_keeps_its_records():
    builder = BatchBuilder(producer_id=1, producer_epoch=0)
    builder.append(b"a")
    with pytest.raises(ValueError, match="base_sequence -1"):
        builder.build()
    assert builder.record_count == 1
    assert read_header(builder.build(base_sequence=0)).record_count == 1


def test_the_last_sequence_may_reach_the_largest_i64():
    batch = _idempotent([b"a", b"b"], base_sequence=2**63 - 2)
    assert list(validate_batches(batch).base_sequences) == [2**63 - 2]
    assert decode_records(batch)[1].sequence == 2**63 - 1


# --- validation: each refusal with its code (FORMAT.md "Validation") ------------------------


@pytest.mark.parametrize(("position", "fmt", "value", "message"), [
    (56, "<q", -1, "producer_id -1 is negative in an idempotent batch"),
    (56, "<q", -(2**63), "producer_id -9223372036854775808 is negative"),
    (64, "<i", -5, "producer_epoch -5 is negative in an idempotent batch"),
    (48, "<q", -1, "base_sequence -1 is negative in an idempotent batch"),
    (48, "<q", 2**63 - 2, r"sequence range overflows: base_sequence 9223372036854775806 \+ last_offset"),
    (48, "<q", 2**63 - 1, "sequence range overflows"),
])
def test_a_bad_identity_or_sequence_range_is_invalid_with_code_3(position, fmt, value, message):
    batch = bytearray(_idempotent([b"a", b"b", b"c"], timestamps=1))
    struct.pack_into(fmt, batch, position, value)
    bad = _recrc(batch)
    with pytest.raises(InvalidRecordError, match=message) as refused:
        validate_batches(bad)
    assert refused.value.code == 3
    scan = scan_batches(bad)
    assert (scan.batch_count, scan.error_code) == (0, 3) and message.split(" ")[0] in scan.error


def test_the_same_fields_are_not_checked_without_bit_3():
    batch = bytearray(build_batch([b"a"], timestamps=1))
    struct.pack_into("<q", batch, 48, -77)  # base_sequence: anything goes without the block
    validate_batches(_recrc(batch))


@pytest.mark.parametrize("name", ["", "p", "name-of-eleven"])
def test_an_identity_block_or_name_that_overruns_the_batch_is_corrupt_with_code_2(name):
    """Bit 3 set on a batch too short for the block and its name: framing (step 2), before the CRC."""
    plain = bytearray(build_batch([b""], producer=name, timestamps=1))
    plain[21] |= ATTR_IDEMPOTENT
    needed = 68 + len(name.encode())
    assert needed > len(plain)
    bad = _recrc(plain)
    message = f"{needed} header bytes\\) overrun a batch of {len(plain)} bytes"
    with pytest.raises(CorruptRecordError, match=message) as refused:
        validate_batches(bad)
    assert refused.value.code == 2
    scan = scan_batches(bad)
    assert (scan.batch_count, scan.error_code, scan.incomplete) == (0, 2, False)
    with pytest.raises(CorruptRecordError, match=message):
        decode_records(bad)


def test_bit_3_set_on_a_plain_batch_long_enough_is_invalid_records():
    """The block then eats the first record bytes: the records no longer parse (step 5, code 3),
    or the block's values are refused (step 4)."""
    batch = bytearray(build_batch([b"x" * 40], producer="p", timestamps=1, base_sequence=0))
    batch[21] |= ATTR_IDEMPOTENT
    with pytest.raises(InvalidRecordError) as refused:
        validate_batches(_recrc(batch))
    assert refused.value.code == 3


@pytest.mark.parametrize("bits", [0x10, 0x20, 0x40, 0x80, 0x18])
def test_attribute_bits_4_to_7_stay_invalid(bits):
    batch = bytearray(_idempotent([b"a"], timestamps=1))
    batch[21] |= bits
    with pytest.raises(InvalidRecordError, match="unsupported attributes") as refused:
        validate_batches(_recrc(batch))
    assert refused.value.code == 3


def test_a_flipped_identity_byte_fails_the_crc():
    """The block is inside the CRC'd range."""
    batch = bytearray(_idempotent([b"a"], timestamps=1))
    batch[60] ^= 0x01
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        validate_batches(bytes(batch))


def test_read_header_of_just_the_fixed_header_leaves_the_identity_unknown():
    batch = _idempotent([b"x"], producer="a-name")
    cut = read_header(batch[:HEADER_SIZE])
    assert cut.idempotent and cut.producer_id is None and cut.producer_epoch is None and cut.producer is None
    assert cut.header_size == 68 and cut.records_position == 68 + 6 and cut.size == len(batch)
    block = read_header(batch[:68])
    assert (block.producer_id, block.producer_epoch, block.producer) == (PID, EPOCH, None)
    assert read_header(batch[:74]).producer == "a-name"


# --- the documented idempotent batch, read independently (FORMAT.md) -------------------------

IDEMPOTENT_GOLDEN = {
    "producer": "orders", "producer_id": 1000, "producer_epoch": 2, "base_sequence": 5,
    "records": [(b"k", b"v1", 1_700_000_000_000), (None, b"v2", 1_700_000_000_003)],
}


def _idempotent_golden_batch() -> bytes:
    keys, values, timestamps = zip(*IDEMPOTENT_GOLDEN["records"], strict=True)
    return build_batch(list(values), keys=list(keys), timestamps=list(timestamps),
                       producer=IDEMPOTENT_GOLDEN["producer"], producer_id=IDEMPOTENT_GOLDEN["producer_id"],
                       producer_epoch=IDEMPOTENT_GOLDEN["producer_epoch"],
                       base_sequence=IDEMPOTENT_GOLDEN["base_sequence"])


def _crc32c_bitwise(data: bytes) -> int:
    """CRC32C as FORMAT.md's conventions define it (reflected 0x82F63B78, init and final XOR
    0xFFFFFFFF), bit by bit: no table, nothing from hpbroker."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _read_by_the_doc(data: bytes) -> dict:
    """A reader written from FORMAT.md alone (struct, varints, CRC32C), checking what the
    validation section asks of an idempotent batch."""
    base_offset, batch_length, leader_epoch, crc = struct.unpack_from("<qiiI", data, 0)
    assert 12 + batch_length == len(data) and batch_length >= 44
    (magic, attributes, producer_length, reserved, last_offset_delta, record_count, first_timestamp,
     max_timestamp, base_sequence) = struct.unpack_from("<BBBBiiqqq", data, 20)
    assert (magic, reserved, attributes & 0xF0, attributes & 0x07) == (1, 0, 0, 0)
    assert crc == _crc32c_bitwise(data[20:])
    out = {"base_offset": base_offset, "leader_epoch": leader_epoch, "crc": crc, "attributes": attributes,
           "base_sequence": base_sequence, "producer_id": -1, "producer_epoch": -1}
    name_at = 56
    if attributes & 0x08:
        out["producer_id"], out["producer_epoch"] = struct.unpack_from("<qi", data, 56)
        name_at = 68
    assert name_at + producer_length <= len(data)
    assert out["producer_id"] >= 0 and out["producer_epoch"] >= 0
    assert 0 <= base_sequence <= 2**63 - 1 - last_offset_delta
    out["producer"] = data[name_at : name_at + producer_length].decode()
    assert last_offset_delta == record_count - 1
    pos, records = name_at + producer_length, []
    for i in range(record_count):
        length, pos = _varint(data, pos)
        end = pos + length
        raw_delta, pos = _varint(data, pos)
        offset_delta, pos = _varint(data, pos)
        assert offset_delta == i
        fields = []
        for _ in range(2):  # key, value: 0 null, else length + 1
            field, pos = _varint(data, pos)
            fields.append(None if field == 0 else data[pos : pos + field - 1])
            pos += max(field - 1, 0)
        header_count, pos = _varint(data, pos)
        assert header_count == 0 and pos == end
        timestamp = first_timestamp + ((raw_delta >> 1) ^ -(raw_delta & 1))
        records.append((fields[0], fields[1], timestamp, base_sequence + i))
    assert pos == len(data) and max(r[2] for r in records) == max_timestamp
    out["records"] = records
    return out


def test_idempotent_golden_bytes_match_the_documented_layout():
    """The bytes of FORMAT.md's second worked example are what build_batch makes, and a reader
    written from the document alone finds the identity, the sequences and the records in them."""
    (documented,) = doc_tables.hex_dumps("FORMAT.md", "## Worked example: an idempotent batch")
    assert documented == _idempotent_golden_batch()
    read = _read_by_the_doc(documented)
    assert (read["attributes"], read["crc"], read["producer"]) == (0x08, 0x7B827AD3, "orders")
    assert (read["producer_id"], read["producer_epoch"], read["base_sequence"]) == (1000, 2, 5)
    assert read["records"] == [(b"k", b"v1", 1_700_000_000_000, 5), (None, b"v2", 1_700_000_000_003, 6)]
    header = read_header(documented)
    assert (header.producer_id, header.producer_epoch, header.records_position) == (1000, 2, 74)


def test_the_documents_identity_block_table_decodes_the_golden_batch():
    """Each field of the identity block table, at its position, size and type, reads the known value."""
    codes = {"i32": "i", "i64": "q"}
    rows = doc_tables.table_rows("FORMAT.md", "### Producer identity block", "position")
    batch = _idempotent_golden_batch()
    fields = {row[2]: struct.unpack_from("<" + codes[row[3]], batch, int(row[0]))[0] for row in rows}
    assert fields == {"producer_id": 1000, "producer_epoch": 2}
    assert {int(row[0]) + int(row[1]) for row in rows} <= {64, HEADER_SIZE + PRODUCER_IDENTITY_SIZE}
    assert all(struct.calcsize(codes[row[3]]) == int(row[1]) for row in rows)


# --- properties ------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    st.integers(0, 2**63 - 1),
    st.integers(0, 2**31 - 1),
    st.lists(st.one_of(st.none(), st.binary(max_size=300)), min_size=1, max_size=30),
    st.integers(0, 2**63 - 31),
    st.sampled_from([CODEC_NONE, CODEC_LZ4]),
    st.text(max_size=20),
)
def test_any_identity_round_trips(pid, epoch, values, base_sequence, codec, producer):
    batch = build_batch(values, producer=producer, producer_id=pid, producer_epoch=epoch,
                        base_sequence=base_sequence, compression=codec, timestamps=1)
    scan = validate_batches(batch)
    assert (list(scan.producer_ids), list(scan.producer_epochs), list(scan.base_sequences)) == (
        [pid], [epoch], [base_sequence])
    header = read_header(batch)
    assert (header.producer_id, header.producer_epoch, header.producer) == (pid, epoch, producer)
    records = decode_records(batch)
    assert [r.value for r in records] == values
    assert [r.sequence for r in records] == [base_sequence + i for i in range(len(values))]
    builder = _columnar.ColumnBuilder(columns=("offset",))
    assert builder.add(batch) == len(batch) and builder.count == len(values)


@given(st.binary(min_size=1, max_size=300), st.integers(0, 400), st.binary(min_size=12, max_size=12),
       st.integers(0, 3))
def test_random_bytes_behind_bit_3_and_a_valid_crc_are_refused_cleanly(section, count, identity, name_length):
    count = max(count, 1)
    header = struct.pack("<BBBBiiqqq", 1, ATTR_IDEMPOTENT, name_length, 0, count - 1, count, 0, 0, 0)
    body = header + identity + section
    batch = struct.pack("<qiiI", 0, len(body) + 8, 0, crc32c(body)) + body
    with contextlib.suppress(CorruptRecordError, InvalidRecordError):
        validate_batches(batch)
    with contextlib.suppress(CorruptRecordError):
        decode_records(batch)
    with contextlib.suppress(CorruptRecordError):
        _columnar.ColumnBuilder().add(batch)
    assert scan_batches(batch).valid_bytes in (0, len(batch))
