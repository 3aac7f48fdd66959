"""The idempotent producer's bookkeeping (hpbroker.client.idempotence), as pure logic: which
requests of a partition go when, in what order their outcomes are told, how many may be
unsettled, and a seeded simulation against a model of the partition leader's sequence check (its
newest 5 runs per producer) with lost connections and other producers writing between."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from hpbroker.client.idempotence import (
    ACKED,
    IN_FLIGHT,
    MAX_UNSETTLED_REQUESTS,
    QUEUED,
    UNKNOWN_PRODUCER_ID_RETRY_S,
    PartitionWindow,
    ProducerIdentity,
)


@dataclass(eq=False)
class FakeRequest:
    name: str
    batch_count: int = 1
    first_sequence: int = 0
    record_count: int = 1
    generation: int = 1
    state: int = QUEUED
    retries: int = 0
    due_s: float = 0.0
    deadline_s: float = 100.0

    def __repr__(self) -> str:
        return self.name


def window_of(*requests: FakeRequest, acknowledged_generation: int = 1) -> PartitionWindow:
    """A window of ``requests``; by default on a partition that has acknowledged a request of
    generation 1 (the leader knows the identity: requests are pipelined)."""
    window = PartitionWindow(acknowledged_generation)
    for request in requests:
        window.add(request)
    return window


def send(window: PartitionWindow, now: float = 0.0, max_in_flight: int = 5) -> list[FakeRequest]:
    out = window.sendable(now, max_in_flight)
    for request in out:
        window.sent(request)
    return out


def fail_retriably(window: PartitionWindow, request: FakeRequest, due_s: float = 0.0) -> None:
    request.retries += 1
    request.due_s = due_s
    window.to_retry(request)


def test_requests_are_pipelined_up_to_max_in_flight_in_order():
    requests = [FakeRequest(f"r{i}") for i in range(5)]
    window = window_of(*requests)
    assert send(window, max_in_flight=2) == requests[:2]
    assert window.blocks_drain(1, 2)
    assert send(window, max_in_flight=2) == []
    assert window.acknowledged(requests[0]) == [requests[0]]
    assert send(window, max_in_flight=2) == [requests[2]]
    assert send(window, max_in_flight=5) == requests[3:]


def test_requests_of_many_batches_are_pipelined_up_to_max_in_flight():
    """The limit counts requests, not batches: the leader remembers runs, and a request of any
    number of batches lies inside one."""
    big = [FakeRequest(f"r{i}", batch_count=8) for i in range(5)]
    window = window_of(*big[:3])
    assert send(window) == big[:3]
    assert not window.blocks_drain(1, 5)  # 24 batches in flight, 3 requests: room for more
    window.add(big[3])
    window.add(big[4])
    assert send(window) == big[3:]
    assert window.blocks_drain(1, 5)
    assert window.next_due_s(5) == math.inf


@pytest.mark.parametrize("max_in_flight", [1, 2, 5])
def test_unsettled_requests_never_exceed_max_in_flight(max_in_flight):
    """In flight, acknowledged but not yet told, or queued for a retry: each counts against the
    limit, so a resend always lies inside one of the leader's remembered runs."""
    requests = [FakeRequest(f"r{i}", batch_count=10) for i in range(max_in_flight)]
    window = window_of(*requests)
    assert send(window, max_in_flight=max_in_flight) == requests
    assert window.blocks_drain(1, max_in_flight)
    if max_in_flight > 1:
        assert window.acknowledged(requests[-1]) == []  # acknowledged, told after r0
        assert window.blocks_drain(1, max_in_flight)
    fail_retriably(window, requests[0])
    assert window.blocks_drain(1, max_in_flight)
    assert window.acknowledged(requests[0])[0] is requests[0]  # settled: room for one more
    assert not window.recovering and not window.blocks_drain(1, max_in_flight)


def test_a_window_refuses_more_requests_than_the_leader_remembers():
    window = window_of(*(FakeRequest(f"r{i}") for i in range(MAX_UNSETTLED_REQUESTS)))
    assert MAX_UNSETTLED_REQUESTS == 5 and window.blocks_drain(1, 5)
    with pytest.raises(RuntimeError, match="5 unsettled requests"):
        window.add(FakeRequest("one too many"))
    assert len(window.requests) == MAX_UNSETTLED_REQUESTS


