"""The sans-I/O wire protocol: round trips, pinned bytes, the document, and hostile input."""

from __future__ import annotations

import contextlib
import re
import struct
from pathlib import Path

import doc_tables
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpbroker import errors
from hpbroker import protocol as p
from hpbroker.errors import InvalidRequestError, UnsupportedVersionError
from hpbroker.records import build_batch

DOC = Path(__file__).resolve().parent.parent / "docs" / "PROTOCOL.md"
NESTED = (p.RequestHeader, p.ResponseHeader, *p.NESTED_TYPES)

i16 = st.integers(-(2**15), 2**15 - 1)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
text = st.text(max_size=30)
configs = st.lists(st.builds(p.TopicConfigEntry, text, text), max_size=3)
broker_ids = st.lists(i32, max_size=4)
partitions = st.lists(st.builds(p.PartitionMetadata, u32, u16, i64, u16, i64, i64, i32, broker_ids,
                                broker_ids), max_size=4)
payloads = st.one_of(st.just(b""), st.binary(min_size=1, max_size=300))

REQUESTS = st.one_of(
    st.builds(p.ProduceRequest, text, u32, st.integers(-128, 127), u32, payloads),
    st.builds(p.FetchRequest, text, u32, i64, u32, u32, u32, i32, i32, i32),
    st.builds(p.ListOffsetsRequest, text, u32, i64),
    st.builds(p.MetadataRequest, st.lists(text, max_size=4)),
    st.builds(p.CreateTopicRequest, text, u32, configs, i16),
    st.builds(p.DeleteTopicRequest, text),
    st.builds(p.AlterTopicConfigRequest, text, configs),
    st.builds(p.InitProducerIdRequest, i64, i32),
)
RESPONSES = st.one_of(
    st.builds(p.ProduceResponse, i64, i64, st.integers(0, 1)),
    st.builds(p.FetchResponse, i64, i64, i32, i64, i32, payloads),
    st.builds(p.ListOffsetsResponse, i64),
    st.builds(p.MetadataResponse,
              st.lists(st.builds(p.BrokerInfo, u32, text, u16, u16), max_size=3),
              st.lists(st.builds(p.TopicMetadata, text, u16, partitions, configs), max_size=3)),
    st.builds(p.CreateTopicResponse),
    st.builds(p.DeleteTopicResponse),
    st.builds(p.AlterTopicConfigResponse),
    st.builds(p.InitProducerIdResponse, i64, i32),
)


def _default(cls, name):
    spec = cls.__dataclass_fields__[name]
    return spec.default_factory() if callable(spec.default_factory) else spec.default


def _at_version(value, version):
    """``value`` as a decoder of ``version`` gives it back: each field of a struct (nested ones
    too) that the version lacks has its default (None: every field kept)."""
    if isinstance(value, list):
        return [_at_version(item, version) for item in value]
    if not hasattr(type(value), "SCHEMA"):
        return value
    present = {name for name, _ in p.schema_of(type(value), version)}
    return {entry[0]: _at_version(getattr(value, entry[0]), version) if entry[0] in present
            else _default(type(value), entry[0]) for entry in value.SCHEMA}


def _fields(message, version=None):
    """A message's field values in ``version`` (None: all) with the payload as bytes; a field
    the version lacks has its default, as a decoder of that version gives it."""
    values = _at_version(message, version)
    values["payload"] = bytes(message.payload)
    return values


def _versions(message):
    return st.integers(type(message).MIN_VERSION, type(message).VERSION)


@given(st.data(), REQUESTS, u32, text)
def test_every_request_round_trips_over_both_transports_in_every_version(data, request, correlation_id,
                                                                         client_id):
    version = data.draw(_versions(request))
    frames = p.encode_request(request, correlation_id, client_id, version=version)
    assert len(frames) == (2 if bytes(request.payload) else 1)
    header, decoded = p.decode_request(frames)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        request.API_KEY, version, correlation_id, client_id)
    assert type(decoded) is type(request) and _fields(decoded) == _fields(request, version)
    stream = b"".join(bytes(f) for f in p.frame_tcp(frames))
    decoder = p.TcpFrameDecoder()
    received = [m for i in range(0, len(stream), 7) for m in decoder.feed(stream[i : i + 7])]
    assert len(received) == 1 and decoder.buffered_bytes == 0
    assert _fields(p.decode_request(received[0])[1]) == _fields(request, version)


