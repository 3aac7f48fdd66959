"""This process's use of the machine, as Prometheus's standard ``process_*`` metrics count it.

Linux's ``/proc/self`` for memory, descriptors and the start time (None elsewhere, or when it
cannot be read); ``time.process_time`` for CPU time (to the nanosecond, where ``os.times`` counts
whole clock ticks and a young worker's reports read 0).  Each call costs a system call or two:
call it per scrape or per report, not per request.
"""

from __future__ import annotations

import os
import time

__all__ = ["cpu_seconds", "open_fds", "resident_memory_bytes", "start_time_seconds"]


def cpu_seconds() -> float:
    """User and system CPU time of this process, all its threads (not its children), in seconds."""
    return time.process_time()


_STARTTIME_FIELD = 19  # starttime, field 22 of /proc/<pid>/stat, counted from field 3 (after "comm)")


def start_time_seconds(pid: int | str = "self", proc: str = "/proc") -> float | None:
    """When the process started, in seconds since 1970, as the kernel recorded it: ``starttime``
    of ``<proc>/<pid>/stat`` (clock ticks since boot) plus the boot time (``btime`` of
    ``<proc>/stat``, whole seconds), as Prometheus's own process collectors compute it.  None
    when they cannot be read."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            stat = f.read()
        # The command name, field 2, is in parentheses and may hold spaces and parentheses itself.
        ticks = int(stat[stat.rindex(b")") + 2:].split()[_STARTTIME_FIELD])
        with open(f"{proc}/stat", "rb") as f:
            boot_time_s = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        return boot_time_s + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def resident_memory_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def open_fds() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the listing's own descriptor
    except OSError:
        return None
