"""One writer per partition directory, enforced by a lock the kernel releases on death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from hpbroker.errors import StorageError
from hpbroker.io import PartitionLog
from hpbroker.records import build_batch


def test_a_second_open_of_the_same_directory_is_refused(tmp_path):
    with PartitionLog(tmp_path / "orders-0") as log:
        log.append(build_batch([b"a"]))
        log.flush()
        with pytest.raises(StorageError, match=f"already open for writing by process {os.getpid()}"):
            PartitionLog(tmp_path / "orders-0")
        assert log.read_bytes(0, 1 << 20), "the refused open must not disturb the open log"
    with PartitionLog(tmp_path / "orders-0") as reopened:
        assert reopened.high_watermark == 1


def test_the_lock_dies_with_a_killed_writer(tmp_path):
    directory = tmp_path / "orders-1"
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from hpbroker.io import PartitionLog
            log = PartitionLog({str(directory)!r})
            print("open", flush=True)
            time.sleep(60)
        """)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "open"
        with pytest.raises(StorageError, match=f"process {child.pid}"):
            PartitionLog(directory)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    with PartitionLog(directory) as log:
        assert log.log_end_offset == 0