@given(st.data(), RESPONSES, u32, u16, text)
def test_every_response_round_trips_in_every_version(data, response, correlation_id, error_code, message):
    version = data.draw(_versions(response))
    frames = p.encode_response(response, correlation_id, error_code, message, version=version)
    header, decoded = p.decode_response(response.API_KEY, frames, version=version)
    assert (header.correlation_id, header.error_code) == (correlation_id, error_code)
    assert header.error_message == message
    assert _fields(decoded) == _fields(response, version)


def test_the_newest_version_is_the_default():
    request = p.ProduceRequest("t", 0, payload=b"x")
    assert p.encode_request(request, 1) == p.encode_request(request, 1, version=p.ProduceRequest.VERSION)
    assert p.decode_request(p.encode_request(request, 1))[0].api_version == 1
    response = p.ProduceResponse(5, 0, duplicate=1)
    frames = p.encode_response(response, 1)
    assert frames == p.encode_response(response, 1, version=1)
    assert p.decode_response(p.ApiKey.PRODUCE, frames)[1].duplicate == 1


def test_a_version_0_produce_response_is_the_bytes_it_always_was():
    """A client that predates version 1 sends version 0 and reads 28 bytes, without duplicate."""
    v0 = p.encode_response(p.ProduceResponse(base_offset=1234, log_start_offset=0, duplicate=1), 7, version=0)
    assert v0[0].hex(" ") == (
        "07 00 00 00 00 00 00 00 d2 04 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"
    )
    _, decoded = p.decode_response(p.ApiKey.PRODUCE, v0, version=0)
    assert (decoded.base_offset, decoded.duplicate) == (1234, 0)
    v1 = p.encode_response(p.ProduceResponse(base_offset=1234, log_start_offset=0, duplicate=1), 7, version=1)
    assert bytes(v1[0]) == bytes(v0[0])[:-4] + b"\x01" + bytes(v0[0])[-4:]
    with pytest.raises(InvalidRequestError, match="unexpected bytes after the body"):
        p.decode_response(p.ApiKey.PRODUCE, v1, version=0)
    with pytest.raises(InvalidRequestError, match="truncated"):
        p.decode_response(p.ApiKey.PRODUCE, v0, version=1)


def test_a_version_not_served_is_refused_when_encoding_and_decoding():
    with pytest.raises(UnsupportedVersionError, match="ProduceRequest version 2 is not served; versions 0.."):
        p.encode_request(p.ProduceRequest("t", 0), 1, version=2)
    with pytest.raises(UnsupportedVersionError, match="version 1 is not served; versions 0..0"):
        p.encode_response(p.ListOffsetsResponse(), 1, version=1)
    with pytest.raises(UnsupportedVersionError, match="version 2 is not served"):
        p.decode_response(p.ApiKey.PRODUCE, p.encode_response(p.ProduceResponse(), 1), version=2)
    head = bytearray(p.encode_request(p.ProduceRequest("t", 0), 9)[0])
    struct.pack_into("<H", head, 2, 2)
    with pytest.raises(UnsupportedVersionError, match="version 2 is not served; versions 0..1") as info:
        p.decode_request([bytes(head)])
    assert (info.value.code, info.value.header.correlation_id, info.value.header.api_version) == (9, 9, 2)


def test_the_response_version_is_the_requests_or_the_nearest_served():
    assert [p.response_version(p.ApiKey.PRODUCE, v) for v in (0, 1, 2, 0xFFFF)] == [0, 1, 1, 1]
    assert [p.response_version(p.ApiKey.FETCH, v) for v in (0, 1, 2, 3)] == [0, 1, 2, 2]
    assert p.response_version(p.ApiKey.LIST_OFFSETS, 3) == 0
    assert p.response_version(99, 3) == 0


