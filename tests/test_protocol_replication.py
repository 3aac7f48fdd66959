"""The wire protocol of replication: Fetch, Metadata and CreateTopic version 1, nested fields
versioned with their message, version 0 bytes pinned as they were before version 1, the
replication error codes, and the document's replica fetch example."""

from __future__ import annotations

import dataclasses

import doc_tables
import pytest

from hpbroker import errors
from hpbroker import protocol as p
from hpbroker.errors import InvalidRequestError

# Version 0 bytes as the codec wrote them before version 1 of these messages existed.
FETCH_REQUEST_V0 = ("01 00 00 00 09 00 00 00 01 00 63 06 00 6f 72 64 65 72 73 03 00 00 00 "
                    "b0 04 00 00 00 00 00 00 00 00 10 00 f4 01 00 00 01 00 00 00 00 00 00 00")
FETCH_RESPONSE_V0 = "09 00 00 00 00 00 00 00 e2 04 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"
METADATA_REQUEST_V0 = "03 00 00 00 04 00 00 00 01 00 63 01 00 00 00 01 00 74 00 00 00 00"
METADATA_RESPONSE_V0 = (
    "04 00 00 00 00 00 00 00 01 00 00 00 01 00 00 00 01 00 68 84 23 85 23 01 00 00 00 01 00 74 00 00 "
    "02 00 00 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 85 23 00 00 00 00 00 00 00 00 "
    "05 00 00 00 00 00 00 00 "
    "01 00 00 00 0f 00 ff ff ff ff ff ff ff ff 00 00 ff ff ff ff ff ff ff ff ff ff ff ff ff ff ff ff "
    "00 00 00 00 00 00 00 00")
CREATE_TOPIC_REQUEST_V0 = ("04 00 00 00 05 00 00 00 01 00 63 01 00 74 02 00 00 00 01 00 00 00 "
                           "0c 00 72 65 74 65 6e 74 69 6f 6e 5f 6d 73 01 00 35 00 00 00 00")
CREATE_TOPIC_RESPONSE_V0 = "05 00 00 00 0b 00 06 00 65 78 69 73 74 73 00 00 00 00"


def _replica_fetch() -> p.FetchRequest:
    return p.FetchRequest("orders", 3, 1200, max_bytes=1 << 20, max_wait_ms=500, min_bytes=1, replica_id=2,
                          current_leader_epoch=4, last_fetched_epoch=3)


def _metadata(leader_epoch: int = 7, replicas: list[int] | None = None,
              isr: list[int] | None = None) -> p.MetadataResponse:
    partitions = [p.PartitionMetadata(0, 0, 1, 9093, 0, 5, leader_epoch, replicas or [1, 2, 0],
                                      isr or [1, 0]),
                  p.PartitionMetadata(1, 15)]
    return p.MetadataResponse([p.BrokerInfo(1, "h", 9092, 9093)], [p.TopicMetadata("t", 0, partitions, [])])


def test_version_0_requests_and_responses_are_the_bytes_they_always_were():
    replica_fetch = _replica_fetch()
    assert p.encode_request(replica_fetch, 9, "c", version=0)[0].hex(" ") == FETCH_REQUEST_V0
    diverged = p.FetchResponse(1250, 0, diverging_epoch=3, diverging_end_offset=1180, leader_epoch=4)
    assert p.encode_response(diverged, 9, version=0)[0].hex(" ") == FETCH_RESPONSE_V0
    assert p.encode_request(p.MetadataRequest(["t"]), 4, "c", version=0)[0].hex(" ") == METADATA_REQUEST_V0
    assert p.encode_response(_metadata(), 4, version=0)[0].hex(" ") == METADATA_RESPONSE_V0
    create = p.CreateTopicRequest("t", 2, [p.TopicConfigEntry("retention_ms", "5")], replication_factor=3)
    assert p.encode_request(create, 5, "c", version=0)[0].hex(" ") == CREATE_TOPIC_REQUEST_V0
    assert p.encode_response(p.CreateTopicResponse(), 5, 11, "exists", version=0)[0].hex(" ") == (
        CREATE_TOPIC_RESPONSE_V0)


