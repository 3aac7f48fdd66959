"""Replication between real worker processes acting as brokers 0 and 1 (no ZooKeeper, no arbiter:
the test sends the ``replica_role`` controls and reads the ``isr_change`` proposals itself).

The follower fetches from the leader's real data port and appends its bytes; acks=-1 is answered
once the follower has the records flushed; consumers read below the replicated high watermark."""

from __future__ import annotations

import pytest
from replication_harness import TOPIC, ReplicaBroker, lead, segment_bytes, wait_until
from worker_harness import TcpClient, fetch_request, make_batch, produce_request, read_log_values, values_of

from hpbroker import protocol
from hpbroker.errors import (
    FencedLeaderEpochError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
)
from hpbroker.protocol import ApiKey
from hpbroker.workers.stats import read_stats


def same_bytes(a: ReplicaBroker, b: ReplicaBroker) -> bool:
    left = segment_bytes(a.worker.directory(TOPIC, 0))
    return bool(left) and left == segment_bytes(b.worker.directory(TOPIC, 0))


@pytest.mark.parametrize("fsync", [False, True], ids=["page-cache", "fdatasync"])
def test_acks_all_is_answered_once_the_follower_has_the_records_and_its_bytes_are_the_leaders(brokers, fsync):
    leader, follower = brokers(2, log={"flush_fsync": fsync})
    lead(leader, [follower])
    header, response = leader.call(produce_request(TOPIC, 0, make_batch("a"), acks=-1))
    assert (header.error_code, response.base_offset) == (0, 0)

    follower.pause()
    correlation_id = leader.arbiter.relay(0, produce_request(TOPIC, 0, make_batch("b"), acks=-1,
                                                             timeout_ms=60_000))
    assert leader.arbiter.nothing_within(1.5), "acks=-1 answered while the follower was stopped"
    follower.resume()
    header, response = leader.arbiter.response(ApiKey.PRODUCE)
    assert (header.correlation_id, header.error_code, response.base_offset) == (correlation_id, 0, 3)

    for i in range(5):  # acks=1 and acks=-1 mixed: answered in request order
        acks = -1 if i % 2 else 1
        header, response = leader.call(produce_request(TOPIC, 0, make_batch(f"c{i}"), acks=acks))
        assert (header.error_code, response.base_offset) == (0, 6 + 3 * i)
    wait_until(lambda: same_bytes(leader, follower), what="the follower's segments equal to the leader's")
    entry = wait_until(lambda: (e := follower.partition_entry(TOPIC, 0)) and e["log_end_offset"] == 21 and e,
                       what="the follower's heartbeat at offset 21")
    assert (entry["role"], entry["leader"], entry["leader_epoch"]) == ("follower", 0, 1)
    entry = wait_until(lambda: (e := leader.partition_entry(TOPIC, 0)) and e["high_watermark"] == 21 and e,
                       what="the leader's heartbeat with high watermark 21")
    assert (entry["role"], entry["isr"], entry["log_end_offset"]) == ("leader", [0, 1], 21)


def test_consumers_read_only_below_the_high_watermark(brokers):
    leader, follower = brokers(2)
    lead(leader, [follower])
    assert leader.call(produce_request(TOPIC, 0, make_batch("a"), acks=-1))[0].error_code == 0
    follower.pause()
    header, response = leader.call(produce_request(TOPIC, 0, make_batch("b"), acks=1))
    assert (header.error_code, response.base_offset) == (0, 3)  # flushed on the leader: acks=1 answered

    header, response = leader.call(fetch_request(TOPIC, 0, 0))
    assert header.error_code == 0 and response.high_watermark == 3 and response.leader_epoch == 1
    assert values_of(response.payload) == values_of(make_batch("a"))
    header, response = leader.call(fetch_request(TOPIC, 0, 3))
    assert (header.error_code, response.high_watermark, bytes(response.payload)) == (0, 3, b"")
    client = TcpClient(leader.worker.port)
    client.send(fetch_request(TOPIC, 0, 0), 1)
    header, response = client.response(ApiKey.FETCH)
    assert header.error_code == 0 and values_of(response.payload) == values_of(make_batch("a"))
    client.send(protocol.ListOffsetsRequest(TOPIC, 0, protocol.LATEST_TIMESTAMP), 2)
    assert client.response(ApiKey.LIST_OFFSETS)[1].offset == 3
    client.close()

    parked = leader.arbiter.relay(0, fetch_request(TOPIC, 0, 3, max_wait_ms=20_000))
    assert leader.arbiter.nothing_within(1.0), "a long poll answered with records above the high watermark"
    follower.resume()
    header, response = leader.arbiter.response(ApiKey.FETCH)
    assert (header.correlation_id, header.error_code, response.high_watermark) == (parked, 0, 6)
    assert values_of(response.payload) == values_of(make_batch("b"))


