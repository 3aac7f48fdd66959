"""hpbroker.io.files.replace_atomically: every small state file of the broker (checkpoints,
producer snapshots, the producer id block, the topic store) is replaced through it."""

from __future__ import annotations

import errno
import os

import pytest

from hpbroker.io import files
from hpbroker.io.files import replace_atomically


def test_a_durable_replace_syncs_the_new_file_before_the_rename_and_the_directory_after(tmp_path,
                                                                                        disk_events):
    path = tmp_path / "state"
    path.write_bytes(b"old")
    replace_atomically(str(path), b"new content")
    ops = [(op, os.path.basename(p)) for op, p, _ in disk_events.events]
    assert ops == [("write", "state.tmp"), ("fsync", "state.tmp"), ("replace", "state"),
                   ("fsync", os.path.basename(tmp_path))]
    assert path.read_bytes() == b"new content" and os.listdir(tmp_path) == ["state"]


def test_a_replace_that_need_not_be_durable_syncs_nothing(tmp_path, disk_events):
    path = tmp_path / "state"
    replace_atomically(str(path), b"0\n5\n", durable=False)
    assert not disk_events.of("fsync", "fdatasync")
    assert path.read_bytes() == b"0\n5\n"


def test_a_failed_write_leaves_the_old_file_and_no_tmp(tmp_path, monkeypatch):
    path = tmp_path / "state"
    path.write_bytes(b"old")

    def no_space(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "write", no_space)
    with pytest.raises(OSError, match="No space"):
        replace_atomically(str(path), b"new")
    monkeypatch.undo()
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["state"]
