"""The consumer side's check: loss, duplication and order, per producer and partition."""

from __future__ import annotations

import numpy as np

from loadgen.payload import HEADER_DTYPE, MAGIC_U16
from loadgen.tally import Tally, merge_tallies

RUN = 0xABCD


def headers(sequences, producer=0, run_id=RUN, magic=MAGIC_U16, send_time_ns=0) -> np.ndarray:
    h = np.zeros(len(sequences), dtype=HEADER_DTYPE)
    h["magic"], h["producer"], h["run_id"] = magic, producer, run_id
    h["sequence"], h["send_time_ns"] = sequences, send_time_ns
    return h


def check(tallies, sent):
    return merge_tallies([t.export() for t in tallies], sent)


def test_everything_once_in_order_is_ok():
    t = Tally(RUN)
    t.add(0, headers(range(0, 500)))
    t.add(1, headers(range(500, 800)))
    t.add(0, headers(range(800, 1000)))
    result = check([t], {(RUN, 0): 1000})
    assert result.ok
    assert (result.sent, result.received, result.distinct, result.missing) == (1000, 1000, 1000, 0)


def test_a_batch_appended_twice_counts_as_duplicated_not_out_of_order():
    t = Tally(RUN)
    t.add(0, headers(range(0, 100)))
    t.add(0, headers(range(50, 100)))  # a retry appended again
    t.add(0, headers(range(100, 120)))
    result = check([t], {(RUN, 0): 120})
    assert (result.duplicated, result.out_of_order, result.missing) == (50, 0, 0)
    assert result.per_partition[0] == {"records": 170, "duplicated": 50, "out_of_order": 0}
    assert not result.ok


def test_repeats_within_one_list_are_found():
    t = Tally(RUN)
    t.add(0, headers([0, 1, 2, 1, 2, 3]))
    result = check([t], {(RUN, 0): 4})
    assert (result.duplicated, result.out_of_order) == (2, 0)


def test_a_record_overtaken_by_a_later_one_is_out_of_order():
    t = Tally(RUN)
    t.add(0, headers([0, 1, 3, 2, 4]))
    t.add(0, headers([6, 5]))
    result = check([t], {(RUN, 0): 7})
    assert (result.out_of_order, result.duplicated, result.missing) == (2, 0, 0)


def test_order_is_per_partition_numbers_may_interleave_across_partitions():
    t = Tally(RUN)
    t.add(0, headers([0, 2, 4]))
    t.add(1, headers([1, 3, 5]))
    assert check([t], {(RUN, 0): 6}).ok


def test_missing_records_are_what_was_sent_and_never_seen():
    t = Tally(RUN)
    t.add(0, headers(list(range(0, 40)) + list(range(50, 100))))
    result = check([t], {(RUN, 0): 120})
    assert result.missing == 30  # 40..49 and the tail 100..119
    assert result.per_producer[0]["missing"] == 30


def test_without_a_sent_count_holes_below_the_highest_are_missing():
    t = Tally(None)
    t.add(0, headers([0, 1, 2, 5]))
    result = check([t], None)
    assert (result.missing, result.sent) == (2, 6)


def test_numbers_never_sent_are_unexpected():
    t = Tally(RUN)
    t.add(0, headers(range(0, 12)))
    result = check([t], {(RUN, 0): 10})
    assert (result.unexpected, result.missing) == (2, 0)


def test_two_consumers_seeing_the_same_record_is_a_duplicate():
    a, b = Tally(RUN), Tally(RUN)
    a.add(0, headers(range(0, 60)))
    b.add(1, headers(range(40, 100)))
    result = check([a, b], {(RUN, 0): 100})
    assert (result.duplicated, result.missing, result.distinct) == (20, 0, 100)


def test_producers_are_tallied_apart_even_within_one_list():
    t = Tally(RUN)
    mixed = np.concatenate([headers([0, 1], producer=0), headers([0, 1, 2], producer=1),
                            headers([2], producer=0)])
    t.add(0, mixed)
    result = check([t], {(RUN, 0): 3, (RUN, 1): 3})
    assert result.ok and result.received == 6
    assert [row["received"] for row in result.per_producer] == [3, 3]


def test_records_of_other_runs_or_without_the_header_are_foreign():
    t = Tally(RUN)
    added = t.add(0, np.concatenate([headers([0, 1]), headers([0], run_id=7), headers([9], magic=0)]))
    assert added == 2
    result = check([t], {(RUN, 0): 2})
    assert result.ok and result.foreign == 2


def test_a_producer_that_sent_but_reached_no_consumer_is_all_missing():
    result = check([Tally(RUN)], {(RUN, 0): 5, (RUN, 1): 0})
    assert result.missing == 5 and not result.ok


def test_large_sequences_grow_the_bitmap():
    t = Tally(RUN)
    t.add(0, headers(range(1_000_000, 1_000_010)))
    result = check([t], {(RUN, 0): 1_000_010})
    assert result.distinct == 10 and result.missing == 1_000_000
