"""Worker liveness measured on the monotonic clock.

A worker proves it is alive by replacing its heartbeat file (``hpbroker.workers.heartbeat``)
every ``heartbeat_interval_ms``.  The arbiter does not compare the file's mtime with its own
wall clock (``time.time()``): a wall-clock step (NTP, an operator setting the date, a process
under libfaketime) would then age every heartbeat by the step at once (a forward step of an
hour: every worker "silent for 3600 s" and aborted), or make a hung worker look fresh for as
long as a backward step.  Instead :class:`HeartbeatWatch` remembers, per slot, the heartbeat
file's *stamp* as last seen and the ``time.monotonic()`` second it last saw the stamp change; a
worker is silent for ``now - changed_at`` monotonic seconds, whatever either clock says the
file's times are.

The stamp is ``(st_ino, st_mtime_ns, st_ctime_ns, st_size)``: every heartbeat replaces the file
(a rename, which sets the ctime to the kernel's now) or, on a full disk, touches its mtime, so
each write changes it; its values are only compared for equality, never with a clock.  A
missing file has the stamp ``None``.

Single-threaded: the arbiter's loop is the only caller.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hpbroker.workers.heartbeat import heartbeat_path

__all__ = ["HeartbeatWatch", "heartbeat_stamp"]

Stamp = tuple[int, int, int, int] | None


def heartbeat_stamp(run_dir: str, slot: int) -> Stamp:
    """What changes whenever the slot's worker writes or touches its heartbeat; None: no file."""
    try:
        st = os.stat(heartbeat_path(run_dir, slot))
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size


@dataclass(slots=True)
class _Seen:
    stamp: Stamp
    changed_at: float  # monotonic seconds: when the stamp was last seen to change (or the watch began)


class HeartbeatWatch:
    """Per slot: how long (monotonic seconds) its worker's heartbeat has not changed."""

    def __init__(self, run_dir: str) -> None:
        self._run_dir = run_dir
        self._seen: dict[int, _Seen] = {}

    def start(self, slot: int, now: float) -> None:
        """The slot's process became ready (``now``: monotonic): its silence counts from now,
        against the heartbeat as it is now."""
        self._seen[slot] = _Seen(heartbeat_stamp(self._run_dir, slot), now)

    def forget(self, slot: int) -> None:
        """The slot's process is gone."""
        self._seen.pop(slot, None)

    def silent_s(self, slot: int, now: float) -> float:
        """Monotonic seconds since the slot's heartbeat last changed (since :meth:`start` at
        most); 0 for a slot not started."""
        seen = self._seen.get(slot)
        if seen is None:
            return 0.0
        stamp = heartbeat_stamp(self._run_dir, slot)
        if stamp != seen.stamp:
            seen.stamp, seen.changed_at = stamp, now
        return max(0.0, now - seen.changed_at)