def test_drain_is_blocked_while_an_older_identity_is_unsettled():
    window = window_of(old := FakeRequest("old", generation=1))
    send(window)
    assert not window.blocks_drain(1, 5)
    assert window.blocks_drain(2, 5)
    window.acknowledged(old)
    assert not window and not window.blocks_drain(2, 5)


def test_an_acknowledgement_behind_an_unsettled_request_waits_for_it():
    r0, r1, r2 = (FakeRequest(f"r{i}") for i in range(3))
    window = window_of(r0, r1, r2)
    send(window)
    assert window.acknowledged(r2) == []
    assert window.acknowledged(r1) == []
    assert r1.state == ACKED
    assert window.acknowledged(r0) == [r0, r1, r2]
    assert not window


def test_a_failure_is_told_at_once_and_releases_the_acknowledgements_behind_it():
    r0, r1, r2 = (FakeRequest(f"r{i}") for i in range(3))
    window = window_of(r0, r1, r2)
    send(window)
    assert window.acknowledged(r1) == []
    assert window.remove(r0) == [r1]
    assert window.is_first(r2)


def test_recovery_resends_one_request_at_a_time_in_sequence_order():
    r0, r1, r2 = (FakeRequest(f"r{i}") for i in range(3))
    window = window_of(r0, r1, r2)
    send(window)
    fail_retriably(window, r0)
    assert window.recovering and window.blocks_drain(1, 5)
    assert send(window) == []  # r1 and r2 still in flight: wait for their answers
    fail_retriably(window, r2)
    fail_retriably(window, r1)
    assert send(window) == [r0]
    assert send(window) == []
    assert window.acknowledged(r0) == [r0]
    assert send(window) == [r1]
    window.acknowledged(r1)
    assert send(window) == [r2]
    window.add(r3 := FakeRequest("r3"))
    assert send(window) == []  # still recovering: r2 has failed once
    window.acknowledged(r2)
    assert not window.recovering
    assert send(window) == [r3]


def test_a_retry_waits_for_its_backoff_and_the_clock_wakes_the_thread_for_it():
    window = window_of(r0 := FakeRequest("r0", deadline_s=50.0), r1 := FakeRequest("r1", deadline_s=60.0))
    send(window)
    fail_retriably(window, r0, due_s=2.0)
    assert window.next_due_s(5) == 50.0  # r1 in flight: r0 waits for its answer first
    fail_retriably(window, r1, due_s=3.0)
    assert window.next_due_s(5) == 2.0
    assert send(window, now=1.0) == []
    assert send(window, now=2.0) == [r0]
    assert window.next_due_s(5) == 60.0


def test_a_request_held_back_by_the_in_flight_limit_is_not_woken_by_the_clock():
    window = window_of(FakeRequest("r0", deadline_s=math.inf), FakeRequest("r1", deadline_s=math.inf))
    send(window, max_in_flight=1)
    assert window.next_due_s(1) == math.inf
    assert window.next_due_s(5) == 0.0
    assert not window_of().next_due_s(5) < math.inf


def test_the_first_request_of_an_identity_goes_alone_until_it_is_acknowledged():
    """A leader with no state for the producer id accepts any first sequence: were r1 (sequence
    5) sent beside r0 (sequence 0) and r0 lost, r1 would be stored behind a gap and r0's resend
    refused.  So r1 waits until r0 is acknowledged, then the partition pipelines."""
    r0 = FakeRequest("r0", first_sequence=0, record_count=5)
    r1 = FakeRequest("r1", first_sequence=5, record_count=5)
    window = window_of(r0, r1, acknowledged_generation=0)
    assert window.in_flight_limit(5) == 1
    assert send(window) == [r0]
    assert window.blocks_drain(1, 5)  # no new batches either: they join the next request
    assert window.next_due_s(5) == r1.deadline_s  # r1 waits for r0's answer, not for the clock
    fail_retriably(window, r0)  # r0 lost (no answer): r1 was never sent, so nothing got ahead
    assert send(window) == [r0]
    assert window.acknowledged(r0) == [r0]
    assert window.acknowledged_generation == 1 and window.in_flight_limit(5) == 5
    r2, r3 = FakeRequest("r2", first_sequence=10), FakeRequest("r3", first_sequence=11)
    window.add(r2)
    window.add(r3)
    assert send(window) == [r1, r2, r3]


def test_a_new_identity_goes_one_request_at_a_time_again():
    window = window_of(old := FakeRequest("old", generation=1))
    send(window)
    window.acknowledged(old)
    assert window.acknowledged_generation == 1
    new = [FakeRequest(f"new{i}", generation=2) for i in range(3)]
    for request in new:
        window.add(request)
    assert send(window) == [new[0]]
    window.acknowledged(new[0])
    assert send(window) == new[1:]