def test_a_version_0_fetch_decodes_as_a_consumers_fetch():
    header, request = p.decode_request([bytes.fromhex(FETCH_REQUEST_V0)])
    assert header.api_version == 0
    assert (request.offset, request.replica_id, request.current_leader_epoch, request.last_fetched_epoch) == (
        1200, p.CONSUMER_REPLICA_ID, p.NO_LEADER_EPOCH, p.NO_LEADER_EPOCH)
    _, response = p.decode_response(p.ApiKey.FETCH, [bytes.fromhex(FETCH_RESPONSE_V0)], version=0)
    assert (response.high_watermark, response.diverging_epoch, response.diverging_end_offset,
            response.leader_epoch) == (1250, -1, -1, -1)


def test_a_version_1_fetch_appends_the_replica_fields_to_the_version_0_body():
    v0 = bytes.fromhex(FETCH_REQUEST_V0)
    v1 = bytes(p.encode_request(_replica_fetch(), 9, "c", version=1)[0])
    assert v1[2:4] == b"\x01\x00" and v0[2:4] == b"\x00\x00"
    assert v1[4:-4 - 12] == v0[4:-4], "version 1: version 0's body, 12 bytes added before payload_length"
    assert v1[-16:-4] == bytes.fromhex("02000000" "04000000" "03000000")
    header, request = p.decode_request([v1])
    assert (header.api_version, request.replica_id, request.current_leader_epoch,
            request.last_fetched_epoch) == (1, 2, 4, 3)
    assert p.encode_request(p.FetchRequest("t", 0, 0), 1) == p.encode_request(p.FetchRequest("t", 0, 0), 1,
                                                                                version=2)


def test_a_version_2_fetch_appends_the_durable_offset_to_the_version_1_body():
    v1 = bytes(p.encode_request(_replica_fetch(), 9, "c", version=1)[0])
    pipelined = dataclasses.replace(_replica_fetch(), durable_offset=1100)
    v2 = bytes(p.encode_request(pipelined, 9, "c", version=2)[0])
    assert v2[2:4] == b"\x02\x00" and v2[4:-4 - 8] == v1[4:-4]
    assert v2[-12:-4] == (1100).to_bytes(8, "little")
    header, request = p.decode_request([v2])
    assert (header.api_version, request.offset, request.durable_offset) == (2, 1200, 1100)
    assert p.decode_request([v1])[1].durable_offset == -1  # older versions: the offset is durable


def test_a_version_1_fetch_response_carries_the_divergence_and_the_leader_epoch():
    diverged = p.FetchResponse(1250, 0, diverging_epoch=3, diverging_end_offset=1180, leader_epoch=4)
    frames = p.encode_response(diverged, 9, version=1)
    assert len(frames[0]) == len(bytes.fromhex(FETCH_RESPONSE_V0)) + 16
    _, decoded = p.decode_response(p.ApiKey.FETCH, frames, version=1)
    assert (decoded.high_watermark, decoded.log_start_offset, decoded.diverging_epoch,
            decoded.diverging_end_offset, decoded.leader_epoch, bytes(decoded.payload)) == (
        1250, 0, 3, 1180, 4, b"")
    plain = p.FetchResponse(10, 0, payload=b"batches")
    _, decoded = p.decode_response(p.ApiKey.FETCH, p.encode_response(plain, 1, version=1), version=1)
    assert (decoded.diverging_epoch, decoded.diverging_end_offset, decoded.leader_epoch) == (-1, -1, -1)
    assert bytes(decoded.payload) == b"batches"
    with pytest.raises(InvalidRequestError, match="truncated"):
        p.decode_response(p.ApiKey.FETCH, [bytes.fromhex(FETCH_RESPONSE_V0)], version=1)
    with pytest.raises(InvalidRequestError, match="unexpected bytes after the body"):
        p.decode_response(p.ApiKey.FETCH, frames, version=0)


