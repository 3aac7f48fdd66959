"""One rule for what a replica assignment may be (``hpbroker.coord.assignment``), applied alike by
the topic node's reader and by the broker's topic store, and importable without kazoo."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpbroker.broker.topics import TopicStore
from hpbroker.coord.assignment import check_replica_assignment
from hpbroker.coord.registry import TopicRegistration
from hpbroker.errors import InvalidPartitionsError

GOOD = [
    {0: (1, 2, 0), 1: (2, 0, 1)},
    {0: (1, 2), 1: (2, 0, 1)},  # a reassignment moving partition 1
    {0: [0], 1: [2147483647]},
]
BAD = [
    ({0: (1, 2)}, "must list partitions 0..1"),  # a partition missing
    ({0: (1,), 1: (2,), 2: (0,)}, "must list partitions 0..1"),  # one too many
    ({0: (1, 1), 1: (2,)}, "partition 0 name a broker twice"),
    ({0: (), 1: (2,)}, "partition 0 must be a non-empty list"),
    ({0: "12", 1: (2,)}, "partition 0 must be a non-empty list"),
    ({0: (1,), 1: (True,)}, "partition 1"),  # a bool is no broker id
    ({0: (1,), 1: (2**31,)}, "partition 1"),  # above the largest broker id
    ({0: (1,), 1: (-1,)}, "partition 1"),
]


@pytest.mark.parametrize("replicas", GOOD)
def test_an_assignment_is_taken_alike_by_the_store_and_the_topic_node(tmp_path, replicas):
    expected = {p: tuple(r) for p, r in replicas.items()}
    assert check_replica_assignment(2, replicas) == expected
    assert TopicStore(tmp_path).create("t", 2, replicas=replicas).replicas == expected
    assert TopicRegistration("t", 2, replicas=replicas).replicas == expected


@pytest.mark.parametrize(("replicas", "why"), BAD)
def test_an_assignment_is_refused_alike_by_the_store_and_the_topic_node(tmp_path, replicas, why):
    with pytest.raises(InvalidPartitionsError, match=why):
        check_replica_assignment(2, replicas)
    with pytest.raises(InvalidPartitionsError, match=why):
        TopicStore(tmp_path).create("t", 2, replicas=replicas)
    with pytest.raises(ValueError, match=why):
        TopicRegistration("t", 2, replicas=replicas)
    assert TopicStore(tmp_path).get("t") is None  # nothing persisted


def test_the_topic_store_with_its_assignment_rule_loads_no_kazoo():
    code = ("import sys, hpbroker.broker.topics; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'kazoo'); "
            "sys.exit(f'kazoo loaded: {bad}' if bad else 0)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
