"""The small state files of a partition directory: the recovery-point checkpoint, the
clean-shutdown marker and the list of damaged segments.

File ``recovery-point-offset-checkpoint``, ASCII, two lines::

    0             format version
    12345         recovery point: every batch below this offset is on disk (fsynced), with its indexes

Written atomically: the content goes to ``recovery-point-offset-checkpoint.tmp``, which is
fsynced, renamed over the old file, and the directory fsynced, so a crash leaves either the old
or the new checkpoint, never a mix; a leftover ``.tmp`` is ignored (and removed on open by the
log).

File ``clean-shutdown``, the same two lines, the second being the log end offset at which the log
was closed.  ``PartitionLog.close()`` writes it (fsynced, then the directory fsynced) as its
last step, once every segment and index is fsynced and the checkpoint says that same offset; the
next open reads and removes it (unlink, then directory fsync) before it changes any segment,
index or checkpoint file, so it exists only while the directory is closed and was closed
cleanly.  No atomic rename is needed: a
crash while writing it leaves no file or a malformed one, which means "not clean".  What a clean
shutdown changes on open is in ``hpbroker.io.loader``.

File ``damaged-segments``, ASCII: the format version, then the base offset of every segment
known to hold a damaged range (``hpbroker.io.damage``), one per line.  A trusted segment's open
checks only its indexes and tail, which damage in its middle passes once the indexes were rebuilt
around it; so the open scans every segment listed here in full, finds its damaged ranges again,
and the list is rewritten with what was found.  Written atomically like the checkpoint; removed
when no segment holds damage.

Single writer: the partition log.  Reading never raises for bad content: a missing or malformed
file reads as None (recover everything; not clean), which is always safe.

:class:`OffsetCheckpointFile`: one offset in a file of its own, the checkpoint's two-line format,
replaced atomically; for an offset that a user of the log keeps beside it (the log never reads
or writes one; the file name and when to write it are the user's).  Reading never raises for
bad content either: missing or malformed is None.
"""

from __future__ import annotations

import logging
import os

from hpbroker.io.files import (
    CHECKPOINT_FILE_NAME,
    CLEAN_SHUTDOWN_FILE_NAME,
    DAMAGED_SEGMENTS_FILE_NAME,
    fsync_dir,
    replace_atomically,
    unlink_if_exists,
    write_all,
)

__all__ = [
    "CHECKPOINT_VERSION",
    "CleanShutdownMarker",
    "DamagedSegments",
    "OffsetCheckpointFile",
    "RecoveryPointCheckpoint",
]

CHECKPOINT_VERSION = 0  # first line of the file
_MAX_CHECKPOINT_BYTES = 64  # two short lines; anything longer is not ours

logger = logging.getLogger(__name__)


class RecoveryPointCheckpoint:
    """Reads and atomically replaces ``<directory>/recovery-point-offset-checkpoint``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, CHECKPOINT_FILE_NAME)

    def read(self) -> int | None:
        """The recovery point, or None when the file is missing or malformed (logged)."""
        try:
            with open(self.path, "rb") as f:
                content = f.read(_MAX_CHECKPOINT_BYTES + 1)
        except FileNotFoundError:
            logger.info("no checkpoint at %s", self.path)
            return None
        offset = _parse(content)
        if offset is None:
            logger.warning("ignoring malformed checkpoint %s: %r", self.path, content[:_MAX_CHECKPOINT_BYTES])
        return offset

    def write(self, recovery_point: int) -> None:
        """Replace the checkpoint with ``recovery_point``, durably (tmp, fsync, rename, fsync dir)."""
        if recovery_point < 0:
            raise ValueError(f"recovery point {recovery_point} is negative")
        replace_atomically(self.path, _content(recovery_point))


class CleanShutdownMarker:
    """Writes and takes ``<directory>/clean-shutdown`` (see the module docstring)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, CLEAN_SHUTDOWN_FILE_NAME)

    def write(self, log_end_offset: int) -> None:
        """Say, durably, that the log was closed cleanly at ``log_end_offset``: call only once
        everything below it and the checkpoint are fsynced."""
        _write_synced(self.path, log_end_offset)
        fsync_dir(self.directory)

    def take(self) -> int | None:
        """Remove the marker, durably, and return the log end offset it held: None when there
        was none, or it was malformed (logged), meaning the log was not closed cleanly."""
        try:
            with open(self.path, "rb") as f:
                content = f.read(_MAX_CHECKPOINT_BYTES + 1)
        except FileNotFoundError:
            return None
        unlink_if_exists(self.path)
        fsync_dir(self.directory)
        offset = _parse(content)
        if offset is None:
            logger.warning("ignoring malformed clean-shutdown marker %s: %r", self.path,
                           content[:_MAX_CHECKPOINT_BYTES])
        return offset


