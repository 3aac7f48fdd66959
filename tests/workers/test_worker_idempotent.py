"""A real worker process deduplicates an idempotent producer's retries: while the first copy
waits for a slow flush, across a kill -9 of the worker, and refuses a producer id the broker
never issued (read from the issued-ceiling file the arbiter writes)."""

from __future__ import annotations

import os
import signal
import time

from worker_harness import fetch_request, produce_request, values_of

from hpbroker import protocol, records
from hpbroker.errors import RequestTimedOutError, UnknownProducerIdError

PRODUCE = protocol.ApiKey.PRODUCE


def idempotent(sequence: int, count: int = 3, *, producer_id: int = 7, epoch: int = 0) -> bytes:
    values = [f"{producer_id}:{sequence + i}".encode() for i in range(count)]
    return records.build_batch(values, producer="p", base_sequence=sequence, producer_id=producer_id,
                               producer_epoch=epoch)


def issue_ids_below(data_dir: str, ceiling: int) -> None:
    """What the arbiter writes before it answers an InitProducerId (docs/PROTOCOL.md)."""
    os.makedirs(data_dir, exist_ok=True)
    tmp = os.path.join(data_dir, "producer-ids-issued.tmp")
    with open(tmp, "w") as f:
        f.write(f"0\n{ceiling}\n")
    os.replace(tmp, os.path.join(data_dir, "producer-ids-issued"))


def stored_values(arbiter, partition: int = 0) -> list[bytes]:
    header, response = arbiter.call(0, fetch_request("orders", partition, 0))
    assert header.error_code == 0
    return values_of(response.payload)


def test_a_retry_while_the_first_copy_waits_for_a_slow_flush_is_stored_once(start_worker, arbiter, data_dir):
    issue_ids_below(data_dir, 1000)
    start_worker(log={"flush_messages": 1_000_000, "flush_ms": 1500, "flush_fsync": True})
    batch = idempotent(0)
    first = arbiter.relay(0, produce_request("orders", 0, batch, timeout_ms=10_000))
    retry = arbiter.relay(0, produce_request("orders", 0, batch, timeout_ms=10_000))
    answers = {}
    for _ in range(2):
        header, response = arbiter.response(PRODUCE)
        answers[header.correlation_id] = (header.error_code, response.base_offset, response.duplicate)
    assert answers == {first: (0, 0, 0), retry: (0, 0, 1)}
    assert stored_values(arbiter) == [b"7:0", b"7:1", b"7:2"]


def test_a_retry_after_a_kill_9_of_the_worker_is_a_duplicate(start_worker, arbiter, data_dir):
    issue_ids_below(data_dir, 1000)
    worker = start_worker(log={"flush_fsync": True})
    for sequence in (0, 3, 6):
        header, response = arbiter.call(0, produce_request("orders", 0, idempotent(sequence)))
        assert (header.error_code, response.duplicate) == (0, 0)
    worker.signal(signal.SIGKILL)  # no clean close: no snapshot at the log end
    assert worker.wait() == -signal.SIGKILL
    start_worker(log={"flush_fsync": True})
    header, response = arbiter.call(0, produce_request("orders", 0, idempotent(3)))
    assert (header.error_code, response.base_offset, response.duplicate) == (0, 3, 1)
    header, response = arbiter.call(0, produce_request("orders", 0, idempotent(9)))
    assert (header.error_code, response.base_offset, response.duplicate) == (0, 9, 0)
    assert len(stored_values(arbiter)) == 12


def test_an_id_never_issued_is_refused_until_the_arbiter_issues_it(start_worker, arbiter, data_dir):
    issue_ids_below(data_dir, 1000)
    start_worker()
    header, _ = arbiter.call(0, produce_request("orders", 0, idempotent(0, producer_id=1500)))
    assert header.error_code == UnknownProducerIdError.code
    issue_ids_below(data_dir, 2000)
    deadline = time.monotonic() + 10
    header, response = arbiter.call(0, produce_request("orders", 0, idempotent(0, producer_id=1500)))
    assert header.error_code == 0 and time.monotonic() < deadline, "read again on the miss"
    assert stored_values(arbiter) == [b"1500:0", b"1500:1", b"1500:2"]


def test_a_retry_after_a_timeout_shorter_than_the_flush_is_stored_once(start_worker, arbiter, data_dir):
    issue_ids_below(data_dir, 1000)
    start_worker(log={"flush_messages": 1_000_000, "flush_ms": 2000, "flush_fsync": True})
    batch = idempotent(0)
    header, _ = arbiter.call(0, produce_request("orders", 0, batch, timeout_ms=300))
    assert header.error_code == RequestTimedOutError.code, "the records may still be appended"
    header, response = arbiter.call(0, produce_request("orders", 0, batch, timeout_ms=10_000))
    assert (header.error_code, response.base_offset, response.duplicate) == (0, 0, 1)
    assert stored_values(arbiter) == [b"7:0", b"7:1", b"7:2"]


def test_every_request_of_a_producer_alone_is_deduplicated_across_a_kill_9(start_worker, arbiter, data_dir):
    """The partition remembers runs, not five batches: a producer alone on it is deduplicated over
    all it sent, and a request of eight batches whole, before and after the worker's kill -9."""
    issue_ids_below(data_dir, 1000)
    worker = start_worker(log={"flush_fsync": True})
    sent = [(idempotent(3 * k), 3 * k) for k in range(7)]  # 7 requests of one batch: offsets 0..20
    eight = b"".join(idempotent(21 + 2 * k, 2) for k in range(8))  # one request of 8 batches: 21..36
    sent.append((eight, 21))
    for payload, offset in sent:
        header, response = arbiter.call(0, produce_request("orders", 0, payload))
        assert (header.error_code, response.base_offset, response.duplicate) == (0, offset, 0)
    for restart in (False, True):
        if restart:
            worker.signal(signal.SIGKILL)  # no clean close: the state is rebuilt from the log
            assert worker.wait() == -signal.SIGKILL
            worker = start_worker(log={"flush_fsync": True})
        for payload, offset in (sent[0], sent[-1], sent[3]):
            header, response = arbiter.call(0, produce_request("orders", 0, payload))
            assert (header.error_code, response.base_offset, response.duplicate) == (0, offset, 1), restart
    assert len(stored_values(arbiter)) == 37, "each record once"
