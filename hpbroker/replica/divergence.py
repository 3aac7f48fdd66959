"""Where a follower's log parts from its leader's, by leader epoch (KIP-101, KIP-320).

Pure functions over a :class:`~hpbroker.io.leader_epochs.LeaderEpochCache` and a log end
offset; no I/O.  Both sides of the exchange:

1. The follower fetches from ``fetch_offset`` (its log end) with ``last_fetched_epoch``, the
   epoch of the last batch in its log.
2. The leader (:func:`diverging_epoch`) looks up where that epoch ends in *its* log.  If the
   leader never had that epoch (it answers an older one) or the epoch ends there before
   ``fetch_offset``, the follower holds records the leader does not: the fetch is answered
   with no records and ``(diverging_epoch, diverging_end_offset)``.
3. The follower (:func:`truncation_offset`) truncates to the offset computed from the answer and
   its own cache, then fetches again with its new last epoch; the leader checks again.  Each
   round removes at least one of the follower's epochs, so they agree after a few rounds at
   most, and from then on the follower appends the leader's very bytes: the logs never diverge.

The rules are Kafka's (``Partition.fetchRecords`` for the leader's check,
``AbstractFetcherThread.getOffsetTruncationState`` for the follower's answer), including the
fallback when the leader cannot tell (an epoch older than every one it has, or no epochs at
all): the answer's end offset is undefined (-1), and the follower truncates to the high
watermark it knows, below which every record is committed, so held by every in-sync replica.
"""

from __future__ import annotations

from hpbroker.io.leader_epochs import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET, LeaderEpochCache

__all__ = ["diverging_epoch", "truncation_offset"]


def diverging_epoch(cache: LeaderEpochCache, log_end_offset: int, last_fetched_epoch: int,
                    fetch_offset: int) -> tuple[int, int] | None:
    """Leader side: ``(epoch, end_offset)`` to answer a replica fetch with when the follower's
    log diverges from this one (module docstring), None when it does not.  ``cache`` and
    ``log_end_offset`` are the leader's.  ``last_fetched_epoch`` -1 (the follower has no epoch
    to check) is never a divergence.  The answer may be ``(-1, -1)``: the leader cannot tell
    where the follower's epoch ends."""
    if last_fetched_epoch == UNDEFINED_EPOCH:
        return None
    epoch, end_offset = _end_offset_for(cache, last_fetched_epoch, log_end_offset)
    if epoch < last_fetched_epoch or end_offset < fetch_offset:
        return epoch, end_offset
    return None


def truncation_offset(cache: LeaderEpochCache, log_end_offset: int, diverging_epoch: int,
                      diverging_end_offset: int, *, high_watermark: int = 0) -> int:
    """Follower side: the offset to truncate this log to for the leader's answer
    ``(diverging_epoch, diverging_end_offset)``; ``cache`` and ``log_end_offset`` are the
    follower's.  Never above ``log_end_offset``.

    - The leader could not tell (``diverging_end_offset`` -1): ``high_watermark``, the replicated
      high watermark the follower last learned from a leader (0 when it knows none: everything is
      fetched again).
    - The follower knows the leader's epoch: the smaller of the two ends of that epoch.
    - The follower knows only older epochs (its newest at or below the leader's is another
      one): the end of that one in its own log; the next fetch carries it and the leader
      checks again.
    - The follower knows no epoch at or below it: the leader's end offset (or, as Kafka does,
      where the follower's first epoch begins, if earlier: its records from there on are of
      epochs the leader's answer does not cover)."""
    if diverging_end_offset == UNDEFINED_EPOCH_OFFSET:
        return max(0, min(high_watermark, log_end_offset))
    epoch, own_end_offset = _end_offset_for(cache, diverging_epoch, log_end_offset)
    if epoch == UNDEFINED_EPOCH:
        return min(diverging_end_offset, log_end_offset)
    if epoch != diverging_epoch:
        return min(own_end_offset, log_end_offset)
    return min(own_end_offset, diverging_end_offset, log_end_offset)


def _end_offset_for(cache: LeaderEpochCache, epoch: int, log_end_offset: int) -> tuple[int, int]:
    """``cache.end_offset_for``, except for an epoch older than every one the cache has: Kafka's
    ``LeaderEpochFileCache.endOffsetFor`` answers ``(epoch, start of the first epoch known)``
    (the epoch ended at the latest where the first one known begins), the cache (-1, -1)."""
    found = cache.end_offset_for(epoch, log_end_offset)
    if found[0] == UNDEFINED_EPOCH and epoch != UNDEFINED_EPOCH:
        entries = cache.entries
        if entries and epoch < entries[0][0]:
            return epoch, entries[0][1]
    return found