def test_the_identity_is_wanted_first_and_after_a_break_of_the_current_one():
    identity = ProducerIdentity(backoff_ms=100, backoff_max_ms=1000)
    assert identity.wanted and identity.generation == 0
    assert not identity.broken(0)
    identity.failed(10.0, RuntimeError("down"))
    assert identity.next_attempt_s == pytest.approx(10.1)
    identity.failed(10.1, RuntimeError("down"))
    assert identity.next_attempt_s == pytest.approx(10.3)
    for _ in range(10):
        identity.failed(20.0, RuntimeError("down"))
    assert identity.next_attempt_s == pytest.approx(21.0)
    identity.obtained(7, 0, 30.0)
    assert not identity.wanted and identity.generation == 1 and identity.last_error is None
    assert identity.broken(1) and identity.wanted
    assert not identity.broken(1)  # asked once
    identity.obtained(8, 0, 40.0)
    assert identity.resets == 1 and identity.generation == 2
    assert not identity.broken(1) and not identity.wanted  # an old identity's failure changes nothing


def test_a_fresh_identity_is_one_taken_less_than_the_retry_time_ago():
    identity = ProducerIdentity(backoff_ms=100, backoff_max_ms=1000)
    assert not identity.fresh(0, 0.0)
    identity.obtained(7, 0, 100.0)
    assert identity.fresh(1, 100.0) and identity.fresh(1, 100.0 + UNKNOWN_PRODUCER_ID_RETRY_S - 0.01)
    assert not identity.fresh(1, 100.0 + UNKNOWN_PRODUCER_ID_RETRY_S)
    assert not identity.fresh(0, 100.0)  # an older identity's request
    identity.broken(1)
    assert not identity.fresh(1, 100.0)  # being replaced: its error 22 is final


class ModelLeader:
    """The partition leader's sequence check (docs/PROTOCOL.md) for one producer id: it
    remembers the producer's newest :attr:`remembered_runs` runs (first and last sequence and
    offset of batches stored one after another, at consecutive offsets); a request whose
    sequences lie inside one is a duplicate (answered at the offsets computed from the run), one
    starting after the newest run's last sequence is appended (extending that run if it also
    follows at the next offset), anything else is error 20 and nothing is appended.  With no
    state for the producer (nothing stored yet) any sequence is appended, as the broker does.
    Other producers' records (:meth:`other_writer`) come between runs."""

    def __init__(self, remembered_runs: int = MAX_UNSETTLED_REQUESTS) -> None:
        self.log: list[tuple[str, int]] = []  # (writer, sequence) at each offset
        self.runs: list[list[int]] = []  # [first_sequence, last_sequence, first_offset, last_offset]
        self.remembered_runs = remembered_runs

    def other_writer(self, count: int) -> None:
        self.log.extend(("other", i) for i in range(count))

    def produce(self, request: FakeRequest) -> str:
        first = request.first_sequence
        last = first + request.record_count - 1
        for first_sequence, last_sequence, first_offset, _last_offset in self.runs:
            if first_sequence <= first and last <= last_sequence:
                offset = first_offset + first - first_sequence
                stored = self.log[offset:offset + request.record_count]
                assert stored == [("me", s) for s in range(first, last + 1)], "a wrong duplicate offset"
                return "duplicate"
        if self.runs and first != self.runs[-1][1] + 1:
            return "out_of_order"
        offset = len(self.log)
        self.log.extend(("me", s) for s in range(first, last + 1))
        newest = self.runs[-1] if self.runs else None
        if newest is not None and newest[1] + 1 == first and newest[3] + 1 == offset:
            newest[1], newest[3] = last, len(self.log) - 1
        else:
            self.runs = [*self.runs, [first, last, offset, len(self.log) - 1]][-self.remembered_runs:]
        return "ok"