def test_a_schema_lists_each_versions_fields():
    assert [name for name, _ in p.schema_of(p.ProduceResponse, 0)] == ["base_offset", "log_start_offset"]
    assert [name for name, _ in p.schema_of(p.ProduceResponse, 1)] == ["base_offset", "log_start_offset",
                                                                       "duplicate"]
    assert p.schema_of(p.ProduceRequest, 0) == p.schema_of(p.ProduceRequest, 1)


def test_produce_request_bytes_match_the_worked_example():
    batch = build_batch([b"hello"], timestamps=1_700_000_000_000, producer="p")
    request = p.ProduceRequest("orders", 3, acks=1, timeout_ms=30_000, payload=batch)
    frames = p.encode_request(request, 7, "cli")
    assert frames[0].hex(" ") == (
        "00 00 01 00 07 00 00 00 03 00 63 6c 69 06 00 6f 72 64 65 72 73 "
        "03 00 00 00 01 30 75 00 00 44 00 00 00"
    )
    assert frames[1] is batch, "the payload travels as its own frame, uncopied"
    assert bytes(p.frame_tcp(frames)[0]).hex(" ") == "22 00 00 00 44 00 00 00"
    assert p.encode_request(request, 7, "cli", version=0)[0][2:4] == b"\x00\x00"
    response = p.encode_response(p.ProduceResponse(base_offset=1234, log_start_offset=0), 7)
    assert response[0].hex(" ") == (
        "07 00 00 00 00 00 00 00 d2 04 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"
    )


def _doc_table(name: str) -> list[tuple[str, str]]:
    """(field, type) rows of the table under '### name' in PROTOCOL.md."""
    section = DOC.read_text().split(f"### {name}\n", 1)[1]
    rows = re.findall(r"^\| `([a-z_]+)` \| `([^`]+)` \|", section.split("\n### ", 1)[0], flags=re.M)
    return rows


def _doc_meanings(name: str) -> dict[str, str]:
    """field -> its meaning cell in the table under '### name'."""
    section = DOC.read_text().split(f"### {name}\n", 1)[1].split("\n### ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \| `[^`]+` \|(.*)\|$", section, flags=re.M)
    return {name: meaning.strip() for name, meaning in rows}


@pytest.mark.parametrize("cls", [*NESTED, *p.REQUEST_TYPES.values(), *p.RESPONSE_TYPES.values()],
                         ids=lambda cls: cls.__name__)
def test_the_protocol_document_lists_every_field_in_order(cls):
    expected = [(name, kind.name) for name, kind in p.schema_of(cls)]
    if issubclass(cls, p.Message):
        expected.append(("payload_length", "u32"))
    assert _doc_table(cls.__name__) == expected
    meanings = _doc_meanings(cls.__name__)
    for entry in cls.SCHEMA:  # a field of a later version says from which one, the others say none
        marked = re.match(r"v(\d+)\+ ", meanings[entry[0]] + " ")
        assert (int(marked[1]) if marked else 0) == (entry[2] if len(entry) > 2 else 0), entry[0]


def test_the_document_generator_marks_fields_of_later_versions():
    table = p.schema_table(p.ProduceResponse)
    assert "| `duplicate` | `u8` | v1+ |" in table and "| `base_offset` | `i64` | |" in table
    assert _doc_table("ProduceResponse") == re.findall(r"^\| `([a-z_]+)` \| `([^`]+)` \|", table, flags=re.M)


def test_the_alter_response_names_every_error_code_the_broker_answers_it_with():
    section = DOC.read_text().split("### AlterTopicConfigResponse\n", 1)[1].split("\n### ", 1)[0]
    (meaning,) = re.findall(r"^\| `payload_length` \| `u32` \| (.*) \|$", section, flags=re.M)
    # 6: no such topic; 7: a worker failed to apply the settings; 8: a value refused; 12: too slow.
    for code in (6, 7, 8, 12):
        assert re.search(rf"\b{code} (if|for)\b", meaning), f"error {code} missing from {meaning!r}"


