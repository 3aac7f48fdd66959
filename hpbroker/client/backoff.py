"""The client's retry backoff: one formula for every wait after a failure.

``retry_backoff_ms`` first, doubling per failure, at most ``retry_backoff_max_ms`` (Kafka's
``retry.backoff.ms`` and ``retry.backoff.max.ms``, without the jitter).  Pure arithmetic.
"""

from __future__ import annotations

__all__ = ["backoff_ms"]


def backoff_ms(first_ms: float, max_ms: float, failures: int) -> float:
    """The wait after the ``failures + 1``-th failure in a row: ``first_ms * 2**failures``, at
    most ``max_ms`` (``failures`` >= 0)."""
    return min(max_ms, first_ms * 2 ** min(failures, 30))
