"""A worker process serving relayed produce, fetch and list-offsets requests (fake arbiter, real
worker, real sockets)."""

from __future__ import annotations

import json
import os
import time

import pytest
from worker_harness import (
    CLIENT,
    batch_values,
    fetch_request,
    make_batch,
    produce_request,
    values_of,
)

from hpbroker import protocol, records
from hpbroker.protocol import ApiKey
from hpbroker.workers import heartbeat


def test_worker_says_ready_and_writes_heartbeats(start_worker, arbiter):
    worker = start_worker()  # start() checks the ready message: slot and pid
    assert arbiter.call(0, produce_request("orders", 1, make_batch("x")))[0].error_code == 0
    deadline = time.monotonic() + 5
    while True:
        age, content = heartbeat.read_heartbeat(arbiter.run_dir, 0)
        entries = {(p["topic"], p["partition"]): p for p in (content or {}).get("partitions", [])}
        if entries.get(("orders", 1), {}).get("high_watermark") == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert content is not None and content["ready"] is True and content["pid"] == worker.pid
    assert age < 2
    assert entries == {
        ("orders", 0): {"topic": "orders", "partition": 0, "log_start_offset": 0, "high_watermark": 0},
        ("orders", 1): {"topic": "orders", "partition": 1, "log_start_offset": 0, "high_watermark": 3},
    }


def test_produce_is_acknowledged_with_offsets_and_fetch_returns_the_exact_batches(start_worker, arbiter):
    start_worker()
    first, second = make_batch("first", count=2), make_batch("second", count=5)
    header, response = arbiter.call(0, produce_request("orders", 0, first))
    assert (header.error_code, response.base_offset, response.log_start_offset) == (0, 0, 0)
    header, response = arbiter.call(0, produce_request("orders", 0, second))
    assert (header.error_code, response.base_offset) == (0, 2)

    header, response = arbiter.call(0, fetch_request("orders", 0, 0))
    assert header.error_code == 0
    assert (response.high_watermark, response.log_start_offset) == (7, 0)
    scan = records.scan_batches(bytes(response.payload))
    assert scan.batch_count == 2 and list(scan.base_offsets) == [0, 2]
    stored = bytes(response.payload)
    assert stored.endswith(second[8:])  # the bytes the producer sent, only base_offset stamped
    assert values_of(response.payload) == batch_values(first) + batch_values(second)

    header, response = arbiter.call(0, fetch_request("orders", 0, 2))  # from the second batch on
    assert values_of(response.payload) == batch_values(second)
    header, response = arbiter.call(0, fetch_request("orders", 1, 0))  # the other partition is empty
    assert (header.error_code, response.high_watermark, bytes(response.payload)) == (0, 0, b"")


def test_pipelined_produces_are_answered_in_order_and_stored_in_order(start_worker, arbiter):
    start_worker(log={"flush_messages": 50, "flush_ms": 2})
    batches = [make_batch(f"b{i}", count=1 + i % 4) for i in range(300)]
    sent = [arbiter.relay(0, produce_request("orders", i % 2, batch)) for i, batch in enumerate(batches)]
    answers: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
    for _ in sent:
        header, response = arbiter.response(ApiKey.PRODUCE)
        assert header.error_code == 0, header
        index = sent.index(header.correlation_id)
        answers[index % 2].append((index, response.base_offset))
    for partition in (0, 1):
        indexes = [index for index, _ in answers[partition]]
        assert indexes == sorted(indexes)  # responses of one partition in request order
        expected_offset = 0
        for index, base_offset in answers[partition]:
            assert base_offset == expected_offset
            expected_offset += records.read_header(batches[index]).record_count
        fetched = []
        offset = 0
        while offset < expected_offset:
            _header, response = arbiter.call(0, fetch_request("orders", partition, offset, max_bytes=4096))
            decoded = list(records.decode_records(response.payload))
            fetched += [r.value for r in decoded if r.offset >= offset]
            offset = decoded[-1].offset + 1
        assert fetched == [v for index, _ in answers[partition] for v in batch_values(batches[index])]