def test_unknown_api_keys_and_versions_are_refused_with_the_header_kept():
    frames = p.encode_request(p.DeleteTopicRequest("t"), 5)
    head = bytearray(frames[0])
    struct.pack_into("<H", head, 0, 99)
    with pytest.raises(UnsupportedVersionError, match="unknown api_key 99") as info:
        p.decode_request([bytes(head)])
    assert info.value.header.correlation_id == 5
    struct.pack_into("<HH", head, 0, p.ApiKey.DELETE_TOPIC, 3)
    with pytest.raises(UnsupportedVersionError, match="version 3 is not served; versions 0..0"):
        p.decode_request([bytes(head)])


def test_every_truncation_of_a_request_is_an_invalid_request():
    request = p.CreateTopicRequest("orders", 12, [p.TopicConfigEntry("retention_ms", "5")])
    frames = p.encode_request(request, 1)
    head = frames[0]
    for cut in range(len(head)):
        with pytest.raises(InvalidRequestError):
            p.decode_request([head[:cut]])
    with pytest.raises(InvalidRequestError, match="unexpected bytes after the body"):
        p.decode_request([head + b"\x00"])


def test_payload_length_must_match_the_payload_frame():
    frames = p.encode_request(p.ProduceRequest("t", 0, payload=b"x" * 10), 1)
    with pytest.raises(InvalidRequestError, match="payload_length says 10 bytes, the payload frame has 9"):
        p.decode_request([frames[0], b"x" * 9])
    with pytest.raises(InvalidRequestError, match="1 or 2 frames"):
        p.decode_request([frames[0], frames[1], b""])


def test_a_huge_array_count_is_refused_before_allocating():
    head = bytearray(p.encode_request(p.MetadataRequest(["a"]), 1)[0])
    count_at = len(head) - 4 - 3 - 4  # count, then one string of 1 byte (2 + 1), then payload_length
    struct.pack_into("<I", head, count_at, 0xFFFFFFFF)
    with pytest.raises(InvalidRequestError, match="array of 4294967295 string"):
        p.decode_request([bytes(head)])


def test_bad_values_are_refused_when_encoding():
    with pytest.raises(InvalidRequestError, match="does not fit u32"):
        p.encode_request(p.FetchRequest("t", -1, 0), 1)
    with pytest.raises(InvalidRequestError, match="exceeds 65535"):
        p.encode_request(p.DeleteTopicRequest("x" * 70_000), 1)


def test_non_utf8_strings_are_invalid():
    head = bytearray(p.encode_request(p.DeleteTopicRequest("ab"), 1)[0])
    head[-6] = 0xFF  # first byte of the topic name
    with pytest.raises(InvalidRequestError, match="not UTF-8"):
        p.decode_request([bytes(head)])


def test_the_tcp_decoder_refuses_oversize_and_empty_heads():
    with pytest.raises(InvalidRequestError, match="at most 100 bytes"):
        p.TcpFrameDecoder(max_message_bytes=100).feed(struct.pack("<II", 90, 20))
    with pytest.raises(InvalidRequestError, match="head must be non-empty"):
        p.TcpFrameDecoder().feed(struct.pack("<II", 0, 0))


@settings(max_examples=300)
@given(st.lists(st.binary(max_size=80), min_size=1, max_size=3))
def test_garbage_frames_only_ever_raise_protocol_errors(frames):
    with contextlib.suppress(InvalidRequestError, UnsupportedVersionError):
        p.decode_request(frames)
    for api_key in p.RESPONSE_TYPES:
        with contextlib.suppress(InvalidRequestError, UnsupportedVersionError):
            p.decode_response(api_key, frames)


@given(st.binary(max_size=200))
def test_garbage_tcp_streams_only_ever_raise_protocol_errors(data):
    decoder = p.TcpFrameDecoder(max_message_bytes=1 << 16)
    try:
        for message in decoder.feed(data):
            with contextlib.suppress(InvalidRequestError, UnsupportedVersionError):
                p.decode_request(message)
    except InvalidRequestError:
        pass