@pytest.mark.parametrize("remembered_runs", [MAX_UNSETTLED_REQUESTS, MAX_UNSETTLED_REQUESTS - 1])
def test_a_full_window_of_many_batch_requests_is_resent_as_duplicates(remembered_runs):
    """Five requests of 8 batches in flight, each stored by the leader with another producer's
    record before it (five runs), every answer lost: resent one at a time, each lies inside a
    remembered run and is answered as a duplicate.  A leader remembering one run fewer than the
    window holds would refuse the first resend (error 20 for the first unsettled request: its
    records would fail), which is why the window holds no more."""
    leader = ModelLeader(remembered_runs)
    window = PartitionWindow()
    window.add(r0 := FakeRequest("r0", batch_count=8, record_count=8))
    assert send(window) == [r0] and leader.produce(r0) == "ok"
    assert window.acknowledged(r0) == [r0]
    requests = []
    while not window.blocks_drain(1, 5):
        sequence = 8 * (len(requests) + 1)
        requests.append(FakeRequest(f"r{len(requests) + 1}", batch_count=8, first_sequence=sequence,
                                    record_count=8))
        window.add(requests[-1])
        assert send(window) == [requests[-1]]  # each goes at once: 8 batches are one request
    assert len(requests) == len(window.requests) == 5
    for request in requests:
        leader.other_writer(1)
        assert leader.produce(request) == "ok"
    for request in requests:  # the connection drops: no answer comes
        fail_retriably(window, request)
    told = []
    for request in requests:
        assert send(window) == [request]  # in order, one at a time
        outcome = leader.produce(request)
        if remembered_runs < len(requests):
            assert outcome == "out_of_order" and window.is_first(request)
            return
        assert outcome == "duplicate"
        told += window.acknowledged(request)
    assert told == requests and not window
    assert [s for writer, s in leader.log if writer == "me"] == list(range(48))


@pytest.mark.parametrize("seed", range(60))
def test_lost_connections_keep_order_and_one_copy_of_every_record(seed):
    """Requests of 1 to 10 batches pipelined on one connection (1, 2 or 5 in flight), other
    producers writing between them; at random the connection drops (requests on the wire are
    processed or not, their answers lost), an answer is delayed, or a request is refused before
    the leader looks at it (a retriable error, nothing appended: error 6 while the leader
    moves).  Following the window's rules (error 20 behind an unsettled request is retried, a
    lost or refused request is retried as it was, one request at a time until the leader has
    stored one), the window never holds more than max_in_flight requests, and every record is
    stored once, in order, and acknowledged in order."""
    rng = random.Random(seed)
    max_in_flight = (1, 2, 5)[seed % 3]
    window = PartitionWindow()
    leader = ModelLeader()
    wire: list[FakeRequest] = []  # sent, not yet processed by the leader (in order)
    answers: list[tuple[FakeRequest, str]] = []  # processed, answer not yet read
    told: list[FakeRequest] = []
    next_sequence = 0
    total = 40
    made = 0
    for _step in range(5000):
        if made < total and rng.random() < 0.3 and not window.blocks_drain(1, max_in_flight):
            batches = rng.randint(1, 10)
            count = batches * rng.randint(1, 3)
            window.add(FakeRequest(f"r{made}", batch_count=batches, first_sequence=next_sequence,
                                   record_count=count))
            next_sequence += count
            made += 1
        assert len(window.requests) <= max_in_flight, f"more requests unsettled than allowed: {window}"
        if rng.random() < 0.3:
            leader.other_writer(rng.randint(1, 3))
        wire += send(window, max_in_flight=max_in_flight)
        roll = rng.random()
        if roll < 0.05:  # the connection drops: some of the wire reached the leader, no answer comes
            for request in wire[:rng.randint(0, len(wire))]:
                leader.produce(request)
            for request in [*wire, *(r for r, _ in answers)]:
                fail_retriably(window, request)
            wire, answers = [], []
        elif roll < 0.6 and wire:
            request = wire.pop(0)
            answers.append((request, "refused" if rng.random() < 0.1 else leader.produce(request)))
        elif answers:
            request, outcome = answers.pop(rng.randrange(len(answers)) if rng.random() < 0.2 else 0)
            if outcome in ("ok", "duplicate"):
                told += window.acknowledged(request)
            elif outcome == "refused":
                fail_retriably(window, request)
            else:
                assert not window.is_first(request), "error 20 for the first unsettled request"
                fail_retriably(window, request)
        if made == total and not window:
            break
    assert made == total and not window, f"not settled: {window}"
    ours = [sequence for writer, sequence in leader.log if writer == "me"]
    assert ours == list(range(next_sequence)), "a record stored twice, out of order or lost"
    assert [r.first_sequence for r in told] == sorted(r.first_sequence for r in told)
    assert len(told) == total
    assert all(r.state == ACKED for r in told) and not any(r.state == IN_FLIGHT for r in told)
