"""A compact log-linear latency histogram (HDR-style), recorded a whole array at a time.

Bucket layout, for non-negative integer values (loadgen records nanoseconds):

- values below ``2 * SUB_BUCKETS`` (256) have a bucket each: recorded exactly;
- above, each power of two ``[2**k, 2**(k+1))`` is cut into ``SUB_BUCKETS`` (128) equal buckets
  of width ``2**(k-7)``.

So ``index(v) = shift * SUB_BUCKETS + (v >> shift)`` with ``shift = max(0, bit_length(v) - 8)``,
and a bucket's width is at most 1/128 of its lower bound.  A percentile is reported as its
bucket's midpoint, within 1/256 (0.4 %) of every value the bucket holds; ``min`` and ``max`` are
kept exactly.  Values from ``2**MAX_BITS`` ns (about 18 minutes) up land in the last bucket and
negative values (a clock that stepped back) in bucket 0; both are counted in ``clamped``.

The counts live in one numpy array of ``BUCKETS`` (4,480) int64s; :meth:`record_array` bins a
whole array of values with two vectorised passes, so recording costs a few nanoseconds per value.
Histograms merge by adding counts, and travel between processes as sparse ``[index, count]``
pairs (:meth:`to_sparse`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["BUCKETS", "Histogram", "MAX_BITS", "SUB_BUCKETS", "bucket_bounds", "bucket_index"]

SUB_BUCKET_BITS = 7
SUB_BUCKETS = 1 << SUB_BUCKET_BITS  # buckets per power of two: relative width <= 1/128
MAX_BITS = 40  # values from 2**40 (ns: ~18 minutes) on are clamped into the last bucket
_LINEAR_LIMIT = 2 * SUB_BUCKETS  # values below this are exact
_MAX_SHIFT = MAX_BITS - SUB_BUCKET_BITS - 1
BUCKETS = (_MAX_SHIFT + 2) * SUB_BUCKETS
_MAX_VALUE = (1 << MAX_BITS) - 1


def bucket_index(value: int) -> int:
    """The bucket of one value (clamped to [0, 2**MAX_BITS - 1])."""
    value = min(max(int(value), 0), _MAX_VALUE)
    shift = max(0, value.bit_length() - SUB_BUCKET_BITS - 1)
    return shift * SUB_BUCKETS + (value >> shift)


def bucket_bounds(index: int) -> tuple[int, int]:
    """``(lowest, highest)`` value that bucket ``index`` holds, both included."""
    if not 0 <= index < BUCKETS:
        raise ValueError(f"bucket index {index} outside [0, {BUCKETS})")
    shift = 0 if index < _LINEAR_LIMIT else index // SUB_BUCKETS - 1
    low = (index - shift * SUB_BUCKETS) << shift
    return low, low + (1 << shift) - 1


def _indexes(values: np.ndarray) -> np.ndarray:
    v = np.clip(values.astype(np.int64, copy=False), 0, _MAX_VALUE)
    # frexp of a float64 is exact for integers below 2**53: v = m * 2**e, m in [0.5, 1), so e is
    # the bit length (0 for v == 0).
    _, bit_length = np.frexp(v.astype(np.float64))
    shift = np.maximum(bit_length.astype(np.int64) - (SUB_BUCKET_BITS + 1), 0)
    return shift * SUB_BUCKETS + (v >> shift)


class Histogram:
    """Counts of values in log-linear buckets, with the exact min, max and sum.

    Single writer: one thread records; copies (:meth:`to_sparse`) travel to whoever merges."""

    __slots__ = ("counts", "total", "min", "max", "sum", "clamped")

    def __init__(self) -> None:
        self.counts = np.zeros(BUCKETS, dtype=np.int64)
        self.total = 0
        self.min: int | None = None
        self.max: int | None = None
        self.sum = 0
        self.clamped = 0

    def __repr__(self) -> str:
        return f"Histogram(total={self.total}, min={self.min}, max={self.max})"

    def _extend(self, low: int, high: int, total: int, value_sum: int) -> None:
        self.min = low if self.min is None else min(self.min, low)
        self.max = high if self.max is None else max(self.max, high)
        self.total += total
        self.sum += value_sum

    def record(self, value: int, count: int = 1) -> None:
        """Record ``value`` ``count`` times."""
        if count <= 0:
            return
        value = int(value)
        if value < 0 or value > _MAX_VALUE:
            self.clamped += count
        self.counts[bucket_index(value)] += count
        self._extend(value, value, count, value * count)

    def record_array(self, values: np.ndarray | Sequence[int], counts: np.ndarray | None = None) -> None:
        """Record every value of ``values`` (once each, or ``counts[i]`` times)."""
        v = np.asarray(values, dtype=np.int64)
        if v.size == 0:
            return
        weights = None if counts is None else np.asarray(counts, dtype=np.int64)
        self.counts += np.bincount(_indexes(v), weights=weights, minlength=BUCKETS).astype(np.int64)
        outside = (v < 0) | (v > _MAX_VALUE)
        n = int(v.size) if weights is None else int(weights.sum())
        if outside.any():
            self.clamped += int(outside.sum()) if weights is None else int(weights[outside].sum())
        value_sum = int(v.sum()) if weights is None else int((v * weights).sum())
        self._extend(int(v.min()), int(v.max()), n, value_sum)

    def merge(self, other: Histogram) -> None:
        """Add ``other``'s counts to these."""
        if other.total == 0:
            return
        self.counts += other.counts
        self.clamped += other.clamped
        self._extend(other.min, other.max, other.total, other.sum)

    def percentile(self, q: float) -> int | None:
        """The value at percentile ``q`` (0-100): the midpoint of the bucket holding the
        ``ceil(q / 100 * total)``-th smallest value, within [min, max]; None when empty."""
        if not 0 <= q <= 100:
            raise ValueError(f"percentile {q} outside [0, 100]")
        if self.total == 0:
            return None
        if q >= 100:
            return self.max
        rank = max(1, int(np.ceil(q / 100 * self.total)))
        index = int(np.searchsorted(np.cumsum(self.counts), rank))
        low, high = bucket_bounds(index)
        return min(max((low + high) // 2, self.min), self.max)

    def mean(self) -> float | None:
        return None if self.total == 0 else self.sum / self.total

    def summary(self, scale: float = 1e-6, percentiles: Iterable[float] = (50, 95, 99, 99.9)) -> dict:
        """``{"count", "min", "mean", "p50", ..., "max"}`` with values multiplied by ``scale``
        (default: ns to ms), None when empty."""
        def scaled(value: float | None) -> float | None:
            return None if value is None else round(value * scale, 6)

        out = {"count": self.total, "min": scaled(self.min), "mean": scaled(self.mean())}
        for q in percentiles:
            out[f"p{q:g}".replace(".", "")] = scaled(self.percentile(q))
        out["max"] = scaled(self.max)
        return out

    def to_sparse(self) -> dict:
        """A compact, picklable and JSON-able copy: non-zero buckets as ``[index, count]``."""
        nonzero = np.flatnonzero(self.counts)
        return {"buckets": [[int(i), int(self.counts[i])] for i in nonzero], "min": self.min,
                "max": self.max, "sum": self.sum, "total": self.total, "clamped": self.clamped}

    @classmethod
    def from_sparse(cls, data: dict) -> Histogram:
        h = cls()
        for index, count in data["buckets"]:
            h.counts[index] += count
        h.total, h.min, h.max = data["total"], data["min"], data["max"]
        h.sum, h.clamped = data["sum"], data["clamped"]
        return h

    def reset(self) -> None:
        self.counts[:] = 0
        self.total = self.sum = self.clamped = 0
        self.min = self.max = None
