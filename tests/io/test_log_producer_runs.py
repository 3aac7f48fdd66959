"""The partition remembers each idempotent producer's newest five *runs* (batches stored one right
after the other with consecutive sequences), not its last five batches: a producer alone on a
partition is deduplicated over everything it sent, a request of any number of batches is
deduplicated whole, and the same holds after a crash rebuilt the state from the log and after a
reopen from a snapshot (hpbroker.io.producer_state)."""

from __future__ import annotations

import os

import pytest
from storage_helpers import START_MS, make_batch, read_all

from hpbroker import _core
from hpbroker.errors import OutOfOrderSequenceError
from hpbroker.io import PartitionLog
from hpbroker.io.producer_state import MAX_RUNS_PER_PRODUCER, list_snapshots

BIG = {"segment_bytes": 1 << 20}  # no roll, so no snapshot but the clean close's


def idempotent(sequence: int, count: int, *, producer_id: int = 7, epoch: int = 0) -> bytes:
    values = [f"{producer_id}:{sequence + i}".encode() + b"v" * 40 for i in range(count)]
    return _core.build_batch(values, timestamps=START_MS, producer="p", base_sequence=sequence,
                             producer_id=producer_id, producer_epoch=epoch)


def request(sequence: int, counts: list[int], *, producer_id: int = 7) -> bytes:
    """One produce request: batches of ``counts`` records each, sequences following from ``sequence``."""
    parts = []
    for count in counts:
        parts.append(idempotent(sequence, count, producer_id=producer_id))
        sequence += count
    return b"".join(parts)


def reopen(open_log, log: PartitionLog, how: str) -> PartitionLog:
    """``live``: the same log; ``rebuilt``: a crash (kill -9 after the flush: no snapshot) and an
    open that replays every batch header; ``snapshot``: a clean close and an open from its
    snapshot at the log end, nothing replayed."""
    if how == "live":
        return log
    log.flush()
    end = log.log_end_offset
    if how == "rebuilt":
        log._abandon()
        assert list_snapshots(log.directory) == []
    else:
        log.close()
        assert list_snapshots(log.directory) == [end]
    log = open_log(**BIG)
    assert log.log_end_offset == end
    assert log._producers.loaded_from == (None if how == "rebuilt" else end)
    return log


HOWS = ["live", "rebuilt", "snapshot"]


@pytest.mark.parametrize("how", HOWS)
def test_a_producer_alone_keeps_one_run_and_a_retry_of_any_of_its_requests_is_a_duplicate(open_log, how):
    log = open_log(**BIG)
    sent, sequence = [], 0  # (request, first offset, last offset)
    for k in range(20):
        count = 1 + k % 3
        payload = idempotent(sequence, count)
        info = log.append(payload)
        assert not info.duplicate
        sent.append((payload, info.first_offset, info.last_offset))
        sequence += count
        if k % 7 == 6:
            log.flush()  # flushed and pending requests alike
    assert len(log.producer_state.get(7).runs) == 1
    log = reopen(open_log, log, how)
    assert log.producer_state.get(7).runs == [(0, sequence - 1, 0, sequence - 1)], "one run, rebuilt too"
    end = log.log_end_offset
    for payload, first, last in [sent[0], *reversed(sent)]:  # the very first too
        info = log.append(payload)
        assert info.duplicate and (info.first_offset, info.last_offset) == (first, last)
    assert log.log_end_offset == end, "nothing appended"
    assert log.append(idempotent(sequence, 2)).first_offset == end
    assert len(log.producer_state.get(7).runs) == 1


@pytest.mark.parametrize("how", HOWS)
def test_requests_interleaved_with_another_producer_are_runs_of_their_own_and_the_newest_five_kept(
        open_log, how):
    log = open_log(**BIG)
    sent, sequence = [], 0
    for k in range(8):
        payload = request(sequence, [2, 1, 3])  # three batches a request
        info = log.append(payload)
        sent.append((payload, info.first_offset, info.last_offset))
        sequence += 6
        log.append(idempotent(k, 1, producer_id=8))  # producer 8 writes between 7's requests
    runs = log.producer_state.get(7).runs
    assert len(runs) == MAX_RUNS_PER_PRODUCER
    assert [(run[2], run[3]) for run in runs] == [(first, last) for _, first, last in sent[-5:]]
    log = reopen(open_log, log, how)
    assert log.producer_state.get(7).runs == runs
    end = log.log_end_offset
    for payload, first, last in reversed(sent[-5:]):
        info = log.append(payload)
        assert info.duplicate and (info.first_offset, info.last_offset) == (first, last)
    with pytest.raises(OutOfOrderSequenceError, match="expected sequence 48"):
        log.append(sent[-6][0])  # the sixth newest request: forgotten
    assert log.log_end_offset == end
    assert log.append(idempotent(sequence, 1)).first_offset == end


@pytest.mark.parametrize("how", HOWS)
def test_a_request_of_eight_batches_retried_after_it_is_stored_is_a_duplicate(open_log, how):
    log = open_log(**BIG)
    log.append(idempotent(0, 1, producer_id=8))
    log.append(idempotent(0, 3))  # a run of its own: producer 8 writes after it
    log.append(idempotent(1, 1, producer_id=8))
    payload = request(3, [2, 1, 4, 1, 3, 2, 1, 5])  # 19 records in 8 batches, more than five
    info = log.append(payload)
    assert (info.first_offset, info.last_offset, info.batch_count) == (5, 23, 8)
    log.append(idempotent(2, 1, producer_id=8))
    log = reopen(open_log, log, how)
    end = log.log_end_offset
    retry = log.append(payload)
    assert retry.duplicate and (retry.first_offset, retry.last_offset, retry.record_count) == (5, 23, 19)
    assert retry.duplicate_records == 19 and log.log_end_offset == end
    single = log.append(idempotent(7, 4))  # one of its batches alone: at its offsets in the request
    assert single.duplicate and (single.first_offset, single.last_offset) == (9, 12)
    assert log.append(idempotent(0, 3)).duplicate, "the run before it too"
    log.flush()
    assert [o for o, _ in read_all(log)] == [0, 1, 4, 5, 7, 8, 12, 13, 16, 18, 19, 24], "stored once"


