"""File names and the few raw file operations storage needs: whole writes, whole reads, dir fsync,
atomic replacement of a small file (:func:`replace_atomically`, for every such file of the broker).

A partition directory holds, per segment, three files named by the segment's base offset
written as 20 zero-padded decimal digits, plus a checkpoint, a lock and, while the log is
closed, maybe a clean-shutdown marker::

    00000000000000000000.log        the batches themselves
    00000000000000000000.index      sparse offset index (see hpbroker.io.index)
    00000000000000000000.timeindex  sparse time index
    recovery-point-offset-checkpoint
    damaged-segments                only while a segment holds a damaged range
    clean-shutdown                  only between a clean close and the next open
    .lock                           flock'ed by the one open log; holds its pid

The checkpoint and the clean-shutdown marker are described in ``hpbroker.io.checkpoint``, what
the marker changes when opening in ``hpbroker.io.loader``.  Any ``*.tmp`` or ``*.deleted`` file
is debris from an interrupted operation and is removed on open.  Every function here may raise
``OSError``; the partition log turns it into ``StorageError`` in one place.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

__all__ = [
    "CHECKPOINT_FILE_NAME",
    "CLEAN_SHUTDOWN_FILE_NAME",
    "DAMAGED_SEGMENTS_FILE_NAME",
    "DELETED_SUFFIX",
    "INDEX_SUFFIX",
    "LOG_SUFFIX",
    "TIME_INDEX_SUFFIX",
    "TMP_SUFFIX",
    "LOCK_FILE_NAME",
    "DirectoryLockedError",
    "fsync_dir",
    "lock_directory",
    "make_directory",
    "open_for_append",
    "parse_segment_file_name",
    "pread_full",
    "replace_atomically",
    "segment_file_name",
    "unlink_if_exists",
    "write_all",
]

LOG_SUFFIX = ".log"  # batches
INDEX_SUFFIX = ".index"  # offset index
TIME_INDEX_SUFFIX = ".timeindex"  # time index
TMP_SUFFIX = ".tmp"  # a file being written, renamed into place when complete
DELETED_SUFFIX = ".deleted"  # a file on its way out (never created by us; cleaned up if found)
CHECKPOINT_FILE_NAME = "recovery-point-offset-checkpoint"  # see hpbroker.io.checkpoint
CLEAN_SHUTDOWN_FILE_NAME = "clean-shutdown"  # written by a clean close, removed by open; ditto
DAMAGED_SEGMENTS_FILE_NAME = "damaged-segments"  # segments known to hold damaged ranges; ditto
LOCK_FILE_NAME = ".lock"  # flock'ed by the one log that has the directory open; holds its pid
_OFFSET_DIGITS = 20  # enough for any non-negative i64


def segment_file_name(base_offset: int, suffix: str) -> str:
    """``00000000000000000042.log`` for base offset 42 and suffix ``.log``."""
    return f"{base_offset:0{_OFFSET_DIGITS}d}{suffix}"


def parse_segment_file_name(name: str) -> tuple[int, str] | None:
    """``(base_offset, suffix)`` for a segment file name, None for anything else."""
    stem, dot, ext = name.partition(".")
    if not dot or len(stem) != _OFFSET_DIGITS or not stem.isdigit() or not stem.isascii():
        return None
    return int(stem), "." + ext


def open_for_append(path: str, *, create: bool, exclusive: bool = False) -> int:
    """A read-write descriptor whose writes always land at the end of the file; ``exclusive``
    refuses (FileExistsError) to open a file that already exists."""
    flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    if exclusive:
        flags |= os.O_CREAT | os.O_EXCL
    return os.open(path, flags, 0o644)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte of ``data`` (``os.write`` may write less than asked)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def replace_atomically(path: str, data: bytes | bytearray | memoryview, *, durable: bool = True) -> None:
    """Replace the file ``path`` with ``data`` so that a crash leaves the old content or the new,
    never a mix: write ``path.tmp``, fsync it, rename it over ``path``, fsync the directory (the
    rename then survives a power loss too).  ``durable=False`` skips both syncs, for a file
    that is rewritten from a durable source at start anyway: after a process crash it holds the
    old or the new content, after an OS crash either, or nothing.  A ``.tmp`` left by a failure
    is removed (best effort); raises OSError."""
    tmp = path + TMP_SUFFIX
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        try:
            write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            unlink_if_exists(tmp)
        raise
    if durable:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


def pread_full(fd: int, length: int, position: int) -> bytes:
    """Up to ``length`` bytes at ``position``; fewer only where the file ends."""
    data = os.pread(fd, length, position)
    if len(data) == length or not data:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, position + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def fsync_dir(path: str) -> None:
    """Make the directory's entries (creations, renames, unlinks) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_directory(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)``, durably: the parent of every directory it creates is
    fsynced before it returns, so that a power loss cannot take away a new partition directory
    (and the acknowledged records later written into it) with its entry in the parent."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent != path:
        make_directory(parent)
    try:
        os.mkdir(path)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
        # Created by someone else meanwhile, who may not have synced it: sync it anyway.
    fsync_dir(parent)


def unlink_if_exists(path: str) -> bool:
    """Remove ``path``; False if it was already gone."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


class DirectoryLockedError(OSError):
    """Another open log (in this or another process) holds the partition directory's lock."""


def lock_directory(directory: str) -> int:
    """Take the directory's exclusive lock and return its descriptor (closing it releases it).

    ``flock`` locks belong to the open file, so a second open in the same process conflicts too,
    and the kernel drops the lock when its holder dies, even by ``kill -9``: no stale locks.
    The holder's pid is written into the file for the error message of whoever is refused.
    """
    path = os.path.join(directory, LOCK_FILE_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise DirectoryLockedError(
            f"{directory} is already open for writing by process {holder} (one writer per partition)"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    return fd
