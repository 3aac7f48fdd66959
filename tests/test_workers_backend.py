"""The arbiter <-> worker framing and the partition ownership rule."""

from __future__ import annotations

import pytest

from hpbroker.workers import backend
from hpbroker.workers.ownership import owner_slot


def test_relay_and_control_messages_round_trip():
    relay = backend.decode(backend.encode_relay(b"\x00abcd", [b"head", b"payload"]))
    assert relay == backend.Relay(b"\x00abcd", [b"head", b"payload"])
    spec = backend.PartitionSpec("orders", 3, {"retention_ms": 1000})
    control = backend.decode(backend.encode_control("open", id=7, partitions=[spec.to_json()]))
    assert control.op == "open" and control.body["id"] == 7
    assert [backend.PartitionSpec.from_json(p) for p in control.body["partitions"]] == [spec]


@pytest.mark.parametrize(
    ("frames", "message"),
    [
        ([], "empty"),
        ([b"X", b"1"], "unknown backend message kind"),
        ([b"R", b"client"], "3 or 4 frames"),
        ([b"C", b"{not json"], "not JSON"),
        ([b"C", b"[1, 2]"], "without an op"),
        ([b"C", b"{}", b"extra"], "2 frames"),
    ],
)
def test_malformed_backend_messages_are_refused(frames, message):
    with pytest.raises(ValueError, match=message):
        backend.decode(frames)


def test_partition_specs_are_checked():
    with pytest.raises(ValueError, match="not a partition spec"):
        backend.PartitionSpec.from_json({"topic": 3, "partition": 0})


def test_ownership_is_stable_and_spreads_a_topic_over_every_slot():
    slots = 4
    owners = [owner_slot("orders", p, slots) for p in range(12)]
    assert owners == [owner_slot("orders", p, slots) for p in range(12)]
    assert sorted(owners.count(s) for s in range(slots)) == [3, 3, 3, 3]
    assert owners[1] == (owners[0] + 1) % slots
    with pytest.raises(ValueError, match="slots must be at least 1"):
        owner_slot("orders", 0, 0)
