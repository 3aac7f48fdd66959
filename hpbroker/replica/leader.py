"""What the leader of one replicated partition knows of its followers: progress, ISR, high watermark.

Pure logic, no I/O and no clock of its own: the worker that leads the partition feeds it each
replica fetch (:meth:`LeaderState.follower_fetched`), asks it for the high watermark
(:meth:`LeaderState.high_watermark`) and for ISR changes to write to ZooKeeper
(:meth:`LeaderState.isr_change`), and tells it when ZooKeeper holds a new ISR
(:meth:`LeaderState.isr_changed`).  Kafka's ``Partition`` and ``Replica`` (2.5 – 2.8:
``updateFollowerFetchState``, ``maybeExpandIsr``, ``maybeShrinkIsr``,
``maybeIncrementLeaderHW``).  Times are milliseconds of one monotonic clock, the caller's.

**Follower progress.**  Each replica fetch says where the follower reads from (its
``fetch_offset``, its log end) and its *durable offset*, its flushed end: every record below it
is durable there.  A follower that fetches only once its last response is flushed sends the two
equal (FetchRequest versions 0 and 1); one that fetches the next range while its flush runs
(version 2) sends a durable offset below its fetch offset.  **Only durable offsets count toward
the HW and toward joining the ISR**; the fetch offset says how far it keeps up.
A follower is *caught up* at a fetch when its fetch offset reaches the leader's flushed end at
that moment (``last_caught_up_ms`` = the fetch's time); or, as Kafka does, when it reaches the
leader's flushed end at its *previous* fetch (then it was caught up as of that previous fetch):
under a steady stream of produces a follower is never exactly at the leader's end, yet it keeps
up.

**High watermark** (HW): the smallest flushed end over the ISR, the leader's own included; with
an ISR change proposed but not yet written, over the *maximal* ISR (the current ISR plus the
replicas being added; a replica being dropped is still in the current ISR), so the HW never
counts on fewer replicas than ZooKeeper may hold.  The HW never moves backwards: a value below
the last one computed (a follower that joined and has not fetched yet) keeps the last one.
A record below the HW is flushed on every in-sync replica: acks=-1 answers once the HW passes
the request's last offset, and consumers read only below it.

**Shrink**: a follower in the ISR whose ``last_caught_up_ms`` is more than ``lag_time_max_ms``
old leaves it (Kafka 2.5+: time only, no record-count lag).  **Expand**: a replica outside the
ISR joins once a fetch of this leader epoch reached both the current HW and the epoch's start
offset (so it holds every record this leader's epoch may have committed), and only while it
fetches: at that fetch, or at a check at most ``EXPAND_FETCH_AGE_MAX_MS`` after it (Kafka expands
only on a fetch).  A replica that stopped fetching (its broker dead, or its worker slot
crash-looping and the replica reported offline) is never proposed back on the strength of an old
fetch, so such a proposal cannot undo the controller's removal of it.  The leader itself is
never dropped.  The ISR proposed lists replicas in assignment order.

Becoming leader resets what is known of the followers (Kafka's ``makeLeader``): fetch offsets are
unknown (-1); followers in the ISR count as caught up now (they get ``lag_time_max_ms`` to fetch
before they are dropped), the others as never caught up.

Single owner: the worker that leads the partition, on its event loop.
"""

from __future__ import annotations

from collections.abc import Sequence

from hpbroker.errors import NotEnoughReplicasError

__all__ = ["EXPAND_FETCH_AGE_MAX_MS", "ISR_CHANGE_RETRY_MS", "LeaderState"]

# How long a proposed ISR change may stay unconfirmed (no isr_changed) before isr_change proposes
# the same change again (the write may have failed, or its news may have been lost).
ISR_CHANGE_RETRY_MS = 5_000
# How old a follower's last fetch may be for it to join the ISR: it is fetching now.  Above the
# default replica_fetch_wait_max_ms (a fetch parked at the leader that long is still a fetch);
# the fetch itself proposes the change at once, this only bounds the timer's checks.
EXPAND_FETCH_AGE_MAX_MS = 1_000
_UNKNOWN_OFFSET = -1


class _Follower:
    """One follower as the leader sees it, within the current leader epoch."""

    __slots__ = ("durable_offset", "fetch_offset", "last_caught_up_ms", "last_fetch_leader_end",
                 "last_fetch_ms")

    def __init__(self, last_caught_up_ms: int) -> None:
        self.fetch_offset = _UNKNOWN_OFFSET  # its log end as of its last fetch
        self.durable_offset = _UNKNOWN_OFFSET  # its flushed end as of its last fetch
        self.last_caught_up_ms = last_caught_up_ms
        self.last_fetch_leader_end = _UNKNOWN_OFFSET  # the leader's flushed end at its last fetch
        self.last_fetch_ms = 0


