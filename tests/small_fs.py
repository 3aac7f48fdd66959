"""Small filesystems for disk-full tests: a tmpfs, or an ext4 image on a loop device, mounted on a
directory of the test's, unmounted (and the image removed) when the test ends.

Mounting needs root (or CAP_SYS_ADMIN) and, for ext4, a loop device and ``mkfs.ext4``: where the
machine refuses, the test is skipped with the mount error as the reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

KINDS = ("tmpfs", "ext4")


def _run(argv: list[str]) -> str | None:
    """None on success, else why it failed."""
    if shutil.which(argv[0]) is None:
        return f"{argv[0]} is not installed"
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{' '.join(argv)}: {e}"
    if done.returncode:
        return f"{' '.join(argv)} exited with {done.returncode}: {(done.stderr or done.stdout).strip()}"
    return None


def _unmount(mount_point: Path) -> None:
    """Unmount, retrying while a process we stopped still lets go of its files; lazily at last."""
    for _ in range(50):
        if _run(["umount", str(mount_point)]) is None:
            return
        time.sleep(0.1)
    _run(["umount", "-l", str(mount_point)])


@contextlib.contextmanager
def small_filesystem(kind: str, where: Path, size_bytes: int) -> Iterator[Path]:
    """A fresh ``kind`` filesystem ("tmpfs" or "ext4", no blocks reserved for root) of about
    ``size_bytes`` mounted at ``where/mnt``; skips the test when it cannot be mounted."""
    mount_point = where / "mnt"
    mount_point.mkdir(parents=True)
    image = where / "fs.img"
    if kind == "tmpfs":
        failure = _run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mount_point)])
    else:
        with open(image, "wb") as f:
            f.truncate(size_bytes)
        failure = (_run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)])
                   or _run(["mount", "-o", "loop", str(image), str(mount_point)]))
    if failure is not None:
        image.unlink(missing_ok=True)
        pytest.skip(f"cannot mount a {kind} filesystem here: {failure}")
    try:
        yield mount_point
    finally:
        _unmount(mount_point)
        image.unlink(missing_ok=True)


def fill(path: Path, *, leave_bytes: int = 0, chunk_bytes: int = 64 << 10, limit_bytes: int = 1 << 30) -> int:
    """Write ``path`` until its filesystem is full but about ``leave_bytes`` (bounded by
    ``limit_bytes``); the bytes written.  The file stays: delete it to give the space back.
    Without ``leave_bytes``, the last blocks a filesystem keeps aside for new small files (ext4's
    reserve for delayed allocation) are eaten too, by small files in ``<path>.d`` (delete them
    with :func:`unfill`)."""
    if not leave_bytes:
        return _fill_file(path, 0, chunk_bytes, limit_bytes) + _fill_small_files(Path(f"{path}.d"))
    return _fill_file(path, leave_bytes, chunk_bytes, limit_bytes)


def unfill(path: Path) -> None:
    """Give back what :func:`fill` took."""
    path.unlink(missing_ok=True)
    shutil.rmtree(f"{path}.d", ignore_errors=True)


def _fill_small_files(directory: Path, limit: int = 20_000) -> int:
    written = 0
    with contextlib.suppress(OSError):
        directory.mkdir()
        for i in range(limit):
            for size in (4096, 1024, 1):
                try:
                    with open(directory / str(i), "wb") as f:
                        f.write(b"\xa5" * size)
                except OSError:
                    continue
                written += size
                break
            else:
                break
    return written


def _fill_file(path: Path, leave_bytes: int, chunk_bytes: int, limit_bytes: int) -> int:
    written = 0
    limit_bytes = min(limit_bytes, max(0, free_bytes(path.parent) - leave_bytes))
    if leave_bytes:
        chunk_bytes = min(chunk_bytes, max(512, limit_bytes))
    chunk = b"\xa5" * chunk_bytes
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while written < limit_bytes and chunk_bytes >= 512:
            try:
                written += os.write(fd, chunk[:chunk_bytes])
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                chunk_bytes //= 2  # fill the last blocks with smaller writes
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
    return written


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize
