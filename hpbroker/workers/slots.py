"""The arbiter's table of worker slots: which process serves each slot, and in what state.

A *slot* is a fixed share of the partitions (``hpbroker.workers.ownership``); the process serving
it changes over time.  One slot, one life cycle::

    DEAD --fork--> BOOTING --"ready"--> SERVING
                      |                    |
                      +----- SIGABRT / SIGTERM / exit ----> STOPPING --reaped--> DEAD

A slot holds at most one process, and a new one is forked only once the old one has been reaped
(``DEAD``): two processes never own the same partitions.  Only ``SERVING`` slots get requests.
Single-threaded: the arbiter's loop is the only reader and writer.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

__all__ = ["RESTART_LIMIT", "RESTART_WINDOW_S", "Slot", "SlotState"]

# A slot whose processes die more than RESTART_LIMIT times within RESTART_WINDOW_S stops the
# broker: respawning would only loop.
RESTART_LIMIT = 5
RESTART_WINDOW_S = 60.0


class SlotState(enum.Enum):
    DEAD = "dead"  # no process (never started, or reaped)
    BOOTING = "booting"  # forked; opening and recovering its partitions
    SERVING = "serving"  # reported ready; gets requests
    STOPPING = "stopping"  # signalled (abort or terminate); waiting to be reaped


@dataclass(slots=True)
class Slot:
    """One slot and its current process.  Times are ``time.monotonic()`` seconds except
    ``ready_wall``, which is ``time.time()`` to compare with heartbeat file mtimes."""

    index: int
    state: SlotState = SlotState.DEAD
    pid: int = 0
    forked_at: float = 0.0
    ready_wall: float = 0.0
    kill_at: float | None = None  # when to SIGKILL a process that was asked to stop
    deaths: deque[float] = field(default_factory=deque)
    forks: int = 0  # processes forked into the slot since the broker started

    @property
    def serving(self) -> bool:
        return self.state is SlotState.SERVING

    @property
    def alive(self) -> bool:
        """Whether a process (not yet reaped) holds the slot."""
        return self.state is not SlotState.DEAD

    def forked(self, pid: int, now: float) -> None:
        assert self.state is SlotState.DEAD, f"slot {self.index} forked while {self.state.value}"
        self.state, self.pid, self.forked_at, self.kill_at, self.ready_wall = \
            SlotState.BOOTING, pid, now, None, 0.0
        self.forks += 1

    def reaped(self, now: float, *, count_death: bool) -> int:
        """Mark the process gone; returns the deaths within the restart window (this one counted
        when ``count_death``)."""
        self.state, self.pid, self.kill_at = SlotState.DEAD, 0, None
        if count_death:
            self.deaths.append(now)
        while self.deaths and self.deaths[0] < now - RESTART_WINDOW_S:
            self.deaths.popleft()
        return len(self.deaths)