class DamagedSegments:
    """Reads and atomically replaces ``<directory>/damaged-segments`` (module docstring)."""

    _MAX_BYTES = 1 << 20  # far more segments than any partition has

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, DAMAGED_SEGMENTS_FILE_NAME)

    def read(self) -> set[int]:
        """The base offsets listed; empty when the file is missing.  A malformed file lists
        nothing it can be sure of (logged): the segments are then checked as usual."""
        try:
            with open(self.path, "rb") as f:
                content = f.read(self._MAX_BYTES + 1)
        except FileNotFoundError:
            return set()
        lines = content.split(b"\n")
        if (len(content) > self._MAX_BYTES or not content.endswith(b"\n")
                or lines[0] != str(CHECKPOINT_VERSION).encode() or not all(x.isdigit() for x in lines[1:-1])):
            logger.warning("ignoring malformed %s: %r", self.path, content[:_MAX_CHECKPOINT_BYTES])
            return set()
        return {int(x) for x in lines[1:-1]}

    def write(self, base_offsets: set[int]) -> None:
        """Replace the list, durably; remove the file when it is empty."""
        if not base_offsets:
            if unlink_if_exists(self.path):
                fsync_dir(self.directory)
            return
        content = "".join(f"{base}\n" for base in sorted(base_offsets))
        replace_atomically(self.path, f"{CHECKPOINT_VERSION}\n{content}".encode("ascii"))


class OffsetCheckpointFile:
    """Reads and atomically replaces the file ``path`` holding one offset (module docstring):
    ``0\n<offset>\n``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self) -> int | None:
        """The offset, or None when the file is missing or malformed (logged)."""
        try:
            with open(self.path, "rb") as f:
                content = f.read(_MAX_CHECKPOINT_BYTES + 1)
        except FileNotFoundError:
            return None
        offset = _parse(content)
        if offset is None:
            logger.warning("ignoring malformed %s: %r", self.path, content[:_MAX_CHECKPOINT_BYTES])
        return offset

    def write(self, offset: int, *, durable: bool = True) -> None:
        """Replace the file with ``offset`` (``replace_atomically``: with ``durable`` the file
        and the directory are fsynced; without, a crash of the OS may leave the old offset or no
        file).  Raises OSError, ValueError for a negative offset."""
        if offset < 0:
            raise ValueError(f"offset {offset} is negative")
        replace_atomically(self.path, _content(offset), durable=durable)


def _content(offset: int) -> bytes:
    return f"{CHECKPOINT_VERSION}\n{offset}\n".encode("ascii")


def _write_synced(path: str, offset: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, _content(offset))
        os.fsync(fd)
    finally:
        os.close(fd)


def _parse(content: bytes) -> int | None:
    if len(content) > _MAX_CHECKPOINT_BYTES or not content.endswith(b"\n"):
        return None
    lines = content[:-1].split(b"\n")
    if len(lines) != 2 or lines[0] != str(CHECKPOINT_VERSION).encode() or not lines[1].isdigit():
        return None
    return int(lines[1])