def test_acks_all_is_refused_below_min_insync_replicas_and_acks_1_still_works(brokers):
    leader, follower = brokers(2)
    lead(leader, [follower], isr=[0], min_insync_replicas=2)
    header, _response = leader.call(produce_request(TOPIC, 0, make_batch("a"), acks=-1))
    assert header.error_code == NotEnoughReplicasError.code
    assert "1 in-sync replicas [0], min_insync_replicas is 2" in header.error_message
    header, response = leader.call(produce_request(TOPIC, 0, make_batch("b"), acks=1))
    assert (header.error_code, response.base_offset) == (0, 0)  # nothing of the refused one appended


def test_a_follower_refuses_clients_naming_the_leader_and_the_leader_fences_stale_epochs(brokers):
    leader, follower = brokers(2)
    lead(leader, [follower], epoch=4, leader_port=9092)
    where = "the leader is broker 0 at 127.0.0.1:9092 (leader epoch 4)"  # its front-end port
    for request in (produce_request(TOPIC, 0, make_batch("a")), fetch_request(TOPIC, 0, 0),
                    protocol.ListOffsetsRequest(TOPIC, 0, protocol.LATEST_TIMESTAMP)):
        header, _response = follower.call(request)
        assert header.error_code == NotLeaderOrFollowerError.code, header
        assert where in header.error_message

    client = TcpClient(leader.worker.port)
    stale = protocol.FetchRequest(TOPIC, 0, 0, replica_id=1, current_leader_epoch=3, max_wait_ms=0)
    client.send(stale, 1)
    assert client.response(ApiKey.FETCH)[0].error_code == FencedLeaderEpochError.code
    stranger = protocol.FetchRequest(TOPIC, 0, 0, replica_id=7, current_leader_epoch=4, max_wait_ms=0)
    client.send(stranger, 2)
    assert client.response(ApiKey.FETCH)[0].error_code == NotLeaderOrFollowerError.code
    client.close()
    client = TcpClient(follower.worker.port)
    client.send(protocol.FetchRequest(TOPIC, 0, 0, replica_id=0, current_leader_epoch=4, max_wait_ms=0), 3)
    assert client.response(ApiKey.FETCH)[0].error_code == NotLeaderOrFollowerError.code
    client.close()


def test_a_role_of_an_older_epoch_is_refused_and_changes_nothing(brokers):
    (broker,) = brokers(1)
    assert broker.role(TOPIC, 0, "leader", epoch=5, leader=0, leader_address=broker.address, replicas=[0],
                       isr=[0])["error"] is None
    ack = broker.role(TOPIC, 0, "follower", epoch=4, leader=1, leader_address=["127.0.0.1", 1],
                      replicas=[0, 1], isr=[0, 1])
    assert "leader epoch 4 refused" in ack["error"]
    header, response = broker.call(produce_request(TOPIC, 0, make_batch("a"), acks=-1))
    assert (header.error_code, response.base_offset) == (0, 0)  # still the leader (ISR [0])
    ack = broker.role(TOPIC, 0, "leader", epoch=6, leader=1, leader_address=None, replicas=[0, 1], isr=[0])
    assert "naming broker 1" in ack["error"]


def test_losing_leadership_fails_the_acks_all_requests_still_waiting(brokers):
    leader, follower = brokers(2)
    lead(leader, [follower])
    follower.pause()
    waiting = leader.arbiter.relay(0, produce_request(TOPIC, 0, make_batch("a"), acks=-1, timeout_ms=60_000))
    assert leader.arbiter.nothing_within(0.5)
    ack = leader.role(TOPIC, 0, "follower", epoch=2, leader=1, leader_address=follower.address,
                      replicas=[0, 1], isr=[1])
    assert ack["error"] is None
    header, _response = leader.arbiter.response(ApiKey.PRODUCE)
    assert (header.correlation_id, header.error_code) == (waiting, NotLeaderOrFollowerError.code)
    assert "may or may not have been stored" in header.error_message
    follower.resume()