def test_records_are_invisible_until_flushed_and_acknowledged_only_then(start_worker, arbiter):
    start_worker(log={"flush_messages": 3, "flush_ms": 600_000})
    ids = [arbiter.relay(0, produce_request("orders", 0, make_batch(f"r{i}", count=1))) for i in range(2)]
    assert arbiter.nothing_within(0.3)  # two records pending, flush_messages is 3: no ack yet
    arbiter.relay(0, fetch_request("orders", 0, 0, max_wait_ms=0), correlation_id=900)
    header, response = arbiter.response(ApiKey.FETCH)
    assert (header.correlation_id, response.high_watermark, bytes(response.payload)) == (900, 0, b"")
    _header, latest = arbiter.call(0, protocol.ListOffsetsRequest("orders", 0, protocol.LATEST_TIMESTAMP))
    assert latest.offset == 0

    ids.append(arbiter.relay(0, produce_request("orders", 0, make_batch("r2", count=1))))  # the third
    acks = [arbiter.response(ApiKey.PRODUCE) for _ in ids]
    assert [(h.correlation_id, h.error_code, r.base_offset) for h, r in acks] == [
        (ids[0], 0, 0), (ids[1], 0, 1), (ids[2], 0, 2)]
    _header, response = arbiter.call(0, fetch_request("orders", 0, 0))
    assert response.high_watermark == 3 and len(values_of(response.payload)) == 3


def test_long_poll_fetch_wakes_soon_after_a_produce(start_worker, arbiter):
    start_worker(log={"flush_messages": 1_000_000, "flush_ms": 5})
    arbiter.relay(0, fetch_request("orders", 1, 0, max_wait_ms=8_000, min_bytes=1), correlation_id=77)
    assert arbiter.nothing_within(0.3)  # parked
    produced_at = time.monotonic()
    produce_id = arbiter.relay(0, produce_request("orders", 1, make_batch("wake")))
    answers = {}
    for _ in range(2):
        header, response = arbiter.any_response({produce_id: ApiKey.PRODUCE, 77: ApiKey.FETCH})
        answers[header.correlation_id] = (time.monotonic() - produced_at, header, response)
    waited, header, response = answers[77]
    assert waited < 1.0  # the flush is due within 5 ms; well before max_wait_ms
    assert header.error_code == 0 and response.high_watermark == 3
    assert values_of(response.payload) == batch_values(make_batch("wake"))


def test_long_poll_fetch_times_out_with_an_empty_payload(start_worker, arbiter):
    start_worker()
    started = time.monotonic()
    header, response = arbiter.call(0, fetch_request("orders", 0, 0, max_wait_ms=300, min_bytes=1))
    waited = time.monotonic() - started
    assert 0.28 <= waited < 2.0
    assert (header.error_code, response.high_watermark, bytes(response.payload)) == (0, 0, b"")


def test_fetches_of_one_client_for_one_partition_are_answered_in_order(start_worker, arbiter):
    start_worker()
    arbiter.call(0, produce_request("orders", 0, make_batch("a")))
    parked = arbiter.relay(0, fetch_request("orders", 0, 3, max_wait_ms=800))  # at the end: parks
    behind = arbiter.relay(0, fetch_request("orders", 0, 0))  # answerable now, but must wait
    other = arbiter.relay(0, fetch_request("orders", 0, 0), client=b"\x00other")  # another client: now
    header, _response = arbiter.response(ApiKey.FETCH, client=b"\x00other")
    assert header.correlation_id == other
    order = [arbiter.response(ApiKey.FETCH)[0].correlation_id for _ in range(2)]
    assert order == [parked, behind]


def test_a_produce_not_flushed_in_time_gets_request_timed_out(start_worker, arbiter):
    start_worker(log={"flush_messages": 1_000_000, "flush_ms": 600_000})
    started = time.monotonic()
    header, response = arbiter.call(0, produce_request("orders", 0, make_batch("late"), timeout_ms=200))
    assert header.error_code == 12 and "timeout_ms 200" in header.error_message
    assert 0.18 <= time.monotonic() - started < 2.0
    assert response.base_offset == -1


def test_a_corrupt_batch_is_refused_with_its_error_and_nothing_is_appended(start_worker, arbiter):
    start_worker()
    good = make_batch("good")
    corrupt = bytearray(make_batch("bad"))
    corrupt[-3] ^= 0xFF  # inside the CRC'd records
    header, response = arbiter.call(0, produce_request("orders", 0, good + bytes(corrupt)))
    assert header.error_code == 2 and "crc" in header.error_message.lower()
    assert response.base_offset == -1
    header, response = arbiter.call(0, produce_request("orders", 0, b"\x01\x02\x03"))
    assert header.error_code == 2
    _header, latest = arbiter.call(0, protocol.ListOffsetsRequest("orders", 0, protocol.LATEST_TIMESTAMP))
    assert latest.offset == 0  # nothing of either request was appended
    header, response = arbiter.call(0, produce_request("orders", 0, good))
    assert (header.error_code, response.base_offset) == (0, 0)