def test_the_documents_worked_example_is_the_encoders_bytes():
    request_head, response = doc_tables.hex_dumps("PROTOCOL.md", "## Worked example")
    frames = p.encode_request(p.ProduceRequest("orders", 3, acks=1, timeout_ms=30_000, payload=b"b" * 68), 7,
                              "cli")
    assert request_head == bytes(frames[0])
    assert "`" + bytes(p.frame_tcp(frames)[0]).hex(" ") + "`" in doc_tables.section("PROTOCOL.md",
                                                                                   "## Worked example")
    header, decoded = p.decode_response(p.ApiKey.PRODUCE, [response], version=1)
    assert (header.correlation_id, decoded.base_offset, decoded.log_start_offset, decoded.duplicate) == (
        7, 1234, 0, 0)
    assert response == bytes(p.encode_response(p.ProduceResponse(base_offset=1234, log_start_offset=0), 7)[0])
    v0 = bytes(p.encode_response(p.ProduceResponse(base_offset=1234, log_start_offset=0), 7, version=0)[0])
    assert v0 == response[:-5] + response[-4:], "version 0: the same bytes without duplicate"


def test_the_documents_producer_id_example_decodes_to_what_it_says():
    """An independent reading: the doc's bytes decoded, then re-encoded to the same bytes."""
    section = doc_tables.section("PROTOCOL.md", "## Worked example: a producer id")
    request_head, response = doc_tables.hex_dumps("PROTOCOL.md", "## Worked example: a producer id")
    header, request = p.decode_request([request_head])
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (7, 0, 8, "cli")
    assert (request.producer_id, request.producer_epoch) == (-1, -1)
    assert bytes(p.encode_request(p.InitProducerIdRequest(), 8, "cli")[0]) == request_head
    header, body = p.decode_response(p.ApiKey.INIT_PRODUCER_ID, [response])
    assert (header.correlation_id, header.error_code) == (8, 0)
    assert (body.producer_id, body.producer_epoch) == (1000, 0)
    assert bytes(p.encode_response(p.InitProducerIdResponse(1000, 0), 8)[0]) == response
    bump_request, bump_response = re.findall(r"`((?:[0-9a-f]{2} ){11}[0-9a-f]{2})`", section)
    assert bytes.fromhex(bump_request.replace(" ", "")) == bytes(
        p.encode_request(p.InitProducerIdRequest(1000, 0), 8, "cli")[0])[13:-4]
    assert bytes.fromhex(bump_response.replace(" ", "")) == bytes(
        p.encode_response(p.InitProducerIdResponse(1000, 1), 8)[0])[8:-4]


def test_the_api_key_table_names_every_request_and_response_and_its_versions():
    rows = [(row[0], row[1], row[2], row[4]) for row in doc_tables.table_rows("PROTOCOL.md", "### API keys")]
    assert rows == [(str(key), p.REQUEST_TYPES[key].__name__, p.RESPONSE_TYPES[key].__name__,
                     f"{p.REQUEST_TYPES[key].MIN_VERSION}..{p.REQUEST_TYPES[key].VERSION}")
                    for key in sorted(p.REQUEST_TYPES)]


def test_the_versioning_table_names_every_version_above_0():
    rows = {(row[0], row[1]) for row in doc_tables.table_rows("PROTOCOL.md", "### Versioning")}
    assert rows == {(cls.__name__, str(v)) for cls in (*p.REQUEST_TYPES.values(), *p.RESPONSE_TYPES.values())
                    for v in range(max(1, cls.MIN_VERSION), cls.VERSION + 1)}


def test_the_error_table_gives_every_codes_name_and_whether_it_is_retriable():
    classes = sorted((cls for cls in vars(errors).values() if isinstance(cls, type)
                      and issubclass(cls, errors.HPBrokerError) and cls is not errors.HPBrokerError),
                     key=lambda cls: cls.code)
    rows = [tuple(row[:3]) for row in doc_tables.table_rows("PROTOCOL.md", "## Error codes")]
    assert rows == [("0", "none", ""), *((str(cls.code), cls.__name__, "yes" if cls.retriable else "no")
                                         for cls in classes)]