def test_a_silent_follower_leaves_the_isr_and_rejoins_once_caught_up(brokers):
    leader, follower = brokers(2)
    lead(leader, [follower], lag_time_max_ms=1000)
    assert leader.call(produce_request(TOPIC, 0, make_batch("a"), acks=-1))[0].error_code == 0
    follower.kill()
    proposal = leader.arbiter.expect_isr_change([0], timeout_s=15)
    assert proposal == {"topic": TOPIC, "partition": 0, "leader_epoch": 1, "isr": [0], "from_isr": [0, 1]}
    # the arbiter wrote it: the same epoch comes back with the new ISR
    lead_ack = leader.role(TOPIC, 0, "leader", epoch=1, leader=0, leader_address=leader.address,
                           replicas=[0, 1], isr=[0], lag_time_max_ms=1000)
    assert lead_ack["error"] is None
    for i in range(3):  # acks=-1 with the leader alone in the ISR (min_insync_replicas 1)
        header, response = leader.call(produce_request(TOPIC, 0, make_batch(f"b{i}"), acks=-1))
        assert (header.error_code, response.base_offset) == (0, 3 + 3 * i)

    leader.arbiter.isr_changes.clear()
    follower.start()
    ack = follower.role(TOPIC, 0, "follower", epoch=1, leader=0, leader_address=leader.address,
                        replicas=[0, 1], isr=[0], lag_time_max_ms=1000)
    assert ack["error"] is None
    proposal = leader.arbiter.expect_isr_change([0, 1], timeout_s=15)
    assert proposal["leader_epoch"] == 1
    wait_until(lambda: same_bytes(leader, follower), what="the restarted follower caught up")
    lead_ack = leader.role(TOPIC, 0, "leader", epoch=1, leader=0, leader_address=leader.address,
                           replicas=[0, 1], isr=[0, 1], lag_time_max_ms=1000)
    assert lead_ack["error"] is None
    entry = wait_until(lambda: (e := leader.partition_entry(TOPIC, 0)) and e["isr"] == [0, 1] and e,
                       what="the leader's heartbeat with ISR [0, 1]")
    assert entry["high_watermark"] == 12


def test_a_follower_with_records_the_new_leader_lacks_truncates_and_ends_byte_identical(brokers):
    first, second = brokers(2)
    lead(first, [second])
    assert first.call(produce_request(TOPIC, 0, make_batch("a"), acks=-1))[0].error_code == 0
    wait_until(lambda: same_bytes(first, second), what="the follower has batch a")
    second.kill()
    for tag in ("lost-1", "lost-2"):  # only the old leader has these (acks=1)
        assert first.call(produce_request(TOPIC, 0, make_batch(tag), acks=1))[0].error_code == 0

    # The controller elects broker 1 (epoch 2); broker 0 learns it is a follower now.
    second.start()
    ack = second.role(TOPIC, 0, "leader", epoch=2, leader=1, leader_address=second.address, replicas=[0, 1],
                      isr=[1])
    assert ack["error"] is None
    header, response = second.call(produce_request(TOPIC, 0, make_batch("new", count=5), acks=-1))
    assert (header.error_code, response.base_offset) == (0, 3)
    ack = first.role(TOPIC, 0, "follower", epoch=2, leader=1, leader_address=second.address, replicas=[0, 1],
                     isr=[1])
    assert ack["error"] is None

    wait_until(lambda: same_bytes(first, second), what="the old leader truncated and caught up")
    _header, response = second.call(fetch_request(TOPIC, 0, 0))
    assert values_of(response.payload) == values_of(make_batch("a")) + values_of(make_batch("new", count=5))
    assert not any(b"lost" in value for value in values_of(segment_bytes(first.worker.directory(TOPIC, 0))))


def test_the_leaders_stats_show_each_followers_lag_in_records_and_bytes(brokers):
    leader, follower = brokers(2, metrics_port=2)  # the worker writes its stats file; nothing is served
    lead(leader, [follower])
    assert leader.call(produce_request(TOPIC, 0, make_batch("a"), acks=-1))[0].error_code == 0
    follower.pause()
    batch = make_batch("b", count=10)
    assert leader.call(produce_request(TOPIC, 0, batch, acks=1))[0].error_code == 0

    def lagging() -> dict | None:
        stats = read_stats(leader.run_dir, 0)
        entry = stats and next(p for p in stats["partitions"] if p["topic"] == TOPIC)
        return entry if entry and entry.get("followers") and entry["followers"][0]["lag_records"] else None

    entry = wait_until(lagging, what="the follower's lag in the leader's stats")
    assert (entry["role"], entry["leader_epoch"], entry["replicated_high_watermark"]) == ("leader", 1, 3)
    assert entry["followers"] == [{"broker": 1, "fetch_offset": 3, "in_sync": True, "lag_records": 10,
                                   "lag_bytes": len(batch),
                                   "last_caught_up_ms": entry["followers"][0]["last_caught_up_ms"]}]
    assert (entry["under_replicated"], entry["isr_shrinks"], entry["isr_expands"]) == (0, 0, 0)
    follower.resume()
    wait_until(lambda: (e := read_stats(leader.run_dir, 0)) and next(
        p for p in e["partitions"] if p["topic"] == TOPIC)["followers"][0]["lag_records"] == 0,
        what="no lag once the follower fetched again")


