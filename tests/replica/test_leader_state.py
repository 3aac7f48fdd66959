"""LeaderState: follower progress, high watermark, ISR shrink and expand (Kafka's Partition rules)."""

from __future__ import annotations

import pytest

from hpbroker.errors import NotEnoughReplicasError
from hpbroker.replica.leader import EXPAND_FETCH_AGE_MAX_MS, ISR_CHANGE_RETRY_MS, LeaderState

LAG_MS = 1000


def _leader(isr=(0, 1, 2), replicas=(0, 1, 2), *, now_ms=0, epoch_start=0, high_watermark=0, min_isr=1):
    return LeaderState(0, 3, replicas, isr, lag_time_max_ms=LAG_MS, min_insync_replicas=min_isr,
                       now_ms=now_ms, leader_epoch_start_offset=epoch_start, high_watermark=high_watermark)


# (fetches as (replica, fetch_offset, leader_flushed_end, now_ms), replica asked, expected last_caught_up_ms)
CAUGHT_UP = [
    pytest.param([(1, 10, 10, 500)], 1, 500, id="at-the-leaders-end"),
    pytest.param([(1, 12, 10, 500)], 1, 500, id="past-the-leaders-end"),
    pytest.param([(1, 5, 10, 500)], 1, 0, id="behind-stays-as-it-was"),
    pytest.param([(1, 5, 10, 500), (1, 10, 20, 900)], 1, 500,
                 id="reached-the-end-of-its-previous-fetch:-caught-up-as-of-then"),
    pytest.param([(1, 5, 10, 500), (1, 9, 20, 900)], 1, 0, id="short-of-its-previous-fetchs-end"),
    pytest.param([(1, 10, 10, 900), (1, 10, 10, 500)], 1, 900, id="never-moves-backwards"),
    pytest.param([(2, 10, 10, 500)], 1, 0, id="another-followers-fetch"),
]


@pytest.mark.parametrize("fetches, replica, expected", CAUGHT_UP)
def test_a_follower_is_caught_up_when_it_reaches_the_leaders_flushed_end(fetches, replica, expected):
    state = _leader(isr=(0,), now_ms=0)
    for fetch in fetches:
        assert state.follower_fetched(*fetch)
    assert state.follower_progress()[replica][1] == expected


def test_becoming_leader_counts_isr_followers_caught_up_now_and_the_others_never():
    state = _leader(isr=(0, 1), now_ms=7000)
    assert state.follower_progress() == {1: (-1, 7000), 2: (-1, 0)}


def test_a_fetch_from_a_broker_that_is_not_a_follower_is_not_recorded():
    state = _leader()
    assert not state.follower_fetched(9, 10, 10, 5)
    assert not state.follower_fetched(0, 10, 10, 5), "the leader is no follower of itself"
    assert set(state.follower_progress()) == {1, 2}


# (isr, {replica: fetch_offset}, leader flushed end, expected HW)
HIGH_WATERMARKS = [
    pytest.param((0,), {1: 3}, 10, 10, id="leader-alone:-its-flushed-end"),
    pytest.param((0, 1, 2), {1: 5, 2: 7}, 10, 5, id="the-smallest-in-the-isr"),
    pytest.param((0, 1, 2), {1: 12, 2: 12}, 10, 10, id="the-leaders-own-end-bounds-it"),
    pytest.param((0, 1), {1: 8, 2: 1}, 10, 8, id="a-follower-outside-the-isr-does-not-hold-it"),
    pytest.param((0, 1, 2), {1: 8}, 10, 4, id="an-isr-follower-without-a-fetch-holds-it-where-it-was"),
]


@pytest.mark.parametrize("isr, offsets, leader_end, expected", HIGH_WATERMARKS)
def test_the_high_watermark_is_the_smallest_flushed_end_in_the_isr(isr, offsets, leader_end, expected):
    state = _leader(isr=isr, high_watermark=4)
    for replica, offset in offsets.items():
        state.follower_fetched(replica, offset, leader_end, 10)
    assert state.high_watermark(leader_end) == expected
    assert state.current_high_watermark == expected


def test_the_high_watermark_never_moves_backwards():
    state = _leader(isr=(0, 1))
    state.follower_fetched(1, 9, 10, 10)
    assert state.high_watermark(10) == 9
    state.isr_changed((0, 1, 2))  # a follower joins that has fetched nothing in this epoch
    assert state.high_watermark(12) == 9
    state.follower_fetched(1, 5, 12, 20)  # (cannot happen: a follower's flushed end only grows)
    assert state.high_watermark(12) == 9
    state.follower_fetched(1, 12, 12, 30)
    state.follower_fetched(2, 11, 12, 30)
    assert state.high_watermark(12) == 11


def test_a_replica_proposed_for_the_isr_holds_the_high_watermark_until_zookeeper_has_it():
    state = _leader(isr=(0, 1))
    state.follower_fetched(1, 20, 20, 10)
    state.follower_fetched(2, 20, 20, 10)
    assert state.isr_change(20, 10) == (0, 1, 2)
    state.follower_fetched(1, 30, 30, 20)  # replica 2 has not fetched the last 10 records yet
    assert state.high_watermark(30) == 20, "the maximal ISR (with 2) counts while the change is written"
    state.isr_changed((0, 1, 2))
    assert state.high_watermark(30) == 20