def test_an_error_waits_behind_earlier_produces_of_its_partition(start_worker, arbiter):
    start_worker(log={"flush_messages": 1_000_000, "flush_ms": 300})
    first = arbiter.relay(0, produce_request("orders", 0, make_batch("ok")))
    refused = arbiter.relay(0, produce_request("orders", 0, b"garbage"))
    answers = [arbiter.response(ApiKey.PRODUCE)[0] for _ in range(2)]
    assert [(h.correlation_id, h.error_code) for h in answers] == [(first, 0), (refused, 2)]


def test_requests_for_partitions_of_other_workers_get_error_6(start_worker, arbiter):
    start_worker()
    for request in (produce_request("orders", 7, make_batch("x")), fetch_request("other", 0, 0),
                    protocol.ListOffsetsRequest("orders", 2, -1)):
        header, response = arbiter.call(0, request)
        assert header.error_code == 6, request
    assert response.offset == -1


def test_acks_0_produce_gets_no_response_even_on_error(start_worker, arbiter):
    start_worker()
    arbiter.relay(0, produce_request("orders", 0, make_batch("fire"), acks=0))
    arbiter.relay(0, produce_request("orders", 0, b"not a batch", acks=0))
    arbiter.relay(0, produce_request("nowhere", 0, make_batch("lost"), acks=0))
    assert arbiter.nothing_within(0.3)
    _header, response = arbiter.call(0, fetch_request("orders", 0, 0))
    assert values_of(response.payload) == batch_values(make_batch("fire"))


def test_list_offsets_latest_earliest_and_by_timestamp(start_worker, arbiter):
    start_worker()
    old = records.build_batch([b"old"], timestamps=1_000)
    new = records.build_batch([b"new1", b"new2"], timestamps=5_000)
    arbiter.call(0, produce_request("orders", 0, old))
    arbiter.call(0, produce_request("orders", 0, new))
    expected = {protocol.LATEST_TIMESTAMP: 3, protocol.EARLIEST_TIMESTAMP: 0, 500: 0, 2_000: 1, 5_000: 1,
                9_000: -1}
    for timestamp, offset in expected.items():
        header, response = arbiter.call(0, protocol.ListOffsetsRequest("orders", 0, timestamp))
        assert (header.error_code, response.offset) == (0, offset), timestamp
    header, _response = arbiter.call(0, protocol.ListOffsetsRequest("orders", 0, -5))
    assert header.error_code == 10


def test_offset_out_of_range_reports_both_offsets(start_worker, arbiter):
    start_worker()
    arbiter.call(0, produce_request("orders", 0, make_batch("a")))
    header, response = arbiter.call(0, fetch_request("orders", 0, 50))
    assert header.error_code == 5
    assert (response.high_watermark, response.log_start_offset) == (3, 0)


@pytest.mark.parametrize(
    ("head", "code"),
    [
        (protocol.encode_request(protocol.FetchRequest("orders", 0, 0), 41)[0][:-6], 10),  # truncated body
        (protocol.encode_request(protocol.FetchRequest("orders", 0, 0), 41)[0] + b"xx", 10),  # trailing bytes
        (b"\x63\x00\x00\x00" + (41).to_bytes(4, "little") + b"\x00\x00\x00\x00\x00\x00", 9),  # api_key 99
        (b"\x01\x00\x05\x00" + (41).to_bytes(4, "little") + b"\x00\x00", 9),  # fetch version 5
        (protocol.encode_request(protocol.MetadataRequest(), 41)[0], 10),  # not a worker's request
    ],
    ids=["truncated", "trailing", "unknown-api-key", "unknown-version", "metadata"],
)
def test_malformed_relayed_requests_get_error_responses(start_worker, arbiter, head, code):
    start_worker()
    arbiter.send_frames(0, [b"R", CLIENT, head])
    header = arbiter.response_header()
    assert (header.correlation_id, header.error_code) == (41, code), header


def test_unparsable_backend_messages_are_dropped_and_the_worker_keeps_serving(start_worker, arbiter):
    worker = start_worker()
    arbiter.send_frames(0, [b"R", CLIENT, b"\x01"])  # header does not parse: nobody to answer
    arbiter.send_frames(0, [b"X", b"what"])  # unknown kind
    arbiter.send_frames(0, [b"C", b"{not json"])
    arbiter.send_frames(0, [b"R", CLIENT, b"a", b"b", b"c"])  # too many frames
    assert arbiter.nothing_within(0.3)
    header, _response = arbiter.call(0, produce_request("orders", 0, make_batch("still")))
    assert header.error_code == 0
    assert os.waitpid(worker.pid, os.WNOHANG) == (0, 0)


def test_unknown_control_op_is_acknowledged_with_an_error(start_worker, arbiter):
    start_worker()
    ack = arbiter.control(0, "reboot")
    assert "unknown control op" in ack["error"]
    assert json.loads(json.dumps(ack))  # plain JSON
