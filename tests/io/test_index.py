"""Offset and time indexes: file format, checks on load, lookups, and the one indexing rule."""

from __future__ import annotations

import os
import struct

import pytest
from storage_helpers import START_MS, make_batch

from hpbroker import _core
from hpbroker.io.index import IndexCorruptError, OffsetIndex, TimeIndex


@pytest.fixture
def offset_index(tmp_path):
    index = OffsetIndex(str(tmp_path / "00000000000000000000.index"))
    yield index
    index.close()


@pytest.fixture
def time_index(tmp_path):
    index = TimeIndex(str(tmp_path / "00000000000000000000.timeindex"))
    yield index
    index.close()


def _reload(index):
    again = type(index)(index.path)
    again.load()
    again.close()
    return again


def test_offset_index_file_holds_little_endian_u32_pairs(offset_index):
    for relative_offset, position in [(0, 0), (7, 4100), (2**32 - 1, 2**31 - 1)]:
        offset_index.append(relative_offset, position)
    assert os.path.getsize(offset_index.path) == 0, "entries wait for write_out"
    offset_index.write_out()
    with open(offset_index.path, "rb") as f:
        assert f.read() == struct.pack("<IIIIII", 0, 0, 7, 4100, 2**32 - 1, 2**31 - 1)
    again = _reload(offset_index)
    assert list(again.relative_offsets) == [0, 7, 2**32 - 1]
    assert list(again.positions) == [0, 4100, 2**31 - 1]


def test_time_index_file_holds_i64_u32_entries(time_index):
    time_index.append(START_MS, 0)
    time_index.append(START_MS + 5, 9)
    time_index.sync()
    with open(time_index.path, "rb") as f:
        assert f.read() == struct.pack("<qIqI", START_MS, 0, START_MS + 5, 9)
    again = _reload(time_index)
    assert (list(again.timestamps), list(again.relative_offsets)) == ([START_MS, START_MS + 5], [0, 9])


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (struct.pack("<II", 0, 0) + b"\1\2\3", "not a multiple of the 8-byte entry"),
        (struct.pack("<IIII", 0, 0, 0, 100), "not strictly increasing"),
        (struct.pack("<IIII", 0, 100, 5, 100), "not strictly increasing"),
        (struct.pack("<IIII", 5, 100, 4, 200), "not strictly increasing"),
    ],
)
def test_offset_index_load_rejects_a_malformed_file(offset_index, content, reason):
    with open(offset_index.path, "wb") as f:
        f.write(content)
    with pytest.raises(IndexCorruptError, match=reason):
        offset_index.load()


@pytest.mark.parametrize(
    "content",
    [struct.pack("<qI", 5, 0)[:-1], struct.pack("<qIqI", 5, 0, 5, 1), struct.pack("<qIqI", 5, 3, 6, 3)],
)
def test_time_index_load_rejects_a_malformed_file(time_index, content):
    with open(time_index.path, "wb") as f:
        f.write(content)
    with pytest.raises(IndexCorruptError):
        time_index.load()


def test_offset_index_lookups(offset_index):
    for relative_offset, position in [(0, 0), (10, 1000), (20, 2000)]:
        offset_index.append(relative_offset, position)
    assert [offset_index.floor(r) for r in (0, 9, 10, 19, 20, 10**6)] == [0, 0, 1, 1, 2, 2]
    assert [offset_index.floor_by_position(p) for p in (0, 999, 1000, 5000)] == [0, 0, 1, 2]
    assert [offset_index.find(r) for r in (0, 10, 15, 20, 21)] == [0, 1, -1, 2, -1]


def test_time_index_finds_the_last_entry_below_a_timestamp(time_index):
    for timestamp, relative_offset in [(100, 0), (200, 5), (300, 9)]:
        time_index.append(timestamp, relative_offset)
    assert [time_index.last_below(t) for t in (50, 100, 101, 200, 250, 301)] == [-1, -1, 0, 0, 1, 2]


def test_rewrite_if_changed_only_writes_a_different_file(offset_index):
    offset_index.append(0, 0)
    offset_index.write_out()
    mtime = os.stat(offset_index.path).st_mtime_ns
    assert not offset_index.rewrite_if_changed()
    assert os.stat(offset_index.path).st_mtime_ns == mtime
    offset_index.clear()
    assert offset_index.rewrite_if_changed()
    assert os.path.getsize(offset_index.path) == 0


# --- the indexing rule, through the log --------------------------------------------------------


def _varied_batches(count: int) -> list[bytes]:
    """Batches from ~60 bytes to ~2.5 KiB, some compressed, timestamps wandering back and forth."""
    out = []
    for i in range(count):
        out.append(make_batch(1 + i % 4, value_bytes=(i * 37) % 600, tag=i,
                              timestamp=START_MS + (i * 7919) % 1000,
                              compression=_core.CODEC_LZ4 if i % 3 == 0 else _core.CODEC_NONE))
    return out


def _index_files(log_dir: str) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(log_dir)):
        if name.endswith((".index", ".timeindex")):
            with open(os.path.join(log_dir, name), "rb") as f:
                out[name] = f.read()
    return out


@pytest.mark.parametrize("interval", [0, 100, 700, 4096])
def test_rebuilt_indexes_equal_the_ones_built_while_appending(open_log, log_dir, interval):
    log = open_log(segment_bytes=8192, index_interval_bytes=interval)
    for i, batch in enumerate(_varied_batches(120)):
        log.append(batch)
        if i % 7 == 0:
            log.flush()  # entries written in many small steps
    log.flush()
    assert len(log.segments) > 3
    incremental = _index_files(log_dir)
    log._abandon()
    for name in list(incremental) + ["recovery-point-offset-checkpoint"]:
        os.unlink(os.path.join(log_dir, name))
    open_log(segment_bytes=8192, index_interval_bytes=interval).close()
    assert _index_files(log_dir) == incremental


def test_offset_index_has_one_entry_per_interval_starting_at_the_first_batch(open_log):
    log = open_log(segment_bytes=1 << 20, index_interval_bytes=1000)
    for batch in _varied_batches(80):
        log.append(batch)
    log.flush()
    segment = log.segments[0]
    batch_positions = [position for position, _ in segment.log.headers(0, segment.size_in_bytes)]
    entries = list(zip(segment.offset_index.relative_offsets, segment.offset_index.positions, strict=True))
    assert entries[0] == (0, 0)
    for (_, position), (_, next_position) in zip(entries, entries[1:], strict=False):
        first_far_enough = next(p for p in batch_positions if p >= position + 1000)
        assert next_position == first_far_enough
    for relative_offset, position in entries:
        assert segment.log.header_at(position).base_offset == relative_offset


def test_time_index_records_each_new_maximum_at_an_offset_index_entry(open_log):
    log = open_log(segment_bytes=1 << 20, index_interval_bytes=0)
    timestamps = [50, 40, 60, 60, 55, 70, 10, 80]
    for ts in timestamps:
        log.append(make_batch(1, timestamp=START_MS + ts))
    log.flush()
    time_index = log.segments[0].time_index
    assert [t - START_MS for t in time_index.timestamps] == [50, 60, 70, 80]
    assert list(time_index.relative_offsets) == [0, 2, 5, 7]
    assert log.segments[0].max_timestamp == START_MS + 80
