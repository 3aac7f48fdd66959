"""Replica assignment of a new topic: Kafka's layout, leaders and replicas spread evenly, no broker
twice in a partition, and clear refusals."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpbroker.coord.assignment import assign_replicas
from hpbroker.errors import InvalidConfigError, InvalidPartitionsError, InvalidReplicationFactorError


def test_layout_is_kafkas_for_a_fixed_start():
    # Kafka's AdminUtils.assignReplicasToBrokers documents this layout for 5 brokers, 10
    # partitions, 3 replicas, starting at index 0.
    assert assign_replicas(10, 3, [0, 1, 2, 3, 4], start=0) == {
        0: (0, 1, 2), 1: (1, 2, 3), 2: (2, 3, 4), 3: (3, 4, 0), 4: (4, 0, 1),
        5: (0, 2, 3), 6: (1, 3, 4), 7: (2, 4, 0), 8: (3, 0, 1), 9: (4, 1, 2)}


def test_broker_ids_are_used_sorted_whatever_their_order():
    assert assign_replicas(3, 2, [9, 4, 7], start=0) == {0: (4, 7), 1: (7, 9), 2: (9, 4)}
    assert assign_replicas(3, 2, [9, 4, 7, 4], start=1) == assign_replicas(3, 2, [4, 7, 9], start=1)


def test_fixed_start_is_deterministic_and_shifts_the_leaders():
    assert assign_replicas(6, 2, [0, 1, 2], start=2) == assign_replicas(6, 2, [2, 1, 0], start=2)
    assert assign_replicas(3, 1, [0, 1, 2], start=1) == {0: (1,), 1: (2,), 2: (0,)}


@pytest.mark.parametrize(("partitions", "replication_factor", "brokers"), [
    (12, 3, 3), (12, 3, 4), (30, 2, 5), (7, 3, 3), (100, 3, 7), (8, 1, 3), (1, 1, 1), (5, 5, 5), (64, 4, 6),
])
@pytest.mark.parametrize("start", [0, 1, 5, None])
def test_leaders_and_replicas_spread_evenly_and_no_broker_twice(partitions, replication_factor, brokers,
                                                                start):
    ids = list(range(10, 10 + brokers))
    assignment = assign_replicas(partitions, replication_factor, ids, start=start)
    assert sorted(assignment) == list(range(partitions))
    for replicas in assignment.values():
        assert len(replicas) == replication_factor
        assert len(set(replicas)) == replication_factor, replicas
        assert set(replicas) <= set(ids)
    leaders = Counter(replicas[0] for replicas in assignment.values())
    held = Counter(b for replicas in assignment.values() for b in replicas)
    # Leadership goes round the brokers: each leads partitions/n, rounded down or up.
    assert {leaders[b] for b in ids} <= {partitions // brokers, -(-partitions // brokers)}
    # Each full round of n partitions gives every broker R replicas; a partial round at most one
    # more replica per broker per replica position.
    full, rest = divmod(partitions, brokers)
    floor = full * replication_factor
    for b in ids:
        assert floor <= held[b] <= floor + min(rest, replication_factor)
    if rest == 0:
        assert set(held.values()) == {partitions * replication_factor // brokers}


@given(st.integers(1, 200), st.data(), st.sets(st.integers(0, 2**31 - 1), min_size=1, max_size=12),
       st.integers(0, 50))
def test_any_assignment_is_complete_distinct_and_leaders_go_round(partitions, data, brokers, start):
    replication_factor = data.draw(st.integers(1, len(brokers)))
    assignment = assign_replicas(partitions, replication_factor, list(brokers), start=start)
    live = sorted(brokers)
    assert sorted(assignment) == list(range(partitions))
    for partition, replicas in assignment.items():
        assert len(replicas) == len(set(replicas)) == replication_factor
        assert set(replicas) <= brokers
        assert replicas[0] == live[(start + partition) % len(live)]


def test_followers_of_one_leader_vary_from_round_to_round():
    assignment = assign_replicas(9, 2, [0, 1, 2], start=0)
    assert {assignment[p][1] for p in (0, 3, 6)} == {1, 2}  # broker 0's followers change with the shift


def test_random_start_still_gives_a_valid_layout():
    starts = {assign_replicas(4, 2, [0, 1, 2, 3])[0][0] for _ in range(200)}
    assert len(starts) > 1  # not always the lowest broker


@pytest.mark.parametrize("replication_factor", [0, -1, True, 1.0, "2"])
def test_replication_factor_below_one_is_refused(replication_factor):
    with pytest.raises(InvalidReplicationFactorError, match="replication factor"):
        assign_replicas(3, replication_factor, [0, 1, 2])


def test_replication_factor_above_the_live_brokers_names_them():
    with pytest.raises(InvalidReplicationFactorError,
                       match=r"replication factor 3 .* 2 live brokers \[1, 4\]"):
        assign_replicas(3, 3, [4, 1])
    with pytest.raises(InvalidReplicationFactorError, match=r"0 live brokers \[\]"):
        assign_replicas(3, 1, [])
    assert InvalidReplicationFactorError.code == 26 and not InvalidReplicationFactorError.retriable


@pytest.mark.parametrize("partitions", [0, -3, True, 2.0])
def test_partition_count_below_one_is_refused(partitions):
    with pytest.raises(InvalidPartitionsError, match="at least 1 partition"):
        assign_replicas(partitions, 1, [0])


def test_bad_broker_ids_and_start_are_refused():
    with pytest.raises(InvalidConfigError, match="broker id"):
        assign_replicas(1, 1, [-1])
    with pytest.raises(ValueError, match="start"):
        assign_replicas(1, 1, [0], start=-1)