def test_three_replicas_an_isr_shrink_answers_the_waiting_acks_all_and_below_the_minimum_refuses_it(brokers):
    leader, second, third = brokers(3)
    lead(leader, [second, third], min_insync_replicas=2, lag_time_max_ms=1000)
    assert leader.call(produce_request(TOPIC, 0, make_batch("a"), acks=-1))[0].error_code == 0
    third.kill()
    waiting = leader.arbiter.relay(0, produce_request(TOPIC, 0, make_batch("b"), acks=-1, timeout_ms=60_000))
    assert leader.arbiter.expect_isr_change([0, 1], timeout_s=15)["leader_epoch"] == 1
    assert leader.arbiter.nothing_within(0.3), "answered before the ISR without broker 2 was written"
    # The arbiter wrote the shrink: broker 0 and 1 have batch b, which is all the ISR asks now.
    ack = leader.role(TOPIC, 0, "leader", epoch=1, leader=0, leader_address=leader.address,
                      replicas=[0, 1, 2], isr=[0, 1], min_insync_replicas=2, lag_time_max_ms=1000)
    assert ack["error"] is None
    header, response = leader.arbiter.response(ApiKey.PRODUCE)
    assert (header.correlation_id, header.error_code, response.base_offset) == (waiting, 0, 3)

    second.pause()
    waiting = leader.arbiter.relay(0, produce_request(TOPIC, 0, make_batch("c"), acks=-1, timeout_ms=60_000))
    leader.arbiter.expect_isr_change([0], timeout_s=15)
    ack = leader.role(TOPIC, 0, "leader", epoch=1, leader=0, leader_address=leader.address,
                      replicas=[0, 1, 2], isr=[0], min_insync_replicas=2, lag_time_max_ms=1000)
    assert ack["error"] is None
    header, _response = leader.arbiter.response(ApiKey.PRODUCE)
    assert (header.correlation_id, header.error_code) == (waiting, NotEnoughReplicasError.code)
    assert "the records were appended but the ISR shrank below min_insync_replicas 2" in header.error_message
    header, _response = leader.call(produce_request(TOPIC, 0, make_batch("d"), acks=-1))
    assert header.error_code == NotEnoughReplicasError.code  # refused at once: nothing appended
    header, response = leader.call(produce_request(TOPIC, 0, make_batch("e"), acks=1))
    assert (header.error_code, response.base_offset) == (0, 9)
    second.resume()


def test_a_follower_behind_the_leaders_log_start_starts_its_log_there_and_catches_up(brokers):
    small = {"segment_bytes": 1024, "retention_bytes": 1024}
    leader, follower = brokers(2, log=small, retention_check_interval_ms=50)
    ack = leader.role(TOPIC, 0, "leader", epoch=1, leader=0, leader_address=leader.address, replicas=[0, 1],
                      isr=[0])
    assert ack["error"] is None
    for i in range(30):
        assert leader.call(produce_request(TOPIC, 0, make_batch(f"r{i}"), acks=-1))[0].error_code == 0
    start = wait_until(lambda: (e := leader.partition_entry(TOPIC, 0)) and e["log_start_offset"],
                       what="retention moving the leader's log start")

    ack = follower.role(TOPIC, 0, "follower", epoch=1, leader=0, leader_address=leader.address,
                        replicas=[0, 1], isr=[0])
    assert ack["error"] is None
    assert leader.arbiter.expect_isr_change([0, 1], timeout_s=15)["leader_epoch"] == 1
    entry = wait_until(lambda: (e := follower.partition_entry(TOPIC, 0)) and e["log_end_offset"] == 90 and e,
                       what="the follower at the leader's end")
    assert entry["log_start_offset"] >= start > 0
    follower.kill()
    leader.kill()
    theirs = dict(read_log_values(leader.worker.directory(TOPIC, 0)))
    mine = read_log_values(follower.worker.directory(TOPIC, 0))
    assert mine and all(theirs.get(offset, value) == value for offset, value in mine)
    assert mine[-1][0] == 89
