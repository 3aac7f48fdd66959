"""Process-wide allocator settings for the broker (glibc ``mallopt``), set once at start.

Every produce request arrives as a ZeroMQ message of up to a few MiB that lives until its records
are flushed.  By default glibc serves each allocation that large with a fresh ``mmap`` and gives
the pages back with ``munmap`` when it is freed (or trims the heap when a freed chunk leaves
enough at its top), so every request pays page faults and zeroing for memory it just had, which
is dearer still on a virtual machine whose host backs guest pages lazily.  Raising the mmap
threshold to its maximum (32 MiB) makes such messages come from the heap, and raising the trim
threshold keeps up to :data:`TRIM_THRESHOLD_BYTES` of freed heap for the next ones.  The cost is
resident memory that stays at its high-water mark, bounded by the requests in flight.

Workers inherit the settings across ``fork``.  On a C library without ``mallopt`` nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

__all__ = ["MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "tune_allocator"]

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's upper bound on 64-bit
TRIM_THRESHOLD_BYTES = 512 << 20


def tune_allocator() -> bool:
    """Apply the settings above; True if the C library took both."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        logger.debug("no mallopt in the C library (%s): allocator left as it is", name)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    took = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) & bool(mallopt(_M_TRIM_THRESHOLD,
                                                                               TRIM_THRESHOLD_BYTES))
    if not took:
        logger.warning("mallopt refused the broker's allocator settings; large requests will be mmapped")
    return took
