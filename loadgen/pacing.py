"""Rate control: how many records to send now, in small chunks against a clock, without drift.

A :class:`Pacer` never counts intervals: it compares what has been sent with what the schedule
says should have been sent by now, ``floor(rate * (now - start))``.  A late wake-up therefore
sends a larger chunk and the next one is on time again (no drift); a producer that fell behind
catches up in chunks of at most ``max_chunk`` records (and reports how far behind it was); one that
is ahead sleeps until the next ``min_chunk`` records are due.  ``rate`` None means as fast as
possible: every chunk is ``max_chunk`` records at once.  ``limit`` bounds the records in all.

The clock is injected so tests can drive it; nothing here sleeps.
"""

from __future__ import annotations

import math

__all__ = ["Pacer"]


class Pacer:
    """The schedule of one producer: records due at ``rate`` per second from ``start_s``.

    Single thread.  Usage: ``n, wait_s = pacer.next(now)``; send ``n`` records then call
    :meth:`sent` with ``n``, or sleep ``wait_s`` when ``n`` is 0."""

    __slots__ = ("rate", "start_s", "limit", "min_chunk", "max_chunk", "sent_total", "max_lag_s")

    def __init__(self, rate: float | None, start_s: float, *, limit: int | None = None,
                 max_chunk: int = 1000, pace_s: float = 0.001) -> None:
        if rate is not None and not rate > 0:
            raise ValueError(f"rate must be positive records/s or None, got {rate!r}")
        if max_chunk < 1 or pace_s <= 0:
            raise ValueError("max_chunk must be >= 1 and pace_s > 0")
        self.rate = rate
        self.start_s = start_s
        self.limit = limit
        self.max_chunk = max_chunk
        # the smallest chunk worth waking up for: pace_s worth of records (at least one)
        self.min_chunk = 1 if rate is None else max(1, min(max_chunk, int(rate * pace_s)))
        self.sent_total = 0
        self.max_lag_s = 0.0

    def due(self, now_s: float) -> int:
        """Records the schedule says should have been sent by ``now_s`` (within ``limit``)."""
        if self.rate is None:
            due = self.sent_total + self.max_chunk
        else:
            due = math.floor(self.rate * max(0.0, now_s - self.start_s))
        return due if self.limit is None else min(due, self.limit)

    def next(self, now_s: float) -> tuple[int, float]:
        """``(records to send now, seconds to wait if none)``.  ``(0, inf)`` once ``limit`` is
        reached."""
        if self.limit is not None and self.sent_total >= self.limit:
            return 0, math.inf
        backlog = self.due(now_s) - self.sent_total
        if self.rate is None:
            return min(backlog, self.max_chunk), 0.0
        if backlog >= self.min_chunk or (backlog > 0 and self.limit is not None
                                          and self.sent_total + backlog >= self.limit):
            # lateness beyond the pacing granularity: the oldest due record waited this much longer
            self.max_lag_s = max(self.max_lag_s, (backlog - self.min_chunk) / self.rate)
            return min(backlog, self.max_chunk), 0.0
        target = self.sent_total + self.min_chunk
        if self.limit is not None:
            target = min(target, self.limit)
        wake_s = self.start_s + target / self.rate + 1e-7  # past floor()'s rounding
        return 0, max(1e-6, wake_s - now_s)

    def sent(self, n: int) -> None:
        self.sent_total += n

    def lag_s(self, now_s: float) -> float:
        """How long the oldest record due but not yet sent has been due (0 when on time)."""
        if self.rate is None:
            return 0.0
        return max(0.0, (self.due(now_s) - self.sent_total) / self.rate)