def test_a_replica_proposed_for_removal_still_holds_the_high_watermark_until_zookeeper_has_it():
    state = _leader(isr=(0, 1, 2), now_ms=0)
    state.follower_fetched(1, 20, 20, 0)
    state.follower_fetched(2, 20, 20, 0)
    state.follower_fetched(1, 30, 30, LAG_MS + 1)
    assert state.isr_change(30, LAG_MS + 1) == (0, 1)
    assert state.high_watermark(30) == 20
    state.isr_changed((0, 1))
    assert state.high_watermark(30) == 30


# (isr, fetches (replica, offset, leader_end, now_ms), now_ms of the check, epoch start, expected change)
ISR_CHANGES = [
    pytest.param((0, 1, 2), [(1, 10, 10, 100), (2, 10, 10, 100)], 100 + LAG_MS, 0, None,
                 id="caught-up-exactly-lag-time-ago:-kept"),
    pytest.param((0, 1, 2), [(1, 10, 10, 100), (2, 10, 10, 100)], 101 + LAG_MS, 0, (0,),
                 id="not-caught-up-for-longer:-dropped"),
    pytest.param((0, 1, 2), [(1, 10, 10, 900), (2, 5, 10, 900)], 1500, 0, (0, 1),
                 id="only-the-one-behind-is-dropped"),
    pytest.param((0, 1, 2), [], LAG_MS, 0, None, id="isr-followers-get-lag-time-after-leadership"),
    pytest.param((0, 1, 2), [], LAG_MS + 1, 0, (0,), id="isr-followers-that-never-fetch-are-dropped"),
    pytest.param((0,), [(2, 10, 10, 50)], 50, 0, (0, 2), id="a-replica-that-reached-the-hw-joins"),
    pytest.param((0,), [(2, 9, 10, 50)], 50, 0, None, id="below-the-hw-it-does-not"),
    pytest.param((0,), [(2, 10, 10, 50)], 50, 11, None,
                 id="below-this-leader-epochs-start-it-does-not"),
    pytest.param((0, 2), [(1, 10, 10, 50), (2, 10, 10, 50)], 60, 0, (0, 1, 2),
                 id="proposed-in-assignment-order"),
    pytest.param((0, 1), [(2, 10, 10, 5000)], 5000, 0, (0, 2), id="dropped-and-added-at-once"),
    pytest.param((0,), [], 10 * LAG_MS, 0, None, id="the-leader-alone-is-never-dropped"),
]


@pytest.mark.parametrize("isr, fetches, now_ms, epoch_start, expected", ISR_CHANGES)
def test_isr_shrinks_by_time_behind_and_expands_once_a_replica_reaches_the_high_watermark(
        isr, fetches, now_ms, epoch_start, expected):
    state = _leader(isr=isr, now_ms=0, epoch_start=epoch_start)
    for fetch in fetches:
        state.follower_fetched(*fetch)
    assert state.isr_change(10, now_ms) == expected


def test_an_isr_change_is_proposed_once_until_confirmed_or_the_retry_time_passes():
    state = _leader(isr=(0,))
    state.follower_fetched(1, 10, 10, 0)
    assert state.isr_change(10, 0) == (0, 1)
    assert state.isr_change(10, ISR_CHANGE_RETRY_MS - 1) is None, "being written"
    state.follower_fetched(1, 10, 10, ISR_CHANGE_RETRY_MS - 1)  # still fetching
    assert state.isr_change(10, ISR_CHANGE_RETRY_MS) == (0, 1), "no news: proposed again"
    state.isr_changed((0, 1))
    assert state.isr == (0, 1)
    state.follower_fetched(1, 10, 10, ISR_CHANGE_RETRY_MS + 1)
    assert state.isr_change(10, ISR_CHANGE_RETRY_MS + 1) is None


def test_news_of_the_isr_from_zookeeper_ends_a_pending_proposal():
    state = _leader(isr=(0,))
    state.follower_fetched(1, 10, 10, 0)
    assert state.isr_change(10, 0) == (0, 1)
    state.isr_changed((0,))  # the write failed; the state as ZooKeeper holds it came back
    assert state.isr_change(10, 1) == (0, 1), "proposed again at once"


def test_a_replica_that_joined_and_stopped_fetching_holds_the_high_watermark_until_dropped():
    state = _leader(isr=(0, 1))
    state.follower_fetched(1, 10, 10, 0)
    state.follower_fetched(2, 10, 10, 0)
    assert state.isr_change(10, 0) == (0, 1, 2)
    state.isr_changed((0, 1, 2))
    now_ms = 0
    for now_ms in range(100, LAG_MS + 200, 100):  # replica 1 keeps up, replica 2 fetches no more
        state.follower_fetched(1, 10 + now_ms, 10 + now_ms, now_ms)
        assert state.high_watermark(10 + now_ms) == 10, "acks=all waits for replica 2 meanwhile"
    assert state.isr_change(10 + now_ms, now_ms) == (0, 1)
    state.isr_changed((0, 1))
    assert state.high_watermark(10 + now_ms) == 10 + now_ms


