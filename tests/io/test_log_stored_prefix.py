"""A resend of an idempotent request that a crash cut after its first whole batches (kill -9 or
power loss during the flush's writev; recovery cuts only a torn batch): the batches after the
stored prefix are appended right after it, the request's records stored once and contiguous,
answered from the prefix's first offset; every other mix of stored and new batches is error 20
with nothing appended (hpbroker.io.producer_state, the stored prefix rule)."""

from __future__ import annotations

import os

import pytest
from storage_helpers import START_MS, make_batch, read_all, stamped

from hpbroker import _core
from hpbroker.errors import OutOfOrderSequenceError
from hpbroker.io import PartitionLog
from hpbroker.io.producer_state import ProducerStateTable, StoredPrefix

BIG = {"segment_bytes": 1 << 20}  # no roll unless a test asks for one


VALUE_BYTES = 100  # the request is about 1 KB: a segment of it is above MIN_SEGMENT_BYTES


def idempotent(sequence: int, count: int, *, producer_id: int = 7, epoch: int = 0) -> bytes:
    values = [f"{producer_id}:{sequence + i}:".encode() + b"v" * VALUE_BYTES for i in range(count)]
    return _core.build_batch(values, timestamps=START_MS, producer="p", base_sequence=sequence,
                             producer_id=producer_id, producer_epoch=epoch)


# The request: three batches of producer 7 (sequences 0..1, 2..4, 5..5), after 2 plain records.
BATCHES = [idempotent(0, 2), idempotent(2, 3), idempotent(5, 1)]
REQUEST = b"".join(BATCHES)


def crash_keeping(open_log, keep_bytes: int, **config) -> PartitionLog:
    """Append the plain records and REQUEST (one segment), flush, crash (no clean close, no
    snapshot at the log end), leave the request's first ``keep_bytes`` bytes in the segment, and
    reopen with ``config``."""
    log = open_log(**BIG)
    log.append(make_batch(2))  # offsets 0..1
    log.flush()
    path, before = log.segments[-1].path, log.segments[-1].size_in_bytes
    assert log.append(REQUEST).first_offset == 2
    log.flush()
    log._abandon()  # kill -9
    os.truncate(path, before + keep_bytes)  # what the disk kept of the writev
    return open_log(**config)


def records_stored(log: PartitionLog) -> list[tuple[int, bytes]]:
    return [(record.offset, record.value) for _, batch in read_all(log)
            for record in _core.decode_records(batch)]


@pytest.mark.parametrize("kept,cut", [(1, 0), (1, 7), (2, 0)],
                         ids=["one-batch", "one-batch-torn", "two-batches"])
def test_a_resend_after_a_crash_kept_its_first_batches_appends_only_the_rest(open_log, kept, cut):
    prefix = sum(map(len, BATCHES[:kept]))
    log = crash_keeping(open_log, prefix + cut, **BIG)
    prefix_records = [2, 5][kept - 1]
    assert log.log_end_offset == 2 + prefix_records, "recovery kept the whole batches, cut the torn one"
    info = log.append(REQUEST)
    assert (info.first_offset, info.last_offset, info.record_count, info.batch_count) == (2, 7, 6, 3)
    assert not info.duplicate and info.duplicate_records == prefix_records
    assert log.log_end_offset == 8
    log.flush()
    stored = records_stored(log)
    assert [offset for offset, _ in stored] == list(range(8)), "contiguous"
    sent = [f"7:{s}:".encode() + b"v" * VALUE_BYTES for s in range(6)]
    assert [value for _, value in stored][2:] == sent, "each record once"
    assert read_all(log)[1:] == [(o, stamped(b, o)) for o, b in zip([2, 4, 7], BATCHES, strict=True)]
    assert log.producer_state.get(7).runs == [(0, 5, 2, 7)]
    again = log.append(REQUEST)
    assert again.duplicate and (again.first_offset, again.last_offset) == (2, 7), "now a whole duplicate"
    assert log.append(idempotent(6, 1)).first_offset == 8


def test_the_state_after_the_resend_survives_a_reopen(open_log):
    log = crash_keeping(open_log, len(BATCHES[0]), **BIG)
    log.append(REQUEST)
    log.flush()
    log._abandon()
    log = open_log(**BIG)
    assert log.append(REQUEST).duplicate
    assert log.log_end_offset == 8


@pytest.mark.parametrize("after", ["other-producer", "plain"])
def test_a_stored_prefix_with_records_appended_after_it_is_out_of_order(open_log, after):
    log = crash_keeping(open_log, len(BATCHES[0]), **BIG)
    log.append(idempotent(0, 1, producer_id=8) if after == "other-producer" else make_batch(1))
    end, state = log.log_end_offset, [list(e.runs) for e in log.producer_state.entries.values()]
    with pytest.raises(OutOfOrderSequenceError, match="not at the log end"):
        log.append(REQUEST)
    assert log.log_end_offset == end == 5 and log.pending_records == 1, "nothing appended"
    assert [list(e.runs) for e in log.producer_state.entries.values()] == state


