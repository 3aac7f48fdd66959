"""A round of GroupOffsetsPoller is bounded by its timeout as a whole, whichever step ZooKeeper is
slow to answer (kazoo's own async results, a stand-in for the session: no ZooKeeper needed)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from kazoo.handlers.threading import SequentialThreadingHandler

from hpbroker.coord.lag import GroupOffsetsPoller
from hpbroker.errors import CoordinationError

TIMEOUT_S = 1.0


class SlowZooKeeper:
    """Answers the list of groups after ``groups_after_s``, and never anything else."""

    def __init__(self, groups_after_s: float) -> None:
        self.handler = SequentialThreadingHandler()
        self.groups_after_s = groups_after_s
        self.timers: list[threading.Timer] = []

    def get_children_async(self, path: str):
        result = self.handler.async_result()
        if path.rstrip("/").endswith("consumers"):
            timer = threading.Timer(self.groups_after_s, result.set, (["audit", "billing"],))
            timer.start()
            self.timers.append(timer)
        return result

    def get_async(self, _path: str):
        return self.handler.async_result()


@pytest.mark.parametrize("groups_after_s", [0.0, 0.5 * TIMEOUT_S, 2 * TIMEOUT_S])
def test_a_round_ends_within_its_timeout_whichever_step_is_slow(groups_after_s):
    zookeeper = SlowZooKeeper(groups_after_s)
    poller = GroupOffsetsPoller(SimpleNamespace(client=zookeeper), interval_s=60, timeout_s=TIMEOUT_S)
    started = time.monotonic()
    try:
        with pytest.raises(CoordinationError, match="no answer from ZooKeeper within"):
            poller.read(frozenset({"orders"}))
    finally:
        for timer in zookeeper.timers:
            timer.cancel()
    assert time.monotonic() - started < 1.9 * TIMEOUT_S  # not the listing's time and a full timeout more