def test_a_follower_dropped_for_silence_is_not_proposed_back_until_it_fetches_again():
    """Its broker died with its last fetch offset at the HW: once dropped, it must not come back
    on the strength of that old offset (the proposal would hold the HW there for good)."""
    state = _leader(isr=(0, 1, 2))
    state.follower_fetched(1, 10, 10, 0)
    state.follower_fetched(2, 10, 10, 0)
    now_ms = 0
    for now_ms in range(100, LAG_MS + 200, 100):  # replica 1 keeps up, replica 2 is dead
        state.follower_fetched(1, 10, 10, now_ms)
    assert state.isr_change(10, now_ms) == (0, 1)
    state.isr_changed((0, 1))
    for later in (now_ms + 100, now_ms + 6000, now_ms + 20_000):  # the leader's flushed end still 10
        state.follower_fetched(1, 10, 10, later)
        assert state.isr_change(10, later) is None, f"replica 2 proposed back at {later} ms"
        assert state.high_watermark(10) == 10
    state.follower_fetched(2, 10, 10, now_ms + 20_100)  # it is back, caught up
    assert state.isr_change(10, now_ms + 20_100) == (0, 1, 2)


def test_the_isr_may_not_name_a_broker_that_is_no_replica():
    state = _leader()
    with pytest.raises(ValueError, match=r"names brokers \[7\]"):
        state.isr_changed((0, 7))


def test_a_leader_must_be_one_of_the_replicas():
    with pytest.raises(ValueError, match="do not include it"):
        LeaderState(5, 0, (0, 1), (0, 1), lag_time_max_ms=LAG_MS, min_insync_replicas=1, now_ms=0)


@pytest.mark.parametrize("isr, min_isr, refused", [((0, 1, 2), 2, False), ((0, 1), 2, False),
                                                   ((0,), 2, True), ((0,), 1, False), ((0, 1), 3, True)])
def test_acks_all_is_refused_while_the_isr_is_below_min_insync_replicas(isr, min_isr, refused):
    state = _leader(isr=isr, min_isr=min_isr)
    if not refused:
        state.check_min_isr("orders-0")
        return
    with pytest.raises(NotEnoughReplicasError) as raised:
        state.check_min_isr("orders-0")
    assert str(raised.value) == (f"orders-0: {len(isr)} in-sync replicas {list(isr)}, "
                                 f"min_insync_replicas is {min_isr}")
    assert raised.value.retriable and raised.value.code == 24


def test_only_a_followers_durable_offset_counts_toward_the_high_watermark():
    state = _leader(isr=(0, 1))
    state.follower_fetched(1, 10, 10, 100, durable_offset=4)  # fetched to 10, flushed to 4
    assert state.high_watermark(10) == 4
    assert state.follower_progress()[1] == (10, 100)  # keeping up is its fetch offset's
    state.follower_fetched(1, 12, 12, 200)  # version 1: its fetch offset is durable
    assert state.high_watermark(12) == 12
    with pytest.raises(ValueError, match="durable offset 13 past its fetch offset 12"):
        state.follower_fetched(1, 12, 12, 300, durable_offset=13)


def test_a_replica_joins_the_isr_only_once_its_durable_offset_reaches_the_high_watermark():
    state = _leader(isr=(0,), high_watermark=10)
    state.follower_fetched(1, 10, 10, 100, durable_offset=9)
    assert state.isr_change(10, 100) is None
    state.follower_fetched(1, 10, 10, 200, durable_offset=10)
    assert state.isr_change(10, 200) == (0, 1)


def test_a_silent_follower_the_controller_removed_is_not_proposed_back_while_it_stays_silent():
    """Its replica reported offline (its worker slot crash-looping), the controller removed it
    from the ISR of an idle partition: its last fetch, younger than replica_lag_time_max_ms and
    at the HW, must not bring it back, or the leader's proposal undoes the removal and acks=all
    waits for a replica that does not fetch."""
    state = LeaderState(0, 3, (0, 1, 2), (0, 1, 2), lag_time_max_ms=30_000, min_insync_replicas=1,
                        now_ms=0)
    state.follower_fetched(1, 100, 100, 0)
    state.follower_fetched(2, 100, 100, 0)
    state.isr_changed((0, 1))  # the controller removed broker 2 (same leader epoch)
    for now_ms in (EXPAND_FETCH_AGE_MAX_MS + 1, 5_000, 20_000):
        state.follower_fetched(1, 100, 100, now_ms)  # broker 1 keeps fetching, broker 2 is silent
        assert state.isr_change(100, now_ms) is None, f"broker 2 proposed back at {now_ms} ms"
    state.follower_fetched(2, 100, 100, 20_500)  # it fetches again, caught up: back at once
    assert state.isr_change(100, 20_500) == (0, 1, 2)
