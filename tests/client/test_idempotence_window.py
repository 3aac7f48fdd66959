"""The idempotent producer's bookkeeping (hpbroker.client.idempotence), as pure logic: which
requests of a partition go when, in what order their outcomes are told, and a seeded simulation
against a model of the partition leader's sequence check with lost connections."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pytest

from hpbroker.client.idempotence import (
    ACKED,
    IN_FLIGHT,
    MAX_UNSETTLED_BATCHES,
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


def test_batches_sent_and_unsettled_never_exceed_what_the_broker_remembers():
    big = [FakeRequest(f"r{i}", batch_count=3) for i in range(2)]
    window = window_of(*big)
    assert send(window) == [big[0]]
    assert window.blocks_drain(1, 5)  # the second waits to be sent: no new batches meanwhile
    window.acknowledged(big[0])
    assert send(window) == [big[1]]
    window.add(small := FakeRequest("small", batch_count=2))
    assert send(window) == [small]  # 3 + 2 batches
    assert window.blocks_drain(1, 5)  # at MAX_UNSETTLED_BATCHES
    assert MAX_UNSETTLED_BATCHES == 5


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
    """The partition leader's sequence check (docs/PROTOCOL.md) for one producer id: remembers
    the last 5 batches; a stored one is a duplicate, the next sequence is appended, anything
    else is error 20 and nothing is appended.  With no state for the producer (nothing stored
    yet) any sequence is appended, as the broker does."""

    def __init__(self) -> None:
        self.log: list[int] = []  # every sequence stored, in offset order
        self.remembered: list[tuple[int, int]] = []

    def produce(self, request: FakeRequest) -> str:
        first = request.first_sequence
        last = first + request.record_count - 1
        if (first, last) in self.remembered:
            return "duplicate"
        if self.remembered and first != self.remembered[-1][1] + 1:
            return "out_of_order"
        self.log.extend(range(first, last + 1))
        self.remembered = [*self.remembered, (first, last)][-MAX_UNSETTLED_BATCHES:]
        return "ok"


@pytest.mark.parametrize("seed", range(60))
def test_lost_connections_keep_order_and_one_copy_of_every_record(seed):
    """Requests pipelined on one connection; at random the connection drops (requests on the
    wire are processed or not, their answers lost), an answer is delayed, or a request is
    refused before the leader looks at it (a retriable error, nothing appended: error 6 while
    the leader moves).  Following the window's rules (error 20 behind an unsettled request is
    retried, a lost or refused request is retried as it was, one request at a time until the
    leader has stored one), every record is stored once, in order, and acknowledged in order."""
    rng = random.Random(seed)
    window = PartitionWindow()
    leader = ModelLeader()
    wire: list[FakeRequest] = []  # sent, not yet processed by the leader (in order)
    answers: list[tuple[FakeRequest, str]] = []  # processed, answer not yet read
    told: list[FakeRequest] = []
    next_sequence = 0
    total = 40
    made = 0
    for _step in range(5000):
        if made < total and rng.random() < 0.3 and not window.blocks_drain(1, 5):
            count = rng.randint(1, 3)
            window.add(FakeRequest(f"r{made}", first_sequence=next_sequence, record_count=count))
            next_sequence += count
            made += 1
        wire += send(window)
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
    assert leader.log == list(range(next_sequence)), "a record stored twice, out of order or lost"
    assert [r.first_sequence for r in told] == sorted(r.first_sequence for r in told)
    assert len(told) == total
    assert all(r.state == ACKED for r in told) and not any(r.state == IN_FLIGHT for r in told)