def test_partition_metadata_fields_of_version_1_travel_only_in_a_version_1_metadata_response():
    v1 = p.encode_response(_metadata(), 4, version=1)
    _, decoded = p.decode_response(p.ApiKey.METADATA, v1, version=1)
    first, offline = decoded.topics[0].partitions
    assert (first.leader, first.leader_epoch, first.replicas, first.isr) == (1, 7, [1, 2, 0], [1, 0])
    assert (offline.error_code, offline.leader, offline.leader_epoch, offline.replicas, offline.isr) == (
        15, -1, -1, [], [])
    # Each partition grows by leader_epoch (4), then replicas and isr (a u32 count and i32 each).
    assert len(v1[0]) == len(bytes.fromhex(METADATA_RESPONSE_V0)) + (4 + 4 + 12 + 4 + 8) + (4 + 4 + 4)
    _, decoded_v0 = p.decode_response(p.ApiKey.METADATA, [bytes.fromhex(METADATA_RESPONSE_V0)], version=0)
    first = decoded_v0.topics[0].partitions[0]
    assert (first.leader, first.high_watermark, first.leader_epoch, first.replicas, first.isr) == (
        1, 5, -1, [], [])
    with pytest.raises(InvalidRequestError):
        p.decode_response(p.ApiKey.METADATA, v1, version=0)
    header, request = p.decode_request(p.encode_request(p.MetadataRequest(["t"]), 4, "c"))
    assert (header.api_version, request.topics) == (1, ["t"])
    assert p.encode_request(p.MetadataRequest(["t"]), 4, "c", version=1)[0][4:] == bytes.fromhex(
        METADATA_REQUEST_V0)[4:], "version 1 of the request has version 0's body"


def test_an_array_of_nested_structs_is_bounded_by_the_size_of_the_version_decoded():
    """A version 0 partition is 32 bytes, a version 1 one at least 44: a count that version 0's
    bytes hold is accepted there, and refused before allocating in version 1."""
    assert p._StructType(p.PartitionMetadata).min_size(0) == 32
    assert p._StructType(p.PartitionMetadata).min_size(1) == 44
    fifty = [p.PartitionMetadata(i) for i in range(50)]
    many = p.MetadataResponse(topics=[p.TopicMetadata("t", partitions=fifty)])
    v0 = p.encode_response(many, 1, version=0)
    assert len(p.decode_response(p.ApiKey.METADATA, v0, version=0)[1].topics[0].partitions) == 50
    with pytest.raises(InvalidRequestError, match="array of 50 PartitionMetadata .* at least 2200 bytes"):
        p.decode_response(p.ApiKey.METADATA, v0, version=1)


def test_create_topic_version_1_carries_the_replication_factor():
    request = p.CreateTopicRequest("t", 2, [p.TopicConfigEntry("retention_ms", "5")], replication_factor=3)
    v1 = bytes(p.encode_request(request, 5, "c")[0])
    assert v1[2:4] == b"\x01\x00"
    assert v1[4:-6] == bytes.fromhex(CREATE_TOPIC_REQUEST_V0)[4:-4] and v1[-6:-4] == b"\x03\x00"
    assert p.decode_request([v1])[1].replication_factor == 3
    default = p.decode_request([bytes(p.encode_request(p.CreateTopicRequest("t", 2), 5, "c")[0])])[1]
    assert default.replication_factor == -1, "-1: the broker's default_replication_factor"
    assert p.decode_request([bytes.fromhex(CREATE_TOPIC_REQUEST_V0)])[1].replication_factor == -1
    with pytest.raises(InvalidRequestError, match="does not fit i16"):
        p.encode_request(p.CreateTopicRequest("t", 2, replication_factor=40_000), 5)
    assert p.encode_response(p.CreateTopicResponse(), 5, 11, "exists", version=1)[0].hex(" ") == (
        CREATE_TOPIC_RESPONSE_V0)