def test_a_stored_prefix_that_is_not_the_tail_of_the_producers_newest_run_is_out_of_order(open_log):
    log = crash_keeping(open_log, len(BATCHES[0]) + len(BATCHES[1]), **BIG)  # 0..1 and 2..4 stored
    with pytest.raises(OutOfOrderSequenceError, match="not the tail of the producer.s newest run"):
        log.append(BATCHES[0] + idempotent(5, 1))  # skips the stored 2..4
    with pytest.raises(OutOfOrderSequenceError):
        log.append(BATCHES[0] + BATCHES[2])
    with pytest.raises(OutOfOrderSequenceError, match="expected sequence 5"):
        log.append(BATCHES[0] + idempotent(2, 2) + idempotent(4, 2))  # 2..3 is no stored batch
    assert log.log_end_offset == 7 and log.pending_records == 0


def test_a_resend_with_another_producers_batch_after_the_stored_prefix_is_out_of_order(open_log):
    log = crash_keeping(open_log, len(BATCHES[0]), **BIG)
    with pytest.raises(OutOfOrderSequenceError, match="not every batch"):
        log.append(BATCHES[0] + BATCHES[1] + idempotent(0, 1, producer_id=8))
    with pytest.raises(OutOfOrderSequenceError, match="not every batch"):
        log.append(BATCHES[0] + BATCHES[1] + make_batch(1))
    assert log.log_end_offset == 4 and log.producer_state.get(8) is None


@pytest.mark.parametrize("rolls", [False, True], ids=["fits", "rolls"])
def test_the_roll_is_decided_on_what_the_resend_appends(open_log, rolls):
    """The active segment holds the prefix; the whole request would not fit beside it, the rest
    does (or, with a smaller segment, does not): the roll goes by the rest."""
    rest = len(REQUEST) - len(BATCHES[0])
    active = len(make_batch(2)) + len(BATCHES[0])  # what the segment holds after the crash
    segment_bytes = active + rest - (1 if rolls else 0)
    assert segment_bytes < active + len(REQUEST)
    log = crash_keeping(open_log, len(BATCHES[0]), segment_bytes=segment_bytes)
    assert log.segment_count == 1 and log.segments[-1].size_in_bytes == active
    assert log.segments[-1].size_in_bytes + len(REQUEST) > segment_bytes, "the whole request would roll"
    info = log.append(REQUEST)
    log.flush()
    assert (info.first_offset, info.last_offset, info.duplicate) == (2, 7, False)
    spans = [(s.base_offset, s.next_offset) for s in log.segments]
    assert spans == ([(0, 4), (4, 8)] if rolls else [(0, 8)])
    assert [offset for offset, _ in records_stored(log)] == list(range(8))


def test_the_table_takes_a_stored_prefix_only_as_the_tail_of_the_newest_run_at_the_log_end():
    table = ProducerStateTable()
    table.update(7, 0, 0, 4, 10, 14, 1000)
    table.update(7, 0, 5, 6, 15, 16, 1000)
    ids, epochs, deltas = [7, 7, 7], [0, 0, 0], [4, 1, 2]

    def check(sequences, log_end_offset, **changes):
        return table.check(changes.get("ids", ids), changes.get("epochs", epochs), sequences,
                           changes.get("deltas", deltas), log_end_offset=log_end_offset)

    assert check([0, 5, 7], 17) == StoredPrefix(2, 10, 16)
    assert check([5, 7, 10], 17, deltas=[1, 2, 0]) == StoredPrefix(1, 15, 16)
    with pytest.raises(OutOfOrderSequenceError, match="mixes"):
        check([0, 5, 7], None)  # no log end: the rule is off
    with pytest.raises(OutOfOrderSequenceError, match="not at the log end"):
        check([0, 5, 7], 18)
    assert check([5, 7, 8], 17, deltas=[1, 0, 0]) == StoredPrefix(1, 15, 16)
    with pytest.raises(OutOfOrderSequenceError, match="expected sequence 7"):
        check([5, 8, 9], 17, deltas=[1, 0, 0])  # a gap after the stored prefix
    table.update(8, 0, 0, 0, 17, 17, 1000)
    table.update(7, 0, 7, 7, 18, 18, 1000)
    with pytest.raises(OutOfOrderSequenceError, match="does not lie in the producer.s newest run"):
        check([5, 7, 8], 19, deltas=[1, 0, 0])  # producer 8 wrote between: 5..6 and 7 are two runs
