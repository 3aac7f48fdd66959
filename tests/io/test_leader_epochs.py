"""LeaderEpochCache: Kafka's leader-epoch file cache (KIP-101), its rules and its file."""

from __future__ import annotations

import logging
import os

import pytest

from hpbroker.io.leader_epochs import LEADER_EPOCH_FILE_NAME, LeaderEpochCache


def file_of(directory) -> str:
    with open(os.path.join(directory, LEADER_EPOCH_FILE_NAME)) as f:
        return f.read()


def test_an_empty_cache_has_no_epoch_and_no_file(tmp_path):
    cache = LeaderEpochCache(str(tmp_path))
    assert cache.entries == [] and cache.latest_epoch == -1
    assert cache.end_offset_for(0, 10) == (-1, -1)
    assert not os.path.exists(os.path.join(tmp_path, LEADER_EPOCH_FILE_NAME))


def test_assign_appends_newer_epochs_and_writes_kafkas_format(tmp_path):
    cache = LeaderEpochCache(str(tmp_path))
    assert cache.assign(0, 0) and cache.assign(3, 100)
    assert cache.entries == [(0, 0), (3, 100)] and cache.latest_epoch == 3
    assert file_of(tmp_path) == "0\n2\n0 0\n3 100\n"


def test_assign_of_the_latest_epoch_at_a_later_offset_changes_nothing(tmp_path):
    cache = LeaderEpochCache(str(tmp_path))
    cache.assign(2, 10)
    assert not cache.assign(2, 10) and not cache.assign(2, 50)
    assert cache.entries == [(2, 10)]


def test_assign_removes_conflicting_entries_as_kafka_does(tmp_path):
    cache = LeaderEpochCache(str(tmp_path))
    for epoch, offset in [(1, 0), (2, 10), (4, 20)]:
        cache.assign(epoch, offset)
    cache.assign(3, 15)  # an older epoch than the latest: the newest truth wins
    assert cache.entries == [(1, 0), (2, 10), (3, 15)]
    cache.assign(5, 5)  # an offset going backwards removes the entries at or above it
    assert cache.entries == [(1, 0), (5, 5)]
    cache.assign(5, 2)  # the latest epoch began earlier than recorded
    assert cache.entries == [(1, 0), (5, 2)]
    assert file_of(tmp_path) == "0\n2\n1 0\n5 2\n"


def test_assign_refuses_negative_values(tmp_path):
    cache = LeaderEpochCache(str(tmp_path))
    with pytest.raises(ValueError):
        cache.assign(-1, 0)
    with pytest.raises(ValueError):
        cache.assign(0, -1)


def test_end_offset_for_each_epoch(tmp_path):
    cache = LeaderEpochCache(str(tmp_path))
    for epoch, offset in [(2, 5), (4, 20), (7, 30)]:
        cache.assign(epoch, offset)
    assert cache.end_offset_for(7, 42) == (7, 42)  # the latest: the log end
    assert cache.end_offset_for(4, 42) == (4, 30)
    assert cache.end_offset_for(2, 42) == (2, 20)
    assert cache.end_offset_for(5, 42) == (4, 30)  # unknown epoch between: the one below it
    assert cache.end_offset_for(1, 42) == (-1, -1)  # below the first: undefined
    assert cache.end_offset_for(8, 42) == (-1, -1)  # above the latest: undefined
    assert cache.end_offset_for(-1, 42) == (-1, -1)


def test_truncate_from_end_drops_entries_starting_at_or_after_it(tmp_path):
    cache = LeaderEpochCache(str(tmp_path))
    for epoch, offset in [(0, 0), (1, 10), (2, 20)]:
        cache.assign(epoch, offset)
    cache.truncate_from_end(25)
    assert cache.entries == [(0, 0), (1, 10), (2, 20)]
    cache.truncate_from_end(20)
    assert cache.entries == [(0, 0), (1, 10)]
    cache.truncate_from_end(3)
    assert cache.entries == [(0, 0)]
    cache.truncate_from_end(0)
    assert cache.entries == [] and file_of(tmp_path) == "0\n0\n"


