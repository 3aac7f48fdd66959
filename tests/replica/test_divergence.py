"""Divergence by leader epoch: the leader's check of a replica fetch and the follower's truncation
offset (KIP-101, KIP-320), on real leader-epoch caches."""

from __future__ import annotations

import itertools

import pytest

from hpbroker.io.leader_epochs import LeaderEpochCache
from hpbroker.replica.divergence import diverging_epoch, truncation_offset


def _cache(tmp_path, entries, name="cache"):
    directory = tmp_path / f"{name}-{next(_names)}"
    directory.mkdir()
    cache = LeaderEpochCache(str(directory))
    for epoch, start_offset in entries:
        cache.assign(epoch, start_offset)
    return cache


_names = itertools.count()

LEADER = [(0, 0), (2, 10)]  # the leader's log: epoch 0 from offset 0, epoch 2 from 10; ends at 20

# (leader entries, leader log end, follower's last_fetched_epoch, fetch_offset, expected answer)
LEADER_CHECKS = [
    pytest.param(LEADER, 20, -1, 35, None, id="no-last-epoch:-nothing-to-check"),
    pytest.param(LEADER, 20, 2, 15, None, id="latest-epoch-behind-the-end"),
    pytest.param(LEADER, 20, 2, 20, None, id="latest-epoch-at-the-end"),
    pytest.param(LEADER, 20, 2, 25, (2, 20), id="latest-epoch-past-the-leaders-end"),
    pytest.param(LEADER, 20, 0, 8, None, id="older-epoch-within-its-range"),
    pytest.param(LEADER, 20, 0, 10, None, id="older-epoch-at-its-end"),
    pytest.param(LEADER, 20, 0, 12, (0, 10), id="older-epoch-past-its-end"),
    pytest.param(LEADER, 20, 1, 12, (0, 10), id="an-epoch-the-leader-never-had"),
    pytest.param(LEADER, 20, 1, 5, (0, 10), id="an-epoch-the-leader-never-had-even-before-its-end"),
    pytest.param([], 20, 3, 5, (-1, -1), id="a-leader-without-epochs-cannot-tell"),
    pytest.param([(3, 100)], 150, 1, 50, None, id="older-than-the-first-epoch-and-before-it"),
    pytest.param([(3, 100)], 150, 1, 120, (1, 100), id="older-than-the-first-epoch-and-past-its-start"),
    pytest.param(LEADER, 20, 5, 20, (-1, -1), id="newer-than-the-leaders-latest"),
]


@pytest.mark.parametrize("entries, log_end, last_epoch, fetch_offset, expected", LEADER_CHECKS)
def test_the_leader_answers_a_fetch_whose_last_epoch_ends_earlier_with_that_epochs_end(
        tmp_path, entries, log_end, last_epoch, fetch_offset, expected):
    assert diverging_epoch(_cache(tmp_path, entries), log_end, last_epoch, fetch_offset) == expected


FOLLOWER = [(0, 0), (1, 10), (3, 20)]  # the follower's log ends at 30

# (follower entries, follower log end, leader's answer, high watermark known, expected truncation offset)
FOLLOWER_TRUNCATIONS = [
    pytest.param(FOLLOWER, 30, (1, 15), 0, 15, id="same-epoch:-the-leaders-end-when-smaller"),
    pytest.param(FOLLOWER, 30, (1, 25), 0, 20, id="same-epoch:-its-own-end-when-smaller"),
    pytest.param(FOLLOWER, 30, (3, 40), 0, 30, id="never-past-the-log-end"),
    pytest.param(FOLLOWER, 30, (2, 25), 0, 20,
                 id="an-epoch-it-never-had:-the-end-of-its-newest-below-and-ask-again"),
    pytest.param(FOLLOWER, 30, (-1, -1), 12, 12, id="leader-cannot-tell:-the-high-watermark"),
    pytest.param(FOLLOWER, 30, (-1, -1), 0, 0, id="leader-cannot-tell-and-no-high-watermark:-all"),
    pytest.param(FOLLOWER, 30, (-1, -1), 45, 30, id="the-high-watermark-never-past-the-log-end"),
    pytest.param([], 8, (2, 5), 0, 5, id="a-follower-without-epochs-takes-the-leaders-end"),
    pytest.param([(4, 50)], 70, (2, 60), 0, 50, id="older-than-its-first-epoch:-where-that-begins"),
]


@pytest.mark.parametrize("entries, log_end, answer, high_watermark, expected", FOLLOWER_TRUNCATIONS)
def test_the_follower_truncates_to_where_both_logs_end_the_epoch(tmp_path, entries, log_end, answer,
                                                                  high_watermark, expected):
    cache = _cache(tmp_path, entries)
    assert truncation_offset(cache, log_end, *answer, high_watermark=high_watermark) == expected


# (leader log as (epoch, records) runs, follower log as runs, offset below which both are the same)
DIVERGED_LOGS = [
    pytest.param([(0, 10), (2, 10)], [(0, 10), (1, 5)], 10, id="follower-led-an-epoch-nobody-saw"),
    pytest.param([(0, 10), (2, 10)], [(0, 14)], 10, id="follower-has-uncommitted-records-of-the-old-epoch"),
    pytest.param([(0, 10), (1, 5), (3, 4)], [(0, 10), (1, 8), (2, 6)], 15, id="two-rounds"),
    pytest.param([(0, 5), (1, 5), (4, 5)], [(0, 5), (1, 5)], 10, id="behind-but-not-diverged"),
    pytest.param([(0, 5), (1, 5), (4, 5)], [(0, 5), (1, 5), (2, 3), (3, 3)], 10, id="several-epochs-to-drop"),
]


def _log(runs):
    """Records as (offset, epoch), and the epoch cache entries, of a log written in ``runs``."""
    records, entries = [], []
    for epoch, count in runs:
        entries.append((epoch, len(records)))
        records += [(len(records) + i, epoch) for i in range(count)]
    return records, entries


@pytest.mark.parametrize("leader_runs, follower_runs, common", DIVERGED_LOGS)
def test_a_follower_that_diverged_truncates_to_the_common_prefix_then_copies_the_leader(
        tmp_path, leader_runs, follower_runs, common):
    leader_records, leader_entries = _log(leader_runs)
    follower_records, follower_entries = _log(follower_runs)
    leader = _cache(tmp_path, leader_entries, "leader")
    follower = _cache(tmp_path, follower_entries, "follower")
    truncated_to = []
    for _round in range(len(follower_runs) + 1):
        fetch_offset = len(follower_records)
        answer = diverging_epoch(leader, len(leader_records), follower.latest_epoch, fetch_offset)
        if answer is None:
            break
        offset = truncation_offset(follower, fetch_offset, *answer)
        assert offset < fetch_offset, "each round removes records"
        del follower_records[offset:]
        follower.truncate_from_end(offset)
        truncated_to.append(offset)
    else:
        raise AssertionError(f"no agreement after {len(follower_runs) + 1} rounds: {truncated_to}")
    assert follower_records == leader_records[:len(follower_records)], "a prefix of the leader's log"
    if truncated_to:
        assert truncated_to[-1] == common, "nothing of the common prefix is dropped"
