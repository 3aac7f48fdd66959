"""This process's use of the machine, as Prometheus's standard ``process_*`` metrics count it.

Linux's ``/proc/self`` for memory and descriptors (None elsewhere, or when it cannot be read);
``os.times`` for CPU time.  Each call costs a system call or two: call it per scrape or per
report, not per request.
"""

from __future__ import annotations

import os

__all__ = ["cpu_seconds", "open_fds", "resident_memory_bytes"]


def cpu_seconds() -> float:
    """User and system CPU time of this process (not of its children), in seconds."""
    times = os.times()
    return times.user + times.system


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