def test_truncate_from_start_moves_the_first_kept_entry_up(tmp_path):
    cache = LeaderEpochCache(str(tmp_path))
    for epoch, offset in [(0, 0), (1, 10), (2, 20)]:
        cache.assign(epoch, offset)
    cache.truncate_from_start(0)
    assert cache.entries == [(0, 0), (1, 10), (2, 20)]
    cache.truncate_from_start(15)
    assert cache.entries == [(1, 15), (2, 20)]
    cache.truncate_from_start(20)
    assert cache.entries == [(2, 20)]
    cache.truncate_from_start(99)
    assert cache.entries == [(2, 99)] and file_of(tmp_path) == "0\n1\n2 99\n"


def test_the_file_round_trips(tmp_path):
    cache = LeaderEpochCache(str(tmp_path))
    for epoch, offset in [(0, 0), (3, 7), (9, 1000)]:
        cache.assign(epoch, offset)
    again = LeaderEpochCache(str(tmp_path))
    assert again.entries == [(0, 0), (3, 7), (9, 1000)] and again.latest_epoch == 9
    assert not os.path.exists(os.path.join(tmp_path, LEADER_EPOCH_FILE_NAME + ".tmp"))


@pytest.mark.parametrize("content", [
    b"", b"0\n", b"1\n0\n", b"0\n2\n0 0\n", b"0\n1\n0 0", b"0\n2\n1 5\n1 9\n", b"0\n2\n1 5\n2 5\n",
    b"0\n1\n-1 0\n", b"0\n1\n1 x\n", b"\xff\xfe\n",
])
def test_a_malformed_file_is_logged_and_the_cache_starts_empty(tmp_path, caplog, content):
    with open(os.path.join(tmp_path, LEADER_EPOCH_FILE_NAME), "wb") as f:
        f.write(content)
    with caplog.at_level(logging.WARNING, logger="hpbroker.io.leader_epochs"):
        cache = LeaderEpochCache(str(tmp_path))
    assert cache.entries == [] and "malformed" in caplog.text
    assert file_of(tmp_path) == "0\n0\n"
    cache.assign(1, 4)
    assert LeaderEpochCache(str(tmp_path)).entries == [(1, 4)]


def test_an_entry_assigned_without_durable_is_written_by_flush_or_the_next_change(tmp_path):
    cache = LeaderEpochCache(str(tmp_path))
    cache.assign(0, 0)
    assert not cache.dirty and not cache.flush()
    assert cache.assign(2, 10, durable=False)
    assert cache.entries == [(0, 0), (2, 10)] and cache.dirty
    assert file_of(tmp_path) == "0\n1\n0 0\n", "the file as it was, whole"
    assert LeaderEpochCache(str(tmp_path)).entries == [(0, 0)], "what a crash now leaves"
    assert cache.flush() and not cache.dirty and not cache.flush()
    assert file_of(tmp_path) == "0\n2\n0 0\n2 10\n"
    cache.assign(4, 20, durable=False)
    cache.truncate_from_start(5)  # any durable change writes every entry
    assert not cache.dirty and file_of(tmp_path) == "0\n3\n0 5\n2 10\n4 20\n"


def test_a_failed_write_leaves_the_cache_dirty_and_flush_tries_again(tmp_path, monkeypatch):
    from hpbroker.io import leader_epochs

    cache = LeaderEpochCache(str(tmp_path))
    cache.assign(1, 0, durable=False)

    def full_disk(path, data, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(leader_epochs, "replace_atomically", full_disk)
    with pytest.raises(OSError, match="No space"):
        cache.flush()
    assert cache.dirty
    monkeypatch.undo()
    assert cache.flush() and file_of(tmp_path) == "0\n1\n1 0\n"
