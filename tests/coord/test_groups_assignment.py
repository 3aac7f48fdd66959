"""The range assignment every group member computes: pure logic, no ZooKeeper."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from hpbroker.coord.groups import range_assignment


def test_twelve_partitions_over_three_members_are_contiguous_ranges_of_four():
    members = {"c2": ["orders"], "c0": ["orders"], "c1": ["orders"]}
    assignment = range_assignment(members, {"orders": range(12)})
    assert assignment == {"c0": [("orders", p) for p in range(0, 4)],
                          "c1": [("orders", p) for p in range(4, 8)],
                          "c2": [("orders", p) for p in range(8, 12)]}


def test_the_first_members_get_one_more_when_it_does_not_divide():
    assignment = range_assignment({"a": ["t"], "b": ["t"], "c": ["t"]}, {"t": range(8)})
    assert assignment == {"a": [("t", 0), ("t", 1), ("t", 2)], "b": [("t", 3), ("t", 4), ("t", 5)],
                          "c": [("t", 6), ("t", 7)]}


def test_more_members_than_partitions_leaves_the_last_members_idle():
    assignment = range_assignment({f"c{i}": ["t"] for i in range(5)}, {"t": range(3)})
    assert [len(assignment[f"c{i}"]) for i in range(5)] == [1, 1, 1, 0, 0]


def test_each_topic_is_shared_only_among_its_subscribers():
    assignment = range_assignment({"a": ["x", "y"], "b": ["y"], "c": ["x"]}, {"x": range(4), "y": range(2)})
    assert assignment == {"a": [("x", 0), ("x", 1), ("y", 0)], "b": [("y", 1)], "c": [("x", 2), ("x", 3)]}


def test_a_topic_without_partitions_or_metadata_is_assigned_to_nobody():
    assignment = range_assignment({"a": ["known", "unknown"]}, {"known": range(2), "empty": []})
    assert assignment == {"a": [("known", 0), ("known", 1)]}


def test_the_partitions_given_are_used_sorted_even_with_gaps():
    assert range_assignment({"a": ["t"], "b": ["t"]}, {"t": [9, 2, 5]}) == \
        {"a": [("t", 2), ("t", 5)], "b": [("t", 9)]}


subscriptions = st.dictionaries(
    st.text("abcdefgh0123456789-", min_size=1, max_size=6),
    st.sets(st.sampled_from(["t0", "t1", "t2"]), max_size=3),
    max_size=8)
topic_partitions = st.dictionaries(st.sampled_from(["t0", "t1", "t2", "t3"]),
                                   st.sets(st.integers(0, 40), max_size=30), max_size=4)


@given(subscriptions, topic_partitions, st.randoms(use_true_random=False))
def test_every_partition_goes_to_exactly_one_subscriber_balanced_and_deterministically(subs, parts, rnd):
    assignment = range_assignment(subs, parts)
    assert set(assignment) == set(subs)
    for topic, partitions in parts.items():
        members = sorted(c for c, topics in subs.items() if topic in topics)
        owners = [(p, c) for c, owned in assignment.items() for t, p in owned if t == topic]
        if not members:
            assert owners == []
            continue
        assert sorted(p for p, _ in owners) == sorted(partitions), "each partition exactly once"
        assert {c for _, c in owners} <= set(members), "only to subscribers"
        sizes = [sum(1 for _, c in owners if c == m) for m in members]
        assert max(sizes) - min(sizes) <= 1, "balanced"
        assert sizes == sorted(sizes, reverse=True), "the larger ranges come first"
        ordered = sorted(partitions)
        flattened = [p for m in members for t, p in assignment[m] if t == topic]
        assert flattened == ordered, "contiguous ranges in member order"
    shuffled_subs = list(subs.items())
    rnd.shuffle(shuffled_subs)
    shuffled_parts = [(t, rnd.sample(sorted(ps), len(ps))) for t, ps in parts.items()]
    rnd.shuffle(shuffled_parts)
    assert range_assignment(dict((c, list(t)) for c, t in shuffled_subs), dict(shuffled_parts)) == assignment


def test_every_member_computes_the_same_assignment_from_the_same_registries():
    rnd = random.Random(7)
    members = {f"host-{i}-{rnd.getrandbits(32):08x}": ["orders", "logs"] for i in range(7)}
    partitions = {"orders": range(12), "logs": range(5)}
    views = []
    for _ in range(5):
        order = list(members.items())
        rnd.shuffle(order)
        views.append(range_assignment(dict(order), partitions))
    assert all(view == views[0] for view in views)
