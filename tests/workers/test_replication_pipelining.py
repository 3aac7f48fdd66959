"""A follower that fetches while it flushes (FetchRequest version 2, ``durable_offset``): the
leader reads from the fetch offset but counts only the durable offset toward the high watermark,
so acks=-1 never answers records a follower has not flushed.

The follower here is the test itself, sending replica fetches as broker 1 to a real leader
worker's data port; the last test runs a real follower worker with fdatasync on."""

from __future__ import annotations

from replication_harness import TOPIC, lead, segment_bytes, wait_until
from worker_harness import TcpClient, make_batch, produce_request

from hpbroker import protocol
from hpbroker.errors import InvalidRequestError
from hpbroker.protocol import ApiKey


def replica_fetch(offset: int, durable_offset: int = -1, *, epoch: int = 1) -> protocol.FetchRequest:
    return protocol.FetchRequest(TOPIC, 0, offset, max_bytes=1 << 20, max_wait_ms=0, replica_id=1,
                                 current_leader_epoch=epoch, last_fetched_epoch=epoch,
                                 durable_offset=durable_offset)


def leading_for_broker_1(brokers):
    (leader,) = brokers(1)
    ack = leader.role(TOPIC, 0, "leader", epoch=1, leader=0, leader_address=leader.address,
                      replicas=[0, 1], isr=[0, 1])
    assert ack["error"] is None, ack
    return leader


def test_records_fetched_but_not_durable_on_the_follower_do_not_move_the_high_watermark(brokers):
    leader = leading_for_broker_1(brokers)
    correlation_id = leader.arbiter.relay(0, produce_request(TOPIC, 0, make_batch("a"), acks=-1,
                                                             timeout_ms=60_000))
    follower = TcpClient(leader.worker.port)
    try:
        header, response = wait_until(lambda: _fetched(follower, replica_fetch(0), 3),
                                      what="the leader's records fetched")
        assert (header.error_code, response.high_watermark) == (0, 0)
        # The follower holds offsets 0..2 but has flushed none of them: nothing is committed.
        follower.send(replica_fetch(3, durable_offset=0), 2)
        header, response = follower.response(ApiKey.FETCH)
        assert (header.error_code, response.high_watermark) == (0, 0)
        assert leader.arbiter.nothing_within(1.0), "acks=-1 answered before the follower flushed"
        # Flushed up to 2 of them: the high watermark follows the durable offset, not the fetch's.
        follower.send(replica_fetch(3, durable_offset=2), 3)
        header, response = follower.response(ApiKey.FETCH)
        assert (header.error_code, response.high_watermark) == (0, 2)
        assert leader.arbiter.nothing_within(0.5), "acks=-1 answered before its last record was flushed"
        follower.send(replica_fetch(3, durable_offset=3), 4)
        header, response = leader.arbiter.response(ApiKey.PRODUCE)
        assert (header.correlation_id, header.error_code, response.base_offset) == (correlation_id, 0, 0)
        assert follower.response(ApiKey.FETCH)[0].error_code == 0
    finally:
        follower.close()


def test_a_durable_offset_past_the_fetch_offset_is_refused(brokers):
    leader = leading_for_broker_1(brokers)
    assert leader.call(produce_request(TOPIC, 0, make_batch("a"), acks=1))[0].error_code == 0
    follower = TcpClient(leader.worker.port)
    try:
        follower.send(replica_fetch(1, durable_offset=3), 1)
        header, _ = follower.response(ApiKey.FETCH)
        assert header.error_code == InvalidRequestError.code
        assert "durable offset 3 past it" in header.error_message
    finally:
        follower.close()


def test_a_durable_offset_below_minus_one_is_refused_not_taken_as_durable(brokers):
    """-1 alone means "the fetch offset"; -2 (garbage, a bug) must not count the fetch offset as
    flushed on the follower: it would let acks=-1 answer records the follower has not flushed."""
    leader = leading_for_broker_1(brokers)
    correlation_id = leader.arbiter.relay(0, produce_request(TOPIC, 0, make_batch("a"), acks=-1,
                                                             timeout_ms=60_000))
    follower = TcpClient(leader.worker.port)
    try:
        wait_until(lambda: _fetched(follower, replica_fetch(0), 3), what="the leader's records fetched")
        follower.send(replica_fetch(3, durable_offset=-2), 2)
        header, response = follower.response(ApiKey.FETCH)
        assert header.error_code == InvalidRequestError.code, (header, response)
        assert "durable offset -2: it must be -1 (none) or an offset >= 0" in header.error_message
        assert leader.arbiter.nothing_within(1.0), "acks=-1 answered though the follower flushed nothing"
        follower.send(replica_fetch(3), 3)  # then flushed (version 1 style): committed
        header, response = leader.arbiter.response(ApiKey.PRODUCE)
        assert (header.correlation_id, header.error_code) == (correlation_id, 0)
        assert follower.response(ApiKey.FETCH)[0].error_code == 0
    finally:
        follower.close()


def test_a_version_1_replica_fetch_still_counts_its_offset_as_durable(brokers):
    leader = leading_for_broker_1(brokers)
    assert leader.call(produce_request(TOPIC, 0, make_batch("a"), acks=1))[0].error_code == 0
    follower = TcpClient(leader.worker.port)
    try:
        request = replica_fetch(3)
        frames = protocol.encode_request(request, 1, "old-follower", version=1)
        follower.sock.sendall(b"".join(bytes(f) for f in protocol.frame_tcp(frames)))
        header, response = follower.response(ApiKey.FETCH)
        assert (header.error_code, response.high_watermark) == (0, 3)
    finally:
        follower.close()


def test_a_pipelining_follower_with_fdatasync_ends_byte_identical_under_a_stream_of_acks_all(brokers):
    leader, follower = brokers(2, log={"flush_fsync": True})
    lead(leader, [follower])
    waiting = [leader.arbiter.relay(0, produce_request(TOPIC, 0, make_batch(f"v{i}", 50), acks=-1,
                                                       timeout_ms=60_000)) for i in range(40)]
    answered = {}
    for _ in waiting:
        header, response = leader.arbiter.response(ApiKey.PRODUCE)
        answered[header.correlation_id] = (header.error_code, response.base_offset)
    assert answered == {cid: (0, 50 * i) for i, cid in enumerate(waiting)}
    directory = leader.worker.directory(TOPIC, 0)
    wait_until(lambda: segment_bytes(follower.worker.directory(TOPIC, 0)) == segment_bytes(directory),
               what="the follower's segments equal to the leader's")


def _fetched(client: TcpClient, request: protocol.FetchRequest, records: int):
    client.send(request, 1)
    header, response = client.response(ApiKey.FETCH)
    return (header, response) if len(response.payload) and header.error_code == 0 else None