def crash_keeping(open_log, payload: bytes, keep_batches: int) -> PartitionLog:
    """Append ``payload`` after the producer's earlier requests (one run with them), flush, crash,
    leave only its first ``keep_batches`` batches on disk (as a cut ``writev`` would), reopen."""
    log = open_log(**BIG)
    log.append(make_batch(2))  # offsets 0..1, no identity
    for sequence in range(0, 6, 2):  # 3 earlier requests, sequences 0..5 at offsets 2..7
        log.append(idempotent(sequence, 2))
    log.flush()
    path, before = log.segments[-1].path, log.segments[-1].size_in_bytes
    assert log.append(payload).first_offset == 8
    log.flush()
    log._abandon()  # kill -9
    scan = _core.scan_batches(payload)
    os.truncate(path, before + scan.positions[keep_batches])
    return open_log(**BIG)


def test_the_resend_of_a_cut_request_appends_the_rest_after_its_stored_prefix(open_log):
    payload = request(6, [1, 2, 1, 1, 2, 1, 1, 3])  # 12 records, sequences 6..17
    log = crash_keeping(open_log, payload, 6)  # its first six batches (8 records) kept
    assert log.log_end_offset == 16
    assert log.producer_state.get(7).runs == [(0, 13, 2, 15)], "one run: the earlier requests and the prefix"
    info = log.append(payload)
    assert (info.first_offset, info.last_offset, info.record_count, info.duplicate) == (8, 19, 12, False)
    assert info.duplicate_records == 8 and log.log_end_offset == 20
    assert log.producer_state.get(7).runs == [(0, 17, 2, 19)]
    again = log.append(payload)
    assert again.duplicate and (again.first_offset, again.last_offset) == (8, 19)
    log.flush()
    values = [r.value for _, b in read_all(log) for r in _core.decode_records(b)][2:]
    assert values == [f"7:{s}".encode() + b"v" * 40 for s in range(18)], "each record once, in order"


def test_a_stored_prefix_starting_inside_a_batch_of_the_newest_run_is_taken(open_log):
    log = open_log(**BIG)
    log.append(idempotent(0, 5))  # offsets 0..4
    tail = idempotent(3, 2) + idempotent(5, 2)  # 3..4 stored, 5..6 new
    info = log.append(tail)
    assert (info.first_offset, info.last_offset, info.duplicate_records) == (3, 6, 2)


def test_a_range_crossing_the_end_of_a_run_is_out_of_order_unless_it_is_a_stored_prefix(open_log):
    log = open_log(**BIG)
    log.append(request(0, [4, 6]))  # run 0..9 at offsets 0..9
    log.append(idempotent(0, 1, producer_id=8))  # offset 10
    log.append(idempotent(10, 5))  # run 10..14 at offsets 11..15
    assert log.producer_state.get(7).runs == [(0, 9, 0, 9), (10, 14, 11, 15)]
    end = log.log_end_offset
    inside = log.append(idempotent(2, 5))  # inside the first run, across its batches' boundary
    assert inside.duplicate and (inside.first_offset, inside.last_offset) == (2, 6)
    with pytest.raises(OutOfOrderSequenceError, match="expected sequence 15"):
        log.append(idempotent(8, 4))  # 8..11: across the first run's end, into the next run
    with pytest.raises(OutOfOrderSequenceError, match="expected sequence 15"):
        log.append(idempotent(13, 4))  # 13..16: across the newest run's end, into unknown sequences
    with pytest.raises(OutOfOrderSequenceError, match="not one right after the other"):
        log.append(idempotent(8, 2) + idempotent(10, 2))  # across two runs: both stored, but apart
    with pytest.raises(OutOfOrderSequenceError, match="does not lie in the producer's newest run"):
        log.append(idempotent(8, 2) + idempotent(10, 5) + idempotent(15, 1))  # the same, then a new batch
    with pytest.raises(OutOfOrderSequenceError, match="not the tail"):
        log.append(idempotent(11, 2) + idempotent(15, 1))  # skips the stored 13..14
    assert log.log_end_offset == end, "nothing appended"
    prefix = log.append(idempotent(13, 2) + idempotent(15, 2))  # the stored prefix case
    assert (prefix.first_offset, prefix.last_offset, prefix.duplicate) == (14, 17, False)
    assert log.producer_state.get(7).runs == [(0, 9, 0, 9), (10, 16, 11, 17)]


def test_a_request_of_several_producers_is_a_duplicate_only_at_contiguous_offsets(open_log):
    log = open_log(**BIG)
    mixed = idempotent(0, 2) + idempotent(0, 1, producer_id=8) + idempotent(2, 3)
    assert log.append(mixed).first_offset == 0
    runs = {pid: log.producer_state.get(pid).runs for pid in (7, 8)}
    assert runs == {7: [(0, 1, 0, 1), (2, 4, 3, 5)], 8: [(0, 0, 2, 2)]}
    retry = log.append(mixed)
    assert retry.duplicate and (retry.first_offset, retry.last_offset) == (0, 5)
