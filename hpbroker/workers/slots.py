"""The arbiter's table of worker slots: which process serves each slot, and in what state.

A *slot* is a fixed share of the partitions (``hpbroker.workers.ownership``); the process serving
it changes over time.  One slot, one life cycle::

    DEAD --fork--> BOOTING --"ready"--> SERVING
      ^               |                    |
      |               +----- SIGABRT / SIGTERM / exit ----> STOPPING --reaped--> DEAD
      |                                                                           |
      +-- retry_at -- BACKOFF <--- crash-looping, failed to boot or fork failed --+

A slot holds at most one process, and a new one is forked only once the old one has been reaped
(``DEAD`` or ``BACKOFF``): two processes never own the same partitions.  Only ``SERVING`` slots
get requests.  Single-threaded: the arbiter's loop is the only reader and writer.

**Crash loops.**  A slot whose processes die more than :data:`RESTART_LIMIT` times within
:data:`RESTART_WINDOW_S`, or whose process exits with "failed to boot", is *crash-looping*: it
is not forked again at once but held in ``BACKOFF`` for :attr:`Slot.backoff_s` seconds, which
starts at :data:`BACKOFF_INITIAL_S` and doubles with every further death (or boot failure) up to
:data:`BACKOFF_MAX_S`.  Only that slot's partitions are unavailable meanwhile; the other slots
keep serving.  A retried process that reports ready serves at once, but the backoff is kept
(a death then holds the slot back again, for twice as long) until it has served
:data:`BACKOFF_RESET_S` without dying.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

__all__ = [
    "BACKOFF_INITIAL_S",
    "BACKOFF_MAX_S",
    "BACKOFF_RESET_S",
    "RESTART_LIMIT",
    "RESTART_WINDOW_S",
    "Slot",
    "SlotState",
]

# A slot whose processes die more than RESTART_LIMIT times within RESTART_WINDOW_S is crash-looping:
# respawning it at once would only loop, so it is retried with backoff.
RESTART_LIMIT = 5
RESTART_WINDOW_S = 60.0
BACKOFF_INITIAL_S = 1.0  # the first hold-back of a crash-looping slot
BACKOFF_MAX_S = 60.0  # the longest: each further death doubles the hold-back up to this
BACKOFF_RESET_S = 60.0  # serving this long without dying ends the crash loop (backoff back to 0)


class SlotState(enum.Enum):
    DEAD = "dead"  # no process (never started, or reaped); forked again at once
    BOOTING = "booting"  # forked; opening and recovering its partitions
    SERVING = "serving"  # reported ready; gets requests
    STOPPING = "stopping"  # signalled (abort or terminate); waiting to be reaped
    BACKOFF = "backoff"  # no process: crash-looping, held back until retry_at


@dataclass(slots=True)
class Slot:
    """One slot and its current process.  Times are ``time.monotonic()`` seconds (a wall-clock
    step moves none of them; liveness is ``hpbroker.workers.liveness``'s, on the same clock)."""

    index: int
    state: SlotState = SlotState.DEAD
    pid: int = 0
    forked_at: float = 0.0
    ready_at: float = 0.0
    kill_at: float | None = None  # when to SIGKILL a process that was asked to stop
    deaths: deque[float] = field(default_factory=deque)
    forks: int = 0  # processes forked into the slot since the broker started
    backoff_s: float = 0.0  # the current hold-back; 0 unless crash-looping (module docstring)
    retry_at: float = 0.0  # in BACKOFF: when to fork again
    backoffs: int = 0  # times the slot was held back since the broker started
    crash_reason: str = ""  # why it is crash-looping, for logs and error messages

    @property
    def serving(self) -> bool:
        return self.state is SlotState.SERVING

    @property
    def alive(self) -> bool:
        """Whether a process (not yet reaped) holds the slot."""
        return self.state not in (SlotState.DEAD, SlotState.BACKOFF)

    @property
    def crash_looping(self) -> bool:
        """Whether its partitions are unavailable because the slot is crash-looping: held back,
        or its retried process not ready yet."""
        return self.backoff_s > 0 and self.state is not SlotState.SERVING

    def forked(self, pid: int, now: float) -> None:
        assert not self.alive, f"slot {self.index} forked while {self.state.value}"
        self.state, self.pid, self.forked_at, self.kill_at, self.ready_at = \
            SlotState.BOOTING, pid, now, None, 0.0
        self.forks += 1

    def became_ready(self, now: float) -> None:
        self.state, self.ready_at = SlotState.SERVING, now

    def reaped(self, now: float, *, count_death: bool) -> int:
        """Mark the process gone; returns the deaths within the restart window (this one counted
        when ``count_death``)."""
        self.state, self.pid, self.kill_at = SlotState.DEAD, 0, None
        if count_death:
            self.deaths.append(now)
        while self.deaths and self.deaths[0] < now - RESTART_WINDOW_S:
            self.deaths.popleft()
        return len(self.deaths)

    def hold_back(self, now: float, reason: str) -> float:
        """Put a slot without a process in ``BACKOFF`` (``reason``: why); returns the seconds
        until it is forked again: :data:`BACKOFF_INITIAL_S` the first time, twice the last
        hold-back after that, at most :data:`BACKOFF_MAX_S`."""
        assert not self.alive, f"slot {self.index} held back while {self.state.value}"
        self.backoff_s = min(BACKOFF_MAX_S, self.backoff_s * 2) if self.backoff_s else BACKOFF_INITIAL_S
        self.state, self.retry_at, self.crash_reason = SlotState.BACKOFF, now + self.backoff_s, reason
        self.backoffs += 1
        return self.backoff_s

    def settled(self, now: float) -> bool:
        """Whether a crash loop just ended: the slot serves and has served :data:`BACKOFF_RESET_S`
        since it was retried.  Resets the backoff when so."""
        if self.backoff_s and self.serving and now - self.ready_at >= BACKOFF_RESET_S:
            self.backoff_s, self.crash_reason = 0.0, ""
            return True
        return False

    def condition(self, now: float) -> str:
        """The slot's state in words, for an error 15 that names why a partition is not served."""
        if self.state is SlotState.BACKOFF:
            retry_s = max(0.0, self.retry_at - now)
            return (f"crash-looping ({self.crash_reason}); it is retried in {retry_s:.1f} s "
                    f"(backoff {self.backoff_s:g} s, doubling up to {BACKOFF_MAX_S:g} s)")
        if self.crash_looping:
            return f"crash-looping ({self.crash_reason}); retried now, recovering its partitions"
        return self.state.value
