"""A Prometheus-style histogram for a hot path: :class:`Histogram`.

Observations fall into buckets by upper bound (``value <= bound``, the ``le`` of the exposition
format); one more bucket holds what lies above every bound (``+Inf``).  Counts are kept *per
bucket* (not cumulative) so that :meth:`Histogram.observe` touches one list slot; the cumulative
counts Prometheus wants are made when rendering.  Plain Python numbers, no lock: one thread
observes, and a snapshot (:meth:`Histogram.to_json`) is copied by that same thread.

Snapshot format (JSON, what a worker publishes): ``{"counts": [c0, ..., cN], "sum": s}`` with
``N = len(bounds)``, ``counts[i]`` the observations in ``(bounds[i-1], bounds[i]]`` and ``counts[N]``
those above ``bounds[-1]``.  The bounds are not in it: writer and reader are the same code.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any

__all__ = ["LATENCY_BUCKETS_S", "Histogram"]

# Request and disk latencies in seconds: 100 µs to 10 s, about three buckets a decade.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005,
    0.001, 0.0025, 0.005,
    0.01, 0.025, 0.05,
    0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
)


class Histogram:
    """Counts of observations per bucket, and their sum (module docstring).  Single-threaded."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS_S) -> None:
        bounds = tuple(float(b) for b in bounds)
        if not bounds or any(not math.isfinite(b) for b in bounds) \
                or any(a >= b for a, b in zip(bounds, bounds[1:], strict=False)):
            raise ValueError(f"bucket bounds must be finite and strictly increasing, got {bounds}")
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations <= it)`` per bucket, ending with ``(inf, count)``."""
        result, total = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            total += n
            result.append((bound, total))
        return result

    def to_json(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "sum": self.sum}

    @classmethod
    def from_json(cls, data: Any, bounds: Sequence[float] = LATENCY_BUCKETS_S) -> Histogram:
        """A histogram from :meth:`to_json`'s output; ValueError when it does not fit ``bounds``."""
        histogram = cls(bounds)
        try:
            counts, total = data["counts"], data["sum"]
        except (KeyError, TypeError):
            raise ValueError(f"not a histogram snapshot: {data!r:.200}") from None
        if not isinstance(counts, list) or len(counts) != len(histogram.counts) \
                or not all(isinstance(n, int) and n >= 0 for n in counts) \
                or not isinstance(total, int | float):
            raise ValueError(f"histogram snapshot does not fit {len(histogram.bounds)} buckets: "
                             f"{data!r:.200}")
        histogram.counts, histogram.sum = list(counts), float(total)
        return histogram