def test_the_broker_answers_a_version_0_client_in_version_0():
    for key in (p.ApiKey.METADATA, p.ApiKey.CREATE_TOPIC):
        assert [p.response_version(key, version) for version in (0, 1, 9)] == [0, 1, 1]
    assert [p.response_version(p.ApiKey.FETCH, version) for version in (0, 1, 2, 9)] == [0, 1, 2, 2]


def test_the_document_marks_nested_fields_of_version_1():
    table = p.schema_table(p.PartitionMetadata)
    assert "| `leader_epoch` | `i32` | v1+ |" in table
    assert "| `replicas` | `array<i32>` | v1+ |" in table and "| `isr` | `array<i32>` | v1+ |" in table
    assert "| `leader` | `i64` | |" in table


def test_a_nested_field_newer_than_its_message_is_caught():
    class Newer:
        SCHEMA = (("a", p.I32), ("b", p.I32, 2))
    assert p._newest_since(p._Array(p._StructType(Newer))) == 2
    assert p._newest_since(p._Array(p._StructType(p.TopicMetadata))) == 1
    assert p._newest_since(p.I64) == 0


REPLICATION_ERRORS = [
    (23, errors.NotLeaderOrFollowerError, True),
    (24, errors.NotEnoughReplicasError, True),
    (25, errors.FencedLeaderEpochError, True),
    (26, errors.InvalidReplicationFactorError, False),
]


@pytest.mark.parametrize(("code", "cls", "retriable"), REPLICATION_ERRORS,
                         ids=lambda v: getattr(v, "__name__", str(v)))
def test_the_replication_errors_have_their_codes_and_are_rebuilt_from_them(code, cls, retriable):
    assert (cls.code, cls.retriable, issubclass(cls, errors.HPBrokerError)) == (code, retriable, True)
    assert errors.ERRORS_BY_CODE[code] is cls
    text = "orders-0: the leader is broker 2 at 127.0.0.1:9192 (leader epoch 4)"
    rebuilt = errors.error_for_code(code, text)
    assert type(rebuilt) is cls and "broker 2" in rebuilt.message
    assert cls.__name__ in errors.__all__
    assert f"{code}    {cls.__name__}" in errors.__doc__


def test_error_codes_are_unique_and_dense():
    codes = sorted(errors.ERRORS_BY_CODE)
    assert codes == list(range(1, len(codes) + 1))


def test_the_documents_replica_fetch_example_decodes_to_what_it_says():
    heading = "## Worked example: a replica fetch"
    request_head, response = doc_tables.hex_dumps("PROTOCOL.md", heading)
    header, request = p.decode_request([request_head])
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        1, 1, 9, "broker-2")
    assert (request.topic, request.partition, request.offset, request.max_bytes, request.max_wait_ms,
            request.min_bytes) == ("orders", 3, 1200, 1 << 20, 500, 1)
    assert (request.replica_id, request.current_leader_epoch, request.last_fetched_epoch) == (2, 4, 3)
    assert bytes(p.encode_request(_replica_fetch(), 9, "broker-2", version=1)[0]) == request_head
    frames = p.encode_request(_replica_fetch(), 9, "broker-2", version=1)
    assert "`" + bytes(p.frame_tcp(frames)[0]).hex(" ") + "`" in doc_tables.section("PROTOCOL.md", heading)
    header, body = p.decode_response(p.ApiKey.FETCH, [response], version=1)
    assert (header.correlation_id, header.error_code) == (9, 0)
    assert (body.high_watermark, body.log_start_offset, body.diverging_epoch, body.diverging_end_offset,
            body.leader_epoch, bytes(body.payload)) == (1250, 0, 3, 1180, 4, b"")
    assert len(p.encode_request(_replica_fetch(), 9, "broker-2", version=0)[0]) == 54
    assert len(p.encode_response(body, 9, version=0)[0]) == 28
