"""Heartbeats on a full filesystem: liveness (the file's mtime) needs no free space."""

from __future__ import annotations

import errno
import os
import time

from small_fs import fill, small_filesystem, unfill

from hpbroker.workers import heartbeat


def test_a_heartbeat_on_a_full_disk_touches_its_file_and_leaves_no_partial_write(tmp_path):
    with small_filesystem("tmpfs", tmp_path, 1 << 20) as run_dir:
        path = heartbeat.heartbeat_path(str(run_dir), 0)
        entries = [{"topic": "orders", "partition": 0, "log_start_offset": 0, "high_watermark": 7}]
        assert heartbeat.write_heartbeat(str(run_dir), 0, ready=True, partitions=entries) is None
        fill(run_dir / "filler")
        os.utime(path, (time.time() - 60, time.time() - 60))

        error = heartbeat.write_heartbeat(str(run_dir), 0, ready=True, partitions=entries * 1000)
        assert isinstance(error, OSError) and error.errno == errno.ENOSPC
        age, content = heartbeat.read_heartbeat(str(run_dir), 0)
        assert age < 10, "the mtime was refreshed"
        assert content["partitions"] == entries, "the last complete content stays"
        assert not os.path.exists(f"{path}.tmp")

        os.unlink(path)  # a respawned worker's first heartbeat: the file is created empty
        fill(run_dir / "filler-2")  # the page the old file held
        assert heartbeat.write_heartbeat(str(run_dir), 0, ready=False, partitions=[]) is not None
        age, content = heartbeat.read_heartbeat(str(run_dir), 0)
        assert age < 10 and content is None

        unfill(run_dir / "filler")
        unfill(run_dir / "filler-2")
        assert heartbeat.write_heartbeat(str(run_dir), 0, ready=True, partitions=entries) is None
        assert heartbeat.read_heartbeat(str(run_dir), 0)[1]["partitions"] == entries