class LeaderState:
    """Follower progress, ISR and high watermark of a partition this broker leads in ``leader_epoch``.

    ``replicas``: the assignment (this broker among them); ``isr``: as ZooKeeper holds it now.
    ``leader_epoch_start_offset``: where this leader epoch began in the log (the log end offset
    when leadership was taken, :meth:`PartitionLog.begin_leader_epoch`); a replica joins the ISR
    only once it has reached it.  ``high_watermark``: where the HW starts (what this broker knew
    of it before; the log start offset when nothing is known): it only rises from there.
    """

    def __init__(self, broker_id: int, leader_epoch: int, replicas: Sequence[int], isr: Sequence[int],
                 *, lag_time_max_ms: int, min_insync_replicas: int, now_ms: int,
                 leader_epoch_start_offset: int = 0, high_watermark: int = 0) -> None:
        if broker_id not in replicas:
            raise ValueError(f"broker {broker_id} leads a partition whose replicas {list(replicas)} "
                             f"do not include it")
        if lag_time_max_ms < 1 or min_insync_replicas < 1:
            raise ValueError(f"lag_time_max_ms {lag_time_max_ms} and min_insync_replicas "
                             f"{min_insync_replicas} must be >= 1")
        self.broker_id = broker_id
        self.leader_epoch = leader_epoch
        self.replicas = tuple(replicas)
        self.lag_time_max_ms = lag_time_max_ms
        self.min_insync_replicas = min_insync_replicas
        self.leader_epoch_start_offset = leader_epoch_start_offset
        self.isr: tuple[int, ...] = ()
        self._high_watermark = high_watermark
        self._followers = {replica: _Follower(now_ms if replica in isr else 0)
                           for replica in self.replicas if replica != broker_id}
        self._proposed: tuple[int, ...] | None = None  # an ISR change not yet in ZooKeeper
        self._proposed_ms = 0
        self.isr_changed(isr)

    def __repr__(self) -> str:
        return (f"LeaderState(broker {self.broker_id}, epoch {self.leader_epoch}, replicas "
                f"{list(self.replicas)}, isr {list(self.isr)}, hw {self._high_watermark})")

    # --- followers -------------------------------------------------------------------------------

    def follower_fetched(self, replica_id: int, fetch_offset: int, leader_log_end: int, now_ms: int,
                         durable_offset: int | None = None) -> bool:
        """A replica fetch of this leader epoch from ``fetch_offset`` (the follower's log end)
        arrived at ``now_ms``, the leader's flushed end being ``leader_log_end``;
        ``durable_offset``: the follower's flushed end (None: ``fetch_offset``).  False (nothing
        recorded) when ``replica_id`` is not a follower of this partition: the caller refuses
        the fetch.  ValueError when ``durable_offset`` is past ``fetch_offset``."""
        follower = self._followers.get(replica_id)
        if follower is None:
            return False
        if durable_offset is None:
            durable_offset = fetch_offset
        if durable_offset > fetch_offset:
            raise ValueError(f"broker {replica_id}: durable offset {durable_offset} past its fetch offset "
                             f"{fetch_offset}")
        if fetch_offset >= leader_log_end:
            follower.last_caught_up_ms = max(follower.last_caught_up_ms, now_ms)
        elif follower.last_fetch_leader_end >= 0 and fetch_offset >= follower.last_fetch_leader_end:
            follower.last_caught_up_ms = max(follower.last_caught_up_ms, follower.last_fetch_ms)
        follower.fetch_offset = fetch_offset
        follower.durable_offset = durable_offset
        follower.last_fetch_leader_end = leader_log_end
        follower.last_fetch_ms = now_ms
        return True

    def follower_progress(self) -> dict[int, tuple[int, int]]:
        """replica -> (fetch_offset, last_caught_up_ms) for every follower (-1: no fetch yet in
        this epoch; 0: never caught up)."""
        return {replica: (f.fetch_offset, f.last_caught_up_ms) for replica, f in self._followers.items()}

    # --- high watermark ---------------------------------------------------------------------------

    @property
    def current_high_watermark(self) -> int:
        """The HW as last computed (:meth:`high_watermark`), without computing it again."""
        return self._high_watermark

    def high_watermark(self, leader_flushed_end: int) -> int:
        """The HW now: the smallest flushed end (durable offset) over the maximal ISR (module
        docstring), never below the last one."""
        candidate = leader_flushed_end
        for replica in self._maximal_isr():
            follower = self._followers.get(replica)
            if follower is not None:
                candidate = min(candidate, follower.durable_offset)
        self._high_watermark = max(self._high_watermark, candidate)
        return self._high_watermark

    def _maximal_isr(self) -> set[int]:
        isr = set(self.isr)
        if self._proposed is not None:
            isr.update(self._proposed)
        return isr

    # --- ISR ---------------------------------------------------------------------------------------

    def isr_change(self, leader_flushed_end: int, now_ms: int) -> tuple[int, ...] | None:
        """The ISR to write to ZooKeeper now, or None when it should stay: followers of the ISR
        not caught up for ``lag_time_max_ms`` dropped, replicas outside it that reached the HW and
        this epoch's start offset added (module docstring).  A change already proposed and not
        yet confirmed by :meth:`isr_changed` is not proposed again for ``ISR_CHANGE_RETRY_MS``,
        and counts in the maximal ISR until then (a proposal the ISR no longer needs is dropped
        once that long has passed without news of it)."""
        high_watermark = self.high_watermark(leader_flushed_end)
        current = set(self.isr)
        wanted = {self.broker_id}
        for replica, follower in self._followers.items():
            if replica in current:
                if now_ms - follower.last_caught_up_ms <= self.lag_time_max_ms:
                    wanted.add(replica)
            elif (follower.durable_offset >= high_watermark
                  and follower.durable_offset >= self.leader_epoch_start_offset
                  and now_ms - follower.last_fetch_ms <= min(EXPAND_FETCH_AGE_MAX_MS, self.lag_time_max_ms)):
                # Only a follower that is fetching: Kafka expands on a fetch.  A follower gone
                # silent (its broker dead, its replica reported offline) whose last fetch offset
                # happens to reach the HW must not be proposed back: the proposal would undo the
                # controller's removal and hold the HW at that offset.
                wanted.add(replica)
        if wanted == current:
            if self._proposed is not None and now_ms - self._proposed_ms >= ISR_CHANGE_RETRY_MS:
                self._proposed = None  # no news of it for that long: it was not written
            return None
        proposal = tuple(replica for replica in self.replicas if replica in wanted)
        if proposal == self._proposed and now_ms - self._proposed_ms < ISR_CHANGE_RETRY_MS:
            return None
        self._proposed, self._proposed_ms = proposal, now_ms
        return proposal

    def replicas_changed(self, replicas: Sequence[int]) -> None:
        """The partition's replicas are now ``replicas`` (a reassignment adds replicas, then drops
        the old ones): a new follower starts never caught up, one dropped is forgotten.  The ISR
        keeps only replicas (ZooKeeper's next state says the rest)."""
        if self.broker_id not in replicas:
            raise ValueError(f"broker {self.broker_id} leads a partition whose replicas {list(replicas)} "
                             f"do not include it")
        self.replicas = tuple(replicas)
        self._followers = {replica: self._followers.get(replica) or _Follower(0)
                           for replica in self.replicas if replica != self.broker_id}
        self.isr = tuple(replica for replica in self.isr if replica in self.replicas)
        if self._proposed is not None:
            self._proposed = tuple(replica for replica in self._proposed if replica in self.replicas)

    def isr_changed(self, isr: Sequence[int]) -> None:
        """ZooKeeper holds ``isr`` now (this leader's proposal written, or any other news of it):
        it becomes the current ISR and no change is pending."""
        unknown = [replica for replica in isr if replica not in self.replicas]
        if unknown:
            raise ValueError(f"ISR {list(isr)} names brokers {unknown} that are not replicas "
                             f"{list(self.replicas)}")
        self.isr = tuple(isr)
        self._proposed = None

    def check_min_isr(self, topic_partition: str) -> None:
        """Raise NotEnoughReplicasError when the ISR (as ZooKeeper holds it) is smaller than
        ``min_insync_replicas``: an acks=-1 produce is refused before anything is appended."""
        if len(self.isr) < self.min_insync_replicas:
            raise NotEnoughReplicasError(
                f"{topic_partition}: {len(self.isr)} in-sync replicas {list(self.isr)}, "
                f"min_insync_replicas is {self.min_insync_replicas}")
