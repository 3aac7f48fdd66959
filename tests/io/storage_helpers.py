"""Helpers shared by the storage tests: a settable clock, a small config, batch builders, readers."""

from __future__ import annotations

import os

from hpbroker import _core
from hpbroker.errors import DamagedRangeError
from hpbroker.io import LogConfig, PartitionLog, _writer

START_MS = 1_700_000_000_000


class Clock:
    """A clock in ms that moves only when told to."""

    def __init__(self, now_ms: int = START_MS) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


# Small segments and indexes so a few batches roll and index; flushes only when asked (or on roll).
TEST_CONFIG = LogConfig(
    segment_bytes=4096,
    index_interval_bytes=256,
    flush_messages=1_000_000,
    flush_ms=1_000_000,
    flush_fsync=False,
)


def make_batch(record_count: int = 1, *, value_bytes: int = 20, timestamp: int | None = None,
               compression: int = _core.CODEC_NONE, tag: int = 0) -> bytes:
    """A batch of ``record_count`` records whose values say which batch and record they are."""
    timestamp = START_MS if timestamp is None else timestamp
    values = [(f"{tag}:{i}:".encode() + b"x" * value_bytes)[: max(value_bytes, 1)]
              for i in range(record_count)]
    return _core.build_batch(values, timestamps=timestamp, compression=compression)


def stamped(batch: bytes, base_offset: int) -> bytes:
    """``batch`` as the log stores it at ``base_offset``."""
    copy = bytearray(batch)
    _core.stamp_batch(copy, 0, base_offset)
    return bytes(copy)


def split_batches(data: bytes) -> list[tuple[int, bytes]]:
    """``(base_offset, bytes)`` of each batch in ``data``, which must be whole valid batches."""
    scan = _core.scan_batches(data)
    assert scan.error is None, scan.error
    return [(scan.base_offsets[i], data[scan.positions[i] : scan.positions[i] + scan.sizes[i]])
            for i in range(scan.batch_count)]


def read_all(log: PartitionLog, max_bytes: int = 1 << 20) -> list[tuple[int, bytes]]:
    """Every flushed batch from ``log_start_offset``, read slice by slice."""
    out: list[tuple[int, bytes]] = []
    offset = log.log_start_offset
    while offset < log.high_watermark:
        batches = split_batches(log.read_bytes(offset, max_bytes))
        assert batches, f"empty read at {offset} below the high watermark {log.high_watermark}"
        out.extend(batches)
        offset = _core.read_header(batches[-1][1]).next_offset
    return out


def read_around_damage(log: PartitionLog, max_bytes: int = 1 << 20) -> tuple[list[tuple[int, bytes]],
                                                                                list[tuple[int, int]]]:
    """Every flushed batch from ``log_start_offset``, stepping over damaged ranges as a consumer
    that skips them would: ``(batches, [(first_offset, next_offset) of each range met])``."""
    out: list[tuple[int, bytes]] = []
    skipped: list[tuple[int, int]] = []
    offset = log.log_start_offset
    while offset < log.high_watermark:
        try:
            data = log.read_bytes(offset, max_bytes)
        except DamagedRangeError as e:
            assert e.first_offset <= offset < e.next_offset, (offset, e)
            skipped.append((e.first_offset, e.next_offset))
            offset = e.next_offset
            continue
        batches = split_batches(data)
        assert batches, f"empty read at {offset} below the high watermark {log.high_watermark}"
        out.extend(batches)
        offset = _core.read_header(batches[-1][1]).next_offset
    return out, skipped


def files_of(directory: str) -> dict[str, bytes]:
    """Name -> content of every file in ``directory``."""
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = f.read()
    return out


def make_unwritable(fd: int, path: str) -> None:
    """The disk goes away under the log: ``fd`` now refuses writes (EBADF), yet stays the log's
    own descriptor, which it closes once, as usual."""
    read_only = os.open(path, os.O_RDONLY)
    os.dup2(read_only, fd)
    os.close(read_only)


def fd_path(fd: int) -> str:
    """The path a descriptor was opened on (Linux: its /proc/self/fd link)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"<fd {fd}>"


class DiskEvents:
    """Records, in order, what storage does to the disk through ``os``: ``(op, path, probe())``.

    ``op`` is the ``os`` function (``write``, ``writev``, ``fdatasync``, ``fsync``, ``replace``,
    ``unlink``, ``mkdir``...), ``path`` the file or directory it touched (for ``replace``, the
    destination), ``probe`` whatever the test wants sampled at that moment (None by default).
    Each call is recorded once it has returned, so an event means "done".  Install with
    :meth:`install` (a pytest monkeypatch undoes the ``os`` part; :meth:`uninstall` stops the
    trace of the native flush jobs, whose ``writev`` and ``fdatasync`` do not go through ``os``).
    """

    _BY_FD = ("write", "writev", "pwrite", "ftruncate", "fsync", "fdatasync")
    _BY_PATH = ("unlink", "mkdir")

    def __init__(self) -> None:
        self.events: list[tuple[str, str, object]] = []
        self.probe = lambda: None

    def install(self, monkeypatch) -> DiskEvents:
        for name in self._BY_FD:
            monkeypatch.setattr(os, name, self._wrap(name, getattr(os, name), by_fd=True))
        for name in self._BY_PATH:
            monkeypatch.setattr(os, name, self._wrap(name, getattr(os, name), by_fd=False))
        original_replace = os.replace

        def replace(src, dst, *args, **kwargs):
            original_replace(src, dst, *args, **kwargs)
            self.events.append(("replace", os.fspath(dst), self.probe()))

        monkeypatch.setattr(os, "replace", replace)
        _writer.set_trace(lambda op, fd: self.events.append((op, fd_path(fd), self.probe())))
        return self

    def uninstall(self) -> None:
        _writer.set_trace(None)

    def _wrap(self, name, original, *, by_fd: bool):
        def recorded(target, *args, **kwargs):
            path = fd_path(target) if by_fd else os.fspath(target)
            result = original(target, *args, **kwargs)
            self.events.append((name, path, self.probe()))
            return result

        return recorded

    def of(self, *ops: str) -> list[tuple[str, str, object]]:
        return [event for event in self.events if event[0] in ops]
